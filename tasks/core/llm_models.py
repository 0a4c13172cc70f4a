"""The models table and model resolution for ``openai:<model>`` and ``local:<name>`` agents:
:func:`load_models_config`, :func:`resolve_model` (endpoint, key, prices, context window),
:class:`ResolvedModel`, :class:`AgentConfigError`. Re-exported by :mod:`tasks.core.llm`.
"""

from __future__ import annotations

import copy
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import ValidationError

from schemas.models import AgentOptions, ModelConfig, ModelsConfig, Prices, check_base_url
from tasks.agents import tool_protocol
from tasks.core.settings import Settings, env_copy, environ

MODELS_FILE = Path(__file__).resolve().parents[2] / "data" / "models.yaml"
OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"



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


#: Parsed YAML of the models files by their text: each batch of a run resolves its model again,
#: and parsing ``data/models.yaml`` costs ~30 ms of CPU under the GIL (a dict lookup by the text
#: read each time cannot go stale). At most :data:`_PARSED_MAX` texts are kept.
_PARSED: dict[str, object] = {}
_PARSED_MAX = 32
_PARSED_LOCK = threading.Lock()


def _parse_yaml(text: str) -> object:
    """``yaml.safe_load(text)``, remembered by text; a deep copy each time (callers own it)."""
    with _PARSED_LOCK:
        if text in _PARSED:
            return copy.deepcopy(_PARSED[text])
    raw = yaml.safe_load(text)
    with _PARSED_LOCK:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[text] = copy.deepcopy(raw)
    return raw


def _read_models_file(path: Path) -> list[ModelConfig]:
    try:
        raw = _parse_yaml(path.read_text())
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
    if paths is None:
        paths = [MODELS_FILE, *Settings.read("models", env)]
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
    description, else None) and ``max_concurrency`` (calls to this model in flight at once:
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


def settings_env(settings: Settings) -> dict[str, str]:
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
    env_url = Settings.read("openai_base_url", env)
    named = agent_url or env_url
    source = "agent" if agent_url else "env" if env_url else None
    try:
        named = check_base_url(named) if named else None
    except ValueError as exc:
        where = f"openai:{name}" if agent_url else "QUERYLAB_OPENAI_BASE_URL"
        raise AgentConfigError(f"{where}: {exc}") from None
    generic_key = Settings.read("openai_api_key", env)
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
    from tasks.core.llm import ChatModel  # the model client imports this module

    chat = ChatModel(resolved, options, limits=False)
    try:
        return chat.protocol()
    except tool_protocol.ProbeError as exc:
        raise AgentConfigError(f"{resolved.name}: {exc}") from None
    finally:
        chat.close()
