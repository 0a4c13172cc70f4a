"""Where a run's artifacts live and how the report reads them: URIs under
``<root>/runs/<run_id>/`` and loaders / lazy scans of the trials stage's Parquet artifacts
(schema-checked; the largest, ``tool_calls`` and ``llm_calls``, are scanned, never loaded
whole by the report's tables)."""

from __future__ import annotations

import polars as pl

from schemas import artifacts
from tasks.core import storage
from tasks.core.layout import RunLayout
from tasks.report.failure_modes import answer_flags
from tasks.scoring.stage import audit_uri, scan_scores, scored_trials


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


#: The trial columns the report's tables read (:func:`tasks.report.stage.compute_report_tables`):
#: a large run's other columns (model, dataset_version, ...) are never loaded for them.
REPORT_TRIAL_COLUMNS = (
    "run_id", "trial_key", "agent", "hints", "dataset", "query_id", "trial", "answer",
    "terminate_reason", "error", "n_llm_calls", "prompt_tokens", "completion_tokens",
    "cached_tokens", "cost_usd", "latency_s",
)
#: Low-cardinality String columns the report holds as ``pl.Categorical`` (4 bytes a row;
#: every table gives them back as String).
REPORT_CATEGORICAL = ("run_id", "agent", "hints", "dataset", "query_id", "terminate_reason",
                      "verdict")


def load_report_trials(artifacts_root: str, run_id: str) -> pl.DataFrame:
    """A run's trials as the report's tables read them: the :data:`REPORT_TRIAL_COLUMNS` of
    ``trials.parquet`` — ``answer`` and ``error`` replaced by the booleans ``no_answer``
    (null or blank) and ``has_error`` (not null), all that the failure-mode rules read of
    them (:func:`tasks.report.failure_modes.answer_flags`) — with ``verdict`` and
    ``is_correct`` of the scores joined on (in trials order) and the
    :data:`REPORT_CATEGORICAL` columns as ``pl.Categorical``, read by streaming scans and a join
    (by position when the files are aligned) of the two files (the staleness check of
    :func:`tasks.scoring.stage.scored_trials` included): at 10M trials about 1 GB instead of
    the 1.5 GB of every column (and 3 GB instead of 5 GB of peak memory while joining).
    ScoringError when the run is not scored or its scores are stale; StorageError when it has
    no ``trials.parquet``."""
    trials = storage.scan_parquet(
        _trials_uri(artifacts_root, run_id, "trials"), artifacts.TRIALS
    ).select(REPORT_TRIAL_COLUMNS)
    # the answers and errors only as the failure-mode rules read them (two booleans instead
    # of two strings: about 0.3 GB less at 10M trials); checked against the scores first
    trials = trials.with_columns(answer_flags())
    return scored_trials(trials, scan_scores(artifacts_root, run_id), run_id,
                         verdicts=("verdict", "is_correct"), categorical=REPORT_CATEGORICAL,
                         drop=("answer", "error"))


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
