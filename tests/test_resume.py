"""Resuming runs of a paid model: a finished run re-run makes no HTTP request; a run killed
midway (SIGKILL, in a subprocess) re-run calls the server only for unfinished trials and loses
or duplicates no trial row."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tasks.core import storage
from tasks.scoring.stage import score_frame
from tasks.trials.stage import batch_uri, combine_trials, plan_batches, run_trial_batch
from tests.fakes.openai_server import ScriptedOpenAIServer, delay, sigkill_after_requests
from tests.helpers import register_model, three_step_turn

ROOT = Path(__file__).resolve().parents[1]
QUERY = "nasdaq_top_volume_2012"


@pytest.fixture
def manifest_uri(stocks_manifest, settings) -> str:
    return storage.join(
        settings.artifacts, "datasets", "stocks", stocks_manifest["version"], "manifest.json"
    )


@pytest.fixture
def model_env(tmp_path, monkeypatch):
    def make(srv) -> str:
        return register_model(srv.base_url, tmp_path, monkeypatch.setenv, name="resume-m",
                              key_env="QL_RESUME_KEY", key="sk-resume",
                              prices="{input: 1.0, cached_input: 0.1, output: 4.0}")

    return make


def _run_all(root: str, run_id: str, batches: list[dict]) -> dict:
    for b in batches:
        run_trial_batch.fn(run_id, root, b)
    return combine_trials.fn(run_id, root, [b["key"] for b in batches])


@pytest.mark.slow
def test_rerun_makes_no_requests_even_without_batch_artifacts(tmp_path, manifest_uri, model_env):
    root = str(tmp_path / "artifacts")
    with ScriptedOpenAIServer(lambda body, i: three_step_turn(body)) as srv:
        agent = model_env(srv)
        batches = plan_batches([manifest_uri], [agent], 2, batch_size=4)
        first = _run_all(root, "r1", batches)
        t1, llm1 = pl.read_parquet(first["trials"]), pl.read_parquet(first["llm_calls"])
        n_first = srv.request_count
        assert n_first == 5 * 2 * 3
        again = _run_all(root, "r1", batches)
        assert srv.request_count == n_first  # finished batches are skipped
        assert pl.read_parquet(again["trials"]).equals(t1)
        # lose every batch artifact but keep the response cache: still no request, $0
        for f in Path(root, "runs", "r1", "trials", "batches").glob("*.parquet"):
            f.unlink()
        replayed = _run_all(root, "r1", batches)
        assert srv.request_count == n_first
    t3 = pl.read_parquet(replayed["trials"])
    cols = ["trial_key", "answer", "terminate_reason", "n_llm_calls", "prompt_tokens",
            "cached_tokens", "n_tool_calls"]
    assert t3.select(cols).equals(t1.select(cols))
    assert t1["cost_usd"].sum() > 0 and t3["cost_usd"].sum() == 0
    llm3 = pl.read_parquet(replayed["llm_calls"])
    assert not llm1["cache_hit"].any() and llm3["cache_hit"].all()
    assert set(llm3["attempts"]) == {0} and llm3.height == llm1.height == n_first


def test_flow_rerun_makes_no_requests(prefect_harness, tmp_path, manifest_uri, model_env):
    from flows.trials import run_trials

    root = str(tmp_path / "artifacts")
    with ScriptedOpenAIServer(lambda body, i: three_step_turn(body)) as srv:
        agent = model_env(srv)
        out = run_trials("flow-r", [manifest_uri], [agent, "oracle"], 1, 3, root)
        n = srv.request_count
        assert n == 5 * 3
        out2 = run_trials("flow-r", [manifest_uri], [agent, "oracle"], 1, 3, root)
        assert srv.request_count == n
    assert set(out) == {"trials", "tool_calls", "llm_calls", "messages", "agents"}
    trials = score_frame(pl.read_parquet(out2["trials"]), [manifest_uri])
    assert trials.height == 10
    correct = trials.filter(pl.col("is_correct"))
    assert set(correct["trial_key"]) == {f"{agent}|stocks|{QUERY}|0"} | set(
        trials.filter(pl.col("agent") == "oracle")["trial_key"])
    llm = pl.read_parquet(out["llm_calls"])
    assert llm.height == 15 and llm["trial_key"].str.starts_with(agent).all()
    agents = storage.read_json(out["agents"])
    assert [a["agent"] for a in agents] == [agent, "oracle"] and agents[0]["priced"] is True
    assert "sk-resume" not in Path(out["agents"]).read_text()


_CHILD = """
import sys
from tasks.trials.stage import combine_trials, plan_batches, run_trial_batch
root, manifest_uri, agent = sys.argv[1:4]
batches = plan_batches([manifest_uri], [agent], 3, batch_size=4)
for b in batches:  # one trial at a time: the request numbers below follow from it
    run_trial_batch.fn("killed", root, b, max_concurrency=1)
combine_trials.fn("killed", root, [b["key"] for b in batches])
"""


@pytest.mark.slow
def test_sigkill_midway_then_rerun(tmp_path, manifest_uri, model_env):
    root = str(tmp_path / "artifacts")
    hang_at = 19  # request 19 = trial 6 (second batch), turn 1: the child is killed waiting

    def responder(body, index):
        step = three_step_turn(body)
        return delay(60, step) if index == hang_at else step

    with ScriptedOpenAIServer(responder) as srv:
        agent = model_env(srv)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        child = subprocess.Popen([sys.executable, "-c", _CHILD, root, manifest_uri, agent],
                                 cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        sigkill_after_requests(child, srv, hang_at)
        assert srv.request_count == hang_at + 1
        batches = plan_batches([manifest_uri], [agent], 3, batch_size=4)
        first_batch = Path(batch_uri(root, "killed", batches[0]["key"], "trials"))
        parts = sorted(Path(root, "runs", "killed", "trials", "batches",
                            f"{batches[1]['key']}.parts").glob("*.json"))
        assert first_batch.exists() and len(parts) == 2  # trials 4 and 5 were checkpointed
        mtime = first_batch.stat().st_mtime_ns
        checkpointed = [storage.read_json(str(p))["trial"] for p in parts]

        out = _run_all(root, "killed", batches)
        rerun = srv.requests[hang_at + 1:]

    # 15 trials × 3 calls = 45; the killed run made 19 answered requests (trials 0-5 and the
    # first call of trial 6, which is now a cache hit); the rerun makes the other 26
    assert len(rerun) == 45 - 19
    assert first_batch.stat().st_mtime_ns == mtime
    trials = pl.read_parquet(out["trials"])
    assert trials.height == 15 and trials["trial_key"].n_unique() == 15
    assert set(trials["terminate_reason"]) == {"return_answer"}
    scored = score_frame(trials, [manifest_uri])
    assert scored.filter(pl.col("query_id") == QUERY)["is_correct"].all()
    for row in checkpointed:  # resumed from the checkpoint, not re-run
        again = trials.filter(pl.col("trial_key") == row["trial_key"]).row(0, named=True)
        assert again["latency_s"] == row["latency_s"] and again["cost_usd"] == row["cost_usd"]
    llm = pl.read_parquet(out["llm_calls"])
    # every answered request has its row (QA M2): the killed attempt's paid first call is
    # kept (trial_attempt 0) beside the resumed attempt's cache hit for it (trial_attempt 1)
    assert llm.height == 46
    assert llm.select("trial_key", "trial_attempt", "call_index").n_unique() == 46
    paid = llm.filter(~pl.col("cache_hit"))
    assert paid.height == 45 and int(paid["attempts"].sum()) == 45
    assert llm["cost_usd"].sum() == pytest.approx(paid["cost_usd"].sum())
    hits = llm.filter(pl.col("cache_hit"))
    assert hits.height == 1 and hits["call_index"].to_list() == [0]
    assert hits["trial_attempt"].to_list() == [1]
    # the cache hit belongs to the trial that was cut short: the 7th in plan order
    plan_order = [f"{agent}|stocks|{q}|{t}" for b in batches for q, t in b["items"]]
    assert hits["trial_key"][0] == plan_order[6]
    killed = paid.filter(pl.col("trial_key") == plan_order[6])
    assert killed["trial_attempt"].to_list() == [0, 1, 1] and killed["cost_usd"].min() > 0
    calls = pl.read_parquet(out["tool_calls"])
    assert calls.height == 45 and calls.select("trial_key", "call_index").n_unique() == 45
    # no checkpoint directories are left behind
    assert not list(Path(root, "runs", "killed", "trials", "batches").glob("*.parts"))
