"""Stopping a run promptly on Ctrl-C (SIGINT) or SIGTERM.

The CLI runs the benchmark flow in a worker thread (:func:`run_interruptible`) so that the
main thread keeps its own signal handlers (Prefect replaces SIGTERM's only when a flow runs
in the main thread, and its handler unwinds only after every running task has ended). A
signal :func:`request`\\ s the stop: every trial then ends at its next check — before each
model call and tool call, and an HTTP request or tool call in flight is abandoned at once
(:func:`call`), a retry back-off is cut short (:func:`sleep`) — by raising
:class:`RunInterrupted`. Such a trial is not checkpointed (a ``rerun`` runs it again); its
batch and the trials stage fail naming it, and the flow's context managers stop the local
llama server and record the stage as failed. If the flow has not ended
:data:`GRACE_S` seconds after the signal (a stage that does not check, e.g. a dataset
build), or on a second signal, the process stops the local servers and Prefect's temporary
server itself, marks the run's running stages failed and exits with status 130.
"""

from __future__ import annotations

import contextvars
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: Seconds the run gets to wind down after the first signal before the process exits anyway.
GRACE_S = 15.0

_EVENT = threading.Event()
_LOCK = threading.Lock()
_WAITERS: set[threading.Event] = set()
_REASON: list[str] = []
_HOOKS: list[Callable[[], None]] = []


def on_request(hook: Callable[[], None]) -> None:
    """Call ``hook()`` (in a thread of its own, errors ignored) when a stop is requested, and
    again, synchronously, before the process exits on a hard stop: e.g. the sandbox kills its
    sessions, so a cell in flight neither delays the stop nor outlives the process."""
    with _LOCK:
        if hook not in _HOOKS:
            _HOOKS.append(hook)


def _run_hooks(wait: bool) -> None:
    for hook in list(_HOOKS):
        def safe(h: Callable[[], None] = hook) -> None:
            try:
                h()
            except Exception:  # noqa: BLE001 - best effort while stopping
                pass
        if wait:
            safe()
        else:
            threading.Thread(target=safe, daemon=True, name="interrupt-hook").start()


class RunInterrupted(Exception):
    """The run was asked to stop (SIGINT / SIGTERM); the message names the signal."""


def request(reason: str) -> None:
    """Ask every trial of this process to stop (``reason``: e.g. ``"SIGINT"``)."""
    with _LOCK:
        if not _REASON:
            _REASON.append(reason)
        first = not _EVENT.is_set()
        _EVENT.set()
        for w in _WAITERS:
            w.set()
    if first:
        _run_hooks(wait=False)


def requested() -> str | None:
    """The reason of the stop request, or None."""
    return _REASON[0] if _EVENT.is_set() and _REASON else None


def reset() -> None:
    """Forget a stop request (a new run in the same process; tests)."""
    with _LOCK:
        _EVENT.clear()
        _REASON.clear()


def check(what: str = "the trial") -> None:
    """RunInterrupted when a stop was requested."""
    if _EVENT.is_set():
        raise RunInterrupted(f"{what} was cancelled: the run was interrupted ({requested()})")


def sleep(seconds: float) -> None:
    """``time.sleep`` that ends early (RunInterrupted) when a stop is requested."""
    if _EVENT.wait(max(float(seconds), 0.0)):
        check()


class _Callers:
    """Daemon threads that run :func:`call`'s functions, kept between calls (a thread start per
    call cost ~0.1 ms of CPU each under the GIL, ~8 % of a trial's harness time at 64 trials in
    flight). A thread waits :data:`IDLE_S` seconds for its next call, then ends; a call never
    waits for a thread (a new one starts when none is idle). Daemon: a call abandoned on a
    stop request does not keep the process alive."""

    IDLE_S = 30.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = 0
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job()`` in an idle thread, or in a new one."""
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1  # this job is that thread's
        self._jobs.put(job)
        if start:
            threading.Thread(target=self._serve, daemon=True, name="interruptible-call").start()

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0 and self._jobs.empty():
                        self._idle -= 1
                        return
                continue  # a job was handed to this thread as it timed out
            job()
            with self._lock:
                self._idle += 1


_CALLERS = _Callers()


def call(fn: Callable[..., T], *args: Any, what: str = "the trial", **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a daemon thread, returning its result or raising its
    exception — or RunInterrupted as soon as a stop is requested (the call is abandoned; the
    process is about to end). The thread runs in a copy of the caller's context (Prefect's
    settings and run context); threads are reused between calls (:class:`_Callers`)."""
    check(what)
    done = threading.Event()
    box: dict[str, Any] = {}
    ctx = contextvars.copy_context()

    def run() -> None:
        try:
            box["value"] = ctx.run(fn, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        finally:
            done.set()

    with _LOCK:
        _WAITERS.add(done)
    try:
        _CALLERS.submit(run)
        done.wait()
    finally:
        with _LOCK:
            _WAITERS.discard(done)
    if "error" in box:
        raise box["error"]
    if "value" not in box:
        check(what)
    return box["value"]


def _hard_stop(artifacts_root: str | None, run_id: str | None) -> None:
    """What the flow's own clean-up would do, when it cannot run: stop the local model
    servers and Prefect's temporary server, stop the sandbox's sessions (the
    :func:`on_request` hooks: ``os._exit`` runs no ``atexit``), record the run's running
    stages as failed."""
    _run_hooks(wait=True)
    try:
        from tasks.agents import local_model

        local_model.stop_servers()
    except Exception:  # noqa: BLE001 - best effort, the process is ending
        pass
    try:
        from prefect.server.api.server import SubprocessASGIServer

        for server in list(SubprocessASGIServer._instances.values()):
            server.stop()
    except Exception:  # noqa: BLE001
        pass
    if artifacts_root and run_id:
        try:
            from tasks.core import runs

            runs.fail_running_stages(artifacts_root, run_id,
                                     f"RunInterrupted: interrupted ({requested()})")
        except Exception:  # noqa: BLE001
            pass


def run_interruptible(fn: Callable[..., T], kwargs: dict[str, Any], *,
                      artifacts_root: str | None = None, run_id: str | None = None,
                      grace_s: float | None = None) -> T:
    """Run ``fn(**kwargs)`` (a flow) in a worker thread with SIGINT and SIGTERM
    handled here (see the module docstring). Returns its result or raises its exception; a
    first signal requests the stop, the process exits (130) when ``fn`` has not returned
    ``grace_s`` (default :data:`GRACE_S`) seconds later or on a second signal (then the running
    stages of ``run_id`` under ``artifacts_root`` are recorded failed). Outside the main thread
    it simply calls ``fn``."""
    if threading.current_thread() is not threading.main_thread():
        return fn(**kwargs)
    grace = GRACE_S if grace_s is None else grace_s
    reset()
    box: dict[str, Any] = {}
    signalled: list[float] = []

    def handler(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if signalled:  # a second signal: stop now
            print(f"{name} again: stopping now", file=sys.stderr, flush=True)
            _hard_stop(artifacts_root, run_id)
            os._exit(130)
        signalled.append(time.monotonic())
        print(f"{name}: stopping the run (trials in flight are cancelled; within "
              f"{grace:g} s; again to stop at once)", file=sys.stderr, flush=True)
        request(name)

    def target() -> None:
        try:
            box["value"] = fn(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            box["error"] = exc

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker = threading.Thread(target=target, name="run", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.2)
            if signalled and time.monotonic() - signalled[0] > grace and worker.is_alive():
                print(f"the run did not stop within {grace:g} s: stopping now",
                      file=sys.stderr, flush=True)
                _hard_stop(artifacts_root, run_id)
                os._exit(130)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if "error" in box:
        raise box["error"]
    return box["value"]


def interrupted_line(command: str, run_id: str) -> str | None:
    """The one line a command prints when its run stopped on a signal (None otherwise)."""
    why = requested()
    if why is None:
        return None
    return (f"querylab {command}: interrupted ({why}): the trials in flight were cancelled "
            f"(not scored, not checkpointed); `querylab rerun --run-id {run_id}` resumes")
