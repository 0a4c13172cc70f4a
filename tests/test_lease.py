"""One run per run id: the lease on ``runs/<run_id>/lease.json`` (tasks/core/runs.py).

A second ``querylab run`` / ``rerun`` of a run id that a live process holds refuses at once
with one line naming the holder; a stale lease (dead pid, reused pid, another host's lease
not renewed) is taken over; the lease is re-entrant within a process and released on exit.
Local roots and S3 (moto server, conditional PUT) both.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tasks.core import run_lease, runs
from tasks.core import storage
from tests.fakes.s3 import moto_s3

ROOT = Path(__file__).resolve().parents[1]

HOLDER = textwrap.dedent("""
    import sys, time
    from tasks.core import runs, storage
    with runs.run_lease(sys.argv[1], sys.argv[2]):
        print("held", flush=True)
        time.sleep(120)
""")


def _hold(root: str, run_id: str, env: dict | None = None) -> subprocess.Popen:
    """A child process that holds the lease until killed."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, root, run_id], cwd=ROOT,
                             env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    assert line.strip() == "held", child.stderr.read()
    return child


def _stop(child: subprocess.Popen) -> None:
    child.kill()
    child.wait(10)


@pytest.mark.slow
def test_a_live_holder_is_refused_at_once_and_named(tmp_path):
    root = str(tmp_path / "art")
    child = _hold(root, "r1")
    try:
        start = time.monotonic()
        with pytest.raises(runs.LeaseHeld) as err:
            with runs.run_lease(root, "r1"):
                pass
        assert time.monotonic() - start < 2
        text = str(err.value)
        assert f"pid {child.pid}" in text and socket.gethostname() in text and "since 20" in text
        assert "\n" not in text and err.value.holder["pid"] == child.pid
    finally:
        _stop(child)
    # the holder died (SIGKILL, no clean-up): its lease is stale and is taken over
    with runs.run_lease(root, "r1") as lease:
        assert lease["pid"] == os.getpid()
        assert json.loads(Path(runs.lease_uri(root, "r1")).read_text())["pid"] == os.getpid()
    assert not Path(runs.lease_uri(root, "r1")).exists()  # released


def test_reentrant_within_a_process_and_other_run_ids_independent(tmp_path):
    root = str(tmp_path / "art")
    with runs.run_lease(root, "a") as outer:
        with runs.run_lease(root, "a") as inner:
            assert inner["token"] == outer["token"]
        assert Path(runs.lease_uri(root, "a")).exists()  # still held by the outer block
        with runs.run_lease(root, "b"):
            pass
    assert not Path(runs.lease_uri(root, "a")).exists()
    assert oct(Path(root).stat().st_mode & 0o777) == "0o700"


def _write(root: str, run_id: str, **record) -> None:
    base = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(),
            "pid_started": None, "since": "2024-01-01T00:00:00Z", "renewed_at": runs.now_iso(),
            "token": "x"}
    storage.write_json(runs.lease_uri(root, run_id), {**base, **record})


def test_stale_leases(tmp_path):
    root = str(tmp_path / "art")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for record in (
        {"pid": dead.pid},                                    # dead pid on this host
        {"pid_started": 1.0},                                 # our pid, but reused (older start)
        {"host": "elsewhere", "renewed_at": "2020-01-01T00:00:00Z"},  # another host, not renewed
    ):
        _write(root, "s", **record)
        with runs.run_lease(root, "s") as lease:
            assert lease["token"] != "x"
    _write(root, "s", host="elsewhere")  # another host, renewed just now: held
    with pytest.raises(runs.LeaseHeld, match="host 'elsewhere'"):
        with runs.run_lease(root, "s"):
            pass


def test_renewal_keeps_the_lease_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lease, "LEASE_RENEW_S", 0.05)
    root = str(tmp_path / "art")
    with runs.run_lease(root, "n") as lease:
        time.sleep(0.3)
        stored = json.loads(Path(runs.lease_uri(root, "n")).read_text())
        assert stored["token"] == lease["token"] and stored["renewed_at"] >= lease["renewed_at"]


@pytest.mark.slow
def test_cli_run_and_rerun_refuse_in_one_line(tmp_path):
    root = str(tmp_path / "art")
    runs.record_benchmark(root, "busy", {"datasets": ["stocks"], "agents": ["oracle"],
                                         "n_trials": 1, "batch_size": 25, "agent_options": {}})
    child = _hold(root, "busy")
    try:
        for argv in (["run", "--run-id", "busy", "--dataset", "stocks", "--artifacts", root],
                     ["rerun", "--run-id", "busy", "--stage", "report", "--artifacts", root]):
            start = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "querylab.cli", *argv], cwd=ROOT,
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 2, proc.stderr
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            assert len(lines) == 1 and "already running" in lines[0] and f"pid {child.pid}" in lines[0]
            assert time.monotonic() - start < 60
            assert "artifacts in" not in proc.stdout  # refused before anything started
    finally:
        _stop(child)


@pytest.mark.slow
def test_a_refused_run_pays_for_no_request(tmp_path):
    """The preflight request of an LLM agent is sent under the lease: a second ``run`` of a
    held run id is refused before it calls the endpoint (QA12 minor 4)."""
    from tests.fakes.openai_server import ScriptedOpenAIServer, message

    root = str(tmp_path / "art")
    child = _hold(root, "busy2")
    try:
        with ScriptedOpenAIServer([message("ok")] * 5) as srv:
            proc = subprocess.run(
                [sys.executable, "-m", "querylab.cli", "run", "--run-id", "busy2", "--dataset",
                 "stocks", "--artifacts", root, "--agent", f"openai:scripted-model@{srv.base_url}",
                 "--unsafe-sandbox"],
                cwd=ROOT, capture_output=True, text=True, timeout=120,
                env={**os.environ, "OPENAI_API_KEY": "sk-test"})
            assert proc.returncode == 2, proc.stderr
            assert "already running" in proc.stderr and f"pid {child.pid}" in proc.stderr
            assert srv.request_count == 0, srv.requests
    finally:
        _stop(child)


@pytest.mark.slow
def test_s3_lease_conditional_put(tmp_path):
    with moto_s3("leases") as aws:
        root = "s3://leases/q"
        child = _hold(root, "r3", aws)
        try:
            with pytest.raises(runs.LeaseHeld, match=f"pid {child.pid}"):
                with runs.run_lease(root, "r3"):
                    pass
        finally:
            _stop(child)
        with runs.run_lease(root, "r3") as lease:  # dead holder: taken over (If-Match)
            assert storage.read_json(runs.lease_uri(root, "r3"))["token"] == lease["token"]
            # a process that lost the race sees the winner's lease, not its own
            other = runs._Lease(root, "r3")
            assert other._s3_put(IfNoneMatch="*") is None
        assert not storage.exists(runs.lease_uri(root, "r3"))
