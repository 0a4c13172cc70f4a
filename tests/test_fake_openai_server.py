"""Tests of the scripted OpenAI-compatible server, driven by the real ``openai`` client.

Every client uses a short timeout and ``max_retries=0`` so that no test can hang.
"""

from __future__ import annotations

import json
import time

import openai
import pytest

try:
    from tests.fakes.openai_server import (
        ScriptedOpenAIServer,
        delay,
        error,
        message,
        tool_calls,
    )
except ImportError:  # tests/ not importable as a package: pytest put tests/ itself on sys.path
    from fakes.openai_server import ScriptedOpenAIServer, delay, error, message, tool_calls

CLIENT_TIMEOUT = 5.0
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_sql",
            "description": "Run a SQL query",
            "parameters": {
                "type": "object",
                "properties": {"sql": {"type": "string"}},
                "required": ["sql"],
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "How many rows?"}]


def _client(srv: ScriptedOpenAIServer, timeout: float = CLIENT_TIMEOUT) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="test", max_retries=0, timeout=timeout)


def _ask(client: openai.OpenAI, **kwargs):
    return client.chat.completions.create(model="gpt-test", messages=MESSAGES, **kwargs)


def test_tool_call_round_trip_and_request_recorded():
    step = tool_calls(("run_sql", {"sql": "SELECT 1"}), ("run_sql", {"sql": "SELECT 2"}))
    with ScriptedOpenAIServer([step]) as srv:
        assert srv.base_url.startswith("http://127.0.0.1:") and srv.base_url.endswith("/v1")
        resp = _ask(_client(srv), tools=TOOLS)

    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert resp.model == "gpt-test"
    assert resp.object == "chat.completion"
    calls = choice.message.tool_calls
    assert [c.id for c in calls] == ["call_0_0", "call_0_1"]
    assert calls[0].type == "function"
    assert calls[0].function.name == "run_sql"
    assert json.loads(calls[0].function.arguments) == {"sql": "SELECT 1"}
    assert json.loads(calls[1].function.arguments) == {"sql": "SELECT 2"}
    assert resp.usage.prompt_tokens == 10
    assert resp.usage.completion_tokens == 5
    assert resp.usage.total_tokens == 15

    assert srv.request_count == 1
    req = srv.requests[0]
    assert req["model"] == "gpt-test"
    assert req["messages"] == MESSAGES
    assert req["tools"] == TOOLS
    assert srv.request_headers[0]["authorization"] == "Bearer test"


def test_malformed_arguments_arrive_verbatim():
    raw = '{"sql": "SELECT 1"'  # truncated JSON
    with ScriptedOpenAIServer([tool_calls(("run_sql", raw), content="thinking")]) as srv:
        resp = _ask(_client(srv), tools=TOOLS)
    msg = resp.choices[0].message
    assert msg.content == "thinking"
    assert msg.tool_calls[0].function.arguments == raw
    with pytest.raises(json.JSONDecodeError):
        json.loads(msg.tool_calls[0].function.arguments)


def test_plain_message_and_multi_step_script():
    script = [tool_calls(("run_sql", {"sql": "SELECT 1"})), message("42 rows")]
    with ScriptedOpenAIServer(script) as srv:
        client = _client(srv)
        first = _ask(client, tools=TOOLS)
        second = _ask(client, tools=TOOLS)
        assert srv.remaining_steps == 0
    assert first.choices[0].message.tool_calls[0].id == "call_0_0"
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "42 rows"
    assert second.choices[0].message.tool_calls is None
    assert srv.request_count == 2


def test_rate_limit_error_with_retry_after():
    with ScriptedOpenAIServer([error(429, retry_after=1)]) as srv:
        with pytest.raises(openai.RateLimitError) as exc_info:
            _ask(_client(srv))
    exc = exc_info.value
    assert exc.status_code == 429
    assert exc.response.headers["Retry-After"] == "1"
    assert exc.code == "rate_limit_exceeded"
    assert srv.request_count == 1


def test_internal_server_error():
    with ScriptedOpenAIServer([error(500, "boom")]) as srv:
        with pytest.raises(openai.InternalServerError) as exc_info:
            _ask(_client(srv))
    assert exc_info.value.status_code == 500
    assert "boom" in exc_info.value.message


def test_custom_error_body_sent_verbatim():
    body = {
        "error": {
            "message": "context too long",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    with ScriptedOpenAIServer([error(400, body)]) as srv:
        with pytest.raises(openai.BadRequestError) as exc_info:
            _ask(_client(srv))
    assert exc_info.value.code == "context_length_exceeded"
    assert exc_info.value.body == body["error"]


def test_delay_causes_client_timeout_and_server_survives():
    with ScriptedOpenAIServer([delay(2, message("late")), message("on time")]) as srv:
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            _ask(_client(srv, timeout=0.5))
        assert time.monotonic() - started < 1.9  # gave up before the 2 s delay ended
        resp = _ask(_client(srv))
        assert resp.choices[0].message.content == "on time"
        assert srv.request_count == 2


def test_usage_with_cached_tokens():
    usage = {"prompt_tokens": 100, "completion_tokens": 7, "cached_tokens": 64}
    with ScriptedOpenAIServer([message("hi", usage=usage)]) as srv:
        resp = _ask(_client(srv))
    assert resp.usage.prompt_tokens == 100
    assert resp.usage.completion_tokens == 7
    assert resp.usage.total_tokens == 107
    assert resp.usage.prompt_tokens_details.cached_tokens == 64


def test_callable_responder_gets_body_and_index():
    seen: list[tuple[str, int]] = []

    def responder(body: dict, index: int):
        seen.append((body["messages"][-1]["content"], index))
        return message(f"reply {index} to {body['model']}")

    with ScriptedOpenAIServer(responder) as srv:
        client = _client(srv)
        r0 = _ask(client)
        r1 = client.chat.completions.create(
            model="other", messages=[{"role": "user", "content": "again"}]
        )
        assert srv.remaining_steps is None
    assert seen == [("How many rows?", 0), ("again", 1)]
    assert r0.choices[0].message.content == "reply 0 to gpt-test"
    assert r1.choices[0].message.content == "reply 1 to other"


def test_responder_exception_becomes_500_and_is_recorded():
    def responder(body: dict, index: int):
        raise KeyError("nope")

    with ScriptedOpenAIServer(responder) as srv:
        with pytest.raises(openai.InternalServerError):
            _ask(_client(srv))
    assert "KeyError" in srv.errors[0]


def test_exhausted_script_returns_500():
    with ScriptedOpenAIServer([message("only one")]) as srv:
        client = _client(srv)
        _ask(client)
        with pytest.raises(openai.InternalServerError) as exc_info:
            _ask(client)
    assert "exhausted" in exc_info.value.message
    assert "exhausted" in srv.errors[0]


def test_stream_rejected_and_step_not_consumed():
    with ScriptedOpenAIServer([message("after stream")]) as srv:
        client = _client(srv)
        with pytest.raises(openai.BadRequestError):
            _ask(client, stream=True)
        assert _ask(client).choices[0].message.content == "after stream"
    assert srv.requests[0]["stream"] is True


def test_models_endpoint_and_unknown_route():
    with ScriptedOpenAIServer([], model_id="fake-1") as srv:
        client = _client(srv)
        models = client.models.list()
        assert [m.id for m in models.data] == ["fake-1"]
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="fake-1", input="x")
        assert srv.request_count == 0


def test_start_stop_lifecycle():
    srv = ScriptedOpenAIServer([message("x")])
    with pytest.raises(RuntimeError):
        _ = srv.base_url
    srv.start()
    try:
        with pytest.raises(RuntimeError):
            srv.start()
        assert _ask(_client(srv)).choices[0].message.content == "x"
    finally:
        srv.stop()
    srv.stop()  # idempotent
    with pytest.raises(RuntimeError):
        _ = srv.base_url


def test_helpers_validate_input():
    with pytest.raises(ValueError):
        tool_calls()
    with pytest.raises(ValueError):
        tool_calls(("run_sql", 42))
    with pytest.raises(ValueError):
        message("x", usage={"prompt_tokens": 1})
    with pytest.raises(ValueError):
        message("x", usage={"prompt_tokens": 1, "completion_tokens": 1, "bogus": 3})
    with pytest.raises(ValueError):
        error(200)
    with pytest.raises(ValueError):
        delay(-1, message("x"))
    with pytest.raises(TypeError):
        ScriptedOpenAIServer([{"not": "a step"}])
