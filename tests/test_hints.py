"""The prompt as DAB builds it and the hint conditions (issue 15, points 3 and 6).

Through the real benchmark flow and the real ``openai`` client against the scripted server on
127.0.0.1: with ``hints=["off", "on"]`` every query is asked twice; the system prompts are the
same, and the first user messages (``QUERY:`` + question, ``DATABASE DESCRIPTION:`` + the
schema description) differ exactly by the dataset's hint text appended with hints on. The
condition is in the run record, in the trial rows (one pass@k row per condition) and in the
report; the oracle runs once, unaffected."""

from __future__ import annotations

import json
import threading

import polars as pl
import pytest

from tasks.core import runs
from tasks.core import storage
from tasks.agents.react import SYSTEM_PROMPT, hint_text, user_prompt
from tasks.trials.stage import AgentConfigError, agent_label, hint_conditions, plan_batches
from tests.fakes.openai_server import ScriptedOpenAIServer, is_preflight, tool_calls
from tests.helpers import register_model


def test_user_prompt_is_dab_shaped(stocks_manifest):
    off = user_prompt(stocks_manifest, " Which company? ", hints=False)
    on = user_prompt(stocks_manifest, "Which company?", hints=True)
    description = stocks_manifest["schema_description"].strip()
    assert off == f"QUERY:\nWhich company?\n\nDATABASE DESCRIPTION:\n{description}"
    assert on == off + "\n\n" + hint_text(stocks_manifest)
    assert hint_text(stocks_manifest).startswith("HINTS:\n")
    assert stocks_manifest["hints"].strip() in on and stocks_manifest["hints"].strip() not in off
    # every database and its description is in the description the agent sees
    for db, d in stocks_manifest["databases"].items():
        assert db in off and d["description"] in off
    # the system prompt carries no dataset: neither databases nor hints
    assert "market" not in SYSTEM_PROMPT and "HINTS" not in SYSTEM_PROMPT


def test_dab_hint_file_is_appended_verbatim():
    manifest = {"schema_description": "1. db (sqlite)", "databases": {},
                "hints": "HINTS: \nA = NYSE MKT"}
    assert user_prompt(manifest, "q", hints=True) == (
        "QUERY:\nq\n\nDATABASE DESCRIPTION:\n1. db (sqlite)\n\nHINTS: \nA = NYSE MKT"
    )
    # no hints: nothing is appended even with hints on
    assert user_prompt({**manifest, "hints": ""}, "q", True) == user_prompt(manifest, "q", False)


def test_hint_conditions_are_checked():
    assert hint_conditions(None) == ["off"]
    assert hint_conditions(["on", "off", "on"]) == ["on", "off"]
    with pytest.raises(AgentConfigError, match="use 'on' or 'off'"):
        hint_conditions(["yes"])
    assert agent_label("openai:m", "on") == "openai:m+hints"
    assert agent_label("openai:m", "off") == "openai:m"
    assert agent_label("oracle", None) == "oracle"


def test_plan_batches_doubles_prompt_agents_only(stocks_manifest, settings):
    uri = storage.join(settings.artifacts, "datasets", "stocks", stocks_manifest["version"],
                       "manifest.json")
    batches = plan_batches([uri], ["oracle", "openai:m"], 1, 100, hints=["off", "on"])
    got = sorted((b["agent"], b["hints"]) for b in batches)
    assert got == [("openai:m", "off"), ("openai:m", "on"), ("oracle", None)]
    keys = {b["hints"]: b["key"] for b in batches if b["agent"] == "openai:m"}
    assert keys["on"] != keys["off"]
    # hints off keeps the key a run without the option had (resuming old runs)
    (old,) = [b for b in plan_batches([uri], ["openai:m"], 1, 100) if b["agent"] == "openai:m"]
    assert old["key"] == keys["off"]


@pytest.fixture
def answers_facebook_model(tmp_path, monkeypatch):
    """A scripted server that answers every request with return_answer("Facebook"), registered
    as model ``hint-m``; yields (agent name, server)."""
    lock = threading.Lock()

    def respond(body: dict, index: int):
        with lock:
            return tool_calls(("return_answer", {"answer": "Facebook"}))

    with ScriptedOpenAIServer(respond) as srv:
        yield register_model(srv.base_url, tmp_path, monkeypatch.setenv, name="hint-m",
                             model="scripted-h", key_env="QL_HINT_KEY", key="sk-hint-test",
                             prices="{input: 1.0, output: 2.0}"), srv


def test_hints_on_and_off_in_one_run_over_http(prefect_harness, settings, stocks_manifest,
                                               answers_facebook_model, tmp_path):
    from flows.benchmark import benchmark

    agent, srv = answers_facebook_model
    root = str(tmp_path / "artifacts")
    out = benchmark(run_id="hints-both", datasets=["stocks"], agents=[agent, "oracle"],
                    n_trials=1, batch_size=10, artifacts_root=root, hints=["off", "on"],
                    agent_options={"cache": "off"})
    questions = {q["question"]: q["id"] for q in stocks_manifest["queries"]}
    requests = [b for b in srv.requests if not is_preflight(b)]  # one preflight check first
    assert srv.preflight_count == 1
    assert len(requests) == 2 * len(questions)  # each query once per condition
    by_question: dict[str, list[str]] = {}
    for body in requests:
        system, user = body["messages"][0], body["messages"][1]
        assert system == {"role": "system", "content": SYSTEM_PROMPT}
        assert user["role"] == "user" and user["content"].startswith("QUERY:\n")
        question = user["content"].split("\n", 1)[1].split("\n\nDATABASE DESCRIPTION:\n")[0]
        by_question.setdefault(question, []).append(user["content"])
    assert set(by_question) == set(questions)
    extra = "\n\n" + hint_text(stocks_manifest)
    for prompts in by_question.values():
        off, on = sorted(prompts, key=len)
        assert on == off + extra  # the bodies differ exactly by the hint text
        assert "HINTS:" not in off

    trials = pl.read_parquet(out["trials"]["trials"])
    conditions = {(a, h) for a, h in trials.select("agent", "hints").unique().iter_rows()}
    assert conditions == {(agent, "off"), (agent + "+hints", "on"), ("oracle", None)}
    assert trials.filter(pl.col("agent") == "oracle").height == len(questions)
    assert all(k.startswith(("openai:hint-m|", "openai:hint-m+hints|", "oracle|"))
               for k in trials["trial_key"])
    # one pass@k row per condition
    summary = pl.read_parquet(out["report"]["summary"])
    assert {agent, agent + "+hints", "oracle"} <= set(summary["agent"])
    # the condition is recorded and reported
    assert runs.benchmark_config(root, "hints-both").hints == ["off", "on"]
    described = json.loads(storage.read_bytes(out["trials"]["agents"]))
    assert {d["agent"]: d["hints"] for d in described} == {agent: ["off", "on"], "oracle": []}
    report_md = storage.read_bytes(out["report"]["markdown"]).decode()
    assert f"`{agent}+hints`: on" in report_md and f"`{agent}`: off" in report_md
    assert "`oracle`: n/a" in report_md
