"""pyarrow schemas of every Parquet artifact querylab writes.

Each schema carries ``schema_version`` (and the artifact name) in its metadata; readers check it
with :func:`check_schema`. Bump the version when a column changes meaning or type.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = "1"


class ArtifactSchemaError(ValueError):
    """An artifact's schema does not match the one querylab expects."""


def artifact_schema(name: str, fields: list[pa.Field], version: str = SCHEMA_VERSION) -> pa.Schema:
    """A pyarrow schema for the Parquet artifact ``name`` with ``schema_version`` = ``version``
    and ``artifact`` = ``name`` in its metadata (checked on read by :func:`check_schema`). Every
    module of ``schemas/`` declares its artifacts with it."""
    return pa.schema(fields, metadata={"schema_version": version, "artifact": name})



def added_later(field: pa.Field) -> pa.Field:
    """Mark a nullable column as added after its artifact's schema version: readers fill it
    with nulls in artifacts written before it (see :func:`check_schema`)."""
    return field.with_metadata({"added_later": "1"})


#: One row per trial (agent × hint condition × dataset × query × trial index). ``agent`` is the
#: agent's label: its name, with ``+hints`` appended for trials run with hints on; ``hints`` is
#: the condition (``on`` / ``off``; null for agents that read no prompt: oracle, replay).
#: ``trial_key`` is ``"<agent>|<dataset>|<query_id>|<trial>"``; ``dataset_version`` the version
#: of the dataset the trial ran on; ``latency_s`` the trial's wall time in seconds, waits for a
#: model-call slot left out (``llm_calls.queue_s``: querylab's queue); tokens as reported by the API (0 for
#: offline agents); ``cached_tokens`` is the part of the prompt tokens the provider served from
#: its prompt cache; ``cost_usd`` the sum of the trial's ``llm_calls`` costs (0 for offline
#: agents and response-cache hits), earlier attempts' paid calls included (tokens likewise;
#: ``n_llm_calls`` and ``latency_s`` are the last attempt's). A trial row carries the answer and the terminate reason but
#: **no verdict**: verdicts are written by the score step (:data:`SCORES`). Version 2:
#: ``is_correct`` moved to ``scores``, ``dataset_version`` added.
TRIALS = artifact_schema(
    "trials",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("trial_key", pa.string(), nullable=False),
        pa.field("agent", pa.string(), nullable=False),
        added_later(pa.field("hints", pa.string())),
        pa.field("model", pa.string()),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("trial", pa.int32(), nullable=False),
        pa.field("answer", pa.string()),
        pa.field("terminate_reason", pa.string(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("n_llm_calls", pa.int32(), nullable=False),
        pa.field("n_tool_calls", pa.int32(), nullable=False),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("completion_tokens", pa.int64(), nullable=False),
        pa.field("cached_tokens", pa.int64(), nullable=False),
        pa.field("cost_usd", pa.float64(), nullable=False),
        pa.field("latency_s", pa.float64(), nullable=False),
        pa.field("dataset_version", pa.string()),
    ],
    version="2",
)

#: One row per model call of a trial, in call order: tokens as reported by the API, cost in USD
#: (tokens × the configured price per million; 0 on a response-cache hit), latency in seconds,
#: ``attempts`` HTTP attempts including infrastructure retries, ``n_tool_calls`` tool calls the
#: response asked for; ``priced`` false when the model has no price in the models table (its
#: ``cost_usd`` is then 0, not measured). ``base_url`` never carries credentials.
#: ``trial_attempt``: which attempt of the trial made the call (0 first; a trial re-run by
#: ``--retry-errors`` or after an interrupted run keeps the rows of the calls its earlier
#: attempts sent to the API, so the costs paid stay in the totals; null in older artifacts).
LLM_CALLS = artifact_schema(
    "llm_calls",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("trial_key", pa.string(), nullable=False),
        pa.field("call_index", pa.int32(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("base_url", pa.string()),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("cached_tokens", pa.int64(), nullable=False),
        pa.field("completion_tokens", pa.int64(), nullable=False),
        pa.field("cost_usd", pa.float64(), nullable=False),
        pa.field("latency_s", pa.float64(), nullable=False),
        pa.field("finish_reason", pa.string()),
        pa.field("n_tool_calls", pa.int32(), nullable=False),
        pa.field("attempts", pa.int32(), nullable=False),
        pa.field("cache_hit", pa.bool_(), nullable=False),
        pa.field("priced", pa.bool_()),
        pa.field("error", pa.string()),
        added_later(pa.field("trial_attempt", pa.int32())),
        added_later(pa.field("queue_s", pa.float64())),
    ],
)

#: One row per tool call made in a trial, in call order. ``turn`` is the index of the model
#: response that requested the call (several calls share a turn when issued in parallel);
#: ``arguments`` is the raw JSON text the agent sent; ``result_size`` is the length in characters
#: of the full tool result; ``duration_s`` in seconds. The columns after ``duration_s`` are typed
#: per-call features computed once when the calls are written
#: (:func:`tasks.report.features.with_call_features`: ``db`` of list_db / query_db, ``is_mongo``,
#: the detection booleans of the tool-use analysis and ``source_refs``, the tables / collections
#: a query_db call references); null in artifacts written before them (the report then computes
#: them itself).
TOOL_CALLS = artifact_schema(
    "tool_calls",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("trial_key", pa.string(), nullable=False),
        pa.field("call_index", pa.int32(), nullable=False),
        pa.field("turn", pa.int32(), nullable=False),
        pa.field("call_id", pa.string(), nullable=False),
        pa.field("tool", pa.string(), nullable=False),
        pa.field("arguments", pa.string(), nullable=False),
        pa.field("success", pa.bool_(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("result_size", pa.int64(), nullable=False),
        pa.field("duration_s", pa.float64(), nullable=False),
        added_later(pa.field("db", pa.string())),
        *[added_later(pa.field(f, pa.bool_())) for f in (
            "is_mongo", "explore", "sql_pattern", "python_regex", "python_string", "model_call",
            "key_reformat", "adj_close")],
        added_later(pa.field("source_refs", pa.list_(pa.string()))),
    ],
)

#: The transcript: one row per message of every trial, in order (``index`` 0, 1, ...).
#: ``role`` is ``system``, ``user``, ``assistant`` or ``tool``; ``turn`` the model call the
#: message belongs to (system and user: 0, the input of the first call; an assistant message:
#: the call that produced it; a tool result: the call that asked for it — as
#: ``tool_calls.turn``). ``content`` is the exact text sent to or returned by the model (for a
#: tool result: what the model saw, cut to the tool-message limit); ``reasoning`` the reasoning
#: text when the API returned one (``reasoning_content`` / ``reasoning``); ``tool_calls`` JSON
#: ``[{"id", "name", "arguments"}]`` of an assistant message; ``tool_call_id`` / ``tool_name`` of a
#: tool result; ``content_chars`` the length of ``content``; ``full_size`` the length in
#: characters of the full tool result (``tool_calls.result_size``; null for other roles);
#: ``runtime_events`` JSON of what an ``execute_python`` cell's run-time audit hook reported
#: (file accesses outside its work directory, network and process events; null when none).
#: Oracle trials record the question, each reference step as an assistant tool call and its
#: result; replay trials the question and the recorded answer.
MESSAGES = artifact_schema(
    "messages",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("trial_key", pa.string(), nullable=False),
        pa.field("index", pa.int32(), nullable=False),
        pa.field("turn", pa.int32(), nullable=False),
        pa.field("role", pa.string(), nullable=False),
        pa.field("content", pa.string()),
        pa.field("reasoning", pa.string()),
        pa.field("tool_calls", pa.string()),
        pa.field("tool_call_id", pa.string()),
        pa.field("tool_name", pa.string()),
        pa.field("content_chars", pa.int64(), nullable=False),
        pa.field("full_size", pa.int64()),
        added_later(pa.field("runtime_events", pa.string())),
    ],
)

#: One row per trial of a run, written by the score step (``runs/<run_id>/score/``):
#: ``verdict`` is ``correct``, ``incorrect`` or ``errored`` (the trial ended ``api_error`` or
#: ``error``: no verdict, ``is_correct`` null, left out of pass@k denominators); ``reason`` the
#: validator's one-line reason (or why the trial errored); ``validator`` the validator kind and
#: ``validator_digest`` 12 hex digits of its spec, ground truth and script; ``answer`` and
#: ``terminate_reason`` as scored (a later re-run of the trial makes the score stale);
#: ``scorer_version`` :data:`tasks.scoring.stage.SCORER_VERSION`; ``audit_flags`` the number of trace
#: audit findings of the trial (rows of :data:`AUDIT`).
SCORES = artifact_schema(
    "scores",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("trial_key", pa.string(), nullable=False),
        pa.field("agent", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("trial", pa.int32(), nullable=False),
        pa.field("terminate_reason", pa.string(), nullable=False),
        pa.field("answer", pa.string()),
        pa.field("verdict", pa.string(), nullable=False),
        pa.field("is_correct", pa.bool_()),
        pa.field("reason", pa.string()),
        pa.field("validator", pa.string()),
        pa.field("validator_digest", pa.string()),
        pa.field("scorer_version", pa.string(), nullable=False),
        pa.field("audit_flags", pa.int32(), nullable=False),
    ],
)

#: Trace-audit findings (``runs/<run_id>/score/audit.parquet``), one row per finding:
#: ``check`` is one of :data:`tasks.scoring.audit.CHECKS` (``path_outside_workdir``,
#: ``network_attempt``, ``answer_key_access``, ``ground_truth_before_tool_output``,
#: ``answer_not_in_tool_output``); ``message_index`` the transcript message that shows it
#: (null when the finding is about the trial as a whole); ``evidence`` a short excerpt.
AUDIT = artifact_schema(
    "audit",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("trial_key", pa.string(), nullable=False),
        pa.field("check", pa.string(), nullable=False),
        pa.field("message_index", pa.int32()),
        pa.field("evidence", pa.string(), nullable=False),
    ],
)

#: The trial-stage and score-stage artifacts; report artifacts (pass@k, cost, failure modes,
#: ...) are in :mod:`schemas.report`.
ALL = {
    s.metadata[b"artifact"].decode(): s
    for s in (TRIALS, TOOL_CALLS, LLM_CALLS, MESSAGES, SCORES, AUDIT)
}


def check_schema(table: pa.Table, expected: pa.Schema, source: str) -> pa.Table:
    """Return ``table`` cast to ``expected``; raise ArtifactSchemaError naming ``source``.

    Raises when a column is missing or the stored ``schema_version`` differs from the expected.
    A nullable column declared with :func:`added_later` may be missing (artifacts written
    before it existed): it reads as nulls.
    """
    meta = table.schema.metadata or {}
    want = expected.metadata[b"schema_version"]
    got = meta.get(b"schema_version")
    if got is not None and got != want:
        raise ArtifactSchemaError(
            f"{source}: schema_version {got.decode()} but querylab reads {want.decode()}"
        )
    for f in expected:  # columns added later: an older artifact reads them as nulls
        if f.name not in table.column_names and (f.metadata or {}).get(b"added_later"):
            table = table.append_column(f.name, pa.nulls(table.num_rows, f.type))
    missing = [f.name for f in expected if f.name not in table.column_names]
    if missing:
        raise ArtifactSchemaError(f"{source}: missing columns {missing}")
    return table.select(expected.names).cast(expected)
