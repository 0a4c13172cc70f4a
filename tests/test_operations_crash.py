"""Crash safety at the operations level: `querylab run` (a subprocess, reporting to the test's
Prefect server) is SIGKILLed during its trials stage; `querylab rerun --run-id` then finishes the
run — no trial lost or duplicated, and no checkpointed trial calls the model again.

tests/test_resume.py kills a bare batch loop; this kills the whole CLI → benchmark flow →
Prefect-mapped batches (running concurrently) and resumes through the run record alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tasks.core import runs
from tasks.core import storage
from tasks.core.progress import count_finished_trials
from tasks.trials.stage import plan_batches
from tests.fakes.openai_server import ScriptedOpenAIServer, delay, sigkill_after_requests
from tests.helpers import checkpointed_trials, ops_cli, three_step_turn

pytestmark = pytest.mark.integration  # a subprocess CLI killed with SIGKILL


REPO = Path(__file__).resolve().parents[1]


def test_sigkill_during_trials_then_rerun(prefect_harness, tmp_path, scripted_model):
    from prefect.settings import PREFECT_API_URL

    root = str(tmp_path / "artifacts")
    hang_at = 19  # this request never gets its answer before the kill
    # two trials in flight: some have finished (and are checkpointed) by request 19

    def responder(body, index):
        step = three_step_turn(body)
        return delay(60, step) if index == hang_at else step

    with ScriptedOpenAIServer(responder) as srv:
        agent = scripted_model(srv)
        env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_API_URL": PREFECT_API_URL.value(),
               "QUERYLAB_ARTIFACTS": root}
        child = subprocess.Popen(
            [sys.executable, "-m", "querylab.cli", "run", "--dataset", "stocks", "--agent", agent,
             "--trials", "3", "--batch-size", "4", "--max-concurrency", "2", "--max-trials", "2",
             "--run-id", "crash"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        sigkill_after_requests(child, srv, hang_at)
        n_killed = srv.trial_request_count
        assert runs.stage_status(root, "crash", "datasets").status == "completed"
        assert runs.stage_status(root, "crash", "trials").status == "running"  # cut short
        saved = checkpointed_trials(root, "crash")
        manifests = runs.load_run(root, "crash").manifests
        batches = plan_batches(manifests, [agent], 3, 4)
        assert 1 <= len(saved) < 15 and count_finished_trials(root, "crash", batches) == len(saved)

        assert ops_cli(["rerun", "--run-id", "crash", "--artifacts", root]) == 0
        rerun_requests = srv.trial_request_count - n_killed
        assert srv.preflight_count == 2  # the run and the rerun each checked the agent

    # checkpointed trials made no request; the others made at most their 3 each
    assert rerun_requests <= 3 * (15 - len(saved))
    out = Path(root, "runs", "crash", "trials")
    trials = pl.read_parquet(out / "trials.parquet")
    assert trials.height == 15 and trials["trial_key"].n_unique() == 15
    assert set(trials["terminate_reason"]) == {"return_answer"}
    for key, row in saved.items():  # kept from before the kill, not run again
        again = trials.filter(pl.col("trial_key") == key).row(0, named=True)
        assert (again["latency_s"], again["cost_usd"]) == (row["latency_s"], row["cost_usd"])
    tools = pl.read_parquet(out / "tool_calls.parquet")
    assert tools.height == 45 and tools.select("trial_key", "call_index").n_unique() == 45
    # every answered model request is a paid call and stays: the 45 of the finished attempts,
    # plus those the trials in flight at the kill had been answered (their earlier attempt)
    llm = pl.read_parquet(out / "llm_calls.parquet")
    last = llm.group_by("trial_key").agg(pl.col("trial_attempt").max().alias("last"))
    final = llm.join(last, on="trial_key").filter(pl.col("trial_attempt") == pl.col("last"))
    assert final.height == 45 and final.select("trial_key", "call_index").n_unique() == 45
    earlier = llm.join(last, on="trial_key").filter(pl.col("trial_attempt") < pl.col("last"))
    # at most 2 trials in flight at the kill: the hung one had at most 2 answers; the other may
    # have had all 3 answered and been killed while writing its checkpoint
    assert earlier["trial_key"].n_unique() <= 2 and earlier.height <= 2 + 3
    assert earlier.height == 0 or earlier["cost_usd"].min() > 0
    # paid (not a response-cache hit) = answered requests: all but the hung one (and at most
    # the other trial's request in flight at the kill)
    paid_before_kill = llm.filter(~pl.col("cache_hit")).height - rerun_requests
    assert n_killed - 2 <= paid_before_kill <= n_killed - 1
    status = runs.stage_status(root, "crash", "trials")
    assert status.status == "completed" and status.attempt == 2
    assert [h.status for h in status.history] == ["running"]
    assert runs.pending_stages(root, "crash") == []
    assert storage.exists(storage.join(root, "runs", "crash", "report", "pass_at_k.parquet"))
