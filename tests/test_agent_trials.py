"""ReAct trials over real HTTP (real ``openai`` client, scripted server) through the batch task
the benchmark maps: trajectories, parallel tool calls, tool errors, retries, limits, cost and
the llm_calls artifact."""

from __future__ import annotations

import json

import polars as pl
import pytest

from tasks.core import storage
from tasks.scoring.stage import score_frame
from tasks.trials.stage import batch_uri, check_agents, combine_trials, run_trial_batch
from tests.fakes.openai_server import ScriptedOpenAIServer, delay, error, message, tool_calls
from tests.helpers import register_model

QUERY = "nasdaq_top_volume_2012"  # ground truth: Facebook
PRICES = {"input": 2.0, "cached_input": 0.5, "output": 8.0}


@pytest.fixture
def manifest_uri(stocks_manifest, settings) -> str:
    return storage.join(
        settings.artifacts, "datasets", "stocks", stocks_manifest["version"], "manifest.json"
    )


@pytest.fixture
def priced_model(tmp_path, monkeypatch):
    """``make(srv)`` registers model ``bench-m`` at the server's URL in a QUERYLAB_MODELS file
    (prices: :data:`PRICES`) and returns the agent name."""

    def make(srv, window: int = 100_000) -> str:
        return register_model(srv.base_url, tmp_path, monkeypatch.setenv, name="bench-m",
                              model="scripted-x", key_env="QL_TEST_KEY", key="sk-trial-test",
                              prices=json.dumps(PRICES), context_window=window)

    return make


def _run(tmp_path, manifest_uri, agent, items, options=None, key="b", max_concurrency=1):
    """Run one batch; its trials one after another by default (the list scripts here are
    consumed in request order)."""
    batch = {"key": key, "agent": agent, "manifest_uri": manifest_uri, "items": items,
             "options": options or {}}
    root = str(tmp_path / "artifacts")
    run_trial_batch.fn("r", root, batch, max_concurrency=max_concurrency)
    read = lambda what: pl.read_parquet(batch_uri(root, "r", key, what))
    trials = read("trials")
    assert "is_correct" not in trials.columns  # the trial side never judges an answer
    scored = score_frame(trials, [manifest_uri]).sort("trial")  # what the score step decides
    return scored, read("tool_calls"), read("llm_calls"), root


@pytest.mark.slow
def test_multi_step_trajectory_cost_and_llm_calls(tmp_path, manifest_uri, priced_model):
    u = [
        {"prompt_tokens": 1000, "completion_tokens": 50},
        {"prompt_tokens": 1500, "completion_tokens": 60, "cached_tokens": 1000},
        {"prompt_tokens": 2100, "completion_tokens": 70, "cached_tokens": 1500},
        {"prompt_tokens": 2600, "completion_tokens": 30, "cached_tokens": 2000},
    ]
    script = [
        tool_calls(("list_db", {"db": "listings"}), usage=u[0]),
        tool_calls(("query_db", {"db": "listings", "query":
                    "SELECT listing, company FROM listings WHERE listing LIKE 'NASDAQ:%'"}), usage=u[1]),
        tool_calls(("query_db", {"db": "market", "query":
                    "SELECT avg(volume) AS v FROM fb WHERE year(date) = 2012"}), usage=u[2]),
        tool_calls(("return_answer", {"answer": "Facebook"}), usage=u[3]),
    ]
    with ScriptedOpenAIServer(script) as srv:
        trials, calls, llm, _ = _run(tmp_path, manifest_uri, priced_model(srv), [[QUERY, 0]])
        base_url = srv.base_url
    t = trials.row(0, named=True)
    assert t["is_correct"] and t["terminate_reason"] == "return_answer"
    assert (t["n_llm_calls"], t["n_tool_calls"]) == (4, 4)
    assert calls["turn"].to_list() == [0, 1, 2, 3] and calls["success"].all()
    # the trials stage stores the typed per-call features the report reads
    assert calls["db"].to_list() == ["listings", "listings", "market", None]
    assert calls["explore"].to_list() == [True, False, False, False]
    assert calls["sql_pattern"].to_list() == [False, True, False, False]
    assert calls["source_refs"].to_list() == [[], ["listings"], ["fb"], []]
    assert llm["call_index"].to_list() == [0, 1, 2, 3]
    assert llm["cached_tokens"].to_list() == [0, 1000, 1500, 2000]
    assert llm["n_tool_calls"].to_list() == [1, 1, 1, 1]
    assert set(llm["finish_reason"]) == {"tool_calls"} and set(llm["attempts"]) == {1}
    assert not llm["cache_hit"].any() and llm["error"].is_null().all()
    assert set(llm["model"]) == {"scripted-x"} and set(llm["base_url"]) == {base_url}
    # cost = Σ calls (uncached × input + cached × cached_input + completion × output) / 1e6
    expected = sum(
        ((x["prompt_tokens"] - x.get("cached_tokens", 0)) * PRICES["input"]
         + x.get("cached_tokens", 0) * PRICES["cached_input"]
         + x["completion_tokens"] * PRICES["output"]) / 1e6
        for x in u
    )
    assert llm["cost_usd"].sum() == pytest.approx(expected)
    assert t["cost_usd"] == pytest.approx(expected)
    assert t["cached_tokens"] == 4500 and t["prompt_tokens"] == 7200 and t["completion_tokens"] == 210


@pytest.mark.slow
def test_parallel_calls_malformed_json_and_unknown_tool(tmp_path, manifest_uri, priced_model):
    script = [
        tool_calls(
            ("query_db", {"db": "listings", "query": "SELECT count(*) AS n FROM listings"}),
            ("list_db", "{not json"),
            ("drop_everything", {}),
            ("query_db", {"db": "market", "query": "SELECT count(*) AS n FROM aapl"}),
        ),
        tool_calls(("execute_python", {"code": "print(var_call_0_0[0]['n'], var_call_0_3[0]['n'] > 0)"})),
        tool_calls(("return_answer", {"answer": "Facebook"}), ("list_db", {})),
    ]
    with ScriptedOpenAIServer(script) as srv:
        trials, calls, llm, _ = _run(tmp_path, manifest_uri, priced_model(srv), [[QUERY, 0]])
        requests = srv.requests
    assert trials["terminate_reason"].to_list() == ["return_answer"]
    assert trials["is_correct"].to_list() == [True]
    # order kept, one turn for the four parallel calls; nothing after return_answer runs
    assert calls["tool"].to_list() == [
        "query_db", "list_db", "drop_everything", "query_db", "execute_python", "return_answer"
    ]
    assert calls["turn"].to_list() == [0, 0, 0, 0, 1, 2]
    assert calls["call_id"].to_list()[:4] == ["call_0_0", "call_0_1", "call_0_2", "call_0_3"]
    assert calls["success"].to_list() == [True, False, False, True, True, True]
    assert "malformed arguments" in calls["error"][1] and "unknown tool" in calls["error"][2]
    assert llm["n_tool_calls"].to_list() == [4, 1, 2]
    # the model got one tool message per call, in order, errors included
    tool_msgs = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["call_0_0", "call_0_1", "call_0_2", "call_0_3"]
    assert "error" in json.loads(tool_msgs[1]["content"])
    stdout = json.loads([m for m in requests[2]["messages"] if m["role"] == "tool"][-1]["content"])
    assert stdout["stdout"].split()[1] == "True"


@pytest.mark.slow
def test_429_then_success_and_500_forever_in_one_batch(tmp_path, manifest_uri, priced_model):
    script = [
        # trial 0: rate limited once, then answers
        error(429, retry_after=0.2),
        tool_calls(("return_answer", {"answer": "Facebook"})),
        # trial 1: the API is down for good
        error(500), error(500), error(500),
        # trial 2: the run goes on
        tool_calls(("return_answer", {"answer": "Facebook"})),
    ]
    opts = {"max_retries": 2, "retry_base_delay_s": 0.01}
    with ScriptedOpenAIServer(script) as srv:
        trials, _, llm, _ = _run(
            tmp_path, manifest_uri, priced_model(srv), [[QUERY, 0], [QUERY, 1], [QUERY, 2]], opts
        )
        assert srv.request_count == 6 and srv.errors == []
    assert trials["terminate_reason"].to_list() == ["return_answer", "api_error", "return_answer"]
    # the API failure is errored (no verdict), not an incorrect answer
    assert trials["verdict"].to_list() == ["correct", "errored", "correct"]
    assert trials["is_correct"].to_list() == [True, None, True]
    assert "HTTP 500" in trials["error"][1]
    llm = llm.sort("trial_key")
    assert llm["attempts"].to_list() == [2, 3, 1]
    assert llm["error"].is_null().to_list() == [True, False, True]
    assert llm["cost_usd"][1] == 0 and llm["cost_usd"][0] > 0


@pytest.mark.slow
def test_slow_response_past_the_timeout(tmp_path, manifest_uri, priced_model):
    script = [delay(2.0, tool_calls(("return_answer", {"answer": "Apple"}))),
              tool_calls(("return_answer", {"answer": "Facebook"}))]
    with ScriptedOpenAIServer(script) as srv:
        trials, _, llm, _ = _run(tmp_path, manifest_uri, priced_model(srv), [[QUERY, 0]],
                                 {"request_timeout_s": 0.3, "retry_base_delay_s": 0.01})
    assert trials["answer"].to_list() == ["Facebook"] and llm["attempts"].to_list() == [2]


@pytest.mark.parametrize(
    ("options", "script", "reason", "n_calls"),
    [
        ({"max_iterations": 3}, [tool_calls(("list_db", {}))] * 3, "max_iterations", 3),
        ({"max_tool_calls_per_turn": 2},
         [tool_calls(("list_db", {}), ("list_db", {}), ("list_db", {}))], "max_tool_calls_per_turn", 1),
        ({"max_total_tokens": 250},
         [tool_calls(("list_db", {}), usage={"prompt_tokens": 100, "completion_tokens": 10})] * 3,
         "token_budget", 3),
        ({}, [tool_calls(("list_db", {}), usage={"prompt_tokens": 900, "completion_tokens": 90}),
              tool_calls(("list_db", {"db": "market"}))], "context_window", 1),
        ({"max_wall_time_s": 0.5},
         [tool_calls(("execute_python", {"code": "import time; time.sleep(5)"}))],
         "max_wall_time", 1),
    ],
    ids=["iterations", "calls-per-turn", "token-budget", "context-window", "wall-time"],
)
def test_limits_have_their_own_terminate_reason(tmp_path, manifest_uri, priced_model, options,
                                                script, reason, n_calls):
    with ScriptedOpenAIServer(script) as srv:
        agent = priced_model(srv, window=1000)
        trials, calls, llm, _ = _run(tmp_path, manifest_uri, agent, [[QUERY, 0]], options)
        assert srv.request_count == n_calls
    t = trials.row(0, named=True)
    assert t["terminate_reason"] == reason and not t["is_correct"] and t["error"]
    assert t["n_llm_calls"] == n_calls == llm.height
    if reason == "max_tool_calls_per_turn":
        assert calls.height == 0  # none of that turn's calls ran
    if reason == "max_wall_time":
        assert "wall time" in calls["error"][0] or "timed out" in calls["error"][0]
        assert t["latency_s"] < 3


def test_no_tool_call_answer_and_combine(tmp_path, manifest_uri, priced_model):
    with ScriptedOpenAIServer([message("It is Facebook.")]) as srv:
        trials, _, llm, root = _run(tmp_path, manifest_uri, priced_model(srv), [[QUERY, 0]])
    assert trials["terminate_reason"].to_list() == ["no_tool_call"] and trials["is_correct"][0]
    assert llm["finish_reason"].to_list() == ["stop"] and llm["n_tool_calls"].to_list() == [0]
    out = combine_trials.fn("r", root, ["b"])
    assert set(out) == {"trials", "tool_calls", "llm_calls", "messages"}
    combined = pl.read_parquet(out["llm_calls"])
    assert combined.height == 1 and combined["trial_key"][0].endswith(f"|{QUERY}|0")


def test_check_agents_fails_before_any_trial(manifest_uri, monkeypatch, tmp_path):
    from tasks.trials.stage import AgentConfigError

    with pytest.raises(AgentConfigError, match="TOGETHER_API_KEY"):
        check_agents(["oracle", "openai:together/llama-3.3-70b"], [manifest_uri], env={})
    with pytest.raises(AgentConfigError, match="max_iterations"):
        check_agents(["oracle"], [manifest_uri], {"max_iterations": 0})
    desc = check_agents(["openai:unlisted-model"], [manifest_uri],
                        env={"QUERYLAB_OPENAI_BASE_URL": "http://127.0.0.1:1/v1"})
    assert desc[0]["priced"] is False and desc[0]["options"]["max_iterations"] == 100


def test_a_failure_of_the_per_call_features_keeps_the_paid_batch(tmp_path, manifest_uri,
                                                                  priced_model, monkeypatch):
    """If computing the stored per-call features fails (here: made to panic as Polars can),
    the batch is still written, without the features, and the trials keep their verdicts."""
    from polars.exceptions import PanicException

    from tasks.report import features

    def panics(table):
        raise PanicException("simulated panic")

    monkeypatch.setattr(features, "tool_calls_with_features", panics)
    script = [
        tool_calls(("list_db", {"db": "listings"})),
        tool_calls(("return_answer", {"answer": "Facebook"})),
    ]
    with ScriptedOpenAIServer(script) as srv:
        trials, calls, llm, _ = _run(tmp_path, manifest_uri, priced_model(srv), [[QUERY, 0]])
    assert trials.height == 1 and trials.row(0, named=True)["is_correct"]
    assert calls["tool"].to_list() == ["list_db", "return_answer"]
    assert "db" not in calls.columns or calls["db"].is_null().all()  # no stored features
    assert llm.height == 2
