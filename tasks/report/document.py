"""The report document: title, intro and sections (tables, figures, examples) built from the
report tables of :func:`tasks.report.stage.compute_report_tables`, for Markdown, HTML and the
Prefect artifacts (:mod:`tasks.report.html` renders them)."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl

from schemas import report as rs
from tasks.core import storage
from tasks.report.failure_modes import CHECKED_OPERATIONS
from tasks.report.html import Figure, Section, Table
from tasks.report.loaders import load_audit, load_scored_trials, run_prefix
from tasks.report.metrics import pass_at_k_queries, pass_at_k_wide
from tasks.scoring.audit import CHECKS
from tasks.scoring.stage import audit_uri, run_full_manifests

#: Longest table (rows) put into report.md / report.html; the Parquet always has every row.
MAX_REPORT_ROWS = 200
#: Example trials shown per failure mode.
EXAMPLES_PER_MODE = 5

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
            "`tasks/report/features.py`.",
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
