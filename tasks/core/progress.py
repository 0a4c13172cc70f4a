"""Progress of long stages, shown three ways at once:

- a **Prefect progress artifact** (``create_progress_artifact`` / ``update_progress_artifact``,
  key ``<run-id>-<stage>-progress``) when the stage runs inside a flow run, visible in the
  Prefect UI and API while the run goes on;
- a **progress bar** (rich) on the terminal while :func:`console_progress` is active — the CLI
  turns it on for ``querylab run`` and ``querylab rerun``;
- **log lines** at every quarter, and without a bar (output not a terminal: a log file, CI)
  also whenever the count moved, at most one every :data:`LINE_MIN_INTERVAL_S` seconds (so a
  run of slow trials shows each finished trial).

A stage makes a :class:`StageProgress` with its total and either advances it or lets it
:meth:`~StageProgress.poll` a counting function (the trials stage counts checkpointed trials
with :func:`count_finished_trials`, so the bar moves per trial even inside a batch). Progress
reporting never fails a stage: an unreachable Prefect API is logged once and ignored.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any, Self

from tasks.core import storage
from tasks.core.layout import RunLayout

log = logging.getLogger("querylab.progress")

#: Seconds between two Prefect artifact updates of one stage (the last one is always sent).
ARTIFACT_MIN_INTERVAL_S = 1.0
#: Seconds between two progress log lines when there is no bar (quarters are always logged).
LINE_MIN_INTERVAL_S = 10.0
#: Seconds between two polls of :meth:`StageProgress.poll`.
POLL_INTERVAL_S = 2.0

_BAR: Any = None  # the active rich Progress, or None
_BAR_LOCK = threading.Lock()


@contextmanager
def console_progress(enabled: bool | None = None, stream: IO[str] | None = None) -> Iterator[None]:
    """While the block runs, every :class:`StageProgress` in this process also shows a rich
    progress bar on ``stream`` (default: stderr).

    ``enabled``: True / False, or None for "only when ``stream`` is a terminal". Nested uses
    keep the outer bar."""
    global _BAR
    stream = stream if stream is not None else sys.stderr
    if enabled is None:
        enabled = bool(getattr(stream, "isatty", lambda: False)())
    if not enabled or _BAR is not None:
        yield
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(file=stream)
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        redirect_stdout=console.is_terminal,
        redirect_stderr=console.is_terminal,
    )
    with bar:
        with _BAR_LOCK:
            _BAR = bar
        try:
            yield
        finally:
            with _BAR_LOCK:
                _BAR = None


def artifact_key(run_id: str, stage: str) -> str:
    """``<run-id>-<stage>-progress`` as Prefect wants artifact keys: lower-case letters,
    digits and dashes."""
    raw = f"{run_id}-{stage}-progress".lower()
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", raw)).strip("-")


def _in_flow_run() -> bool:
    try:
        from prefect.context import FlowRunContext, TaskRunContext

        return FlowRunContext.get() is not None or TaskRunContext.get() is not None
    except Exception:  # noqa: BLE001
        return False


class StageProgress:
    """Progress of one stage of one run: ``total`` items of ``unit`` (e.g. 120 trials).

    Use as a context manager (or :meth:`start` / :meth:`close`); :meth:`update` sets the
    number done, :meth:`advance` adds to it, :meth:`poll` updates it from a function every
    ``interval`` seconds in a background thread until closed. ``artifact``: create a Prefect
    progress artifact when inside a flow or task run (default True). Thread-safe."""

    def __init__(
        self, stage: str, run_id: str, total: int, unit: str = "items", artifact: bool = True
    ):
        self.stage, self.run_id, self.unit = stage, run_id, unit
        self.total = max(int(total), 0)
        self.completed = 0
        self.key = artifact_key(run_id, stage)
        self._want_artifact = artifact
        self._artifact_id = None
        self._artifact_pct = -1.0
        self._artifact_at = 0.0
        self._bar_task = None
        self._bar = None
        self._lock = threading.Lock()
        self._logged_quarter = 0
        self._line_at, self._line_count = time.monotonic(), 0
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._log: Any = log

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> StageProgress:
        """Create the artifact and the bar row (each only where available)."""
        in_run = _in_flow_run()
        if in_run:  # log lines go to the flow run's log (Prefect UI) too
            try:
                from prefect import get_run_logger

                self._log = get_run_logger()
            except Exception:  # noqa: BLE001
                self._log = log
        if self._want_artifact and in_run:
            try:
                from prefect.artifacts import create_progress_artifact

                self._artifact_id = create_progress_artifact(
                    progress=0.0, key=self.key, description=self._description()
                )
                self._artifact_pct, self._artifact_at = 0.0, time.monotonic()
            except Exception as exc:  # noqa: BLE001 - progress never fails a stage
                log.warning("progress artifact %s not created: %s", self.key, exc)
        with _BAR_LOCK:
            if _BAR is not None:
                self._bar = _BAR
                self._bar_task = _BAR.add_task(
                    f"{self.stage} {self.run_id}", total=self.total or None, unit=self.unit
                )
        return self

    def close(self, completed: int | None = None) -> None:
        """Stop polling, take a last reading, send the final artifact and bar update."""
        if self._poller is not None:
            self._stop.set()
            self._poller.join()
            self._poller = None
            if self._poll_fn is not None and completed is None:
                completed = self._read(self._poll_fn)
        if completed is not None:
            self.update(completed, final=True)
        else:
            self.update(self.completed, final=True)

    # -- updates -----------------------------------------------------------------------------

    def _description(self) -> str:
        pct = 100.0 * self.completed / self.total if self.total else 100.0
        return (f"{self.stage} of run {self.run_id}: {self.completed}/{self.total} {self.unit} "
                f"({pct:.0f}%)")

    def percent(self) -> float:
        """Percent done (100 when ``total`` is 0)."""
        return min(100.0, 100.0 * self.completed / self.total) if self.total else 100.0

    def update(self, completed: int, final: bool = False) -> None:
        """Set the number of items done (clamped to ``[0, total]``)."""
        with self._lock:
            self.completed = max(0, min(int(completed), self.total))
            pct = self.percent()
            if self._bar is not None and self._bar_task is not None:
                self._bar.update(self._bar_task, completed=self.completed)
            quarter = int(pct // 25)
            moved = self.completed != self._line_count
            now = time.monotonic()
            if quarter > self._logged_quarter or (
                    self._bar is None and moved and now - self._line_at >= LINE_MIN_INTERVAL_S):
                self._logged_quarter = max(quarter, self._logged_quarter)
                self._line_at, self._line_count = now, self.completed
                self._log.info(self._description())
            self._send_artifact(pct, final)

    def advance(self, n: int = 1) -> None:
        """Add ``n`` items done."""
        self.update(self.completed + n)

    def _send_artifact(self, pct: float, final: bool) -> None:
        if self._artifact_id is None:
            return
        now = time.monotonic()
        if pct == self._artifact_pct:
            return
        if not final and (pct - self._artifact_pct < 1.0 or now - self._artifact_at <
                          ARTIFACT_MIN_INTERVAL_S):
            return
        try:
            from prefect.artifacts import update_progress_artifact

            update_progress_artifact(self._artifact_id, progress=pct,
                                     description=self._description())
            self._artifact_pct, self._artifact_at = pct, now
        except Exception as exc:  # noqa: BLE001 - progress never fails a stage
            log.warning("progress artifact %s not updated (%s); no more updates", self.key, exc)
            self._artifact_id = None

    # -- polling -----------------------------------------------------------------------------

    _poll_fn: Callable[[], int] | None = None

    def _read(self, fn: Callable[[], int]) -> int | None:
        try:
            return int(fn())
        except Exception as exc:  # noqa: BLE001 - a failed poll is skipped
            log.debug("progress poll of %s failed: %s", self.key, exc)
            return None

    def poll(self, fn: Callable[[], int], interval: float = POLL_INTERVAL_S) -> None:
        """Call ``fn()`` (→ items done) every ``interval`` seconds in a daemon thread until
        :meth:`close`, and once more on close."""
        self._poll_fn = fn

        def loop() -> None:
            while not self._stop.wait(interval):
                value = self._read(fn)
                if value is not None:
                    self.update(value)

        self._poller = threading.Thread(target=loop, name=f"progress-{self.key}", daemon=True)
        self._poller.start()


def count_finished_trials(artifacts_root: str, run_id: str, batches: Sequence[dict]) -> int:
    """Trials of ``batches`` (see :func:`tasks.trials.stage.plan_batches`) that are done: every item of
    a batch whose ``<key>.trials.parquet`` exists, plus the checkpointed trials
    (``<key>.parts/*.json``) of unfinished batches. One listing of the run's
    ``trials/batches/`` prefix (local directory walk or S3 ``ListObjectsV2``)."""
    prefix = RunLayout(artifacts_root, run_id).batches()
    finished: set[str] = set()
    parts: dict[str, int] = {}
    for uri in storage.list_uris(prefix):
        name = uri[len(prefix):].lstrip("/")
        if name.endswith(".trials.parquet") and "/" not in name:
            finished.add(name[: -len(".trials.parquet")])
        elif ".parts/" in name and name.endswith(".json"):
            key = name.split(".parts/", 1)[0]
            parts[key] = parts.get(key, 0) + 1
    return sum(
        len(b["items"]) if b["key"] in finished else min(parts.get(b["key"], 0), len(b["items"]))
        for b in batches
    )
