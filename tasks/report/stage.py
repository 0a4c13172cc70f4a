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

from datetime import UTC, datetime

import polars as pl

from schemas import artifacts
from schemas import report as rs
from tasks.core import storage
from tasks.scoring.audit import CHECKS
from tasks.report.failure_modes import (
    CHECKED_OPERATIONS,
    REQUIREMENTS_SCHEMA,
    classify_failures,
    failure_mode_table,
    requirements_from_manifests,
    unchecked_operations,
)
from tasks.report.metrics import (
    DEFAULT_KS,
    cost_table,
    pass_at_1_ci,
    pass_at_k_per_query,
    pass_at_k_queries,
    pass_at_k_summary,
    pass_at_k_wide,
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
from tasks.scoring.stage import (
    audit_uri,
    run_full_manifests,
    scan_scores,
    scored_trials,
    summarise,
)
from tasks.report.tool_use import tool_use_table
from tasks.core.settings import env_copy
from tasks.core.layout import DatasetLayout, RunLayout

#: Longest table (rows) put into report.md / report.html; the Parquet always has every row.
MAX_REPORT_ROWS = 200
#: Example trials shown per failure mode.
EXAMPLES_PER_MODE = 5

# ``markdown_table`` is imported from here by other stages (text2sql, equivalence, lifecycle).


def run_prefix(artifacts_root: str, run_id: str) -> str:
    """Artifact prefix of one run."""
    return RunLayout(artifacts_root, run_id).root


def report_uri(artifacts_root: str, run_id: str, *name: str) -> str:
    """URI of a report artifact (``runs/<run_id>/report/<name>``)."""
    return storage.join(run_prefix(artifacts_root, run_id), "report", *name)


def _trials_uri(artifacts_root: str, run_id: str, name: str) -> str:
    return storage.join(run_prefix(artifacts_root, run_id), "trials", f"{name}.parquet")


def load_trials(artifacts_root: str, run_id: str) -> pl.DataFrame:
    """A run's trials as a Polars frame (schema-checked), read by a streaming scan of the file
    (:func:`tasks.core.storage.scan_parquet`: no bytes copy); StorageError naming the URI when the
    run has no ``trials.parquet``."""
    return storage.scan_parquet(
        _trials_uri(artifacts_root, run_id, "trials"), artifacts.TRIALS
    ).collect(engine="streaming")


def load_scored_trials(artifacts_root: str, run_id: str) -> pl.DataFrame:
    """A run's trials with their verdicts (:func:`tasks.scoring.stage.scored_trials`): ScoringError
    when the run is not scored or its scores are stale."""
    trials = storage.scan_parquet(_trials_uri(artifacts_root, run_id, "trials"), artifacts.TRIALS)
    return scored_trials(trials, scan_scores(artifacts_root, run_id), run_id)


def load_messages(artifacts_root: str, run_id: str) -> pl.DataFrame | None:
    """A run's transcripts (schema-checked), or None when the run has no ``messages.parquet``."""
    uri = _trials_uri(artifacts_root, run_id, "messages")
    if not storage.exists(uri):
        return None
    return pl.from_arrow(storage.read_parquet(uri, artifacts.MESSAGES))


def load_audit(artifacts_root: str, run_id: str) -> pl.DataFrame:
    """A run's trace-audit findings (empty when the score step wrote none)."""
    uri = audit_uri(artifacts_root, run_id)
    if not storage.exists(uri):
        return pl.from_arrow(artifacts.AUDIT.empty_table())
    return pl.from_arrow(storage.read_parquet(uri, artifacts.AUDIT))


def load_tool_calls(artifacts_root: str, run_id: str) -> pl.DataFrame | None:
    """A run's tool calls (schema-checked), or None when the run has no ``tool_calls.parquet``."""
    lf = scan_tool_calls(artifacts_root, run_id)
    return None if lf is None else lf.collect(engine="streaming")


def scan_tool_calls(artifacts_root: str, run_id: str) -> pl.LazyFrame | None:
    """A run's tool calls as a lazy scan of ``tool_calls.parquet`` (schema-checked; nothing is
    read until collected: the report's tables stream it), or None when the run has none."""
    uri = _trials_uri(artifacts_root, run_id, "tool_calls")
    if not storage.exists(uri):
        return None
    return storage.scan_parquet(uri, artifacts.TOOL_CALLS)


def load_llm_calls(artifacts_root: str, run_id: str) -> pl.DataFrame | None:
    """A run's per-model-call accounting (schema-checked), or None when the run has no
    ``llm_calls.parquet`` (offline agents, or runs from before per-call accounting)."""
    lf = scan_llm_calls(artifacts_root, run_id)
    return None if lf is None else lf.collect(engine="streaming")


def scan_llm_calls(artifacts_root: str, run_id: str) -> pl.LazyFrame | None:
    """A run's per-model-call accounting as a lazy scan of ``llm_calls.parquet``
    (schema-checked; the cost table streams it), or None when the run has none."""
    uri = _trials_uri(artifacts_root, run_id, "llm_calls")
    if not storage.exists(uri):
        return None
    return storage.scan_parquet(uri, artifacts.LLM_CALLS)


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


def hint_conditions_of(trials: pl.DataFrame) -> dict[str, str]:
    """Agent (as named in the trial rows) → its hint condition: ``on``, ``off`` or ``n/a``
    (agents that read no prompt: oracle, replay; also trials written before the condition was
    recorded)."""
    if "hints" not in trials.columns:
        return {a: "n/a" for a in sorted(trials["agent"].unique().to_list())}
    pairs = trials.select("agent", pl.col("hints").fill_null("n/a")).unique().sort("agent")
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
    trials = load_scored_trials(artifacts_root, run_id)
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
    labels = classify_failures(trials, tool_calls, requirements)
    fm = failure_mode_table(trials, labels)
    tool_use = tool_use_table(trials, tool_calls)
    uris = {
        "pass_at_k": _write(artifacts_root, run_id, "pass_at_k", per_query, rs.PASS_AT_K),
        "summary": _write(
            artifacts_root, run_id, "pass_at_k_summary", summary, rs.PASS_AT_K_SUMMARY
        ),
        "pass_at_1_ci": _write(artifacts_root, run_id, "pass_at_1_ci", ci, rs.PASS_AT_1_CI),
        "cost": _write(artifacts_root, run_id, "cost", cost, rs.COST),
        "failure_labels": _write(
            artifacts_root, run_id, "failure_labels", labels, rs.FAILURE_LABELS
        ),
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
    verdicts = summarise(trials.select("verdict", "terminate_reason"))
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
            "incorrect": labels.height,
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


def _read(uri: str, schema) -> pl.DataFrame:
    return pl.from_arrow(storage.read_parquet(uri, schema))


def _capped(df: pl.DataFrame, what: str) -> tuple[pl.DataFrame, str]:
    if df.height <= MAX_REPORT_ROWS:
        return df, ""
    return df.head(MAX_REPORT_ROWS), (
        f"First {MAX_REPORT_ROWS} of {df.height:,} rows; every row is in `{what}`."
    )


#: Longest question / answer / ground truth shown in a report example (characters).
EXAMPLE_CHARS = 240
#: The viewer's file name beside report.html (report examples link to ``viewer.html#trial=``).
VIEWER_FILE = "viewer.html"


def _clip(value, limit: int = EXAMPLE_CHARS) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _truth_text(truth) -> str | None:
    if truth is None:
        return None
    if isinstance(truth, list):
        return "; ".join(str(t) for t in truth)
    if isinstance(truth, float) and truth.is_integer():
        return str(int(truth))
    return str(truth)


def _query_texts(manifests: list[dict]) -> pl.DataFrame:
    """(dataset, query_id, question, ground_truth) of every query of the (full) manifests."""
    rows = [
        {"dataset": m["name"], "query_id": q["id"], "question": _clip(q.get("question")),
         "ground_truth": _clip(_truth_text(q.get("ground_truth")))}
        for m in manifests for q in m.get("queries", [])
    ]
    schema = {"dataset": pl.String, "query_id": pl.String, "question": pl.String,
              "ground_truth": pl.String}
    return pl.DataFrame(rows, schema=schema).unique(["dataset", "query_id"], keep="first")


def _modes_display(fm: pl.DataFrame) -> pl.DataFrame:
    """The failure-mode table with each mode as ``count (share %)`` (one column per mode, so
    it fits the page)."""
    cols = []
    for m in rs.FAILURE_MODES:
        share = pl.col(f"{m}_share")
        cols.append(
            pl.when(share.is_null()).then(pl.col(m).cast(pl.String))
            .otherwise(pl.format("{} ({}%)", pl.col(m), (share * 100).round(0).cast(pl.Int64)))
            .alias(m)
        )
    return fm.select("agent", "dataset", "trials", "errored", "incorrect", *cols)


#: The cost table split for reading (every column is in ``cost.parquet``).
COST_VIEWS = {
    "Cost (USD)": ["trials", "errored", "correct", "cost_usd", "cost_per_trial_usd",
                   "cost_per_correct_usd", "unpriced_calls"],
    "Tokens and model calls": ["prompt_tokens", "completion_tokens", "cached_tokens",
                               "tokens_per_trial", "tokens_per_correct", "prompt_cache_share",
                               "llm_calls", "response_cache_hit_share", "retries"],
    "Latency (s) and iterations per trial": [
        "latency_mean_s", "latency_p50_s", "latency_p95_s", "iterations_mean",
        "iterations_p50", "iterations_p95"],
}
#: The tool-use table split for reading (every column is in ``tool_use.parquet``).
TOOL_USE_VIEWS = {
    "Tool calls": ["trials", "errored", "tool_calls", "calls_per_trial", "failed_call_share",
                   "exploration_share", "db_calls", "python_calls", "db_python_ratio"],
    "Turns and extraction methods": ["turns", "parallel_turn_share", "max_calls_per_turn",
                                     "extract_sql_pattern", "extract_python_regex",
                                     "extract_python_string", "extract_model_call"],
}


def build_document(
    run_id: str, artifacts_root: str, tables: dict
) -> tuple[str, str, list[Section]]:
    """Title, intro and sections of the report from :func:`compute_report_tables` output (reads
    the small report tables back; failure labels, scores and audit findings for the examples,
    the errored trials and the flagged trials). An empty section is one sentence."""
    u = tables["uris"]
    per_query = _read(u["pass_at_k"], rs.PASS_AT_K)
    summary = _read(u["summary"], rs.PASS_AT_K_SUMMARY)
    ci = _read(u["pass_at_1_ci"], rs.PASS_AT_1_CI)
    cost = _read(u["cost"], rs.COST)
    fm = _read(u["failure_modes"], rs.FAILURE_MODE_TABLE)
    tool_use = _read(u["tool_use"], rs.TOOL_USE)
    labels = _read(u["failure_labels"], rs.FAILURE_LABELS)
    trials = load_scored_trials(artifacts_root, run_id)
    audit = load_audit(artifacts_root, run_id)
    manifests = run_full_manifests(artifacts_root, run_id, tables.get("manifests", []))
    texts = _query_texts(manifests)
    c = tables["counts"]
    conf = round(tables.get("confidence", 0.95) * 100)
    link = f"{VIEWER_FILE}#trial="

    title = f"querylab run `{run_id}`"
    errored = c.get("errored", 0)
    intro = (
        f"{c['trials']:,} trials ({c.get('scored', c['trials']):,} scored, {errored:,} "
        f"errored), {c['agents']} agent(s), {c['datasets']} dataset(s), {c['queries']} "
        f"queries, {c['tool_calls']:,} tool calls; {c['incorrect']:,} incorrect trials; "
        f"{c.get('flagged', 0):,} flagged by the trace audit. Every trial's transcript is in "
        f"the viewer (`{VIEWER_FILE}`). Report generated {datetime.now(UTC):%Y-%m-%d %H:%M} "
        f"UTC from the run's artifacts alone (`{run_prefix(artifacts_root, run_id)}`)."
    )
    if errored:
        by_reason = tables.get("errored", {}).get("by_reason", {})
        intro += (
            f"\n\n**{errored} trial(s) errored** (infrastructure or harness failures: "
            + ", ".join(f"`{r}` {n}" for r, n in by_reason.items())
            + "). They have no verdict and are left out of every score below (`n_errored` "
            f"beside `n`); retry them with `querylab rerun --run-id {run_id} --retry-errors`."
        )
    hints = tables.get("hints") or {}
    if any(h != "n/a" for h in hints.values()):
        shown = "; ".join(f"`{a}`: {h}" for a, h in hints.items())
        intro += (
            f"\n\nHint condition per agent (off = question and database description only, "
            f"DAB's default; on = the dataset's hints too, DAB's `--use_hints`; n/a = the "
            f"agent reads no prompt): {shown}."
        )
    if tables["notes"]:
        intro += "\n\n" + "\n".join(f"- {n}" for n in tables["notes"])

    k_note = (
        "`n` = scored trials, `n_errored` = errored trials left out of `n`. `ALL (queries)` = "
        "mean over all queries; `ALL (datasets)` = mean of the dataset scores (stratified). "
        "Dataset score = mean over its queries; a query with fewer than k scored trials is "
        "left out at that k (`queries` in `pass_at_k_summary.parquet` counts those scored)."
    )
    sections = [
        Section(
            "pass@k",
            "pass@k is the unbiased estimator 1 - C(n-c, k) / C(n, k) per query (Chen et al. "
            "2021): the probability that at least one of k trials is correct. pass^k = "
            "C(c, k) / C(n, k): the probability that all k are correct. k runs over "
            "{1, 2, 3, 5, 10, 20, 50} up to the most scored trials of a query. " + k_note,
            [
                Table("pass@k", pass_at_k_wide(summary)),
                Table("Queries behind each pass@k", pass_at_k_queries(summary),
                      "A query needs at least k scored trials for pass@k; one with fewer (some "
                      "errored) is left out of that k's mean, and one whose every trial "
                      "errored (`all errored`) is in no mean. `pass@k over`: the queries each "
                      "mean is over."),
                Table("pass^k (all k trials correct)", pass_at_k_wide(summary, "pass_hat_k")),
                Figure(
                    "pass@k curves",
                    "pass_at_k",
                    b"",
                    "Solid: pass@k; dashed: pass^k; mean over all queries.",
                ),
            ],
        ),
        Section(
            "pass@1 with confidence intervals",
            f"{conf}% Wilson score interval for p̂ = the reported pass@1 over the n scored "
            "trials behind it (trials treated as independent; equal to the pooled-count "
            "interval when every query has the same number of trials); `errored` trials are "
            "not in `trials`.",
            [
                Table(f"pass@1 and {conf}% Wilson interval", ci.drop("confidence")),
                Figure("pass@1 by agent and dataset", "pass_at_1_heatmap", b""),
            ],
        ),
        Section(
            "Cost",
            "Every trial counts here, errored ones too (they cost money and time). USD and "
            "tokens as recorded per trial (token usage × the configured price); per correct "
            "answer divides by correct trials (empty when none); a row with unpriced model "
            "calls has an unknown (empty) cost. Latency in seconds and iterations (model calls) "
            "per trial: mean, median (p50) and 95th percentile. `prompt_cache_share` = cached / "
            "prompt tokens (provider prompt cache); `response_cache_hit_share` = model calls "
            "answered from querylab's response cache (from `llm_calls.parquet`). A trial "
            "re-run (`--retry-errors`, a resumed run) keeps the cost of the calls its earlier "
            "attempts paid for." + _paid_text(tables.get("paid")),
            [
                *[
                    Table(name, cost.select("agent", "dataset", *cols),
                          float_precision=6 if name.startswith("Cost") else 4)
                    for name, cols in COST_VIEWS.items()
                ],
                Figure(
                    "Cost vs pass@1",
                    "cost_vs_pass_at_1",
                    b"",
                    "One point per agent; error bars: Wilson interval of pass@1.",
                ),
            ],
        ),
    ]

    unchecked = tables.get("unchecked_operations") or []
    fm_text = (
        "Every incorrect trial gets exactly one label by deterministic rules (first match "
        "wins); errored trials get none. FM5 runtime (stopped by a timeout or a "
        "call/iteration/token limit); FM1 other (answer without any data tool call, no answer, "
        "or requirements unknown); FM3 wrong data source (a table/collection in the query's "
        "`requires.sources` never referenced by a `query_db` call); FM4 wrong implementation "
        "(all sources touched and every checkable operation in `requires.operations` evident "
        "in the trajectory); FM2 wrong plan (otherwise). Checkable operations: "
        + ", ".join(f"`{o}`" for o in CHECKED_OPERATIONS)
        + ". Rules: `tasks/report/failure_modes.py`. Each example links to its transcript in the viewer."
    )
    if unchecked:
        fm_text += (
            " Operations without a trajectory signature (never counted missing): "
            + ", ".join(f"`{o}`" for o in unchecked)
            + "."
        )
    if labels.height == 0:
        sections.append(Section(
            "Failure modes",
            f"No incorrect trials among the {c.get('scored', c['trials']):,} scored: nothing "
            "to label.",
        ))
    else:
        examples = (
            labels.sort("trial_key")
            .group_by("failure_mode", maintain_order=True)
            .head(EXAMPLES_PER_MODE)
            .join(trials.select("trial_key", "answer", "reason"), on="trial_key", how="left")
            .join(texts, on=["dataset", "query_id"], how="left")
            .sort("failure_mode", "trial_key")
            .select(
                pl.col("failure_mode").alias("mode"),
                "rule",
                pl.col("trial_key").alias("trial"),
                "question",
                pl.col("answer").map_elements(_clip, return_dtype=pl.String),
                "ground_truth",
                pl.col("reason").alias("validator"),
                pl.concat_list("missing_sources", "missing_operations").alias("missing"),
            )
        )
        fm_blocks: list = [
            Table("Failure modes of incorrect trials (count and share)", _modes_display(fm)),
            Figure("Failure modes per agent", "failure_modes", b""),
            Table(f"Examples (up to {EXAMPLES_PER_MODE} per mode)", examples, wrap=True,
                  links={"trial": link}),
        ]
        judge_uri = tables["uris"].get("failure_judge")
        if judge_uri and storage.exists(judge_uri):
            from tasks.report.failure_judge import judge_agreement

            judged = _read(judge_uri, rs.FAILURE_JUDGE)
            for (model,), part in judged.group_by("model", maintain_order=True):
                fm_blocks.append(
                    Table(
                        f"LLM judge `{model}` vs deterministic labels ({part.height} trials judged)",
                        judge_agreement(labels, part),
                    )
                )
        sections.append(Section("Failure modes", fm_text, fm_blocks))

    bad = trials.filter(pl.col("verdict") == "errored")
    if bad.height == 0:
        sections.append(Section("Errored trials", "No trial errored: every trial was scored."))
    else:
        by = (
            bad.group_by("agent", "dataset", "terminate_reason")
            .agg(pl.len().alias("errored"), pl.col("error").drop_nulls().first().alias("first_error"))
            .with_columns(pl.col("first_error").map_elements(_clip, return_dtype=pl.String))
            .sort("agent", "dataset", "terminate_reason")
        )
        sections.append(Section(
            "Errored trials",
            f"{bad.height} trial(s) ended `api_error` or `error` (an infrastructure or harness "
            "failure, not the agent's answer): no verdict, left out of every score. Retry "
            f"exactly these with `querylab rerun --run-id {run_id} --retry-errors` (finished "
            "trials and cached model responses are kept).",
            [Table("Errored trials", by, wrap=True)],
        ))

    check_list = ", ".join(f"`{x}`" for x in CHECKS)
    if audit.height == 0:
        sections.append(Section(
            "Trace audit",
            f"No trial was flagged by the trace audit (checks: {check_list}; rules: "
            "`tasks/scoring/audit.py`).",
        ))
    else:
        flagged = (
            audit.group_by("trial_key")
            .agg(pl.col("check").unique().sort().alias("checks"),
                 pl.col("evidence").first().alias("evidence"))
            .join(trials.select("trial_key", "agent", "dataset", "query_id", "verdict"),
                  on="trial_key", how="left")
            .sort("trial_key")
            .select(pl.col("trial_key").alias("trial"), "verdict", "checks",
                    pl.col("evidence").map_elements(_clip, return_dtype=pl.String))
        )
        flagged, note = _capped(flagged, audit_uri(artifacts_root, run_id))
        counts = audit.group_by("check").len(name="findings").sort("check")
        sections.append(Section(
            "Trace audit",
            f"{audit['trial_key'].n_unique()} trial(s) flagged at score time (checks: "
            f"{check_list}; rules: `tasks/scoring/audit.py`). A flag keeps the verdict: it says where "
            "to look; each trial links to its transcript.",
            [Table("Findings per check", counts),
             Table("Flagged trials", flagged, note, wrap=True, links={"trial": link})],
        ))

    sections.append(
        Section(
            "Tool use",
            "Over every trial (errored ones included). `exploration_share`: exploratory calls "
            "(list_db, `SELECT * ... LIMIT`, information_schema / sqlite_master / PRAGMA, "
            "unfiltered Mongo finds) over all calls but return_answer. `db_python_ratio`: "
            "(list_db + query_db) / execute_python calls. `parallel_turn_share`: model turns "
            "with two or more tool calls over turns with any. `extract_*`: share of trials "
            "whose trajectory used that way of reading values out of text (pattern match in "
            "the query, regex or string search in Python, a model call). Rules: "
            "`tasks/report/tool_use.py`.",
            [
                Table(name, _with_errored(tool_use, fm).select("agent", "dataset", *cols))
                for name, cols in TOOL_USE_VIEWS.items()
            ],
        )
    )
    pq1 = per_query.filter(pl.col("k") == 1).select(
        "agent", "dataset", "query_id", "n", "n_errored", "c", pl.col("pass_at_k").alias("pass@1")
    )
    pq1, note = _capped(pq1, u["pass_at_k"])
    sections.append(Section("Per query", "", [Table("pass@1 per query", pq1, note)]))
    terminate = (
        trials.group_by("agent", "terminate_reason", "verdict")
        .agg(pl.len().alias("trials"))
        .sort("agent", "terminate_reason", "verdict")
    )
    sections.append(Section("Terminate reasons", "", [Table("Terminate reasons", terminate)]))

    from tasks.report.agents import agents_section

    agents = agents_section(artifacts_root, run_id)  # what the agents were
    if agents is not None:
        sections.insert(1, agents)  # after pass@k (render_report reads sections[0])

    from tasks.report import plots

    pngs = {
        "pass_at_k": plots.pass_at_k_curves(summary),
        "pass_at_1_heatmap": plots.pass_at_1_heatmap(ci),
        "cost_vs_pass_at_1": plots.cost_vs_pass_at_1(cost, ci),
        "failure_modes": plots.failure_mode_bars(fm) if labels.height else b"",
    }
    for sec in sections:
        for block in sec.blocks:
            if isinstance(block, Figure):
                block.png = pngs[block.name]
    return title, intro, sections


def _paid_text(paid: dict | None) -> str:
    """The Cost section's sentence on what the run paid in all: the trials plus the
    preflight checks (real requests made before any trial, in no per-trial figure)."""
    if not paid:
        return ""
    return (f" Paid in all: ${paid['total_cost_usd']:.6f} (trials ${paid['trials_cost_usd']:.6f}"
            f"; {paid['preflight_requests']} preflight request(s) "
            f"${paid['preflight_cost_usd']:.6f}, not in the per-trial figures).")


def _with_errored(tool_use: pl.DataFrame, fm: pl.DataFrame) -> pl.DataFrame:
    """``tool_use`` with the errored-trial count of each (agent, dataset) row beside it."""
    return tool_use.join(fm.select("agent", "dataset", "errored"), on=["agent", "dataset"],
                         how="left").with_columns(pl.col("errored").fill_null(0))


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
