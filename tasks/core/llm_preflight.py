"""Preflight: one minimal real request per model before a run builds anything (key accepted,
endpoint reachable, model known, tool calling accepted), bounded in time. Re-exported by
:mod:`tasks.core.llm`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import openai
from openai.types.chat import ChatCompletion
from pydantic import ValidationError

from schemas.models import AgentOptions
from tasks.core.llm_calls import usage_counts
from tasks.core.llm_models import ResolvedModel, model_label
from tasks.core.safe_text import terminal_text

# --------------------------------------------------------------------------------------------
# Preflight: one minimal real request before a run builds anything
# --------------------------------------------------------------------------------------------

#: The one tool of a preflight request (checks that the endpoint accepts ``tools``).
PREFLIGHT_TOOL = {
    "type": "function",
    "function": {
        "name": "ping",
        "description": "Answer the check through this tool.",
        "parameters": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                       "required": []},
    },
}
#: The user message of a preflight request (scripted test servers recognise it).
PREFLIGHT_PROMPT = "querylab preflight check: reply OK."
#: Seconds a whole preflight of one model may take (connect + request + one retry).
PREFLIGHT_TIMEOUT_S = 8.0
#: The same for a model querylab serves itself (on this machine, but maybe a busy one).
LOCAL_PREFLIGHT_TIMEOUT_S = 60.0


@dataclass
class PreflightResult:
    """The outcome of :func:`preflight` for one model.

    ``ok``: the model can be used. ``problem``: one line saying what is wrong (None when ok);
    ``warning``: something to tell the user that does not stop the run (rate-limited at the
    check); ``status``: the HTTP status of the last attempt (None
    without a response); ``tools_accepted``: True when the endpoint accepted a request with
    ``tools``, False when it rejected them, None when unknown (no answer); ``latency_s``:
    seconds the check took; ``model_id`` / ``base_url``: what was called; ``requests``: HTTP
    requests the endpoint answered (or timed out on); ``prompt_tokens`` / ``completion_tokens``
    / ``cost_usd`` (USD, the model's prices) of the answer: the check is a paid call, recorded
    with the run (:func:`tasks.core.runs.record_preflight`)."""

    agent: str
    model_id: str
    base_url: str
    ok: bool
    problem: str | None = None
    warning: str | None = None
    status: int | None = None
    tools_accepted: bool | None = None
    latency_s: float = 0.0
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    priced: bool = True

    def line(self) -> str:
        """``"<agent> at <base url>: <problem>"`` (or ``ok``): the one line the CLI prints."""
        return f"{self.agent} at {self.base_url}: {self.problem or 'ok'}"


def _cause(exc: BaseException) -> str:
    """The innermost message of an exception chain (``[Errno 111] Connection refused``)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    text = str(exc).strip() or type(exc).__name__
    return terminal_text(text.splitlines()[0], 200)


def preflight(
    resolved: ResolvedModel,
    options: AgentOptions | None = None,
    timeout_s: float = PREFLIGHT_TIMEOUT_S,
    tools: list[dict] | None = None,
) -> PreflightResult:
    """One minimal real Chat Completions request to ``resolved`` (never cached): the question
    :data:`PREFLIGHT_PROMPT`, ``tools`` (default: :data:`PREFLIGHT_TOOL`; ``[]`` sends none),
    the model's and ``options``' sampling parameters and ``max_completion_tokens`` 16.

    Checks, each reported as one line in ``problem``: the endpoint is reachable (connection
    refused, DNS, TLS, timeout), the key is accepted (401/403), the model is known (404), the
    request — tools and sampling parameters included — is accepted (400; ``tools_accepted`` is
    False when the error is about tools), the answer is a chat completion. A 429 passes with a
    warning (reachable and authenticated; the run's retries handle rate limits) unless the
    provider says the quota is used up. One retry on 5xx / connection errors while time is
    left. Never raises for endpoint problems; the whole check ends within ``timeout_s``.
    Engineer-facing contract: ``preflight(resolved, options=None, timeout_s=8.0, tools=None)
    -> PreflightResult``."""
    import httpx

    agent = model_label(resolved.name)
    result = PreflightResult(agent, resolved.model_id, resolved.base_url, ok=False,
                             priced=resolved.priced)
    sampling = {**resolved.sampling, **(options.sampling() if options else {})}
    body: dict[str, Any] = {
        "model": resolved.model_id,
        "messages": [{"role": "user", "content": PREFLIGHT_PROMPT}],
        **sampling,
    }
    if "max_tokens" not in body:
        body["max_completion_tokens"] = 16
    sent_tools = [PREFLIGHT_TOOL] if tools is None else tools
    if sent_tools:
        body["tools"] = sent_tools
    start = time.monotonic()
    deadline = start + timeout_s
    client = openai.OpenAI(base_url=resolved.base_url, api_key=resolved.api_key, max_retries=0)
    try:
        for attempt in (1, 2):
            left = deadline - time.monotonic()
            if left <= 0.2:
                break
            timeout = httpx.Timeout(left, connect=min(3.0, left))
            try:
                resp = client.post("/chat/completions", body=body, cast_to=ChatCompletion,
                                   options={"timeout": timeout})
                result.requests += 1
                prompt, cached, completion = usage_counts(getattr(resp, "usage", None))
                result.prompt_tokens += prompt
                result.completion_tokens += completion
                result.cost_usd += resolved.prices.cost_usd(prompt, cached, completion)
            except openai.APITimeoutError:
                result.requests += 1
                result.status, result.problem = None, f"no answer within {timeout_s:g} s (timeout)"
                break
            except openai.APIConnectionError as exc:
                result.problem = f"endpoint unreachable: {_cause(exc)}"
                if attempt == 1 and deadline - time.monotonic() > 1.5:
                    time.sleep(0.5)
                    continue
                break
            except openai.APIStatusError as exc:
                result.requests += 1
                result.status = exc.status_code
                msg = exc.message if isinstance(exc.message, str) else str(exc)
                msg = terminal_text(msg, 200)
                code = str(getattr(exc, "code", "") or "")
                if exc.status_code in (401, 403):
                    result.problem = f"the API key was refused (HTTP {exc.status_code}): {msg}"
                elif exc.status_code == 404:
                    result.problem = (
                        f"HTTP 404: {msg} (model {resolved.model_id!r} unknown there, or the base "
                        f"URL is wrong: requests go to {resolved.base_url}/chat/completions)"
                    )
                elif exc.status_code == 429:
                    if "quota" in code or "quota" in msg.lower():
                        result.problem = f"quota used up (HTTP 429): {msg}"
                    else:
                        result.ok, result.tools_accepted = True, None
                        result.warning = f"rate-limited at the check (HTTP 429): {msg}"
                elif exc.status_code in (400, 422):
                    if sent_tools and re.search(r"(?i)tool|function", msg):
                        result.tools_accepted = False
                        result.problem = f"tool calling not accepted (HTTP {exc.status_code}): {msg}"
                    else:
                        result.problem = f"request rejected (HTTP {exc.status_code}): {msg}"
                elif exc.status_code >= 500:
                    result.problem = f"the endpoint failed (HTTP {exc.status_code}): {msg}"
                    if attempt == 1 and deadline - time.monotonic() > 1.5:
                        time.sleep(0.5)
                        continue
                else:
                    result.problem = f"HTTP {exc.status_code}: {msg}"
                break
            except (openai.OpenAIError, ValidationError, ValueError) as exc:
                result.problem = f"not an OpenAI-compatible answer: {_cause(exc)}"
                break
            else:
                if not getattr(resp, "choices", None):
                    result.problem = "not an OpenAI-compatible answer: no choices"
                else:
                    result.ok, result.problem, result.status = True, None, 200
                    result.tools_accepted = True if sent_tools else None
                break
    finally:
        client.close()
        result.latency_s = time.monotonic() - start
    return result
