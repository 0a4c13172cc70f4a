"""What the suites that ask a model one turn at a time share (the text-to-SQL generators,
:mod:`tasks.text2sql.generators`, and the lifecycle agents, :mod:`tasks.lifecycle.agents`): one
reply (:class:`AgentReply`) and one chat model behind an OpenAI-compatible API
(:class:`ChatAgent`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.models import AgentOptions
from schemas.settings import Settings
from tasks.core.llm import (
    AgentConfigError,
    ChatModel,
    LLMCallError,
    ResponseCache,
    model_label,
    resolve_model,
    settings_env,
)

__all__ = ["AgentReply", "ChatAgent"]


@dataclass
class AgentReply:
    """One answer: ``content`` text, ``tool_calls`` ``[{"id", "name", "arguments" (JSON
    text)}]`` (none for a generator), tokens, ``latency_s`` (seconds), ``cost_usd`` (None when
    unknown) and ``error`` for an API failure (then there is no content)."""

    content: str | None
    tool_calls: list[dict] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cost_usd: float | None = 0.0
    error: str | None = None


class ChatAgent:
    """A chat model through :class:`tasks.core.llm.ChatModel`: ``model`` is resolved in the
    models table (endpoint, key, USD prices; ``data/models.yaml`` + ``QUERYLAB_MODELS``), a
    model in no file runs at the endpoint of ``settings`` (``QUERYLAB_OPENAI_BASE_URL`` /
    ``QUERYLAB_OPENAI_API_KEY``) unpriced (cost null). ``options``: the call options (infra-only
    retries honouring ``Retry-After``, sampling); ``cache``: the shared
    :class:`tasks.core.llm.ResponseCache` (None: no cache). Raises ``error`` (a subclass of
    :class:`AgentConfigError`) when the model cannot be resolved (no endpoint, missing key).

    Attributes: ``model``, ``label`` (the model column of rows), ``resolved``, ``chat``."""

    def __init__(self, model: str, settings: Settings, options: AgentOptions,
                 cache: ResponseCache | None = None,
                 error: type[AgentConfigError] = AgentConfigError):
        try:
            resolved = resolve_model(model, env=settings_env(settings))
        except AgentConfigError as exc:
            raise error(str(exc)) from None
        self.model = model
        self.label = model_label(model)
        self.resolved = resolved
        self.chat = ChatModel(resolved, options, cache)

    def ask(self, messages: list[dict], tools: list[dict] | None, trial: int,
            call_index: int) -> AgentReply:
        """One model call: ``messages`` (OpenAI chat format), ``tools`` (function specs; None
        or empty: none), ``trial`` and ``call_index`` as the response cache keys them
        (:meth:`tasks.core.llm.ChatModel.complete`). A call that still fails after the shared
        retries comes back with ``error`` set (``"api_error: ..."``, at most 500 characters),
        no content and its tokens and latency; a priced model's failed call costs 0.0, an
        unpriced one's None."""
        try:
            resp, rec = self.chat.complete(list(messages), tools or None, trial=trial,
                                           call_index=call_index)
        except LLMCallError as exc:
            rec = exc.record
            return AgentReply(
                None, [], rec.prompt_tokens, rec.completion_tokens, rec.latency_s,
                0.0 if rec.priced else None, f"api_error: {exc}"[:500],
            )
        cost = rec.cost_usd if rec.priced else None
        msg = resp.choices[0].message
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments or "{}"}
            for c in (msg.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]
        return AgentReply(
            msg.content, calls, rec.prompt_tokens, rec.completion_tokens, rec.latency_s, cost
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.chat.close()
