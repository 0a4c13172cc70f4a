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
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai
import yaml
from openai.types.chat import ChatCompletion
from pydantic import ValidationError

from schemas.models import AgentOptions, ModelConfig, ModelsConfig, Prices, check_base_url
from tasks.core import interrupt
from tasks.core import storage
from tasks.agents import tool_protocol
from tasks.core.safe_text import terminal_text
from tasks.core.settings import env_copy, environ

log = logging.getLogger(__name__)

MODELS_FILE = Path(__file__).resolve().parents[2] / "data" / "models.yaml"
OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: Bump when the cache entry layout or key material changes.
CACHE_VERSION = "1"

if TYPE_CHECKING:
    from schemas.settings import Settings


class AgentConfigError(ValueError):
    """An agent cannot be run as configured (unknown kind, bad models file, missing key)."""


#: The model kinds of a model spec ``<kind>:<name>`` that are called through this module.
MODEL_KINDS = ("openai", "local")


def model_spec_name(spec: str) -> str | None:
    """What :func:`resolve_model` takes for a model spec: ``openai:<m>`` → ``<m>``,
    ``local:<m>`` → ``local:<m>`` (kept whole: it names a local model); None for any other
    spec (``oracle``, ``replay:...``, a bare name, an empty name)."""
    kind, _, name = spec.partition(":")
    if kind not in MODEL_KINDS or not name:
        return None
    return spec if kind == "local" else name


def model_label(name: str) -> str:
    """The label a model of :func:`resolve_model` is recorded under: ``local:<m>`` as it is,
    any other ``<m>`` as ``openai:<m>``."""
    return name if name.startswith("local:") else f"openai:{name}"


# --------------------------------------------------------------------------------------------
# Models table and resolution
# --------------------------------------------------------------------------------------------


def _read_models_file(path: Path) -> list[ModelConfig]:
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise AgentConfigError(f"{path}: models file not found") from exc
    except yaml.YAMLError as exc:
        raise AgentConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise AgentConfigError(
            f"{path}: expected a mapping with a `models:` list (as data/models.yaml), got "
            f"{'a list: put it under `models:`' if isinstance(raw, list) else type(raw).__name__}")
    try:
        return ModelsConfig.model_validate(raw).models
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "-"
        if first["loc"][:1] == ("models",) and len(first["loc"]) > 1:
            try:
                name = raw["models"][first["loc"][1]].get("name")
                loc += f" ({name})" if name else ""
            except (KeyError, IndexError, TypeError, AttributeError):
                pass
        raise AgentConfigError(f"{path}: {loc}: {first['msg']}") from None


def load_models_config(
    paths: list[str | Path] | None = None, env: dict[str, str] | None = None
) -> ModelsConfig:
    """The models table: ``data/models.yaml`` then each file of ``QUERYLAB_MODELS``
    (``os.pathsep``-separated), later entries replacing earlier ones of the same name.

    ``paths`` replaces the whole list of files when given. Raises AgentConfigError naming the
    file and field for a missing file, bad YAML or an invalid entry.
    """
    env = environ() if env is None else env
    if paths is None:
        extra = [p for p in (env.get("QUERYLAB_MODELS") or "").split(os.pathsep) if p]
        paths = [MODELS_FILE, *extra]
    merged: dict[str, ModelConfig] = {}
    for path in paths:
        for m in _read_models_file(Path(path)):
            merged[m.name] = m
    return ModelsConfig(models=list(merged.values()))


@dataclass
class ResolvedModel:
    """A model ready to call: ``name`` (as in ``openai:<name>``, without an ``@<url>``; or
    ``local:<name>`` whole), ``model_id`` (sent to the API), ``base_url`` (the endpoint
    actually called; no trailing ``/``, never credentials), ``api_key`` (never logged),
    ``prices`` (USD per million tokens), ``context_window`` (tokens, None when unknown),
    ``sampling`` defaults, ``provider``, ``priced`` (False: not in the models table, cost
    recorded as 0), ``base_url_source`` (``table``, ``agent`` for ``openai:<model>@<url>``,
    ``env`` for ``QUERYLAB_OPENAI_BASE_URL`` / ``OPENAI_BASE_URL``, ``default`` for OpenAI's,
    ``local`` for a server querylab runs), ``overridden_base_url`` (the models table's URL the
    named endpoint replaced, else None), ``tool_protocol`` (``native``, ``json_schema`` or
    ``auto``), ``cache_base_url`` (what the response-cache key uses instead of ``base_url``: a
    local server's port-free identity; None: ``base_url``), ``local`` (a local server's
    description, else None) and ``max_concurrency`` (trials of this model in flight at once:
    the models table's ``max_concurrency``, a local model's ``parallel`` slots by default;
    None: no cap of its own, see :mod:`tasks.core.concurrency`)."""

    name: str
    model_id: str
    base_url: str
    api_key: str = field(repr=False)
    prices: Prices
    context_window: int | None
    sampling: dict = field(default_factory=dict)
    provider: str = "openai"
    priced: bool = True
    base_url_source: str = "table"
    overridden_base_url: str | None = None
    tool_protocol: str = "native"
    cache_base_url: str | None = None
    local: dict | None = None
    max_concurrency: int | None = None

    def describe(self) -> dict:
        """JSON-able description without the key (for ``agents.json``)."""
        return {
            "name": self.name,
            "model_id": self.model_id,
            "provider": self.provider,
            "base_url": self.base_url,
            "base_url_source": self.base_url_source,
            "overridden_base_url": self.overridden_base_url,
            "priced": self.priced,
            "prices_usd_per_million": self.prices.model_dump(),
            "context_window": self.context_window,
            "sampling": self.sampling,
            "tool_protocol": self.tool_protocol,
            "max_concurrency": self.max_concurrency,
            **({"local": self.local} if self.local is not None else {}),
        }


#: ``<model>@<http(s) URL>``: a model name with the endpoint to call (a model id may itself
#: contain ``@``, e.g. ``claude-3-5-sonnet@20240620``; only an ``@`` followed by a URL counts).
_MODEL_AT_URL = re.compile(r"^(?P<model>.+?)@(?P<url>https?://\S+)$")


def split_model_url(name: str) -> tuple[str, str | None]:
    """``"m@http://h:8000/v1"`` → ``("m", "http://h:8000/v1")``; ``"m"`` → ``("m", None)``."""
    m = _MODEL_AT_URL.match(name)
    return (m["model"], m["url"]) if m else (name, None)


def endpoint_warning(resolved: ResolvedModel) -> str | None:
    """The warning to show when a named endpoint overrides the models table's, else None."""
    if resolved.overridden_base_url is None or resolved.overridden_base_url == resolved.base_url:
        return None
    via = {"agent": f"openai:{resolved.name}@<url>",
           "env": "QUERYLAB_OPENAI_BASE_URL"}.get(resolved.base_url_source, "the named endpoint")
    return (f"openai:{resolved.name}: {via} sends requests to {resolved.base_url}, not to the "
            f"models table's {resolved.overridden_base_url}")


def _first_env(env: dict[str, str], names: list[str]) -> str | None:
    for name in names:
        if env.get(name):
            return env[name]
    return None


def settings_env(settings: "Settings") -> dict[str, str]:
    """The process environment with the OpenAI endpoint variables replaced by ``settings``'
    (``QUERYLAB_OPENAI_BASE_URL`` / ``QUERYLAB_OPENAI_API_KEY``; the ``OPENAI_*`` fallbacks
    removed), for :func:`tasks.core.llm.resolve_model` of a model in no models file."""
    env = env_copy()
    for name in ("QUERYLAB_OPENAI_BASE_URL", "OPENAI_BASE_URL",
                 "QUERYLAB_OPENAI_API_KEY", "OPENAI_API_KEY"):
        env.pop(name, None)
    if settings.openai_base_url:
        env["QUERYLAB_OPENAI_BASE_URL"] = settings.openai_base_url
    if settings.openai_api_key:
        env["QUERYLAB_OPENAI_API_KEY"] = settings.openai_api_key
    return env


def resolve_model(
    name: str, config: ModelsConfig | None = None, env: dict[str, str] | None = None
) -> ResolvedModel:
    """Resolve ``<name>`` of ``openai:<name>`` (optionally ``<model>@<base url>``), or a whole
    ``local:<name>``.

    ``local:<name>``: the table's entry ``<name>`` must have a ``local`` block; its server is
    started now unless this process already runs it (:func:`tasks.agents.local_model.ensure_server`;
    AgentConfigError when xllamacpp or the weights are missing, saying how to install them, or
    when the server does not start); no named endpoint applies to it.

    The endpoint: the URL after ``@`` when given, else ``QUERYLAB_OPENAI_BASE_URL`` (or
    ``OPENAI_BASE_URL``), else the models table's ``base_url``, else OpenAI's — a named
    endpoint overrides the table (see :func:`endpoint_warning`). In the models table: its
    prices and context window; the key from ``QUERYLAB_OPENAI_API_KEY`` / ``OPENAI_API_KEY``
    when the endpoint was overridden and one is set, else from the entry's ``api_key_env``
    variables (AgentConfigError naming them when required, unset and the endpoint is the
    table's). Not in the table: ``QUERYLAB_OPENAI_API_KEY`` (or ``OPENAI_API_KEY``), prices 0
    and ``priced=False``; with neither a key nor an endpoint it raises AgentConfigError.
    """
    env = environ() if env is None else env
    config = load_models_config(env=env) if config is None else config
    if name.startswith("local:"):
        return _resolve_local(name.removeprefix("local:"), config)
    model, agent_url = split_model_url(name)
    env_url = _first_env(env, ["QUERYLAB_OPENAI_BASE_URL", "OPENAI_BASE_URL"])
    named = agent_url or env_url
    source = "agent" if agent_url else "env" if env_url else None
    try:
        named = check_base_url(named) if named else None
    except ValueError as exc:
        where = f"openai:{name}" if agent_url else "QUERYLAB_OPENAI_BASE_URL"
        raise AgentConfigError(f"{where}: {exc}") from None
    generic_key = _first_env(env, ["QUERYLAB_OPENAI_API_KEY", "OPENAI_API_KEY"])
    entry = config.get(model)
    if entry is not None and entry.local is not None:
        raise AgentConfigError(
            f"{model} is a local model (served by querylab): use local:{model}")
    if entry is not None:
        table_url = entry.base_url or OPENAI_DEFAULT_BASE_URL
        key = _first_env(env, entry.api_key_env) if entry.api_key_env else None
        if named:
            key = generic_key or key
        elif entry.api_key_env and entry.api_key_required and not key:
            raise AgentConfigError(
                f"openai:{model} needs an API key: set {' or '.join(entry.api_key_env)}"
            )
        return ResolvedModel(
            name=model,
            model_id=entry.model_id,
            base_url=named or table_url,
            api_key=key or "not-needed",
            prices=entry.prices,
            context_window=entry.context_window,
            sampling=dict(entry.sampling),
            provider=entry.provider,
            priced=True,
            base_url_source=source or "table",
            overridden_base_url=table_url if named and named != table_url else None,
            tool_protocol=entry.tool_protocol,
            max_concurrency=entry.max_concurrency,
        )
    if not generic_key and not named:
        raise AgentConfigError(
            f"openai:{model} is not in the models table ({MODELS_FILE.name} / QUERYLAB_MODELS) "
            "and no endpoint is configured: set QUERYLAB_OPENAI_API_KEY (or OPENAI_API_KEY), "
            "name the endpoint (openai:<model>@<base url> or QUERYLAB_OPENAI_BASE_URL), or add "
            "the model to a models file"
        )
    return ResolvedModel(
        name=model,
        model_id=model,
        base_url=named or OPENAI_DEFAULT_BASE_URL,
        api_key=generic_key or "not-needed",
        prices=Prices(input=0, output=0),
        context_window=None,
        provider="unlisted",
        priced=False,
        base_url_source=source or "default",
    )


def local_entry(name: str, config: ModelsConfig | None = None) -> ModelConfig:
    """The models-table entry of ``local:<name>`` after checking, without starting anything,
    that it can be served: the entry has a ``local`` block, ``xllamacpp`` is installed and the
    weights file exists. AgentConfigError saying what is missing and how to install it."""
    from tasks.agents import local_model

    config = load_models_config() if config is None else config
    entry = config.get(name)
    if entry is None or entry.local is None:
        local = sorted(m.name for m in config.models if m.local is not None)
        raise AgentConfigError(
            f"local:{name}: no local model of that name in the models table; have "
            f"{', '.join('local:' + n for n in local) or 'none'}"
        )
    if not local_model.xllamacpp_installed():
        raise AgentConfigError(f"local:{name} needs xllamacpp: {local_model.INSTALL_HINT}")
    try:
        local_model.weights_path(entry.local)
    except local_model.LocalModelError as exc:
        raise AgentConfigError(f"local:{name}: {exc}") from None
    return entry


def _resolve_local(name: str, config: ModelsConfig) -> ResolvedModel:
    """``local:<name>``: the entry's server (started or reused) as a resolved model."""
    from tasks.agents import local_model

    entry = local_entry(name, config)
    assert entry.local is not None
    try:
        server = local_model.ensure_server(name, entry.local, entry.context_window)
    except local_model.LocalModelError as exc:
        raise AgentConfigError(str(exc)) from None
    assert server.base_url is not None
    return ResolvedModel(
        name=f"local:{name}",
        model_id=entry.model_id,
        base_url=server.base_url,
        api_key=server.api_key,
        prices=entry.prices,
        context_window=entry.context_window,
        sampling=dict(entry.sampling),
        provider="local",
        priced=True,
        tool_protocol=entry.tool_protocol,
        cache_base_url=server.identity,
        local=server.describe(),
        max_concurrency=entry.max_concurrency or entry.local.parallel,
    )


def check_tool_protocol(resolved: ResolvedModel, options: AgentOptions | None = None) -> str:
    """The tool protocol ``resolved`` will use (``native`` or ``json_schema``); ``auto`` is
    probed now with one request (the preflight's job; the verdict is kept for the process).
    Raises AgentConfigError when the probe request fails."""
    if resolved.tool_protocol != "auto":
        return resolved.tool_protocol
    chat = ChatModel(resolved, options, limits=False)
    try:
        return chat.protocol()
    except tool_protocol.ProbeError as exc:
        raise AgentConfigError(f"{resolved.name}: {exc}") from None
    finally:
        chat.close()


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


# --------------------------------------------------------------------------------------------
# Call records
# --------------------------------------------------------------------------------------------


@dataclass
class LLMCallRecord:
    """One model call of a trial (a row of ``llm_calls.parquet`` without run/trial keys).

    Tokens as the provider reported them (on a cache hit: as reported when the response was
    first obtained); ``cost_usd`` what this call cost now (0 on a cache hit or failure);
    ``latency_s`` seconds from the first attempt to the response, retry waits included;
    ``attempts`` HTTP attempts (0 on a cache hit); ``error`` set when the call failed.
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


def usage_counts(usage: Any) -> tuple[int, int, int]:
    """``(prompt_tokens, cached_tokens, completion_tokens)`` of an OpenAI usage object (zeros
    when absent; ``cached_tokens`` from ``prompt_tokens_details.cached_tokens``)."""
    if usage is None:
        return 0, 0, 0
    details = getattr(usage, "prompt_tokens_details", None)
    cached = (getattr(details, "cached_tokens", None) or 0) if details is not None else 0
    return usage.prompt_tokens or 0, cached, usage.completion_tokens or 0


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


# --------------------------------------------------------------------------------------------
# Per-model concurrency and rate limits (Prefect global concurrency limits, opt-in)
# --------------------------------------------------------------------------------------------

#: ``prefect`` (or ``on`` / ``1`` / ``true``) turns per-model limits on; unset or ``off``: none.
MODEL_LIMITS_ENV = "QUERYLAB_MODEL_LIMITS"
_PREFECT_BANNED = re.compile(r"[/%&<>]")


def model_limit_names(name: str) -> tuple[str, str]:
    """``("model:<name>", "model-rate:<name>")``: the Prefect global concurrency limits that
    bound ``openai:<name>`` (``<name>`` as in the models table; the characters Prefect bans in
    names, ``/ % & < >``, become ``_``)."""
    safe = _PREFECT_BANNED.sub("_", name)
    return f"model:{safe}", f"model-rate:{safe}"


def model_limits_enabled(env: dict[str, str] | None = None) -> bool:
    """True when ``QUERYLAB_MODEL_LIMITS`` asks for Prefect limits; AgentConfigError for an
    unknown value."""
    value = ((environ() if env is None else env).get(MODEL_LIMITS_ENV) or "").strip().lower()
    if value in ("", "0", "off", "false", "no", "none"):
        return False
    if value in ("prefect", "1", "on", "true", "yes"):
        return True
    raise AgentConfigError(f"{MODEL_LIMITS_ENV}={value!r}: use 'prefect' (on) or 'off'")


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


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


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
        self.client = openai.OpenAI(
            base_url=resolved.base_url,
            api_key=resolved.api_key,
            max_retries=0,
            timeout=self.options.request_timeout_s,
        )

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
        (request timeouts and retry waits are cut to it). With ``tools`` and the
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
                    self._fill(record, resp, cost=False)
                    record.cache_hit = True
                    record.latency_s = time.monotonic() - start
                    return resp, record
        kwargs: dict[str, Any] = {"model": r.model_id, "messages": messages, **params}
        if tools:
            kwargs["tools"] = tools
        last_error: str | None = None  # the infrastructure failure being retried
        while True:
            record.attempts += 1
            timeout = self.options.request_timeout_s
            if deadline is not None:
                timeout = min(timeout, deadline - time.monotonic())
                if timeout <= 0:
                    if last_error is not None:  # the wall time ran out waiting for the API
                        return self._fail(record, start, "api_error", _waited(last_error))
                    return self._fail(record, start, "max_wall_time", "trial wall time exhausted")
            try:
                # client.post is what chat.completions.create ends in (same HTTP, auth, error
                # mapping and ChatCompletion parsing) minus its per-call parameter transform,
                # a no-op for the plain JSON querylab builds that costs ms on long histories
                # in a thread of its own: abandoned at once on Ctrl-C / SIGTERM
                if self.limits is None:
                    resp = interrupt.call(
                        self.client.post, "/chat/completions", body=kwargs,
                        cast_to=ChatCompletion, options={"timeout": timeout},
                    )
                else:
                    resp = interrupt.call(self._limited_post, kwargs, timeout, deadline)
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
                        time.monotonic() + 0.05 >= deadline:
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
                if deadline is not None and time.monotonic() + wait >= deadline:
                    what = f"{msg}; Retry-After {ra:g} s" if ra is not None else msg
                    return self._fail(record, start, "api_error", _waited(what))
                log.info("model call %s failed (%s); retry %d in %.2f s",
                         r.model_id, msg, record.attempts, wait)
                self.sleep(wait)
        self._fill(record, resp, cost=True)
        record.latency_s = time.monotonic() - start
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
        record.latency_s = time.monotonic() - start
        raise LLMCallError(reason, message, record)
