"""Ctrl-C (SIGINT) and SIGTERM stop a running `querylab run` within seconds (M1): the trials in
flight — each waiting on a model request the scripted server holds for two minutes — are
cancelled, not scored and not checkpointed; the trials stage is recorded as failed (not left
`running`), no process of the run is left behind, and `querylab rerun` finishes the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from tasks.core import interrupt
from tasks.core import runs
from tests.fakes.openai_server import ScriptedOpenAIServer, delay
from tests.helpers import checkpointed_trials, ops_cli, three_step_turn

pytestmark = pytest.mark.integration  # a subprocess CLI interrupted


REPO = Path(__file__).resolve().parents[1]


def _session_processes(sid: int) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid=,sid=,args="], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if ln.split()[1:2] == [str(sid)]]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_run_and_rerun_resumes(sig, prefect_harness, tmp_path,
                                                  scripted_model):
    from prefect.settings import PREFECT_API_URL

    root = str(tmp_path / "artifacts")
    run_id = f"intr-{sig.name.lower()}"
    hang = {"on": True}

    def responder(body, index):
        step = three_step_turn(body)
        # every trial's second model call is held for two minutes while the run is signalled
        n = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return delay(120, step) if hang["on"] and n == 1 else step

    with ScriptedOpenAIServer(responder) as srv:
        agent = scripted_model(srv)
        env = {**os.environ, "PYTHONPATH": str(REPO), "QUERYLAB_ARTIFACTS": root}
        if sig == signal.SIGINT:  # the test's Prefect server; SIGTERM: Prefect's temporary one
            env["PREFECT_API_URL"] = PREFECT_API_URL.value()
        else:
            env.pop("PREFECT_API_URL", None)
        child = subprocess.Popen(
            [sys.executable, "-m", "querylab.cli", "run", "--dataset", "stocks", "--agent", agent,
             "--trials", "2", "--limit", "2", "--run-id", run_id],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            end = time.monotonic() + 240
            while srv.trial_request_count < 8:  # 4 trials: first calls + the held second ones
                assert child.poll() is None, child.communicate()[1].decode()[-3000:]
                assert time.monotonic() < end, "the trials never reached the held request"
                time.sleep(0.1)
            time.sleep(0.5)
            sent = time.monotonic()
            os.kill(child.pid, sig)
            _, err = child.communicate(timeout=60)
            took = time.monotonic() - sent
        finally:
            if child.poll() is None:
                child.kill()
        err = err.decode()
        assert child.returncode == 130, err[-3000:]
        assert took < interrupt.GRACE_S + 10, took  # seconds, not the two-minute request
        assert "interrupted" in err and f"querylab rerun --run-id {run_id}" in err, err[-2000:]
        status = runs.stage_status(root, run_id, "trials")
        assert status.status == "failed" and "interrupted" in status.error, status
        # `runs` / `status` say interrupted, not failed (QA re-check N1)
        assert [r["status"] for r in runs.list_runs(root) if r["run_id"] == run_id] == ["interrupted"]
        assert checkpointed_trials(root, run_id) == {}  # no cancelled trial counted as a result
        time.sleep(1.0)
        assert _session_processes(child.pid) == []  # Prefect's server etc. gone with it

        hang["on"] = False
        assert ops_cli(["rerun", "--run-id", run_id, "--artifacts", root]) == 0
    trials = pl.read_parquet(Path(root, "runs", run_id, "trials", "trials.parquet"))
    assert trials.height == 4 and set(trials["terminate_reason"]) == {"return_answer"}
    assert runs.pending_stages(root, run_id) == []


def test_interruptible_calls_end_at_once_on_a_request():
    """The building blocks: a call in flight is abandoned, a back-off sleep cut short."""
    import threading

    interrupt.reset()
    try:
        assert interrupt.call(lambda x: x + 1, 1) == 2
        import contextvars

        var = contextvars.ContextVar("v", default="unset")
        var.set("caller's")
        assert interrupt.call(var.get) == "caller's"  # Prefect's settings and run context
        with pytest.raises(ZeroDivisionError):
            interrupt.call(lambda: 1 / 0)
        threading.Timer(0.2, interrupt.request, ["SIGINT"]).start()
        t0 = time.monotonic()
        with pytest.raises(interrupt.RunInterrupted, match="SIGINT"):
            interrupt.call(time.sleep, 30)
        assert time.monotonic() - t0 < 5
        with pytest.raises(interrupt.RunInterrupted):
            interrupt.sleep(30)
        line = interrupt.interrupted_line("run", "r1")
        assert line.endswith("`querylab rerun --run-id r1` resumes")
    finally:
        interrupt.reset()
    assert interrupt.requested() is None and interrupt.interrupted_line("run", "r1") is None


_STUCK = r"""
import sys, time
from tasks.core import interrupt, runs

root = sys.argv[1]
runs.record_benchmark(root, "stuck", {"datasets": ["stocks"]})

def stage():  # a stage that never checks for a stop request (e.g. a dataset build)
    with runs.stage_run(root, "stuck", "datasets"):
        print("started", flush=True)
        time.sleep(120)

interrupt.run_interruptible(stage, {}, artifacts_root=root, run_id="stuck", grace_s=1.0)
"""


def test_a_stage_that_does_not_stop_is_ended_after_the_grace_period(tmp_path):
    """The fallback: the process exits 130 a grace period after the signal and records the
    running stage as failed (it was left `running` when only SIGKILL ended a run)."""
    root = str(tmp_path / "art")
    child = subprocess.Popen([sys.executable, "-c", _STUCK, root], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert child.stdout.readline().strip() == "started", child.stderr.read()[-2000:]
        t0 = time.monotonic()
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130 and time.monotonic() - t0 < 15, err[-2000:]
    assert "did not stop within 1 s" in err
    status = runs.stage_status(root, "stuck", "datasets")
    assert status.status == "failed" and "interrupted (SIGTERM)" in status.error



def test_a_stop_request_kills_the_sandbox_sessions_at_once():
    """QA12 re-check NEW-1/NEW-2: Ctrl-C while an execute_python cell (and a process it
    started) runs: the stop request kills the shared sandbox's sessions at once, so the cell
    neither delays the stop (it returned after ~15 s before) nor outlives querylab (os._exit
    runs no atexit: the hard stop runs the same hook)."""
    import threading

    from tasks.sandbox.session import shared_sandbox

    interrupt.reset()
    session = shared_sandbox().open_session(require_isolation=True)
    code = ("import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "time.sleep(120)\n")
    box = {}
    def run() -> None:
        try:
            box["res"] = session.run(code, timeout_s=110)
        except Exception as exc:  # noqa: BLE001 - the session was killed under the cell
            box["error"] = exc

    t = threading.Thread(target=run)
    try:
        t.start()
        time.sleep(3.0)  # the cell and its child are running
        t0 = time.monotonic()
        interrupt.request("SIGINT")
        t.join(20)
        assert not t.is_alive() and time.monotonic() - t0 < 10
        assert not session.alive  # killed with its processes, not recycled
        assert "error" in box or box["res"].sandbox_failed
    finally:
        interrupt.reset()
        session.close()


def test_interruptible_calls_reuse_their_threads_and_never_wait_for_one():
    """A call's thread serves the next call (no thread start per call); calls made at once each
    get a thread of their own (none waits for another to end), and each sees its own caller's
    context."""
    import contextvars
    import threading
    from concurrent.futures import ThreadPoolExecutor

    interrupt.reset()
    assert interrupt.call(threading.get_ident) != threading.get_ident()
    before = {t.ident for t in threading.enumerate()}
    idents = {interrupt.call(threading.get_ident) for _ in range(20)}
    assert idents <= before  # idle threads took the calls: none was started for them

    var = contextvars.ContextVar("who", default="unset")
    barrier = threading.Barrier(8, timeout=10)

    def caller(i: int) -> tuple[str, int]:
        var.set(f"caller {i}")

        def body() -> tuple[str, int]:
            barrier.wait()  # all 8 calls in flight at the same time, or this times out
            return var.get(), threading.get_ident()
        return interrupt.call(body)

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(caller, range(8)))
    assert [who for who, _ in got] == [f"caller {i}" for i in range(8)]
    assert len({ident for _, ident in got}) == 8
