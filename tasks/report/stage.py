"""Run reports from a run's artifacts alone: tables (Parquet), plots (PNG), Markdown, one
self-contained HTML file, and Prefect artifacts when running inside a flow.

Inputs (``<root>/runs/<run_id>/``): ``trials/trials.parquet`` (required: answers and
terminate reasons), ``score/scores.parquet`` (required: the verdicts of the score step,
:mod:`tasks.scoring.stage`; the report never judges an answer itself), ``score/audit.parquet`` (the
trace audit), ``trials/tool_calls.parquet`` (trajectories; a run without it is reported with
empty trajectories and says so), ``trials/messages.parquet`` (transcripts, for the viewer) and
``trials/llm_calls.parquet`` (optional: cache hits and retries). The datasets' scoring files
give the queries' ``requires`` annotations for the failure-mode classifier and the questions
and ground truths of the examples (see :func:`resolve_manifests`).

Outputs (``<root>/runs/<run_id>/report/``): ``pass_at_k.parquet``, ``pass_at_k_summary.parquet``,
``pass_at_1_ci.parquet``, ``cost.parquet``, ``failure_labels.parquet``,
``failure_modes.parquet``, ``tool_use.parquet`` (schemas in :mod:`schemas.report`),
``failure_judge.parquet`` when the LLM judge ran, ``manifests.json`` (the manifests used),
``plots/*.png``, ``report.md``, ``report.html`` and ``viewer.html`` (the transcript viewer,
:mod:`tasks.report.viewer`; the report's examples link to it).

Errored trials (``api_error`` / ``error``) have no verdict: every pass@k, interval and
failure-mode table is over the scored trials and shows the errored count beside it, and the
report says how to retry them. Nothing here imports Prefect unless a flow runs it.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from schemas import artifacts
from schemas import report as rs
from tasks.core import storage
from tasks.report.failure_modes import (
    ONE_LABEL,
    REQUIREMENTS_SCHEMA,
    check_label_keys,
    failure_label_slices,
    failure_mode_table,
    requirements_from_manifests,
    unchecked_operations,
)
from tasks.report.metrics import (
    DEFAULT_KS,
    cost_table,
    pass_at_1_ci,
    pass_at_k_per_query,
    pass_at_k_summary,
    with_verdicts,
)
from tasks.core.prefect_task import task
from tasks.report.html import (
    Figure,
    Section,
    Table,
    markdown_table,
    render_html,
    render_markdown,
    slug,
)
from tasks.scoring.dab_rules import condition_notes
from tasks.sandbox.session import sandbox_notes
from tasks.scoring.stage import run_full_manifests, summarise
from tasks.report.tool_use import tool_use_table
from tasks.report.document import build_document
from tasks.report.loaders import (
    _trials_uri,
    load_audit,
    load_report_trials,
    load_tool_calls,
    load_trials,
    report_uri,
    run_prefix,
    scan_llm_calls,
    scan_tool_calls,
)
from tasks.core.settings import env_copy
from tasks.core.layout import DatasetLayout

# ``markdown_table`` is imported from here by other stages (text2sql, equivalence, lifecycle).


def replayed_from_cache(
    llm_calls: pl.DataFrame | pl.LazyFrame, trials: pl.DataFrame
) -> list[str]:
    """A warning (report note starting ``Warning:``) for each agent whose every model call in
    the run was answered from the response cache: it sent no request, so its trials repeat
    the samples (and $0 cost) of an earlier run with the same model, endpoint, prompts and
    trial indices — not new measurements. Calls re-answered within the run after a retry do
    not count (the run paid for them first)."""
    per_agent = (  # one streaming query: a scan of llm_calls is never loaded whole
        llm_calls.lazy()
        .select("trial_key", "cache_hit")
        .join(trials.lazy().select("trial_key", "agent"), on="trial_key", how="inner")
        .group_by("agent")
        .agg(pl.len().alias("n"), pl.col("cache_hit").all().alias("all_hits"))
        .collect(engine="streaming")
    )
    out = []
    for r in per_agent.sort("agent").iter_rows(named=True):
        if r["all_hits"] and r["n"]:
            out.append(
                f"Warning: {r['agent']} made no request to its endpoint: all {r['n']} model "
                "calls were answered from the response cache, recorded by an earlier run with "
                "the same model, endpoint, prompts and trial indices. Its trials repeat that "
                "run's samples at $0; for new samples run with `--cache refresh` (or `off`).")
    return out


def resolve_manifests(
    artifacts_root: str,
    run_id: str,
    run_queries: dict[str, set[str]],
    manifest_uris: list[str] | None = None,
) -> tuple[list[str], list[str]]:
    """The dataset manifests to read query annotations from, and notes for the report.

    Order: ``manifest_uris`` when given; else the manifests the trials stage recorded
    (``trials/manifests.json``); else the run's ``report/manifests.json`` from an earlier
    report; else, per dataset of the run, the manifests under
    ``<root>/datasets/<name>/`` whose query ids cover the run's query ids for that dataset (the
    last version in sort order when several do). A dataset without a covering manifest is
    named in the notes (its incorrect trials become FM1 ``requirements_unknown``).
    ``run_queries`` maps dataset name → query ids seen in the run.
    """
    notes: list[str] = []
    if manifest_uris:
        return list(manifest_uris), notes
    for recorded in (
        storage.join(run_prefix(artifacts_root, run_id), "trials", "manifests.json"),
        report_uri(artifacts_root, run_id, "manifests.json"),
    ):
        if not storage.exists(recorded):
            continue
        uris = [u for u in storage.read_json(recorded) if storage.exists(u)]
        names = {storage.read_json(u)["name"] for u in uris}
        if set(run_queries) <= names:
            return uris, notes
    uris = []
    for name, ids in sorted(run_queries.items()):
        found = None
        for uri in storage.list_uris(
            DatasetLayout(artifacts_root, name).name_dir, "manifest.json"
        ):
            m = storage.read_json(uri)
            if m.get("name") == name and ids <= {q["id"] for q in m.get("queries", [])}:
                found = uri
        if found is None:
            notes.append(
                f"No manifest for dataset `{name}` under the artifact root covers the run's "
                "queries: their failure modes are FM1 `requirements_unknown`."
            )
        else:
            uris.append(found)
    return uris, notes


def _write(artifacts_root: str, run_id: str, name: str, df: pl.DataFrame, schema) -> str:
    return storage.write_parquet(
        report_uri(artifacts_root, run_id, f"{name}.parquet"), df.to_arrow(), schema
    )


def write_failure_labels(
    trials: pl.DataFrame,
    tool_calls: pl.DataFrame | pl.LazyFrame,
    requirements: pl.DataFrame,
    uri: str,
) -> tuple[int, pl.DataFrame]:
    """Label the incorrect trials (:func:`tasks.report.failure_modes.failure_label_slices`,
    same arguments and errors) and stream the labels into ``uri`` (``FAILURE_LABELS``, one
    slice at a time: at 10M trials the 5M labels are never held together), then count them
    into the failure-mode table from the written artifact
    (:func:`tasks.report.failure_modes.failure_mode_table`). Returns (labels written, table).
    The labels are checked as they are streamed (a key per incorrect trial, none null or
    twice: :func:`tasks.report.failure_modes.check_label_keys`, and as many as there are
    incorrect trials); a ValueError raised then leaves the artifact at ``uri`` as it was.
    The artifact's bytes equal those of writing the concatenated labels in one go whenever
    there is at most one slice (fewer than ``PARTITION_TRIALS`` incorrect trials)."""
    schema = rs.FAILURE_LABELS
    verdicts = with_verdicts(trials.select(c for c in ("verdict", "is_correct")
                                           if c in trials.columns))["verdict"]
    n_bad = int((verdicts == "incorrect").sum())

    def batches():
        n, last = 0, None
        for part in failure_label_slices(trials, tool_calls, requirements):
            keys = part["trial_key"]
            check_label_keys(keys, last)  # before the artifact replaces the one there
            if keys.len():
                last = keys[-1]
            n += part.height
            # one chunk, so one batch: row groups cut as writing the slice whole would
            table = artifacts.check_schema(part.rechunk().to_arrow(), schema, uri)
            del part, keys
            yield from table.to_batches()
            del table
            pa.default_memory_pool().release_unused()  # the slice's buffers, back to the OS
        if n != n_bad:
            raise ValueError(f"{ONE_LABEL}: {n} failure labels for {n_bad} incorrect trials")

    n = storage.write_parquet_batches(uri, schema, batches())
    return n, failure_mode_table(trials, storage.scan_parquet(uri, schema))


def hint_conditions_of(trials: pl.DataFrame) -> dict[str, str]:
    """Agent (as named in the trial rows) → its hint condition: ``on``, ``off`` or ``n/a``
    (agents that read no prompt: oracle, replay; also trials written before the condition was
    recorded)."""
    if "hints" not in trials.columns:
        return {a: "n/a" for a in sorted(trials["agent"].cast(pl.String).unique().to_list())}
    pairs = (  # distinct pairs first: String or Categorical columns
        trials.select("agent", "hints").unique()
        .select(pl.col("agent"), pl.col("hints").fill_null("n/a"))
        .cast(pl.String).unique().sort("agent")
    )
    return {a: h for a, h in pairs.iter_rows()}


@task(name="report-tables", persist_result=False)
def compute_report_tables(
    run_id: str,
    artifacts_root: str,
    manifest_uris: list[str] | None = None,
    ks: tuple[int, ...] = DEFAULT_KS,
    confidence: float = 0.95,
) -> dict:
    """Compute every report table of a run from its artifacts and write them as Parquet.

    Reads the verdicts of the score step (ScoringError when the run is not scored or the
    scores are stale: ``querylab rescore``). Returns a small manifest: ``uris`` (table name →
    URI), ``failed`` (queries with an incorrect scored trial: agent, dataset, query_id, n,
    n_errored, c), ``counts`` (trials, scored, errored, agents, datasets, queries, incorrect,
    tool_calls, flagged), ``errored`` (the score summary's errored counts by reason),
    ``manifests`` (URIs used), ``notes`` (what was missing), ``unchecked_operations`` and
    ``has_llm_calls``. Raises StorageError when the run has no trials.
    """
    trials = load_report_trials(artifacts_root, run_id)  # only the columns read here
    # the largest artifact: scanned lazily, streamed by each table's query, never loaded whole
    tool_calls = scan_tool_calls(artifacts_root, run_id)
    llm_calls = scan_llm_calls(artifacts_root, run_id)  # streamed by the cost table
    audit = load_audit(artifacts_root, run_id)
    notes = []
    if tool_calls is None:
        notes.append("The run has no `tool_calls.parquet`: trajectories are empty.")
        tool_calls = pl.from_arrow(artifacts.TOOL_CALLS.empty_table()).lazy()
    if llm_calls is None:
        notes.append(
            "The run has no `llm_calls.parquet` (offline agents or no per-call accounting): "
            "`llm_calls`, `response_cache_hit_share` and `retries` are empty."
        )
    else:
        notes += replayed_from_cache(llm_calls, trials)
    if not storage.exists(_trials_uri(artifacts_root, run_id, "messages")):
        notes.append("The run has no `messages.parquet`: the viewer shows no transcripts and "
                     "the trace audit checked tool-call arguments only.")
    run_queries = {
        d: set(q)
        for d, q in trials.group_by("dataset").agg(pl.col("query_id").unique()).iter_rows()
    }
    uris_m, more = resolve_manifests(artifacts_root, run_id, run_queries, manifest_uris)
    notes += more
    notes += sandbox_notes(artifacts_root, run_id)
    notes += condition_notes(artifacts_root, run_id)
    # scorer side (requirements, questions), with the scoring the run was scored with
    manifests = run_full_manifests(artifacts_root, run_id, uris_m)
    requirements = (
        requirements_from_manifests(manifests)
        if manifests
        else pl.DataFrame(schema=REQUIREMENTS_SCHEMA)
    )
    storage.write_json(report_uri(artifacts_root, run_id, "manifests.json"), uris_m)

    per_query = pass_at_k_per_query(trials, ks)
    summary = pass_at_k_summary(per_query)
    ci = pass_at_1_ci(trials, confidence)
    cost = cost_table(trials, llm_calls)
    labels_uri = report_uri(artifacts_root, run_id, "failure_labels.parquet")
    n_labels, fm = write_failure_labels(trials, tool_calls, requirements, labels_uri)
    tool_use = tool_use_table(trials, tool_calls)
    uris = {
        "pass_at_k": _write(artifacts_root, run_id, "pass_at_k", per_query, rs.PASS_AT_K),
        "summary": _write(
            artifacts_root, run_id, "pass_at_k_summary", summary, rs.PASS_AT_K_SUMMARY
        ),
        "pass_at_1_ci": _write(artifacts_root, run_id, "pass_at_1_ci", ci, rs.PASS_AT_1_CI),
        "cost": _write(artifacts_root, run_id, "cost", cost, rs.COST),
        "failure_labels": labels_uri,
        "failure_modes": _write(artifacts_root, run_id, "failure_modes", fm, rs.FAILURE_MODE_TABLE),
        "tool_use": _write(artifacts_root, run_id, "tool_use", tool_use, rs.TOOL_USE),
    }
    judge = report_uri(artifacts_root, run_id, "failure_judge.parquet")
    if storage.exists(judge):
        uris["failure_judge"] = judge
    failed = (
        per_query.filter(pl.col("k") == 1, pl.col("c") < pl.col("n"))
        .select("agent", "dataset", "query_id", "n", "n_errored", "c")
        .to_dicts()
    )
    verdicts = summarise(trials.select(pl.col("verdict", "terminate_reason").cast(pl.String)))
    from tasks.core.runs import preflight_checks

    checks = preflight_checks(artifacts_root, run_id)
    paid = {
        "preflight_requests": sum(c["requests"] for c in checks),
        "preflight_cost_usd": sum(c["cost_usd"] for c in checks),
        "trials_cost_usd": float(trials["cost_usd"].sum()) if trials.height else 0.0,
    }
    paid["total_cost_usd"] = paid["preflight_cost_usd"] + paid["trials_cost_usd"]
    return {
        "uris": uris,
        "failed": failed,
        "counts": {
            "trials": trials.height,
            "scored": trials.height - verdicts["errored"],
            "errored": verdicts["errored"],
            "agents": trials["agent"].n_unique(),
            "datasets": trials["dataset"].n_unique(),
            "queries": trials.select("dataset", "query_id").unique().height,
            "incorrect": n_labels,
            "tool_calls": tool_calls.select(pl.len()).collect().item(),
            "flagged": audit["trial_key"].n_unique() if audit.height else 0,
        },
        "errored": {"share": verdicts["error_share"], "by_reason": verdicts["errored_by_reason"]},
        "manifests": uris_m,
        "notes": notes,
        "hints": hint_conditions_of(trials),
        "unchecked_operations": unchecked_operations(requirements),
        "has_llm_calls": llm_calls is not None,
        "confidence": confidence,
        "paid": paid,
    }


@task(name="report-failure-judge", persist_result=False)
def judge_failure_modes(
    run_id: str,
    artifacts_root: str,
    model: str,
    manifest_uris: list[str],
    limit: int | None = 200,
    base_url: str | None = None,
    api_key: str | None = None,
) -> str:
    """The optional LLM-judge stage: label up to ``limit`` incorrect trials (not yet judged by
    ``model``) and merge them into ``report/failure_judge.parquet``; returns its URI.

    ``model`` is ``openai:<model>`` or a bare model name, resolved through the shared model
    layer (:func:`tasks.core.llm.resolve_model`: the models table ``data/models.yaml`` +
    ``QUERYLAB_MODELS``, else ``QUERYLAB_OPENAI_BASE_URL`` / ``QUERYLAB_OPENAI_API_KEY``);
    ``base_url`` / ``api_key`` given here replace the resolved endpoint / key (the key is never
    written). Calls use temperature 0, the shared infra-only retries (3) and the response cache
    under ``<artifacts_root>/cache/judge`` (the judge sees ground truth: never beside agent
    responses). Raises AgentConfigError (a ValueError) when the model
    has no endpoint. Needs ``report/failure_labels.parquet`` (run
    :func:`compute_report_tables` first).
    """
    import dataclasses

    from schemas.models import AgentOptions, check_base_url
    from tasks.report.failure_judge import judge_failures
    from tasks.core.llm import JUDGE_CACHE, AgentConfigError, ChatModel, ResponseCache, resolve_model

    name = model.removeprefix("openai:")
    env = env_copy()
    if base_url:
        env["QUERYLAB_OPENAI_BASE_URL"] = base_url
    if api_key:
        env["QUERYLAB_OPENAI_API_KEY"] = api_key
    resolved = resolve_model(name, env=env)
    if base_url:
        try:
            resolved = dataclasses.replace(resolved, base_url=check_base_url(base_url))
        except ValueError as exc:
            raise AgentConfigError(f"judge base_url: {exc}") from None
    if api_key:
        resolved = dataclasses.replace(resolved, api_key=api_key)
    chat = ChatModel(
        resolved,
        AgentOptions(temperature=0, max_retries=3, request_timeout_s=120.0),
        ResponseCache(artifacts_root, namespace=JUDGE_CACHE),  # never beside agent responses
    )
    labels = pl.from_arrow(
        storage.read_parquet(
            report_uri(artifacts_root, run_id, "failure_labels.parquet"), rs.FAILURE_LABELS
        )
    )
    uri = report_uri(artifacts_root, run_id, "failure_judge.parquet")
    previous = (
        pl.from_arrow(storage.read_parquet(uri, rs.FAILURE_JUDGE))
        if storage.exists(uri)
        else pl.from_arrow(rs.FAILURE_JUDGE.empty_table())
    )
    done = set(previous.filter((pl.col("model") == name) & pl.col("error").is_null())["trial_key"])
    failed = set(
        previous.filter((pl.col("model") == name) & pl.col("error").is_not_null())["trial_key"]
    )
    trials = load_trials(artifacts_root, run_id)
    calls = load_tool_calls(artifacts_root, run_id)
    if calls is None:
        calls = pl.from_arrow(artifacts.TOOL_CALLS.empty_table())
    manifests = run_full_manifests(artifacts_root, run_id, manifest_uris)  # question, truth
    try:
        judged = judge_failures(
            labels, trials, calls, manifests, chat, name, limit, done, rejudge=failed
        )
    finally:
        chat.close()
    keep = previous.filter(
        ~((pl.col("model") == name) & pl.col("trial_key").is_in(judged["trial_key"].to_list()))
    )
    merged = pl.concat([keep, judged]).sort("model", "trial_key")
    return storage.write_parquet(uri, merged.to_arrow(), rs.FAILURE_JUDGE)


def publish_prefect_artifacts(run_id: str, markdown: str, sections: list[Section]) -> list[str]:
    """Create a Prefect markdown artifact (the report) and table artifacts (each table of the
    report) when called inside a Prefect flow or task run; returns the artifact keys created
    (none outside a run, and Prefect is not even imported then)."""
    import sys

    if "prefect" not in sys.modules:
        return []
    from prefect.artifacts import create_markdown_artifact, create_table_artifact
    from prefect.context import FlowRunContext, TaskRunContext

    if FlowRunContext.get() is None and TaskRunContext.get() is None:
        return []
    # ids cut to 60 characters: the run's part survives the 100-character key limit
    run_slug = slug(run_id, "run")[:60]
    key = f"querylab-report-{run_slug}"
    create_markdown_artifact(
        markdown=markdown, key=key, description=f"querylab report for run {run_id}"
    )
    keys = [key]
    for sec in sections:
        for block in sec.blocks:
            if isinstance(block, Table) and block.frame.height:
                tkey = f"querylab-{slug(block.title)[:60]}-{run_slug}"[:100].rstrip("-")
                rows = block.frame.with_columns(
                    pl.col(c).list.join(", ")
                    for c, t in block.frame.schema.items()
                    if isinstance(t, pl.List)
                ).to_dicts()
                create_table_artifact(table=rows, key=tkey, description=block.title)
                keys.append(tkey)
    return keys


@task(name="report-render", persist_result=False)
def render_report(run_id: str, artifacts_root: str, tables: dict) -> dict:
    """Write ``report/plots/*.png``, ``report/report.md``, ``report/report.html`` and the
    transcript viewer ``report/viewer.html`` from the tables of :func:`compute_report_tables`,
    and publish Prefect artifacts when inside a run.

    Returns ``{"markdown": uri, "html": uri, "viewer": uri, "plots": {name: uri}, "table":
    <Markdown of the pass@k table>, "prefect_artifacts": [keys]}``.
    """
    from tasks.report.viewer import write_viewer

    title, intro, sections = build_document(run_id, artifacts_root, tables)
    plot_uris = {}
    for sec in sections:
        for block in sec.blocks:
            if isinstance(block, Figure):
                plot_uris[block.name] = storage.write_bytes(
                    report_uri(artifacts_root, run_id, "plots", f"{block.name}.png"), block.png
                )
    md = render_markdown(title, intro, sections)
    md_uri = storage.write_bytes(report_uri(artifacts_root, run_id, "report.md"), md.encode())
    html_uri = storage.write_bytes(
        report_uri(artifacts_root, run_id, "report.html"),
        render_html(title, intro, sections).encode(),
    )
    viewer_uri = write_viewer(run_id, artifacts_root, tables.get("manifests"))
    wide = next(b for b in sections[0].blocks if isinstance(b, Table)).frame
    behind = next(b for b in sections[0].blocks if isinstance(b, Table)
                  and b.title == "Queries behind each pass@k").frame
    over = [c for c in behind.columns if c.endswith(" over")]
    left_out = behind.height > 0 and behind.select(
        pl.any_horizontal([pl.col("all errored") > 0,
                           *[pl.col(c) < pl.col("queries") - pl.col("all errored")
                             for c in over]]).any()).item()
    keys = publish_prefect_artifacts(
        run_id,
        md.replace("](plots/", f"]({report_uri(artifacts_root, run_id, 'plots')}/"),
        sections,
    )
    return {
        "markdown": md_uri,
        "html": html_uri,
        "viewer": viewer_uri,
        "plots": plot_uris,
        "table": markdown_table(wide),
        "queries_table": markdown_table(behind) if left_out else None,
        "prefect_artifacts": keys,
    }


def report_run(
    run_id: str,
    artifacts_root: str,
    manifest_uris: list[str] | None = None,
    judge_model: str | None = None,
    judge_limit: int | None = 200,
) -> dict:
    """The whole report of a run as plain function calls (no Prefect): tables, the optional
    LLM-judge labels, rendering. What ``querylab report`` runs and the report flow composes.
    Returns the dict of :func:`flows.report.report`."""
    tables = compute_report_tables.fn(run_id, artifacts_root, manifest_uris)
    if judge_model:
        tables["uris"]["failure_judge"] = judge_failure_modes.fn(
            run_id, artifacts_root, judge_model, tables["manifests"], judge_limit
        )
    out = render_report.fn(run_id, artifacts_root, tables)
    return report_result(tables, out)


def report_result(tables: dict, rendered: dict) -> dict:
    """The report flow's return value from the tables and the rendered files."""
    return {
        **rendered,
        "failed": tables["failed"],
        "pass_at_k": tables["uris"]["pass_at_k"],
        "summary": tables["uris"]["summary"],
        "tables": tables["uris"],
        "counts": tables["counts"],
        "errored": tables.get("errored", {}),
        "notes": tables["notes"],
    }
