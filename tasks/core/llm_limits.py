"""Per-model concurrency and rate limits (Prefect global concurrency limits, opt-in with
``QUERYLAB_MODEL_LIMITS=prefect``): :class:`ModelLimits`, :func:`model_limits`. Re-exported by
:mod:`tasks.core.llm`.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from tasks.core.llm_models import AgentConfigError
from tasks.core.settings import Settings, SettingsError

log = logging.getLogger("tasks.core.llm")

# --------------------------------------------------------------------------------------------
# Per-model concurrency and rate limits (Prefect global concurrency limits, opt-in)
# --------------------------------------------------------------------------------------------

#: ``prefect`` (or ``on`` / ``1`` / ``true``) turns per-model limits on; unset or ``off``: none.
MODEL_LIMITS_ENV = Settings.env_names("model_limits")[0]
_PREFECT_BANNED = re.compile(r"[/%&<>]")


def model_limit_names(name: str) -> tuple[str, str]:
    """``("model:<name>", "model-rate:<name>")``: the Prefect global concurrency limits that
    bound ``openai:<name>`` (``<name>`` as in the models table; the characters Prefect bans in
    names, ``/ % & < >``, become ``_``)."""
    safe = _PREFECT_BANNED.sub("_", name)
    return f"model:{safe}", f"model-rate:{safe}"


def model_limits_enabled(env: dict[str, str] | None = None) -> bool:
    """True when ``QUERYLAB_MODEL_LIMITS`` asks for Prefect limits; AgentConfigError for an
    unknown value. Read from ``env`` (default the process environment) at each call."""
    try:
        return Settings.read("model_limits", env)
    except SettingsError as exc:
        raise AgentConfigError(str(exc)) from None


class _SlotWaitTimeout(Exception):
    """No limit slot was granted before the trial's deadline."""


class ModelLimits:
    """The Prefect global concurrency limits of one model, looked up once.

    ``concurrency``: name of an existing, active limit whose slots are held while a request is in
    flight (None: none); ``rate``: name of an existing, active limit with slot decay, one slot
    per request (None: none). Create them with the Prefect CLI, e.g.
    ``prefect gcl create model:gpt-4o-mini --limit 8`` (8 requests in flight) and
    ``prefect gcl create model-rate:gpt-4o-mini --limit 10 --slot-decay-per-second 5``
    (bursts of 10, 5 requests per second sustained)."""

    def __init__(self, name: str, concurrency: str | None, rate: str | None):
        self.name, self.concurrency, self.rate = name, concurrency, rate

    def __bool__(self) -> bool:
        return bool(self.concurrency or self.rate)

    @classmethod
    def lookup(cls, name: str) -> ModelLimits:
        """Read both limits of ``name`` from the Prefect API (``PREFECT_API_URL``); a missing,
        inactive or (for the rate limit) decay-less limit is left out with a warning."""
        from prefect.client.orchestration import get_client
        from prefect.exceptions import ObjectNotFound

        conc_name, rate_name = model_limit_names(name)
        found: dict[str, str | None] = {"concurrency": None, "rate": None}
        with get_client(sync_client=True) as client:
            for kind, limit_name in (("concurrency", conc_name), ("rate", rate_name)):
                try:
                    limit = client.read_global_concurrency_limit_by_name(limit_name)
                except ObjectNotFound:
                    continue
                if not limit.active:
                    log.warning("global concurrency limit %s is inactive: not used", limit_name)
                elif kind == "rate" and not limit.slot_decay_per_second:
                    log.warning("global concurrency limit %s has no slot decay, so it cannot "
                                "limit a rate: not used", limit_name)
                else:
                    found[kind] = limit_name
        limits = cls(name, found["concurrency"], found["rate"])
        if not limits:
            log.warning("%s is on but neither %s nor %s exists in Prefect: calls to %s are not "
                        "limited", MODEL_LIMITS_ENV, conc_name, rate_name, name)
        return limits

    @contextmanager
    def hold(self, deadline: float | None = None) -> Iterator[None]:
        """Take a rate slot, then hold a concurrency slot for the block. Waits at most until
        ``deadline`` (``time.monotonic()``; None: as long as it takes), then raises
        :class:`_SlotWaitTimeout`."""
        from prefect.concurrency.sync import concurrency, rate_limit

        def remaining() -> float | None:
            if deadline is None:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise _SlotWaitTimeout()
            return left

        stack = ExitStack()
        try:
            if self.rate:
                rate_limit(self.rate, occupy=1, timeout_seconds=remaining())
            if self.concurrency:
                stack.enter_context(
                    concurrency(self.concurrency, occupy=1, timeout_seconds=remaining())
                )
        except TimeoutError as exc:  # AcquireConcurrencySlotTimeoutError
            stack.close()
            raise _SlotWaitTimeout() from exc
        except BaseException:
            stack.close()
            raise
        with stack:
            yield


_LIMITS_CACHE: dict[str, ModelLimits] = {}


def model_limits(name: str, env: dict[str, str] | None = None) -> ModelLimits | None:
    """The limits of ``openai:<name>`` when ``QUERYLAB_MODEL_LIMITS`` is on (looked up once per
    process and model), else None."""
    if not model_limits_enabled(env):
        return None
    if name not in _LIMITS_CACHE:
        _LIMITS_CACHE[name] = ModelLimits.lookup(name)
    return _LIMITS_CACHE[name] or None


def forget_model_limits() -> None:
    """Forget looked-up limits (after creating or deleting one in the same process)."""
    _LIMITS_CACHE.clear()
