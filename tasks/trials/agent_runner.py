"""The agent a trial batch runs: :class:`_Agent` gives each agent kind (oracle, replay,
``openai:`` / ``local:`` models through the ReAct loop, registered plugin kinds) one
``run(query, trial, toolbox)`` → :class:`tasks.agents.react.TrialOutcome`.

Moved verbatim from :mod:`tasks.trials.stage` (its batches build one per batch).
"""

from __future__ import annotations

from collections.abc import Callable

from schemas.models import AgentOptions
from tasks.agents.react import (
    Transcript,
    TrialOutcome,
    run_oracle,
    run_react,
    system_prompt,
    user_prompt,
)
from tasks.agents.registry import agent_kind
from tasks.agents.replay import answers_for, load_answers, run_replay
from tasks.agents.tools import ToolBox
from tasks.core.llm import AgentConfigError, ChatModel, ResponseCache, resolve_model
from tasks.scoring.stage import load_scoring
from tasks.trials.agent_checks import parse_agent

#: A plugin kind's trial runner: (query, trial, toolbox) -> TrialOutcome.
Runner = Callable[[dict, int, ToolBox], TrialOutcome]


class _Agent:
    """What a batch needs to run one agent: a runner, the model name for trial rows and a
    close() for resources (the HTTP client). Only the oracle reads the private scoring file
    (its reference solutions); every other agent sees the public manifest alone."""

    def __init__(
        self, agent: str, manifest_uri: str, manifest: dict, options: AgentOptions,
        artifacts_root: str, hints: bool = False,
    ):
        self.kind, arg = parse_agent(agent)
        self.manifest = manifest
        self.hints = hints
        self.model: str | None = arg if self.kind in ("openai", "local") else None
        self.chat: ChatModel | None = None
        self.error: str | None = None
        self.replay: dict | None = None
        self.plugin: Runner | None = None
        self.references: dict[str, list] = {}
        self.options = options
        self.system = system_prompt(manifest)
        try:
            if self.kind in ("openai", "local"):
                resolved = resolve_model(agent if self.kind == "local" else arg)
                self.model = resolved.name.removeprefix("local:")
                cache = None if options.cache == "off" else ResponseCache(artifacts_root, options.cache)
                self.chat = ChatModel(resolved, options, cache)
            elif self.kind == "replay":
                self.replay = answers_for(load_answers(arg), manifest)
            elif self.kind != "oracle":  # a registered plugin kind (tasks.agents.registry)
                self.plugin = agent_kind(self.kind).trial_runner(arg, manifest, options, hints)
            else:  # the trusted oracle: reference solutions from the private side
                private = load_scoring(manifest_uri)["queries"]
                self.references = {qid: q.get("reference") or [] for qid, q in private.items()}
        except (AgentConfigError, ValueError, OSError) as exc:
            self.error = f"{type(exc).__name__}: {exc}" if not isinstance(
                exc, AgentConfigError) else str(exc)

    def run(self, query: dict, trial: int, toolbox: ToolBox,
            on_call: Callable[[list], None] | None = None) -> TrialOutcome:
        if self.error is not None:
            return TrialOutcome(None, "error", self.error)
        if self.plugin is not None:
            return self.plugin(query, trial, toolbox)
        if self.kind == "oracle":
            return run_oracle(toolbox, self.references.get(query["id"], []), query["question"])
        if self.kind == "replay":
            outcome = run_replay(self.replay or {}, query["id"], trial)
            transcript = Transcript()
            transcript.add("user", 0, query["question"])
            if outcome.answer is not None:
                transcript.add("assistant", 0, outcome.answer)
            outcome.messages = transcript.rows
            return outcome
        assert self.chat is not None
        prompt = user_prompt(self.manifest, query["question"], self.hints)
        return run_react(self.chat, toolbox, prompt, self.system, trial, self.options, on_call)

    def concurrency_cap(self) -> tuple[int | None, str | None, str | None]:
        """``(max_concurrency, model name, base URL)`` of this agent's model (the models
        table's cap on its calls in flight; None: none), for
        :func:`tasks.core.concurrency.call_slot`."""
        if self.chat is None:
            return None, None, None
        r = self.chat.resolved
        return r.max_concurrency, r.name, r.base_url

    def close(self) -> None:
        if self.chat is not None:
            self.chat.close()
