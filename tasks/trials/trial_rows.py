"""The rows of one trial and what a batch keeps while its trials run: the trial, tool-call,
model-call and message rows of a finished trial (its checkpoint, :func:`_rows`), the journal of
the model calls of an attempt in flight and the paid calls of earlier attempts, the errored
outcome of a harness failure, and the scratch directories of trials.

Moved verbatim from :mod:`tasks.trials.stage`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from schemas.settings import Settings
from tasks.agents.react import TrialOutcome
from tasks.core import storage
from tasks.core.layout import RunLayout

__all__ = ["scratch_dir", "work_root"]


def _llm_row(run_id: str, key: str, c, attempt: int) -> dict:
    """One ``llm_calls`` row of trial ``key`` for the call record ``c``
    (:class:`tasks.core.llm.LLMCallRecord`) made by attempt ``attempt`` of the trial."""
    return {
        "run_id": run_id, "trial_key": key, "call_index": c.call_index, "model": c.model,
        "base_url": c.base_url, "prompt_tokens": c.prompt_tokens,
        "cached_tokens": c.cached_tokens, "completion_tokens": c.completion_tokens,
        "cost_usd": c.cost_usd, "latency_s": c.latency_s, "finish_reason": c.finish_reason,
        "n_tool_calls": c.n_tool_calls, "attempts": c.attempts, "cache_hit": c.cache_hit,
        "error": c.error, "priced": c.priced, "trial_attempt": attempt, "queue_s": c.queue_s,
    }


def _journal_uri(artifacts_root: str, run_id: str, key: str, index: int) -> str:
    """The model calls of the attempt of batch item ``index`` running now (rewritten after
    every call; ``<key>.calls/`` beside the checkpoints, removed with them): what an
    interrupted attempt paid for, read back on resume."""
    return RunLayout(artifacts_root, run_id).batches(f"{key}.calls", f"{index:05d}.json")


def _earlier_calls(journal_uri: str, previous: list[dict]) -> tuple[list[dict], int]:
    """The ``llm_calls`` rows of a trial's earlier attempts that reached the API (cache hits
    cost nothing and are dropped), and the number of the attempt about to run.

    ``previous``: the rows of the trial's last recorded (errored) attempt, earlier attempts'
    rows included; the journal adds an attempt that was interrupted before it was recorded
    (a killed process)."""
    attempts = {r.get("trial_attempt") or 0 for r in previous}
    rows = [{**r, "trial_attempt": r.get("trial_attempt") or 0}
            for r in previous if not r["cache_hit"]]
    if storage.exists(journal_uri):
        journal = storage.read_json(journal_uri)
        if journal["attempt"] not in attempts:
            attempts.add(journal["attempt"])
            rows += [r for r in journal["calls"] if not r["cache_hit"]]
    return rows, (max(attempts) + 1 if attempts else 0)


def _with_earlier_calls(rows: dict, earlier: list[dict]) -> dict:
    """A trial's rows with the paid calls of its earlier attempts: their ``llm_calls`` rows
    first, their cost and tokens added to the trial row (what the trial cost in all)."""
    if not earlier:
        return rows
    trial = dict(rows["trial"])
    for col in ("cost_usd", "prompt_tokens", "completion_tokens", "cached_tokens"):
        trial[col] += sum(r[col] for r in earlier)
    return {**rows, "trial": trial, "llm_calls": earlier + rows["llm_calls"]}


def _rows(run_id: str, key: str, agent: str, model: str | None, manifest: dict, query: dict,
          trial: int, outcome: TrialOutcome, hints: str | None = None, attempt: int = 0) -> dict:
    """The artifact rows of one finished trial: ``{"trial": row, "tool_calls": [...],
    "llm_calls": [...], "messages": [...]}`` (the checkpoint of the trial; ``attempt``: the
    trial attempt that made the model calls). No verdict."""
    trial_row = {
        "run_id": run_id,
        "trial_key": key,
        "agent": agent,
        "hints": hints,
        "model": model,
        "dataset": manifest["name"],
        "query_id": query["id"],
        "trial": trial,
        "answer": outcome.answer,
        "terminate_reason": outcome.terminate_reason,
        "error": outcome.error,
        "n_llm_calls": outcome.n_llm_calls,
        "n_tool_calls": len(outcome.tool_calls),
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "cached_tokens": outcome.cached_tokens,
        "cost_usd": outcome.cost_usd,
        "latency_s": outcome.latency_s,
        "dataset_version": manifest["version"],
    }
    tool_rows = []
    for i, rec in enumerate(outcome.tool_calls):
        o = rec.outcome
        tool_rows.append(
            {
                "run_id": run_id,
                "trial_key": key,
                "call_index": i,
                "turn": rec.turn,
                "call_id": o.call_id,
                "tool": o.tool,
                "arguments": o.arguments,
                "success": o.success,
                "error": o.error,
                "result_size": o.result_size,
                "duration_s": o.duration_s,
            }
        )
    llm_rows = [_llm_row(run_id, key, c, attempt) for c in outcome.llm_calls]
    message_rows = [{"run_id": run_id, "trial_key": key, **m} for m in outcome.messages]
    return {"trial": trial_row, "tool_calls": tool_rows, "llm_calls": llm_rows,
            "messages": message_rows}


def work_root(settings: Settings) -> Path:
    """Where per-trial working directories go (scratch, removed after each trial):
    ``QUERYLAB_WORK_DIR`` when set; else ``/dev/shm/querylab-<uid>`` when ``/dev/shm`` is a
    writable RAM file system (no disk I/O for scratch files); else ``<QUERYLAB_HOME>/work``."""
    explicit = Settings.read("work_dir")
    if explicit is not None:
        return explicit
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm / f"querylab-{os.getuid()}"
    return Path(settings.home) / "work"


def scratch_dir(settings: Settings, artifacts_root: str, run_id: str) -> Path:
    """A run's scratch directory: ``<work root>/<run_id>-<8 hex of the artifact root>``, so two
    runs with the same id under different artifact roots (two checkouts, two test sessions on
    one machine) never share — or delete — each other's trial work directories."""
    digest = hashlib.sha256(artifacts_root.encode()).hexdigest()[:8]
    return work_root(settings) / f"{run_id}-{digest}"


def _harness_error(exc: BaseException) -> TrialOutcome:
    """An errored trial for an exception the harness did not expect (a bug or a broken
    database connection): the batch goes on, the trial can be retried."""
    text = str(exc).strip().splitlines()
    return TrialOutcome(None, "error",
                        f"harness error: {type(exc).__name__}: {text[0][:500] if text else ''}")
