"""Agents of the lifecycle suite: ``oracle``, ``replay:<path>`` and ``openai:<model>``.

Every agent answers one model call at a time: ``respond(item, step, messages, tools)`` returns
an :class:`AgentReply` (text and/or tool calls, tokens, cost, latency, API error) or None when
it has nothing to say (a replay without a recorded answer). ``step`` is the call's index within
the item: the debugging round, the graph node, the expert turn; 0 otherwise.

- ``oracle`` answers every call with the item's reference (reference schema, DDL, gold SQL,
  gold node SQL, right experts, expected tool calls): the pipeline's self-check, it must score
  1.0 on every phase.
- ``replay:<file.jsonl>`` replays answers produced elsewhere, one JSON object per line:
  ``{"item_id": ..., "step": 0, "response": "..."}`` or, for Expert items,
  ``{"item_id": ..., "step": 0, "tool_calls": [{"name": ..., "arguments": {...}}]}``; lines
  without ``step`` are numbered in file order per item.
- ``openai:<model>`` calls a chat model through the ``openai`` client at
  ``QUERYLAB_OPENAI_BASE_URL`` with ``QUERYLAB_OPENAI_API_KEY`` (:class:`schemas.settings.Settings`),
  with the same request shape, retries (the client's own, for 429/5xx/timeouts) and cost rule
  (tokens × ``prices`` per million, null when unpriced) as :mod:`tasks.text2sql`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.lifecycle import LifecycleConfig
from schemas.settings import Settings

__all__ = [
    "Agent",
    "AgentConfigError",
    "AgentReply",
    "OpenAIAgent",
    "OracleAgent",
    "ReplayAgent",
    "agent_label",
    "check_agent_spec",
    "make_agent",
]


class AgentConfigError(ValueError):
    """An agent spec cannot be used (unknown kind, missing replay file, no API settings)."""


@dataclass
class AgentReply:
    """One answer: ``content`` text, ``tool_calls`` ``[{"id", "name", "arguments" (JSON
    text)}]``, tokens, ``latency_s``, ``cost_usd`` (None when unknown) and ``error`` for an API
    failure (then there is no content)."""

    content: str | None
    tool_calls: list[dict] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cost_usd: float | None = 0.0
    error: str | None = None


class Agent:
    """Base class: ``label`` (the model column of results) and :meth:`respond`."""

    label = "agent"

    def respond(
        self, item: dict, step: int, messages: list[dict], tools: list[dict] | None
    ) -> AgentReply | None:
        raise NotImplementedError


class OracleAgent(Agent):
    """Answers with the item's reference (see :func:`tasks.lifecycle.runner.oracle_answer`)."""

    label = "oracle"

    def respond(self, item, step, messages, tools):
        from tasks.lifecycle.runner import oracle_answer

        answer = oracle_answer(item, step)
        if answer is None:
            return None
        if isinstance(answer, list):
            return AgentReply(
                None,
                [
                    {
                        "id": f"oracle_{step}_{i}",
                        "name": c["name"],
                        "arguments": json.dumps(c["arguments"]),
                    }
                    for i, c in enumerate(answer)
                ],
            )
        return AgentReply(answer)


class ReplayAgent(Agent):
    """Replays recorded answers from a JSONL file (module docstring). ``label`` is
    ``replay:<file name without extension>``. Raises :class:`AgentConfigError` for a missing,
    empty or malformed file (naming the line)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.label = f"replay:{self.path.stem}"
        self.answers: dict[tuple[str, int], dict] = {}
        if not self.path.is_file():
            raise AgentConfigError(f"{self.path}: replay file not found (a .jsonl file)")
        counters: dict[str, int] = {}
        for lineno, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                item_id = str(obj["item_id"])
                if "response" not in obj and "tool_calls" not in obj:
                    raise KeyError("response")
                step = int(obj["step"]) if "step" in obj else counters.get(item_id, 0)
                calls = obj.get("tool_calls") or []
                if not isinstance(calls, list) or any(
                    not isinstance(c, dict) or "name" not in c for c in calls
                ):
                    raise ValueError("tool_calls")
            except (ValueError, KeyError, TypeError):
                raise AgentConfigError(
                    f"{self.path}:{lineno}: expected a JSON object with item_id and response "
                    "(or tool_calls: [{name, arguments}])"
                ) from None
            counters[item_id] = step + 1
            self.answers[(item_id, step)] = obj
        if not self.answers:
            raise AgentConfigError(f"{self.path}: no recorded answers")

    def respond(self, item, step, messages, tools):
        obj = self.answers.get((item["item_id"], step))
        if obj is None:
            return None
        calls = [
            {
                "id": f"replay_{step}_{i}",
                "name": str(c["name"]),
                "arguments": c.get("arguments")
                if isinstance(c.get("arguments"), str)
                else json.dumps(c.get("arguments") or {}),
            }
            for i, c in enumerate(obj.get("tool_calls") or [])
        ]
        resp = obj.get("response")
        return AgentReply(None if resp is None else str(resp), calls)


class OpenAIAgent(Agent):
    """A chat model behind an OpenAI-compatible API (module docstring). API failures after the
    client's retries come back as an :class:`AgentReply` with ``error`` set."""

    def __init__(self, model: str, settings: Settings, config: LifecycleConfig):
        import openai

        if not settings.openai_api_key and not settings.openai_base_url:
            raise AgentConfigError(
                "openai: agents need QUERYLAB_OPENAI_API_KEY (or OPENAI_API_KEY), or "
                "QUERYLAB_OPENAI_BASE_URL for a local server"
            )
        self.model = model
        self.label = f"openai:{model}"
        self.config = config
        self.price = config.prices.get(model)
        self.client = openai.OpenAI(
            base_url=settings.openai_base_url,
            api_key=settings.openai_api_key or "not-needed",
            timeout=config.request_timeout_s,
            max_retries=config.api_retries,
        )

    def respond(self, item, step, messages, tools):
        import openai

        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.config.temperature,
        }
        if self.config.max_tokens:
            kwargs["max_tokens"] = self.config.max_tokens
        if tools:
            kwargs["tools"] = tools
        start = time.perf_counter()
        try:
            resp = self.client.chat.completions.create(**kwargs)
        except openai.OpenAIError as e:
            status = getattr(e, "status_code", None)
            msg = f"api_error: {type(e).__name__}" + (f" {status}" if status else "") + f": {e}"
            return AgentReply(
                None, latency_s=time.perf_counter() - start, cost_usd=None, error=msg[:500]
            )
        latency = time.perf_counter() - start
        usage = resp.usage
        pt = int(getattr(usage, "prompt_tokens", 0) or 0)
        ct = int(getattr(usage, "completion_tokens", 0) or 0)
        cost = None if self.price is None else (pt * self.price[0] + ct * self.price[1]) / 1e6
        if not resp.choices:
            return AgentReply(
                None, [], pt, ct, latency, cost, "api_error: the response has no choices"
            )
        msg = resp.choices[0].message
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments or "{}"}
            for c in (msg.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]
        return AgentReply(msg.content, calls, pt, ct, latency, cost)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.client.close()


def check_agent_spec(spec: str) -> None:
    """Raise :class:`AgentConfigError` unless ``spec`` is ``oracle``, ``openai:<model>`` or
    ``replay:<path>`` with an existing file (checked before any work is mapped)."""
    kind, _, arg = spec.partition(":")
    if spec == "oracle" or (kind == "openai" and arg):
        return
    if kind == "replay" and arg:
        if not Path(arg).is_file():
            raise AgentConfigError(f"{arg}: replay file not found (a .jsonl file)")
        return
    raise AgentConfigError(
        f"unknown agent {spec!r}; use 'oracle', 'openai:<model>' or 'replay:<file.jsonl>'"
    )


def agent_label(spec: str) -> str:
    """The model label an agent spec records (``replay:<path>`` → ``replay:<file stem>``)."""
    kind, _, arg = spec.partition(":")
    return f"replay:{Path(arg).stem}" if kind == "replay" and arg else spec


def make_agent(
    spec: str, settings: Settings | None = None, config: LifecycleConfig | None = None
) -> Agent:
    """An agent from its spec (module docstring). Raises :class:`AgentConfigError`."""
    check_agent_spec(spec)
    if spec == "oracle":
        return OracleAgent()
    kind, _, arg = spec.partition(":")
    if kind == "replay":
        return ReplayAgent(arg)
    return OpenAIAgent(arg, settings or Settings.from_env(), config or LifecycleConfig())
