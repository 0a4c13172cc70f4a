"""Run ids, timestamps and the errors of runs and stages (shared by :mod:`tasks.core.runs`,
:mod:`tasks.core.run_lease` and :mod:`tasks.core.batching`)."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime

from schemas.runs import STAGES, check_run_id

#: Longest error message kept in a stage record (characters).
MAX_ERROR_CHARS = 4000


class RunError(ValueError):
    """A run cannot be (re-)run as asked: bad run id, no run record, a stage without the
    parameters it needs. The message names the run and what to do."""


class LeaseHeld(RunError):
    """Another live process is running this run id. ``holder``: its lease record (``host``,
    ``pid``, ``since``, ``renewed_at``)."""

    def __init__(self, run_id: str, uri: str, holder: dict):
        self.run_id, self.uri, self.holder = run_id, uri, holder
        super().__init__(
            f"run {run_id!r} is already running: pid {holder.get('pid')} on host "
            f"{holder.get('host')!r} holds its lease since {holder.get('since')} (last renewed "
            f"{holder.get('renewed_at')}); wait for it to finish, or, if that process is gone "
            f"for good, delete {uri}"
        )


class StageFailed(RuntimeError):
    """Some items of a stage failed after every item was attempted.

    ``failed``: ``[(item key, error message)]``; ``total``: items in the stage. The message
    names each failed item (first line of its error) and how to re-run the stage: ``querylab
    rerun --stage <stage>`` for a stage of :data:`schemas.runs.STAGES`, else the same command
    with the same run id (a flow ``querylab rerun`` does not run, e.g. ``sql-complexity``)."""

    def __init__(self, run_id: str, stage: str, failed: list[tuple[str, str]], total: int):
        self.run_id, self.stage, self.failed, self.total = run_id, stage, failed, total
        lines = [f"{key}: {err.splitlines()[0] if err else '?'}" for key, err in failed]
        rerun = (f"Re-run with `querylab rerun --run-id {run_id} --stage {stage}`."
                 if stage in STAGES else f"Re-run the same command with run id {run_id!r}.")
        super().__init__(
            f"{stage}: {len(failed)} of {total} items failed in run {run_id!r} "
            f"(the other {total - len(failed)} finished and are kept); failed: "
            + "; ".join(lines)
            + f". {rerun}"
        )


def now_iso() -> str:
    """The current UTC time as ISO 8601 with seconds (``2025-01-31T12:00:00Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_id() -> str:
    """``YYYYmmdd-HHMMSS-xxxx`` (UTC time + 4 random hex digits), as ``querylab run`` makes."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def valid_run_id(run_id: str) -> str:
    """:func:`schemas.runs.check_run_id` raising :class:`RunError`."""
    try:
        return check_run_id(run_id)
    except ValueError as exc:
        raise RunError(str(exc)) from None
