"""pyarrow schemas of the report stage's Parquet artifacts (``runs/<run_id>/report/*.parquet``).

Same pattern as :mod:`schemas.artifacts`: every schema carries ``schema_version`` and the
artifact name in its metadata, and readers check it with
:func:`schemas.artifacts.check_schema`. Units: USD for cost, seconds for latency, shares in
[0, 1]. Rows with ``dataset == "ALL (queries)"`` aggregate over every query of an agent,
``"ALL (datasets)"`` is the stratified mean over datasets (pass@k tables only), ``"ALL"`` is an
agent's total (cost, failure-mode and tool-use tables). Errored trials (ended ``api_error`` /
``error``: no verdict) are left out of every pass@k, pass^k, interval and failure-mode
denominator and counted beside it (``n_errored`` / ``errored``).
"""

from __future__ import annotations

import pyarrow as pa

from schemas.artifacts import artifact_schema

REPORT_SCHEMA_VERSION = "1"

ALL_QUERIES = "ALL (queries)"
ALL_DATASETS = "ALL (datasets)"
ALL = "ALL"

FAILURE_MODES = ("FM1", "FM2", "FM3", "FM4", "FM5")


def _schema(name: str, fields: list[pa.Field], version: str = REPORT_SCHEMA_VERSION) -> pa.Schema:
    return artifact_schema(name, fields, version)


def _f(name: str, typ: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, typ, nullable=nullable)


_KEYS = [_f("agent", pa.string(), False), _f("dataset", pa.string(), False)]

#: pass@k and pass^k per (agent, dataset, query_id, k): ``n`` scored trials, ``n_errored``
#: errored trials (not in n), ``c`` correct; both null when n < k. pass@k = 1 - C(n-c, k)/C(n, k)
#: (Chen et al. 2021); pass^k = C(c, k)/C(n, k).
PASS_AT_K = _schema(
    "pass_at_k",
    [
        *_KEYS,
        _f("query_id", pa.string(), False),
        _f("k", pa.int32(), False),
        _f("n", pa.int32(), False),
        _f("n_errored", pa.int32(), False),
        _f("c", pa.int32(), False),
        _f("pass_at_k", pa.float64()),
        _f("pass_hat_k", pa.float64()),
    ],
    version="3",  # 3: n counts scored trials only, n_errored beside it
)

#: Mean pass@k / pass^k per (agent, dataset, k) over the ``queries`` scored at that k, plus the
#: two overall rows per agent and k; ``n`` scored and ``n_errored`` errored trials behind it.
#: The queries left out of a k's mean are counted: ``queries_short`` (fewer than k scored
#: trials), ``queries_errored`` (every trial errored). Version 3 added both.
PASS_AT_K_SUMMARY = _schema(
    "pass_at_k_summary",
    [
        *_KEYS,
        _f("k", pa.int32(), False),
        _f("queries", pa.int32(), False),
        _f("queries_short", pa.int32(), False),
        _f("queries_errored", pa.int32(), False),
        _f("n", pa.int64(), False),
        _f("n_errored", pa.int64(), False),
        _f("pass_at_k", pa.float64()),
        _f("pass_hat_k", pa.float64()),
    ],
    version="3",
)

#: pass@1 per (agent, dataset) with a Wilson score interval (``confidence``, default 0.95):
#: ``trials`` (scored) behind the estimate, ``errored`` beside them, ``correct`` among them,
#: ``queries`` scored.
PASS_AT_1_CI = _schema(
    "pass_at_1_ci",
    [
        *_KEYS,
        _f("queries", pa.int32(), False),
        _f("trials", pa.int64(), False),
        _f("errored", pa.int64(), False),
        _f("correct", pa.int64(), False),
        _f("pass_at_1", pa.float64()),
        _f("ci_low", pa.float64()),
        _f("ci_high", pa.float64()),
        _f("confidence", pa.float64(), False),
    ],
    version="2",
)

#: Cost and effort per (agent, dataset) and per agent (``dataset == "ALL"``) over every trial,
#: errored ones included (``errored`` of the ``trials``; they cost money and time).
#: ``cost_per_correct_usd`` is null without a correct trial; ``prompt_cache_share`` is
#: cached_tokens / prompt_tokens (null without prompt tokens); ``llm_calls``,
#: ``response_cache_hit_share`` and ``retries`` come from ``llm_calls.parquet`` and are null when
#: the run has none; ``unpriced_calls`` counts model calls of models without a price — a row
#: with any has null (unknown) ``cost_usd`` and per-trial/per-correct costs. Latency in
#: seconds; iterations = model calls per trial.
COST = _schema(
    "cost",
    [
        *_KEYS,
        _f("trials", pa.int64(), False),
        _f("errored", pa.int64(), False),
        _f("correct", pa.int64(), False),
        _f("cost_usd", pa.float64()),
        _f("cost_per_trial_usd", pa.float64()),
        _f("cost_per_correct_usd", pa.float64()),
        _f("prompt_tokens", pa.int64(), False),
        _f("completion_tokens", pa.int64(), False),
        _f("cached_tokens", pa.int64(), False),
        _f("tokens_per_trial", pa.float64()),
        _f("tokens_per_correct", pa.float64()),
        _f("prompt_cache_share", pa.float64()),
        _f("llm_calls", pa.int64()),
        _f("response_cache_hit_share", pa.float64()),
        _f("retries", pa.int64()),
        _f("unpriced_calls", pa.int64()),
        _f("latency_mean_s", pa.float64()),
        _f("latency_p50_s", pa.float64()),
        _f("latency_p95_s", pa.float64()),
        _f("iterations_mean", pa.float64()),
        _f("iterations_p50", pa.float64()),
        _f("iterations_p95", pa.float64()),
    ],
    version="3",  # 2: cost_usd is null (unknown) when calls were unpriced; 3: errored
)

#: One row per incorrect trial: the deterministic failure mode (FM1–FM5), the ``rule`` that
#: fired (see :mod:`tasks.report.failure_modes`), the required sources never touched and the required
#: operations without evidence in the trajectory.
FAILURE_LABELS = _schema(
    "failure_labels",
    [
        _f("run_id", pa.string(), False),
        _f("trial_key", pa.string(), False),
        *_KEYS,
        _f("query_id", pa.string(), False),
        _f("trial", pa.int32(), False),
        _f("terminate_reason", pa.string(), False),
        _f("failure_mode", pa.string(), False),
        _f("rule", pa.string(), False),
        _f("missing_sources", pa.list_(pa.string())),
        _f("missing_operations", pa.list_(pa.string())),
    ],
)

#: Failure-mode counts per (agent, dataset) and per agent (``"ALL"``): ``trials`` (scored),
#: ``errored`` (beside them, never labelled), ``incorrect``, one count column per mode and its
#: share of the incorrect trials.
FAILURE_MODE_TABLE = _schema(
    "failure_modes",
    [
        *_KEYS,
        _f("trials", pa.int64(), False),
        _f("errored", pa.int64(), False),
        _f("incorrect", pa.int64(), False),
        *[_f(m, pa.int64(), False) for m in FAILURE_MODES],
        *[_f(f"{m}_share", pa.float64()) for m in FAILURE_MODES],
    ],
    version="2",
)

#: Labels of the optional LLM-judge stage, one row per judged incorrect trial: the judge's
#: ``failure_mode`` (null when the reply could not be parsed or the call failed, see ``error``),
#: its ``rationale``, the judge ``model`` and the tokens the call used.
FAILURE_JUDGE = _schema(
    "failure_judge",
    [
        _f("run_id", pa.string(), False),
        _f("trial_key", pa.string(), False),
        _f("model", pa.string(), False),
        _f("failure_mode", pa.string()),
        _f("rationale", pa.string()),
        _f("error", pa.string()),
        _f("prompt_tokens", pa.int64(), False),
        _f("completion_tokens", pa.int64(), False),
    ],
)

#: Tool use per (agent, dataset) and per agent (``"ALL"``). Shares in [0, 1]; see
#: :mod:`tasks.report.features` for the detection rules. ``db_python_ratio`` is null without Python
#: calls; ``extract_*`` are shares of trials whose trajectory used that extraction method.
TOOL_USE = _schema(
    "tool_use",
    [
        *_KEYS,
        _f("trials", pa.int64(), False),
        _f("tool_calls", pa.int64(), False),
        _f("calls_per_trial", pa.float64()),
        _f("failed_call_share", pa.float64()),
        _f("exploration_share", pa.float64()),
        _f("db_calls", pa.int64(), False),
        _f("python_calls", pa.int64(), False),
        _f("db_python_ratio", pa.float64()),
        _f("turns", pa.int64(), False),
        _f("parallel_turn_share", pa.float64()),
        _f("max_calls_per_turn", pa.int32()),
        _f("extract_sql_pattern", pa.float64()),
        _f("extract_python_regex", pa.float64()),
        _f("extract_python_string", pa.float64()),
        _f("extract_model_call", pa.float64()),
    ],
)

ALL_SCHEMAS = {
    s.metadata[b"artifact"].decode(): s
    for s in (
        PASS_AT_K,
        PASS_AT_K_SUMMARY,
        PASS_AT_1_CI,
        COST,
        FAILURE_LABELS,
        FAILURE_MODE_TABLE,
        FAILURE_JUDGE,
        TOOL_USE,
    )
}
