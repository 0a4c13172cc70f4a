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
- ``openai:<model>`` calls a chat model through the shared model layer :mod:`tasks.core.llm`, like
  :mod:`tasks.text2sql.generators`: the model is resolved in the models table (``data/models.yaml`` +
  ``QUERYLAB_MODELS``: endpoint, key, USD prices), a model in no file runs at
  ``QUERYLAB_OPENAI_BASE_URL`` / ``QUERYLAB_OPENAI_API_KEY`` (:class:`schemas.settings.Settings`)
  with a null (unknown) cost; infra-only retries with backoff honouring ``Retry-After``
  (``api_retries``), the response cache under ``<artifacts>/cache/llm`` (keyed by the item and
  the conversation, so each debugging round or graph node is its own entry; see
  :func:`item_trial_index`) and the optional per-model Prefect limits.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from schemas.lifecycle import LifecycleConfig
from schemas.settings import Settings
from tasks.agents.chat import AgentReply, ChatAgent
from tasks.agents.registry import parse_agent_spec, suite_agent
from tasks.core import llm
from tasks.core.jsonl import parse_jsonl
from tasks.core.llm import AgentConfigError

__all__ = [
    "Agent",
    "AgentConfigError",
    "AgentReply",
    "OpenAIAgent",
    "OracleAgent",
    "ReplayAgent",
    "check_agent_spec",
    "make_agent",
]


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

        def parse(obj) -> tuple[str, int, dict]:
            item_id = str(obj["item_id"])
            if "response" not in obj and "tool_calls" not in obj:
                raise KeyError("response")
            step = int(obj["step"]) if "step" in obj else counters.get(item_id, 0)
            calls = obj.get("tool_calls") or []
            if not isinstance(calls, list) or any(
                not isinstance(c, dict) or "name" not in c for c in calls
            ):
                raise ValueError("tool_calls")
            return item_id, step, obj

        def bad_line(lineno: int, _exc: Exception) -> AgentConfigError:
            return AgentConfigError(
                f"{self.path}:{lineno}: expected a JSON object with item_id and response "
                "(or tool_calls: [{name, arguments}])"
            )

        for _, (item_id, step, obj) in parse_jsonl(
            self.path.read_text(encoding="utf-8"), parse, bad_line
        ):
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


def item_trial_index(item_id: str) -> int:
    """The response-cache "trial" of an item: a stable 48-bit number from its id. With the
    conversation it keys the cache, so a re-run of an item gets its own answers back, while two
    items whose prompts happen to be equal (a variant or level that changes nothing) are still
    two samples with two model calls."""
    return int.from_bytes(hashlib.sha256(item_id.encode()).digest()[:6], "big")


class OpenAIAgent(ChatAgent, Agent):
    """A chat model through :class:`tasks.agents.chat.ChatAgent` (module docstring), with the
    options of ``config``. ``cache``: the shared :class:`tasks.core.llm.ResponseCache` (None: no
    cache). API failures after the shared retries come back as an :class:`AgentReply` with
    ``error`` set. Raises :class:`AgentConfigError` when the model cannot be resolved (no
    endpoint, missing key)."""

    def __init__(
        self,
        model: str,
        settings: Settings,
        config: LifecycleConfig,
        cache: llm.ResponseCache | None = None,
    ):
        super().__init__(model, settings, config.agent_options(), cache)
        self.config = config

    def respond(self, item, step, messages, tools):
        return self.ask(messages, tools, item_trial_index(item["item_id"]), step)


def check_agent_spec(spec: str) -> None:
    """Raise :class:`AgentConfigError` unless ``spec`` is ``oracle``, ``openai:<model>`` or
    ``replay:<path>`` with an existing file (checked before any work is mapped)."""
    parse_agent_spec(spec, "lifecycle", check=True)


def make_agent(
    spec: str,
    settings: Settings | None = None,
    config: LifecycleConfig | None = None,
    artifacts_root: str | None = None,
) -> Agent:
    """An agent from its spec (module docstring); ``artifacts_root``: where ``openai:`` agents
    keep the shared response cache (mode ``config.cache``; None: no cache). Raises
    :class:`AgentConfigError`."""
    config = config or LifecycleConfig()

    def model(name: str) -> OpenAIAgent:
        cache = llm.ResponseCache(artifacts_root, config.cache) if artifacts_root else None
        return OpenAIAgent(name, settings or Settings.from_env(), config, cache)

    return suite_agent(spec, "lifecycle", oracle=OracleAgent, replay=ReplayAgent, model=model,
                       check=True)
