"""Model calls for ``openai:<model>`` agents: model resolution, cost, response cache and
infrastructure-only retries.

- :func:`load_models_config` reads ``data/models.yaml`` (plus files in ``QUERYLAB_MODELS``);
  :func:`resolve_model` turns ``<model>`` of ``openai:<model>`` into a :class:`ResolvedModel`
  (endpoint, key, prices, context window). A model in no file falls back to
  ``QUERYLAB_OPENAI_BASE_URL`` / ``QUERYLAB_OPENAI_API_KEY`` (or ``OPENAI_*``) with cost 0 and
  ``priced=False``.
- The endpoint the user names is the endpoint used: ``openai:<model>@<base url>`` names it for
  one agent, ``QUERYLAB_OPENAI_BASE_URL`` for every model; both override the models table's
  ``base_url`` (``ResolvedModel.base_url_source`` says which, ``overridden_base_url`` what was
  replaced, and :func:`endpoint_warning` the warning to show).
- :func:`preflight`: one minimal real request per model before a run builds anything (key
  accepted, endpoint reachable, model known, tool calling accepted), bounded in time.
- :class:`ResponseCache`: content-addressed JSON files under
  ``<artifacts>/cache/llm/<aa>/<sha256>.json``; the key hashes model id, base URL, messages,
  tools, sampling parameters and the trial index. A hit makes no HTTP request and costs $0.
- ``local:<name>``: :func:`resolve_model` of a models-table entry with a ``local`` block starts
  (or reuses) querylab's own llama.cpp server for it (:mod:`tasks.agents.local_model`) and returns its
  127.0.0.1 endpoint; everything below applies to it as to any model (cost 0).
- Tool calls follow the model's ``tool_protocol`` (:mod:`tasks.agents.tool_protocol`): ``native``
  ``tools``, or ``json_schema`` constrained output translated to and from tool calls inside
  :meth:`ChatModel.complete`, or ``auto`` (one probe request decides, :meth:`ChatModel.protocol`).
- :class:`ChatModel.complete`: one model call through the ``openai`` client with
  ``max_retries=0`` and querylab's own retry loop, so every attempt is counted. Retried:
  HTTP 408, 429 and 5xx, timeouts and connection errors, with exponential backoff and jitter
  (``Retry-After`` / ``retry-after-ms`` honoured). Everything else (401, 404, 400, ...) fails at
  once. A failure raises :class:`LLMCallError` carrying the call's record.
- Per-model concurrency and rate limits (opt-in, :class:`ModelLimits`): with
  ``QUERYLAB_MODEL_LIMITS=prefect`` every HTTP attempt to ``openai:<name>`` holds a slot of the
  Prefect global concurrency limit ``model:<name>`` (at most N requests in flight across every
  worker sharing the Prefect server) and takes a slot of ``model-rate:<name>`` (a limit with
  slot decay: a request rate). Only limits that exist are used; cache hits take none. Unset,
  the call path does no Prefect work at all.

This module holds the response cache and :class:`ChatModel`; the rest lives in
:mod:`tasks.core.llm_models` (models table, resolution), :mod:`tasks.core.llm_calls` (call
records, retry policy), :mod:`tasks.core.llm_limits` and :mod:`tasks.core.llm_preflight`, and is
re-exported here, so ``from tasks.core.llm import resolve_model`` keeps working.
"""

from __future__ import annotations

import hashlib
import logging
import json
import random
import re
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import openai
from openai.types.chat import ChatCompletion
from pydantic import ValidationError

from schemas.models import AgentOptions
from tasks.agents import tool_protocol
from tasks.core.llm_clients import openai_client
from tasks.core import interrupt, storage
from tasks.core.llm_calls import (  # noqa: F401 - re-exported
    JUDGE_CACHE,
    LLMCallError,
    LLMCallRecord,
    _EmptyResponse,
    _is_context_overflow,
    _waited,
    classify_error,
    retry_after_s,
    usage_counts,
)
from tasks.core.llm_limits import (  # noqa: F401 - re-exported
    MODEL_LIMITS_ENV,
    ModelLimits,
    _LIMITS_CACHE,
    _PREFECT_BANNED,
    _SlotWaitTimeout,
    forget_model_limits,
    model_limit_names,
    model_limits,
    model_limits_enabled,
)
from tasks.core.llm_models import (  # noqa: F401 - re-exported
    AgentConfigError,
    MODELS_FILE,
    MODEL_KINDS,
    OPENAI_DEFAULT_BASE_URL,
    ResolvedModel,
    _MODEL_AT_URL,
    _first_env,
    _read_models_file,
    _resolve_local,
    check_tool_protocol,
    endpoint_warning,
    load_models_config,
    local_entry,
    model_label,
    model_spec_name,
    resolve_model,
    settings_env,
    split_model_url,
)
from tasks.core.llm_preflight import (  # noqa: F401 - re-exported
    LOCAL_PREFLIGHT_TIMEOUT_S,
    PREFLIGHT_PROMPT,
    PREFLIGHT_TIMEOUT_S,
    PREFLIGHT_TOOL,
    PreflightResult,
    _cause,
    preflight,
)

log = logging.getLogger("tasks.core.llm")


#: Bump when the cache entry layout or key material changes.
CACHE_VERSION = "1"


# --------------------------------------------------------------------------------------------
# Response cache
# --------------------------------------------------------------------------------------------


def _construct(data: Any) -> ChatCompletion | None:
    """A cached response that does not validate, built without validation (as the client
    builds API responses); None if it is not even a mapping."""
    if not isinstance(data, dict):
        return None
    try:
        return ChatCompletion.construct(**data)
    except Exception:  # noqa: BLE001 - an unusable entry is a cache miss
        return None


def cache_key(
    model_id: str, base_url: str, messages: list, tools: list | None, sampling: dict, trial: int
) -> str:
    """SHA-256 hex of the canonical JSON of everything that determines a response."""
    material = {
        "v": CACHE_VERSION,
        "model": model_id,
        "base_url": base_url.rstrip("/"),
        "messages": messages,
        "tools": tools,
        "sampling": sampling,
        "trial": trial,
    }
    blob = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


class ResponseCache:
    """Content-addressed model responses under ``<artifacts_root>/cache/<namespace>``.

    ``mode``: ``on`` (read + write), ``refresh`` (write only), ``off``. ``namespace``: ``llm``
    (agents, default) or :data:`JUDGE_CACHE` for judges, whose prompts and answers discuss
    ground truth and must never sit beside agent responses. Entries are JSON
    ``{"response": <ChatCompletion JSON>, "cost_usd": <cost when first paid>, "model",
    "base_url", "trial"}``, written atomically; an unreadable entry counts as a miss.
    ValueError for a namespace that is not a plain lower-case name.
    """

    def __init__(self, artifacts_root: str, mode: str = "on", namespace: str = "llm"):
        if not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", namespace):
            raise ValueError(f"response cache namespace {namespace!r}: use a lower-case name")
        self.root = storage.join(artifacts_root, "cache", namespace)
        self.mode = mode

    def uri(self, key: str) -> str:
        """Where the entry for ``key`` lives."""
        return storage.join(self.root, key[:2], f"{key}.json")

    def get(self, key: str) -> dict | None:
        """The stored entry or None (always None unless mode is ``on``)."""
        if self.mode != "on":
            return None
        uri = self.uri(key)
        try:
            if not storage.exists(uri):
                return None
            return storage.read_json(uri)
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable response-cache entry %s: %s", uri, exc)
            return None

    def put(self, key: str, entry: dict) -> None:
        """Store ``entry`` (no-op when mode is ``off``)."""
        if self.mode == "off":
            return
        # ASCII JSON: a response holding lone surrogates (invalid UTF-8 from the model) is
        # stored as \\udxxx escapes and reads back unchanged
        data = json.dumps(entry, separators=(",", ":"), ensure_ascii=True, default=str)
        storage.write_bytes(self.uri(key), data.encode())


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


class _SlotHold:
    """A call slot (a context manager, :func:`tasks.core.concurrency.call_slot`) entered now
    and exited once, by whichever thread comes first: the thread running the request
    (:meth:`around`) or the caller's (:meth:`release`). Thread-safe."""

    def __init__(self, slot: Any):
        self._slot = slot
        slot.__enter__()
        self._held = True
        self._lock = threading.Lock()

    def release(self) -> None:
        """Exit the slot unless it was exited already."""
        with self._lock:
            if not self._held:
                return
            self._held = False
        self._slot.__exit__(None, None, None)

    def around(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, then :meth:`release` (whatever it raised)."""
        try:
            return fn(*args, **kwargs)
        finally:
            self.release()


class ChatModel:
    """Chat Completions calls for one resolved model with querylab's retries and cache.

    ``options`` give retries, timeouts, sampling and the cache mode; ``cache`` is a
    :class:`ResponseCache` (None: no cache); ``sleep`` and ``rng`` are injectable for tests;
    ``limits``: per-model :class:`ModelLimits` (default: :func:`model_limits`, i.e. none unless
    ``QUERYLAB_MODEL_LIMITS`` is on).
    """

    def __init__(
        self,
        resolved: ResolvedModel,
        options: AgentOptions | None = None,
        cache: ResponseCache | None = None,
        sleep: Callable[[float], None] = interrupt.sleep,
        rng: random.Random | None = None,
        limits: ModelLimits | None | bool = True,
    ):
        self.resolved = resolved
        self.limits = model_limits(resolved.name) if limits is True else (limits or None)
        self.options = options or AgentOptions()
        self.cache = cache
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.sampling = {**resolved.sampling, **self.options.sampling()}
        self._local = threading.local()  # per thread: trials of a batch share the model
        #: () -> context manager held around each HTTP request (None: none): the trials
        #: stage's :func:`tasks.core.concurrency.call_slot` (calls in flight across the stage)
        self.call_slot: Callable[[], Any] | None = None
        self.client = openai_client(resolved.base_url, resolved.api_key,
                                    self.options.request_timeout_s)

    @property
    def in_flight(self) -> LLMCallRecord | None:
        """The record of this thread's call that reached the API while :meth:`complete` had
        not returned yet (None otherwise): when something raises after the response arrived
        (the cache write, decoding), the caller still counts the paid call
        (:func:`tasks.agents.react.run_react`)."""
        return getattr(self._local, "record", None)

    @in_flight.setter
    def in_flight(self, record: LLMCallRecord | None) -> None:
        self._local.record = record

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.client.close()

    def backoff_s(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before attempt ``attempt + 1``: ``Retry-After`` plus up to 10 %
        jitter when given, else ``base * 2**(attempt-1)`` capped at the maximum, times a
        jitter factor in [0.5, 1.0]."""
        o = self.options
        if retry_after is not None:
            return retry_after * (1.0 + 0.1 * self.rng.random())
        raw = min(o.retry_max_delay_s, o.retry_base_delay_s * 2 ** (attempt - 1))
        return raw * (0.5 + 0.5 * self.rng.random())

    def protocol(self) -> str:
        """How this model is asked for tool calls: ``native`` or ``json_schema`` as the models
        table says, or for ``auto`` the verdict of one probe request
        (:func:`tasks.agents.tool_protocol.detect`, once per model and endpoint per process; raises
        :class:`tasks.agents.tool_protocol.ProbeError` when the probe fails)."""
        r = self.resolved
        if r.tool_protocol != "auto":
            return r.tool_protocol
        return tool_protocol.detect(
            self.client.post, r.model_id, r.cache_base_url or r.base_url,
            self.options.request_timeout_s,
        )

    def complete(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        trial: int,
        call_index: int,
        deadline: float | None = None,
    ) -> tuple[ChatCompletion, LLMCallRecord]:
        """One model call: the cached response for this exact request and trial index, else
        the API with retries. ``deadline`` is a ``time.monotonic()`` instant bounding the call
        (request timeouts and retry waits are cut to it), moved by the time the call waited for
        a call slot (``record.queue_s``: querylab's own queue is not the caller's time; callers
        move their deadline by it too). With ``tools`` and the
        ``json_schema`` protocol (:meth:`protocol`) the request is encoded and the reply decoded
        by :mod:`tasks.agents.tool_protocol`: the caller sees OpenAI tool calls either way (the cache
        keeps the raw reply, keyed by the encoded request).

        Returns ``(response, record)``; raises :class:`LLMCallError` (reason ``api_error``,
        ``context_window`` or ``max_wall_time``) when the call fails for good.
        """
        self.in_flight = None
        encoded = None
        if tools:
            try:
                protocol = self.protocol()
            except tool_protocol.ProbeError as exc:
                r = self.resolved
                record = LLMCallRecord(call_index, r.model_id, r.base_url, priced=r.priced)
                return self._fail(record, time.monotonic(), "api_error", str(exc))
            if protocol == "json_schema":
                encoded = tool_protocol.encode(messages, tools)
                messages, tools = encoded.messages, None
        resp, record = self._call(
            messages, tools, encoded.body if encoded else {}, trial, call_index, deadline
        )
        if encoded is not None:
            resp, _ = tool_protocol.decode(resp, encoded, call_index)
            choice = resp.choices[0]
            record.finish_reason = choice.finish_reason
            record.n_tool_calls = len(choice.message.tool_calls or [])
        self.in_flight = None
        return resp, record

    def _call(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        body: dict,
        trial: int,
        call_index: int,
        deadline: float | None,
    ) -> tuple[ChatCompletion, LLMCallRecord]:
        """:meth:`complete` after the tool protocol: ``body`` holds extra request fields
        (``response_format``), sent and keyed like sampling parameters."""
        r = self.resolved
        record = LLMCallRecord(call_index, r.model_id, r.base_url, priced=r.priced)
        start = time.monotonic()
        params = {**self.sampling, **body}
        key = cache_key(r.model_id, r.cache_base_url or r.base_url, messages, tools, params, trial)
        if self.cache is not None:
            entry = self.cache.get(key)
            if entry is not None:
                try:
                    resp = ChatCompletion.model_validate(entry["response"])
                except ValidationError:
                    # what the API sent did not match the schema either (hostile model output
                    # in tool calls): build it as leniently as the client did
                    resp = _construct(entry["response"])
                except (KeyError, TypeError):
                    resp = None
                if resp is not None and resp.choices:
                    try:
                        self._fill(record, resp, cost=False)
                    except ValueError:  # a malformed usage cached by an older version
                        resp = None
                if resp is not None and resp.choices:
                    record.cache_hit = True
                    record.latency_s = time.monotonic() - start
                    return resp, record
        kwargs: dict[str, Any] = {"model": r.model_id, "messages": messages, **params}
        if tools:
            kwargs["tools"] = tools
        last_error: str | None = None  # the infrastructure failure being retried

        def until() -> float | None:
            # the deadline moved by the time spent waiting for a call slot: a queue in
            # querylab (other trials hold the slots) is not the trial's time (Inspect AI's
            # working time); the caller moves its own deadline by record.queue_s likewise
            return None if deadline is None else deadline + record.queue_s

        while True:
            record.attempts += 1
            timeout = self.options.request_timeout_s
            if deadline is not None:
                timeout = min(timeout, until() - time.monotonic())
                if timeout <= 0:
                    if last_error is not None:  # the wall time ran out waiting for the API
                        return self._fail(record, start, "api_error", _waited(last_error))
                    return self._fail(record, start, "max_wall_time", "trial wall time exhausted")
            try:
                # client.post is what chat.completions.create ends in (same HTTP, auth, error
                # mapping and ChatCompletion parsing) minus its per-call parameter transform,
                # a no-op for the plain JSON querylab builds that costs ms on long histories
                # in a thread of its own: abandoned at once on Ctrl-C / SIGTERM
                queued = time.monotonic()
                hold = _SlotHold(self.call_slot() if self.call_slot is not None
                                 else nullcontext())
                try:
                    record.queue_s += time.monotonic() - queued
                    if deadline is not None:  # the wait for the slot moved the deadline
                        timeout = min(timeout, max(0.001, until() - time.monotonic()))
                    # the request's own thread gives the slot back as the response is in: the
                    # next waiter starts its request without waiting for this trial's thread
                    # to wake up first (one thread hand-over less per call under the GIL)
                    if self.limits is None:
                        resp = interrupt.call(
                            hold.around, self.client.post, "/chat/completions", body=kwargs,
                            cast_to=ChatCompletion, options={"timeout": timeout},
                        )
                    else:
                        resp = interrupt.call(hold.around, self._limited_post, kwargs, timeout,
                                              until())
                finally:
                    hold.release()  # not started, or abandoned (Ctrl-C): given back here
                if not resp.choices:
                    raise _EmptyResponse("the response has no choices")
                break
            except _SlotWaitTimeout:
                # waiting for a slot is infrastructure (other trials hold them): errored
                return self._fail(
                    record, start, "api_error",
                    f"no slot of the model's Prefect concurrency/rate limits before the trial's "
                    f"wall time ran out ({', '.join(model_limit_names(r.name))}); the trial is "
                    "errored, not scored",
                )
            except ValueError as exc:  # a body that is not JSON / UTF-8: not retried
                return self._fail(record, start, "api_error",
                                  f"the API's response could not be decoded: {exc}"[:500])
            except (openai.OpenAIError, _EmptyResponse) as exc:
                if _is_context_overflow(exc):
                    _, _, msg = classify_error(exc)
                    return self._fail(record, start, "context_window", msg)
                retryable, ra, msg = classify_error(exc)
                if not retryable:
                    return self._fail(record, start, "api_error", msg)
                if deadline is not None and isinstance(exc, openai.APITimeoutError) and \
                        timeout < self.options.request_timeout_s and \
                        time.monotonic() + 0.05 >= until():
                    # the request was cut at the trial's deadline while the API had not answered
                    return self._fail(record, start, "api_error", _waited(msg))
                last_error = msg
                if record.attempts > self.options.max_retries:
                    return self._fail(
                        record, start, "api_error",
                        f"{msg} (gave up after {record.attempts} attempts)",
                    )
                if ra is not None and ra > self.options.max_retry_after_s:
                    return self._fail(
                        record, start, "api_error",
                        f"{msg}; Retry-After {ra:g} s exceeds the {self.options.max_retry_after_s:g}"
                        " s limit",
                    )
                wait = self.backoff_s(record.attempts, ra)
                if deadline is not None and time.monotonic() + wait >= until():
                    what = f"{msg}; Retry-After {ra:g} s" if ra is not None else msg
                    return self._fail(record, start, "api_error", _waited(what))
                log.info("model call %s failed (%s); retry %d in %.2f s",
                         r.model_id, msg, record.attempts, wait)
                self.sleep(wait)
        try:
            self._fill(record, resp, cost=True)
        except ValueError as exc:  # e.g. a usage count of 2**63 or NaN: not cached, errored
            return self._fail(record, start, "api_error", f"malformed model response: {exc}")
        record.latency_s = time.monotonic() - start - record.queue_s
        self.in_flight = record  # paid: kept by the caller even if what follows raises
        if self.cache is not None:
            self.cache.put(
                key,
                {
                    "response": resp.model_dump(mode="json", exclude_unset=True, warnings=False),
                    "cost_usd": record.cost_usd,
                    "model": r.model_id,
                    "base_url": r.base_url,
                    "trial": trial,
                },
            )
        return resp, record

    def _limited_post(self, kwargs: dict, timeout: float, deadline: float | None):
        """The HTTP request inside the model's limits; the request timeout is cut to what is
        left of the deadline once the slot is granted."""
        assert self.limits is not None
        with self.limits.hold(deadline):
            if deadline is not None:
                timeout = min(timeout, deadline - time.monotonic())
                if timeout <= 0:
                    raise _SlotWaitTimeout()
            return self.client.post(
                "/chat/completions", body=kwargs, cast_to=ChatCompletion,
                options={"timeout": timeout},
            )

    def _fill(self, record: LLMCallRecord, resp: ChatCompletion, cost: bool) -> None:
        prompt, cached, completion = usage_counts(resp.usage)
        record.prompt_tokens, record.cached_tokens = prompt, cached
        record.completion_tokens = completion
        choice = resp.choices[0]
        finish = getattr(choice, "finish_reason", None)
        record.finish_reason = None if finish is None else str(finish)[:100]
        calls = getattr(getattr(choice, "message", None), "tool_calls", None)
        record.n_tool_calls = len(calls) if isinstance(calls, list) else int(calls is not None)
        if cost:
            record.cost_usd = self.resolved.prices.cost_usd(prompt, cached, completion)

    def _fail(self, record: LLMCallRecord, start: float, reason: str, message: str):
        record.error = message
        record.latency_s = time.monotonic() - start - record.queue_s
        raise LLMCallError(reason, message, record)
