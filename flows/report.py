"""Report stage: a run's artifacts (trials, verdicts of the score stage, audit, transcripts) →
tables (Parquet), optional LLM-judge failure labels, plots, Markdown and HTML report, the
transcript viewer, Prefect artifacts."""

from __future__ import annotations

from prefect import flow

from schemas.settings import Settings
from tasks.report.stage import compute_report_tables, judge_failure_modes, render_report, report_result


@flow(name="report", flow_run_name="report-tables-{run_id}")
def report(
    run_id: str,
    artifacts_root: str | None = None,
    manifest_uris: list[str] | None = None,
    judge_model: str | None = None,
    judge_limit: int | None = 200,
) -> dict:
    """Report on ``run_id`` from its artifacts alone (it must have been scored: the score stage
    or ``querylab rescore``).

    ``manifest_uris`` pins the dataset manifests (default: those the trials stage recorded);
    ``judge_model`` (``openai:<model>``) adds the LLM-judge failure labels for up to
    ``judge_limit`` incorrect trials. Returns ``table`` (Markdown pass@k table), ``failed``
    (queries with incorrect trials), the URIs ``markdown``, ``html``, ``viewer``,
    ``pass_at_k``, ``summary`` and every other table under ``tables``, ``plots``, ``counts``
    (with ``errored``) and ``errored`` (share and counts by terminate reason).
    """
    root = artifacts_root or Settings.from_env().artifacts
    tables = compute_report_tables(run_id, root, manifest_uris)
    if judge_model:
        tables["uris"]["failure_judge"] = judge_failure_modes(
            run_id, root, judge_model, tables["manifests"], judge_limit
        )
    return report_result(tables, render_report(run_id, root, tables))
