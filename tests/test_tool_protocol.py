"""The json_schema tool-call protocol (tasks/agents/tool_protocol.py) and its hook in ChatModel: unit
checks of the schema, the conversation encoding and the reply decoding (hostile replies
included), then the real ReAct loop over real HTTP against the scripted server, which answers
like a server without tool support, and the ``auto`` probe."""

from __future__ import annotations

import json

import polars as pl
import pytest
from openai.types.chat import ChatCompletion

from schemas.models import AgentOptions
from tasks.core import storage
from tasks.agents import tool_protocol
from tasks.agents.react import run_react
from tasks.core.llm import AgentConfigError, ChatModel, ResponseCache, check_tool_protocol, resolve_model
from tasks.agents.tools import TOOL_NAMES, TOOL_SCHEMAS
from tasks.trials.stage import plan_batches, run_trial_batch
from tests.fakes.openai_server import ScriptedOpenAIServer, error, message, tool_calls
from tests.helpers import register_model

QUERY = "nasdaq_top_volume_2012"  # ground truth: Facebook


def _reply(obj) -> str:
    return obj if isinstance(obj, str) else json.dumps(obj)


def _completion(content: str | None, finish: str = "stop") -> ChatCompletion:
    return ChatCompletion.model_validate({
        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": finish,
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    })


def _models_file(tmp_path, monkeypatch, base_url: str, protocol: str, name: str = "schema-m"):
    register_model(base_url, tmp_path, monkeypatch.setenv, name=name,
                   prices="{input: 1, output: 2}", tool_protocol=protocol)
    return name


# --------------------------------------------------------------------------- unit


def test_response_schema_has_one_alternative_per_tool_and_a_final_answer():
    schema = tool_protocol.response_schema(TOOL_SCHEMAS)
    alts = schema["anyOf"]
    names = [a["properties"]["name"]["const"] for a in alts]
    assert names == [*TOOL_NAMES, "final_answer"]
    query = alts[TOOL_NAMES.index("query_db")]
    assert query["required"] == ["name", "arguments"] and query["additionalProperties"] is False
    args = query["properties"]["arguments"]
    assert args["required"] == ["db", "query"] and args["additionalProperties"] is False
    # the tool's own schema is not modified
    assert "additionalProperties" not in TOOL_SCHEMAS[1]["function"]["parameters"]
    final = alts[-1]["properties"]["arguments"]
    assert final["required"] == ["answer"]


def test_final_answer_name_never_collides_with_a_tool():
    tools = [{"type": "function", "function": {"name": "final_answer", "parameters": {}}}]
    schema = tool_protocol.response_schema(tools)
    assert [a["properties"]["name"]["const"] for a in schema["anyOf"]] == [
        "final_answer", "final_answer_"]
    req = tool_protocol.encode([{"role": "user", "content": "q"}], tools)
    assert req.final_name == "final_answer_"
    resp, ok = tool_protocol.decode(
        _completion(_reply({"name": "final_answer", "arguments": {}})), req, 3)
    assert ok and resp.choices[0].message.tool_calls[0].function.name == "final_answer"


def test_encode_rewrites_tool_turns_for_a_template_without_tools():
    messages = [
        {"role": "system", "content": "You are a data agent."},
        {"role": "user", "content": "How many?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": "query_db", "arguments": '{"db": "a", "query": "SELECT 1"}'}},
            {"id": "call_0b", "type": "function",
             "function": {"name": "list_db", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": '{"rows": [[1]]}'},
        {"role": "tool", "tool_call_id": "call_0b", "content": "err"},
        {"role": "assistant", "content": "It is 1."},
        {"role": "user", "content": "Sure?"},
    ]
    req = tool_protocol.encode(messages, TOOL_SCHEMAS)
    out = req.messages
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "user",
                                        "assistant", "user"]
    assert out[0]["content"].startswith("You are a data agent.\n\n## Tools")
    for name in TOOL_NAMES:
        assert f"- {name}:" in out[0]["content"]
    calls = [json.loads(line) for line in out[2]["content"].splitlines()]
    assert calls == [{"name": "query_db", "arguments": {"db": "a", "query": "SELECT 1"}},
                     {"name": "list_db", "arguments": "not json"}]
    assert out[3]["content"] == 'Result of query_db (call call_0):\n{"rows": [[1]]}'
    assert out[4]["content"].startswith("Result of list_db (call call_0b)")
    assert json.loads(out[5]["content"]) == {"name": "final_answer",
                                             "arguments": {"answer": "It is 1."}}
    assert all("tool_calls" not in m and m["role"] != "tool" for m in out)
    rf = req.body["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["schema"]["anyOf"]
    # the caller's messages are untouched
    assert messages[2]["tool_calls"][0]["id"] == "call_0"


def test_encode_adds_a_system_message_when_there_is_none():
    req = tool_protocol.encode([{"role": "user", "content": "q"}], TOOL_SCHEMAS)
    assert req.messages[0]["role"] == "system" and "## Tools" in req.messages[0]["content"]
    assert req.messages[1] == {"role": "user", "content": "q"}


def test_decode_tool_call_and_final_answer():
    req = tool_protocol.encode([{"role": "user", "content": "q"}], TOOL_SCHEMAS)
    resp, ok = tool_protocol.decode(_completion(_reply(
        {"name": "query_db", "arguments": {"db": "market", "query": "SELECT 1"}})), req, 4)
    msg = resp.choices[0].message
    assert ok and msg.content is None and resp.choices[0].finish_reason == "tool_calls"
    (tc,) = msg.tool_calls
    assert tc.id == "call_4" and tc.function.name == "query_db"
    assert json.loads(tc.function.arguments) == {"db": "market", "query": "SELECT 1"}
    assert resp.usage.prompt_tokens == 7  # usage kept
    resp, ok = tool_protocol.decode(
        _completion(_reply({"name": "final_answer", "arguments": {"answer": "Facebook"}})), req, 5)
    assert ok and resp.choices[0].message.content == "Facebook"
    assert not resp.choices[0].message.tool_calls


@pytest.mark.parametrize("content", [
    '{"name": "query_db", "arguments": {"db": "market", "query": "SELECT',  # cut off at length
    "",
    None,
    "plain text answer",
    "[1, 2]",
    '{"name": 5, "arguments": {}}',
    '{"arguments": {}}',
    '{"name": "query_db"}',
    "[" * 100_000 + "]" * 100_000,  # nesting bomb
])
def test_decode_passes_anything_else_on_as_text(content):
    req = tool_protocol.encode([{"role": "user", "content": "q"}], TOOL_SCHEMAS)
    original = _completion(content, "length")
    resp, ok = tool_protocol.decode(original, req, 0)
    assert not ok and resp is original


def test_decode_hostile_names_and_arguments_are_left_to_the_tool_box():
    req = tool_protocol.encode([{"role": "user", "content": "q"}], TOOL_SCHEMAS)
    resp, ok = tool_protocol.decode(_completion(_reply(
        {"name": "../../etc/passwd", "arguments": "rm -rf /", "id": "evil id"})), req, 2)
    (tc,) = resp.choices[0].message.tool_calls
    assert ok and tc.id == "call_2"  # querylab numbers calls, never the model
    assert tc.function.name == "../../etc/passwd" and tc.function.arguments == "rm -rf /"
    resp, _ = tool_protocol.decode(_completion(_reply(
        {"name": "final_answer", "arguments": {"answer": 42}})), req, 3)
    assert resp.choices[0].message.content == '{"answer": 42}'


# --------------------------------------------------------------------------- over HTTP


def test_react_loop_over_json_schema_protocol(tmp_path, monkeypatch, stocks_manifest, settings):
    """The ReAct loop sees normal tool calls; the server sees no `tools`, only response_format
    and a rewritten conversation; transcripts and tool-call rows look like a native model's."""
    script = [
        message(_reply({"name": "list_db", "arguments": {}})),
        message(_reply({"name": "query_db", "arguments": {
            "db": "listings",
            "query": "SELECT listing, company FROM listings WHERE listing LIKE 'NASDAQ:%'"}})),
        message(_reply({"name": "query_db", "arguments": {"db": "nowhere", "query": "SELECT 1"}})),
        message('{"name": "return_answer", "arguments": {"answer": "Faceb'),  # cut off: text
    ]
    with ScriptedOpenAIServer(script) as srv:
        name = _models_file(tmp_path, monkeypatch, srv.base_url, "json_schema")
        uri = storage.join(settings.artifacts, "datasets", "stocks", stocks_manifest["version"],
                           "manifest.json")
        batch = plan_batches([uri], [f"openai:{name}"], 1)
        batch = {**batch[0], "key": "schema-test", "items": [[QUERY, 0]]}
        out = run_trial_batch.fn("schema-run", settings.artifacts, batch)
        requests = srv.requests

    assert len(requests) == 4
    for req in requests:
        assert "tools" not in req and "tool_choice" not in req
        assert req["response_format"]["type"] == "json_schema"
        assert all(m["role"] in ("system", "user", "assistant") for m in req["messages"])
    assert "## Tools" in requests[0]["messages"][0]["content"]
    # turn 2 saw the first call as the JSON it "wrote" and its result as a user turn
    second = requests[1]["messages"]
    assert json.loads(second[2]["content"]) == {"name": "list_db", "arguments": {}}
    assert second[3]["role"] == "user" and second[3]["content"].startswith(
        "Result of list_db (call call_0):")
    trial = pl.read_parquet(out).row(0, named=True)
    assert trial["terminate_reason"] == "no_tool_call"
    assert trial["answer"].startswith('{"name": "return_answer"')
    assert trial["n_llm_calls"] == 4 and trial["n_tool_calls"] == 3
    calls = pl.read_parquet(out.replace(".trials.", ".tool_calls.")).sort("call_index")
    assert calls["tool"].to_list() == ["list_db", "query_db", "query_db"]
    assert calls["call_id"].to_list() == ["call_0", "call_1", "call_2"]
    assert calls["success"].to_list() == [True, True, False]
    llm = pl.read_parquet(out.replace(".trials.", ".llm_calls.")).sort("call_index")
    assert llm["finish_reason"].to_list() == ["tool_calls", "tool_calls", "tool_calls", "stop"]
    assert llm["n_tool_calls"].to_list() == [1, 1, 1, 0]
    assert llm["prompt_tokens"].to_list() == [10] * 4
    assert llm["cost_usd"].sum() == pytest.approx(4 * (10 * 1 + 5 * 2) / 1e6)


def test_json_schema_calls_are_cached_and_decoded_on_a_hit(tmp_path, monkeypatch):
    reply = _reply({"name": "query_db", "arguments": {"db": "a", "query": "SELECT 1"}})
    messages = [{"role": "user", "content": "q"}]
    with ScriptedOpenAIServer([message(reply)]) as srv:
        name = _models_file(tmp_path, monkeypatch, srv.base_url, "json_schema")
        cache = ResponseCache(str(tmp_path / "art"))
        chat = ChatModel(resolve_model(name), AgentOptions(max_retries=0), cache)
        first, rec1 = chat.complete(messages, TOOL_SCHEMAS, trial=0, call_index=0)
        again, rec2 = chat.complete(messages, TOOL_SCHEMAS, trial=0, call_index=0)
        chat.close()
        assert srv.request_count == 1
    assert not rec1.cache_hit and rec2.cache_hit and rec2.n_tool_calls == 1
    assert again.choices[0].message.tool_calls[0].function.name == "query_db"
    assert first.choices[0].message.tool_calls[0].id == "call_0"


def test_calls_without_tools_are_sent_as_they_are(tmp_path, monkeypatch):
    with ScriptedOpenAIServer([message("SELECT 1")]) as srv:
        name = _models_file(tmp_path, monkeypatch, srv.base_url, "json_schema")
        chat = ChatModel(resolve_model(name), AgentOptions(max_retries=0))
        resp, _ = chat.complete([{"role": "user", "content": "q"}], None, 0, 0)
        chat.close()
        (req,) = srv.requests
    assert "response_format" not in req and req["messages"] == [{"role": "user", "content": "q"}]
    assert resp.choices[0].message.content == "SELECT 1"


def test_native_protocol_is_unchanged(tmp_path, monkeypatch):
    with ScriptedOpenAIServer([tool_calls(("list_db", {}))]) as srv:
        name = _models_file(tmp_path, monkeypatch, srv.base_url, "native")
        chat = ChatModel(resolve_model(name), AgentOptions(max_retries=0))
        resp, _ = chat.complete([{"role": "user", "content": "q"}], TOOL_SCHEMAS, 0, 0)
        chat.close()
        (req,) = srv.requests
    assert req["tools"] == TOOL_SCHEMAS and "response_format" not in req
    assert resp.choices[0].message.tool_calls[0].function.name == "list_db"


@pytest.mark.parametrize("probe_step, expected", [
    (tool_calls(("ping", {"n": 1})), "native"),
    (message("pong"), "json_schema"),
    (error(400, "tools are not supported by this model"), "json_schema"),
])
def test_auto_probe_decides_once_per_model(tmp_path, monkeypatch, probe_step, expected):
    tool_protocol.forget_detected()
    reply = (tool_calls(("list_db", {})) if expected == "native"
             else message(_reply({"name": "list_db", "arguments": {}})))
    with ScriptedOpenAIServer([probe_step, reply, reply]) as srv:
        name = _models_file(tmp_path, monkeypatch, srv.base_url, "auto")
        resolved = resolve_model(name)
        assert check_tool_protocol(resolved) == expected
        chat = ChatModel(resolved, AgentOptions(max_retries=0))
        for i in range(2):
            resp, _ = chat.complete([{"role": "user", "content": "q"}], TOOL_SCHEMAS, 0, i)
            assert resp.choices[0].message.tool_calls[0].function.name == "list_db"
        chat.close()
        requests = srv.requests
    assert len(requests) == 3  # one probe, then the two calls
    assert requests[0]["tools"][0]["function"]["name"] == "ping"
    assert ("tools" in requests[1]) == (expected == "native")
    tool_protocol.forget_detected()


def test_auto_probe_failure_is_a_clear_config_error(tmp_path, monkeypatch):
    tool_protocol.forget_detected()
    with ScriptedOpenAIServer([error(401, "bad key")]) as srv:
        name = _models_file(tmp_path, monkeypatch, srv.base_url, "auto")
        with pytest.raises(AgentConfigError, match="probe: HTTP 401"):
            check_tool_protocol(resolve_model(name))
    tool_protocol.forget_detected()


def test_auto_probe_failure_inside_a_trial_is_an_api_error(tmp_path, monkeypatch):
    tool_protocol.forget_detected()
    with ScriptedOpenAIServer([error(500, "down")]) as srv:
        name = _models_file(tmp_path, monkeypatch, srv.base_url, "auto")
        chat = ChatModel(resolve_model(name), AgentOptions(max_retries=0))

        class NoTools:
            deadline = None

        outcome = run_react(chat, NoTools(), "q", "sys")
        chat.close()
    assert outcome.terminate_reason == "api_error" and "probe: HTTP 500" in outcome.error
    tool_protocol.forget_detected()
