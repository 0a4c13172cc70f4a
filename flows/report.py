"""Report stage: a run's artifacts → tables (Parquet), optional LLM-judge failure labels,
plots, Markdown and HTML report, Prefect artifacts."""

from __future__ import annotations

from prefect import flow

from schemas.settings import Settings
from tasks.report import compute_report_tables, judge_failure_modes, render_report


@flow(name="report")
def report(
    run_id: str,
    artifacts_root: str | None = None,
    manifest_uris: list[str] | None = None,
    judge_model: str | None = None,
    judge_limit: int | None = 200,
) -> dict:
    """Report on ``run_id`` from its artifacts alone.

    ``manifest_uris`` pins the dataset manifests (default: found under the artifact root);
    ``judge_model`` (``openai:<model>``) adds the LLM-judge failure labels for up to
    ``judge_limit`` incorrect trials. Returns ``table`` (Markdown pass@k table), ``failed``
    (queries with failed trials), the URIs ``markdown``, ``html``, ``pass_at_k``, ``summary``
    and every other table under ``tables``, ``plots`` and ``counts``.
    """
    root = artifacts_root or Settings.from_env().artifacts
    tables = compute_report_tables(run_id, root, manifest_uris)
    if judge_model:
        tables["uris"]["failure_judge"] = judge_failure_modes(
            run_id, root, judge_model, tables["manifests"], judge_limit
        )
    out = render_report(run_id, root, tables)
    return {
        **out,
        "failed": tables["failed"],
        "pass_at_k": tables["uris"]["pass_at_k"],
        "summary": tables["uris"]["summary"],
        "tables": tables["uris"],
        "counts": tables["counts"],
        "notes": tables["notes"],
    }
