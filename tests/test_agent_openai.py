"""A ReAct agent driven by a scripted OpenAI-compatible server over real HTTP (real ``openai``
client), through the same trial task the benchmark maps."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tasks.core import storage
from tasks.scoring.stage import score_frame
from tasks.trials.stage import batch_uri, plan_batches, run_trial_batch
from tests.fakes.openai_server import ScriptedOpenAIServer, message, tool_calls

API_KEY = "sk-test-SECRET-do-not-store"
QUERY = "nasdaq_top_volume_2012"  # ground truth: Facebook


def _manifest_uri(manifest: dict, settings) -> str:
    return storage.join(
        settings.artifacts, "datasets", manifest["name"], manifest["version"], "manifest.json"
    )


@pytest.mark.slow
def test_scripted_agent_correct_incorrect_and_tool_error(stocks_manifest, settings, monkeypatch):
    script = [
        # trial 0: explores, hits a missing table (tool error, trial goes on), answers right
        tool_calls(("list_db", {})),
        tool_calls(("query_db", {"db": "listings", "query": "SELECT * FROM companies"})),
        tool_calls(
            ("query_db", {"db": "listings",
                          "query": "SELECT listing, company FROM listings WHERE listing LIKE 'NASDAQ:%'"}),
        ),
        tool_calls(("query_db", {"db": "market",
                                 "query": "SELECT avg(volume) AS v FROM fb WHERE year(date) = 2012"})),
        tool_calls(("execute_python", {"code": "print(len(var_call_2_0), var_call_3_0[0]['v'] > 0)"})),
        tool_calls(("return_answer", {"answer": "Facebook had the highest average volume."})),
        # trial 1: answers wrong straight away
        tool_calls(("return_answer", {"answer": "Apple"})),
        # trial 2: replies in text without calling a tool
        message("I think it is Facebook."),
    ]
    with ScriptedOpenAIServer(script) as srv:
        monkeypatch.setenv("QUERYLAB_OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("QUERYLAB_OPENAI_API_KEY", API_KEY)
        batch = plan_batches([_manifest_uri(stocks_manifest, settings)], ["openai:scripted"], 3)
        batch = [b for b in batch if any(q == QUERY for q, _ in b["items"])][0]
        batch = {**batch, "key": "agent-test", "items": [[QUERY, 0], [QUERY, 1], [QUERY, 2]]}
        # one trial after another: the script is consumed in request order
        uri = run_trial_batch.fn("agent-run", settings.artifacts, batch, max_concurrency=1)
        requests = srv.requests
        headers = srv.request_headers

    trials = score_frame(pl.read_parquet(uri), [_manifest_uri(stocks_manifest, settings)])
    trials = trials.sort("trial")
    assert trials["is_correct"].to_list() == [True, False, True]
    assert trials["terminate_reason"].to_list() == ["return_answer", "return_answer", "no_tool_call"]
    assert trials["n_llm_calls"].to_list() == [6, 1, 1]
    assert trials["n_tool_calls"].to_list() == [6, 1, 0]
    assert trials["prompt_tokens"].to_list() == [60, 10, 10]
    assert trials["model"].to_list() == ["scripted"] * 3

    calls = pl.read_parquet(batch_uri(settings.artifacts, "agent-run", "agent-test", "tool_calls"))
    t0 = calls.filter(pl.col("trial_key").str.ends_with("|0")).sort("call_index")
    assert t0["tool"].to_list() == [
        "list_db", "query_db", "query_db", "query_db", "execute_python", "return_answer"
    ]
    assert t0["success"].to_list() == [True, False, True, True, True, True]
    assert "companies" in t0["error"][1]

    # the model saw the tool error and the tool results, over real HTTP
    assert len(requests) == 8
    tool_msgs = [m for m in requests[2]["messages"] if m["role"] == "tool"]
    assert "error" in json.loads(tool_msgs[-1]["content"])
    python_result = json.loads(
        [m for m in requests[5]["messages"] if m["role"] == "tool"][-1]["content"]
    )
    assert python_result["stdout"].split() == ["4", "True"]
    assert {t["function"]["name"] for t in requests[0]["tools"]} == {
        "list_db", "query_db", "execute_python", "return_answer"
    }
    assert requests[0]["model"] == "scripted"
    # the key went to the server, never into an artifact
    assert headers[0]["authorization"] == f"Bearer {API_KEY}"
    for f in Path(settings.artifacts).rglob("*"):
        if f.is_file():
            assert API_KEY.encode() not in f.read_bytes(), f


@pytest.mark.slow
def test_openai_agent_without_key_or_base_url_is_an_error_trial(stocks_manifest, settings):
    batch = {
        "key": "no-key",
        "agent": "openai:gpt-4o-mini",
        "manifest_uri": _manifest_uri(stocks_manifest, settings),
        "items": [[QUERY, 0]],
    }
    uri = _manifest_uri(stocks_manifest, settings)
    trials = score_frame(pl.read_parquet(run_trial_batch.fn("no-key-run", settings.artifacts, batch)),
                         [uri])
    assert trials["terminate_reason"].to_list() == ["error"]
    assert "OPENAI_API_KEY" in trials["error"][0]
    # a configuration error is errored (retryable once fixed), not an incorrect answer
    assert trials["verdict"].to_list() == ["errored"] and trials["is_correct"].to_list() == [None]


@pytest.mark.slow
def test_unknown_agent_is_rejected_when_planning(stocks_manifest, settings):
    from tasks.trials.stage import AgentConfigError

    with pytest.raises(AgentConfigError):
        plan_batches([_manifest_uri(stocks_manifest, settings)], ["claude"], 1)
