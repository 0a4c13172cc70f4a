"""One model call's record (:class:`LLMCallRecord`), its errors (:class:`LLMCallError`) and the
retry policy: which failures are retried (HTTP 408, 429, 5xx, timeouts, connection errors) and
how long ``Retry-After`` asks to wait. Re-exported by :mod:`tasks.core.llm`.
"""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass
from typing import Any

import openai

from tasks.core.safe_text import terminal_text

# --------------------------------------------------------------------------------------------
# Call records
# --------------------------------------------------------------------------------------------


@dataclass
class LLMCallRecord:
    """One model call of a trial (a row of ``llm_calls.parquet`` without run/trial keys).

    Tokens as the provider reported them (on a cache hit: as reported when the response was
    first obtained); ``cost_usd`` what this call cost now (0 on a cache hit or failure);
    ``latency_s`` seconds from the first attempt to the response, retry waits included and
    the wait for a call slot left out; ``queue_s`` seconds spent waiting for a call slot
    (the stage's ``--max-concurrency`` or the model's ``max_concurrency``: a queue, not the
    model's latency); ``attempts`` HTTP attempts (0 on a cache hit); ``error`` set when the call failed.
    """

    call_index: int
    model: str
    base_url: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    finish_reason: str | None = None
    n_tool_calls: int = 0
    attempts: int = 0
    queue_s: float = 0.0
    cache_hit: bool = False
    error: str | None = None
    priced: bool = True


def _waited(what: str) -> str:
    """The error of a trial whose wall time ran out waiting for the model API (a hang, a
    timeout, a ``Retry-After`` longer than the time left): infrastructure, so the trial is
    errored (``api_error``) and retried with ``--retry-errors``, never scored incorrect."""
    return (f"the model API did not answer before the trial's wall time ran out ({what}); "
            "errored, not scored: retry with --retry-errors (or raise --trial-timeout)")


class _EmptyResponse(Exception):
    """A 200 response without choices (treated as a non-retryable API error)."""


class LLMCallError(Exception):
    """A model call failed for good. ``reason`` is the trial's terminate reason
    (``api_error``, ``context_window`` or ``max_wall_time``); ``record`` the call's record."""

    def __init__(self, reason: str, message: str, record: LLMCallRecord):
        super().__init__(message)
        self.reason, self.record = reason, record


#: The most tokens one model call may report per count; more is a malformed response.
MAX_USAGE_TOKENS = 10**9


def _token_count(value: Any, field: str) -> int:
    """``value`` as a token count (None → 0); ValueError naming ``field`` for anything but a
    whole number in ``[0, MAX_USAGE_TOKENS]`` (NaN, 1e300, 2**63, -5, "12", [1])."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"usage.{field} is not a number: {str(value)[:40]!r}")
    if isinstance(value, float) and not value.is_integer():  # NaN, inf and 1.5 too
        raise ValueError(f"usage.{field} is not a whole number: {value!r}")
    if not 0 <= value <= MAX_USAGE_TOKENS:
        raise ValueError(f"usage.{field} out of range [0, {MAX_USAGE_TOKENS}]: "
                         f"{str(value)[:40]}")
    return int(value)


def usage_counts(usage: Any) -> tuple[int, int, int]:
    """``(prompt_tokens, cached_tokens, completion_tokens)`` of an OpenAI usage object (zeros
    when absent; ``cached_tokens`` from ``prompt_tokens_details.cached_tokens``). Raises
    ValueError for a count that is not a whole number in ``[0, MAX_USAGE_TOKENS]`` (the
    endpoint's reply is malformed: it must not reach cost, budgets or int64 columns)."""
    if usage is None:
        return 0, 0, 0
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    return (_token_count(getattr(usage, "prompt_tokens", None), "prompt_tokens"),
            _token_count(cached, "prompt_tokens_details.cached_tokens"),
            _token_count(getattr(usage, "completion_tokens", None), "completion_tokens"))


# --------------------------------------------------------------------------------------------
# Retries
# --------------------------------------------------------------------------------------------


#: The response-cache namespace of LLM judges (failure-mode and SQL-equivalence judges).
JUDGE_CACHE = "judge"


def retry_after_s(headers: Any) -> float | None:
    """Seconds asked for by ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date);
    None when absent or unreadable."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def classify_error(exc: Exception) -> tuple[bool, float | None, str]:
    """``(retryable, retry_after_s, message)`` for an exception from the openai client.

    Retryable: HTTP 408/429/5xx, timeouts, connection errors. The message never includes
    request headers (so never the key), nor escape sequences or control characters
    (:func:`tasks.core.safe_text.terminal_text`: it is printed and logged).
    """
    if isinstance(exc, openai.APITimeoutError):
        return True, None, "request timed out"
    if isinstance(exc, openai.APIConnectionError):
        return True, None, f"connection error: {terminal_text(exc, 300)}"
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retryable = status in (408, 429) or status >= 500
        ra = retry_after_s(exc.response.headers) if exc.response is not None else None
        msg = exc.message if isinstance(exc.message, str) else str(exc)
        return retryable, ra, f"HTTP {status}: {terminal_text(msg, 300)}"
    return False, None, f"{type(exc).__name__}: {terminal_text(exc, 300)}"


def _is_context_overflow(exc: Exception) -> bool:
    if not isinstance(exc, openai.BadRequestError):
        return False
    code = getattr(exc, "code", None) or ""
    text = str(exc).lower()
    return code == "context_length_exceeded" or "context length" in text or (
        "maximum context" in text
    )
