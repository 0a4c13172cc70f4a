"""A scripted, OpenAI-compatible HTTP server for tests.

The real ``openai`` client talks to it over real HTTP on 127.0.0.1, so tests
exercise request serialisation, response parsing, error mapping, retries and
timeouts exactly as production code does -- without network access or an API
key. Only the standard library is used.

Typical use::

    from tests.fakes.openai_server import ScriptedOpenAIServer, tool_calls, message

    script = [tool_calls(("run_sql", {"sql": "SELECT 1"})), message("done")]
    with ScriptedOpenAIServer(script) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="test", max_retries=0)
        ...
        assert srv.requests[0]["tools"][0]["function"]["name"] == "run_sql"

Endpoints:

* ``POST /v1/chat/completions`` -- answered by the script (one step per request).
* ``GET /v1/models`` -- a list holding one model (``model_id``).
* anything else -- 404 with an OpenAI-style error body.

A script is either a list of steps consumed in order, or a callable
``responder(request_body: dict, index: int) -> step``. Steps are built with the
helpers :func:`tool_calls`, :func:`message`, :func:`error` and :func:`delay`; hostile-model
tests shape the reply themselves with :func:`raw_tool_calls` (tool-call objects sent verbatim:
any id, type or nesting) and :func:`raw` (any response body, e.g. invalid UTF-8).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Union

__all__ = [
    "DEFAULT_USAGE",
    "DelayStep",
    "ErrorStep",
    "MessageStep",
    "ScriptedOpenAIServer",
    "Step",
    "ToolCallsStep",
    "delay",
    "error",
    "is_preflight",
    "message",
    "raw",
    "raw_tool_calls",
    "RawStep",
    "sigkill_after_requests",
    "tool_calls",
]

#: Usage reported when a step does not specify one.
DEFAULT_USAGE: dict[str, int] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}

_USAGE_KEYS = {
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "cached_tokens",
    "reasoning_tokens",
}

# status -> (error.type, error.code) used when error() is given no body.
_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    409: ("invalid_request_error", None),
    422: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
}


# --------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class ToolCallsStep:
    """An assistant turn that calls tools (``finish_reason == "tool_calls"``).

    ``calls`` holds ``(name, arguments)`` pairs; ``arguments`` is a dict (JSON
    encoded by the server) or a str (sent verbatim, e.g. malformed JSON).
    ``usage`` is a normalised usage dict (see :func:`message`).
    """

    calls: tuple[tuple[str, Union[dict[str, Any], str]], ...]
    content: str | None = None
    usage: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_USAGE))
    reasoning: str | None = None


@dataclass(frozen=True)
class MessageStep:
    """A plain assistant text turn (``finish_reason == "stop"``)."""

    content: str
    usage: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_USAGE))
    reasoning: str | None = None


@dataclass(frozen=True)
class ErrorStep:
    """An HTTP error response: ``status``, a JSON ``body`` and optional ``Retry-After``."""

    status: int
    body: dict[str, Any]
    retry_after: float | None = None


@dataclass(frozen=True)
class DelayStep:
    """Sleep ``seconds`` and then answer with ``then`` (for client-timeout tests)."""

    seconds: float
    then: "Step"


@dataclass(frozen=True)
class RawStep:
    """A 200 response whose body is ``body`` as is (bytes), or the completion JSON built around
    ``message`` (a dict sent verbatim as ``choices[0].message``)."""

    body: bytes | None = None
    message: dict[str, Any] | None = None


Step = Union[ToolCallsStep, MessageStep, ErrorStep, DelayStep, RawStep]
Responder = Callable[[dict[str, Any], int], Step]
_STEP_TYPES = (ToolCallsStep, MessageStep, ErrorStep, DelayStep, RawStep)


def _normalise_usage(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """Turn a flat usage spec into the Chat Completions ``usage`` object.

    Accepts ``prompt_tokens``, ``completion_tokens`` and optionally
    ``total_tokens`` (default: the sum), ``cached_tokens`` (emitted as
    ``prompt_tokens_details.cached_tokens``) and ``reasoning_tokens`` (emitted as
    ``completion_tokens_details.reasoning_tokens``). Raises ``ValueError`` on
    unknown keys or missing/negative/non-integer counts.
    """
    if usage is None:
        return dict(DEFAULT_USAGE)
    unknown = set(usage) - _USAGE_KEYS
    if unknown:
        raise ValueError(f"unknown usage keys {sorted(unknown)}; allowed: {sorted(_USAGE_KEYS)}")
    for key in ("prompt_tokens", "completion_tokens"):
        if key not in usage:
            raise ValueError(f"usage needs {key!r}")
    for key, value in usage.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"usage[{key!r}] must be a non-negative int, got {value!r}")
    prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": usage.get("total_tokens", prompt + completion),
    }
    if "cached_tokens" in usage:
        out["prompt_tokens_details"] = {"cached_tokens": usage["cached_tokens"]}
    if "reasoning_tokens" in usage:
        out["completion_tokens_details"] = {"reasoning_tokens": usage["reasoning_tokens"]}
    return out


def tool_calls(
    *calls: tuple[str, Union[dict[str, Any], str]],
    content: str | None = None,
    usage: Mapping[str, Any] | None = None,
    reasoning: str | None = None,
) -> ToolCallsStep:
    """Step: the assistant calls one or more tools.

    Each call is ``(name, arguments)``: a dict is JSON-encoded by the server, a
    str is sent verbatim as ``function.arguments`` (use it for malformed JSON).
    Call ids are deterministic: ``call_<request_index>_<i>``. ``content`` is the
    optional assistant text sent alongside; ``usage`` as in :func:`message`;
    ``reasoning`` is sent as the message's ``reasoning_content`` (as DeepSeek, vLLM and
    llama.cpp servers do). Raises ``ValueError`` when no calls are given or a call is badly
    shaped.
    """
    if not calls:
        raise ValueError("tool_calls() needs at least one (name, arguments) call")
    checked = []
    for call in calls:
        if not (isinstance(call, tuple) and len(call) == 2 and isinstance(call[0], str)):
            raise ValueError(f"each call must be a (name, arguments) tuple, got {call!r}")
        if not isinstance(call[1], (dict, str)):
            raise ValueError(f"arguments must be a dict or str, got {type(call[1]).__name__}")
        checked.append((call[0], call[1]))
    return ToolCallsStep(calls=tuple(checked), content=content, usage=_normalise_usage(usage),
                         reasoning=reasoning)


def raw_tool_calls(calls: Sequence[Any], content: Any = None) -> RawStep:
    """Step: an assistant turn whose ``tool_calls`` list is ``calls`` sent verbatim (JSON
    encoded as given: ids of any length or type, arguments that are objects, numbers or huge
    strings, lone surrogates as ``\\udxxx`` escapes, ...)."""
    return RawStep(message={"role": "assistant", "content": content, "tool_calls": list(calls)})


def raw(body: bytes) -> RawStep:
    """Step: a 200 ``application/json`` response with exactly these bytes as its body."""
    if not isinstance(body, bytes):
        raise ValueError("raw() takes bytes")
    return RawStep(body=body)


def message(
    content: str, usage: Mapping[str, Any] | None = None, reasoning: str | None = None
) -> MessageStep:
    """Step: a plain assistant text reply (``finish_reason == "stop"``).

    ``usage`` defaults to :data:`DEFAULT_USAGE`; otherwise a dict with
    ``prompt_tokens`` and ``completion_tokens`` plus optional ``total_tokens``,
    ``cached_tokens`` (-> ``usage.prompt_tokens_details.cached_tokens``) and
    ``reasoning_tokens`` (-> ``usage.completion_tokens_details.reasoning_tokens``).
    Raises ``ValueError`` on a malformed usage dict.
    """
    return MessageStep(content=content, usage=_normalise_usage(usage), reasoning=reasoning)


def error(
    status: int,
    body: Union[Mapping[str, Any], str, None] = None,
    retry_after: float | None = None,
) -> ErrorStep:
    """Step: an HTTP error response with an OpenAI-style JSON body.

    ``body`` may be ``None`` (a default ``{"error": {"message", "type", "code"}}``
    for ``status``), a str (used as ``error.message``) or a dict (sent verbatim as
    the whole JSON body). ``retry_after`` (seconds) adds a ``Retry-After`` header.
    Note that the ``openai`` client retries 408/409/429/5xx unless
    ``max_retries=0``; each retry consumes another step. Raises ``ValueError``
    for a status outside 400-599.
    """
    if not 400 <= status <= 599:
        raise ValueError(f"error status must be 4xx/5xx, got {status}")
    if isinstance(body, Mapping):
        payload = dict(body)
    else:
        kind, code = _ERROR_KINDS.get(status, ("server_error", None))
        text = body if isinstance(body, str) else f"Scripted error {status}"
        payload = {"error": {"message": text, "type": kind, "param": None, "code": code}}
    return ErrorStep(status=status, body=payload, retry_after=retry_after)


def delay(seconds: float, then_step: Step) -> DelayStep:
    """Step: wait ``seconds`` before answering with ``then_step``.

    If the client gives up (timeout) meanwhile, the late write is dropped
    silently and the server keeps serving. Stopping the server cuts the wait
    short. Raises ``ValueError`` on a negative delay or a non-step ``then_step``.
    """
    if seconds < 0:
        raise ValueError("delay seconds must be >= 0")
    if not isinstance(then_step, _STEP_TYPES):
        raise ValueError(f"then_step must be a step, got {type(then_step).__name__}")
    return DelayStep(seconds=float(seconds), then=then_step)


# --------------------------------------------------------------------------- server


def _error_body(message_text: str, kind: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message_text, "type": kind, "param": None, "code": code}}


class _QuietThreadingHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Client disconnects (e.g. after a client-side timeout) are expected.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class ScriptedOpenAIServer:
    """An OpenAI-compatible HTTP server whose replies follow a script.

    ``script`` is a sequence of steps (consumed one per chat-completion request;
    once exhausted every further request gets a 500 saying so) or a callable
    ``responder(request_body, index) -> step`` (called under a lock, so calls are
    serialised; an exception or a non-step return becomes a 500).
    ``model_id`` is what ``GET /v1/models`` lists; chat replies echo the
    request's ``model``.

    Use as a context manager (``with ScriptedOpenAIServer(script) as srv``) or
    call :meth:`start` / :meth:`stop`. Attributes, safe to read from tests:

    * ``base_url`` -- ``http://127.0.0.1:<port>/v1`` (``RuntimeError`` if not started).
    * ``requests`` -- parsed JSON bodies of the chat-completion requests, in order.
    * ``request_headers`` -- the matching request headers (lower-cased keys).
    * ``request_count`` -- ``len(requests)``.
    * ``errors`` -- script problems (exhaustion, responder exceptions) as strings.
    * ``remaining_steps`` -- unconsumed steps of a list script (``None`` for a callable).
    * ``in_flight`` / ``max_in_flight`` -- chat-completion requests being answered now / the
      most answered at once so far (the server's view of a client's concurrency; a request
      counts from its arrival until its reply starts, delays included — not while the reply
      is written, when the client may already have read it and sent its next request).

    Requests with an invalid JSON body or ``"stream": true`` get a 400 and do
    not consume a step (streaming ones are still recorded).

    ``keep_alive``: answer in HTTP/1.1 and keep each connection open for the client's next
    request, as the OpenAI API, vLLM and llama.cpp's server do (the benchmarks); by default
    HTTP/1.0, one connection per request (what the tests were written against).
    """

    def __init__(
        self,
        script: Union[Sequence[Step], Responder],
        *,
        model_id: str = "scripted-model",
        keep_alive: bool = False,
    ) -> None:
        if callable(script):
            self._responder: Responder | None = script
            self._steps: list[Step] = []
        else:
            steps = list(script)
            for i, step in enumerate(steps):
                if not isinstance(step, _STEP_TYPES):
                    raise TypeError(f"script[{i}] is not a step: {step!r}")
            self._responder = None
            self._steps = steps
        self.model_id = model_id
        self.keep_alive = keep_alive
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._next_step = 0
        self._requests: list[dict[str, Any]] = []
        self._headers: list[dict[str, str]] = []
        self._errors: list[str] = []
        self._httpd: _QuietThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._in_flight = 0
        self._max_in_flight = 0

    # ------------------------------------------------------------- lifecycle

    def start(self) -> "ScriptedOpenAIServer":
        """Bind 127.0.0.1 on a free port and serve in a daemon thread; returns self.

        Raises ``RuntimeError`` if already started.
        """
        if self._httpd is not None:
            raise RuntimeError("server already started")
        self._stopping.clear()
        httpd = _QuietThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"ScriptedOpenAIServer:{httpd.server_address[1]}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake pending delays, close the socket. Idempotent."""
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> "ScriptedOpenAIServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------- inspection

    @property
    def port(self) -> int:
        """The bound TCP port (``RuntimeError`` if not started)."""
        if self._httpd is None:
            raise RuntimeError("server not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``, suitable for ``openai.OpenAI(base_url=...)``."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A snapshot list of chat-completion request bodies received so far."""
        with self._lock:
            return list(self._requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """A snapshot list of the chat-completion request headers (lower-cased names)."""
        with self._lock:
            return [dict(h) for h in self._headers]

    @property
    def request_count(self) -> int:
        """Number of chat-completion requests received so far."""
        with self._lock:
            return len(self._requests)

    @property
    def trial_request_count(self) -> int:
        """Chat-completion requests other than querylab's preflight checks (see
        :func:`is_preflight`): the requests trials made."""
        return sum(not is_preflight(r) for r in self.requests)

    @property
    def preflight_count(self) -> int:
        """querylab preflight requests received so far."""
        return sum(is_preflight(r) for r in self.requests)

    @property
    def in_flight(self) -> int:
        """Chat-completion requests being answered right now."""
        with self._lock:
            return self._in_flight

    @property
    def max_in_flight(self) -> int:
        """The most chat-completion requests answered at once so far."""
        with self._lock:
            return self._max_in_flight

    def _enter(self) -> None:
        with self._lock:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    @property
    def errors(self) -> list[str]:
        """Script problems seen so far (exhausted script, responder failures)."""
        with self._lock:
            return list(self._errors)

    @property
    def remaining_steps(self) -> int | None:
        """Steps of a list script not yet consumed; ``None`` for a callable script."""
        with self._lock:
            if self._responder is not None:
                return None
            return len(self._steps) - self._next_step

    # ------------------------------------------------------------- internals

    def _record(self, body: dict[str, Any], headers: dict[str, str]) -> int:
        with self._lock:
            self._requests.append(body)
            self._headers.append(headers)
            return len(self._requests) - 1

    def _next(self, body: dict[str, Any], index: int) -> Step | ErrorStep:
        """Pick the step answering request ``index``; script faults become 500 steps."""
        with self._lock:
            if self._responder is not None:
                try:
                    step = self._responder(body, index)
                except Exception as exc:  # noqa: BLE001 - reported to the client and in .errors
                    msg = f"scripted responder raised on request {index}: {exc!r}"
                    self._errors.append(msg)
                    return error(500, msg)
                if not isinstance(step, _STEP_TYPES):
                    msg = f"scripted responder returned a non-step on request {index}: {step!r}"
                    self._errors.append(msg)
                    return error(500, msg)
                return step
            if self._next_step >= len(self._steps):
                msg = (
                    f"scripted OpenAI server: script exhausted "
                    f"({len(self._steps)} steps) at request {index}"
                )
                self._errors.append(msg)
                return error(500, msg)
            step = self._steps[self._next_step]
            self._next_step += 1
            return step

    def _completion(
        self, step: ToolCallsStep | MessageStep, body: dict[str, Any], index: int
    ) -> dict[str, Any]:
        """Build the Chat Completions JSON object answering request ``index``."""
        msg: dict[str, Any] = {"role": "assistant", "refusal": None}
        if isinstance(step, ToolCallsStep):
            msg["content"] = step.content
            msg["tool_calls"] = [
                {
                    "id": f"call_{index}_{i}",
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
                for i, (name, args) in enumerate(step.calls)
            ]
            finish = "tool_calls"
        else:
            msg["content"] = step.content
            finish = "stop"
        if step.reasoning is not None:
            msg["reasoning_content"] = step.reasoning
        return {
            "id": f"chatcmpl-scripted-{index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model_id,
            "choices": [{"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}],
            "usage": json.loads(json.dumps(step.usage)),
            "system_fingerprint": None,
        }


def _make_handler(server: ScriptedOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "ScriptedOpenAI/1.0"
        protocol_version = "HTTP/1.1" if server.keep_alive else "HTTP/1.0"
        # a reply's headers and body are two writes: with Nagle's algorithm the body of a
        # kept-alive connection waits for the client's delayed ACK (~40 ms a reply)
        disable_nagle_algorithm = True
        timeout = 30  # idle socket read timeout for a handler thread

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # keep test output clean

        def _send_json(
            self, status: int, payload: Any, headers: Mapping[str, str] | None = None
        ) -> None:
            self._send_bytes(status, json.dumps(payload).encode("utf-8"), headers)

        def _send_bytes(
            self, status: int, data: bytes, headers: Mapping[str, str] | None = None
        ) -> None:
            self._uncount()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
                self.wfile.flush()
            except OSError:
                self.close_connection = True  # client went away (e.g. it timed out)

        def _not_found(self) -> None:
            self._send_json(
                404,
                _error_body(
                    f"Unknown route {self.command} {self.path}",
                    "invalid_request_error",
                    "not_found",
                ),
            )

        def _path(self) -> str:
            return self.path.split("?", 1)[0].rstrip("/")

        def do_GET(self) -> None:  # noqa: N802
            if self._path() == "/v1/models":
                self._send_json(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": server.model_id,
                                "object": "model",
                                "created": 0,
                                "owned_by": "scripted",
                            }
                        ],
                    },
                )
            else:
                self._not_found()

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self._path() != "/v1/chat/completions":
                self._not_found()
                return
            try:
                body = json.loads(raw.decode("utf-8"))
                if not isinstance(body, dict):
                    raise ValueError("body is not a JSON object")
            except (ValueError, UnicodeDecodeError) as exc:
                msg = f"Invalid JSON body: {exc}"
                self._send_json(400, _error_body(msg, "invalid_request_error"))
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            index = server._record(body, headers)
            if body.get("stream"):
                self._send_json(
                    400,
                    _error_body(
                        "Streaming is not supported by the scripted OpenAI server",
                        "invalid_request_error",
                        "stream_unsupported",
                    ),
                )
                return
            server._enter()
            self._counted = True
            try:
                self._respond(server._next(body, index), body, index)
            finally:
                self._uncount()

        def _uncount(self) -> None:
            """Leave the in-flight count once: when the reply starts (the client may read
            it and send its next request before this thread runs again) or at the end."""
            if getattr(self, "_counted", False):
                self._counted = False
                server._leave()

        def _respond(self, step: Step, body: dict[str, Any], index: int) -> None:
            while isinstance(step, DelayStep):
                if server._stopping.wait(step.seconds):
                    self.close_connection = True  # server stopping: drop the request
                    return
                step = step.then
            if isinstance(step, ErrorStep):
                headers = {}
                if step.retry_after is not None:
                    ra = step.retry_after
                    headers["Retry-After"] = str(int(ra)) if float(ra).is_integer() else str(ra)
                self._send_json(step.status, step.body, headers)
                return
            if isinstance(step, RawStep):
                if step.body is not None:
                    self._send_bytes(200, step.body)
                    return
                completion = {
                    "id": f"chatcmpl-scripted-{index}", "object": "chat.completion",
                    "created": int(time.time()), "model": body.get("model") or server.model_id,
                    "choices": [{"index": 0, "message": step.message,
                                 "finish_reason": "tool_calls", "logprobs": None}],
                    "usage": dict(DEFAULT_USAGE),
                }
                self._send_json(200, completion)
                return
            self._send_json(200, server._completion(step, body, index))

    return Handler


#: The user message of querylab's preflight request (``tasks.core.llm.PREFLIGHT_PROMPT``).
PREFLIGHT_PROMPT = "querylab preflight check: reply OK."


def is_preflight(body: dict[str, Any]) -> bool:
    """True for querylab's one-request preflight check (``tasks.core.llm.preflight``)."""
    msgs = body.get("messages") or []
    return len(msgs) == 1 and msgs[0].get("content") == PREFLIGHT_PROMPT


def sigkill_after_requests(child, server: "ScriptedOpenAIServer", count: int,
                           timeout_s: float = 120.0) -> None:
    """SIGKILL the subprocess ``child`` (a ``subprocess.Popen`` with piped stderr) once
    ``server`` has received more than ``count`` requests, and reap it. Fails the test with the
    child's stderr tail if it exits first, or if ``timeout_s`` passes without that request."""
    import os
    import signal

    try:
        end = time.monotonic() + timeout_s
        while server.request_count <= count:
            assert child.poll() is None, child.communicate()[1].decode()[-3000:]
            assert time.monotonic() < end, "the child never reached the hanging request"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
