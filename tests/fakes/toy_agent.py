"""A toy agent kind, registered from outside ``tasks/`` (tests/test_registry.py): ``toy:<word>``
answers every query with ``"toy <word>"`` without calling any tool."""

from __future__ import annotations

from tasks.agents.registry import AgentKind, agentkind
from tasks.agents.react import TrialOutcome


@agentkind("toy")
class ToyAgent(AgentKind):
    """``toy:<word>``: answers ``"toy <word>"``; runs in the trials suite only."""

    usage = "toy:<word>"
    suites = frozenset({"trials"})

    def trial_runner(self, arg, manifest, options, hints):
        return lambda query, trial, toolbox: TrialOutcome(f"toy {arg}", "return_answer")
