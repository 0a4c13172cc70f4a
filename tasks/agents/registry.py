"""The agent-kind registry: every suite parses agent specs here.

An agent spec is ``<kind>`` (a kind that takes no argument, e.g. ``oracle``) or
``<kind>:<argument>`` (``openai:gpt-4o-mini``, ``local:smollm2-135m``, ``replay:answers.json``).
A kind is one class decorated with :func:`agentkind` (modelled on Inspect AI's ``@modelapi``):

    @agentkind("toy")
    class ToyAgent(AgentKind):
        usage = "toy:<word>"
        suites = frozenset({"trials"})

        def trial_runner(self, arg, manifest, options, hints):
            return lambda query, trial, toolbox: TrialOutcome(arg, "return_answer")

The built-in kinds (:mod:`tasks.agents.kinds`) are registered on first use; kinds outside the
repository register when their module is imported, or — as Inspect AI does with its
``inspect_ai`` group — through a setuptools entry point in the ``querylab`` group, loaded once
by :func:`load_plugins`::

    [project.entry-points.querylab]
    toy = "mypackage.toy_agent"

Suites: ``trials`` (the data agent), ``text2sql`` (generators), ``lifecycle`` (the database
lifecycle agent). A kind lists the suites it can run; a spec of another suite's kind is an
unknown agent there, with the same one-line message listing what that suite accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any, ClassVar

from tasks.core.llm import AgentConfigError
from tasks.core.registries import ENTRY_POINT_GROUP, check_unclaimed, load_entry_points

__all__ = [
    "ENTRY_POINT_GROUP",
    "SUITES",
    "AgentKind",
    "agent_kind",
    "agentkind",
    "kind_names",
    "load_plugins",
    "parse_agent_spec",
    "spec_label",
    "suite_agent",
    "usage",
]


#: The suites that run agents.
SUITES = frozenset({"trials", "text2sql", "lifecycle"})

_KINDS: dict[str, type[AgentKind]] = {}


class AgentKind:
    """One agent kind. Class attributes: ``name`` (set by :func:`agentkind`), ``takes_arg``
    (``<kind>:<arg>``; False: the bare ``<kind>``), ``usage`` (how the spec is written, shown in
    errors; a dict suite → text when suites word it differently), ``suites`` (where it runs),
    ``prompted`` (False: reads no prompt, so hint conditions do not apply), ``trusted`` (True:
    its tool calls are the harness's own, the oracle's reference solutions or recorded
    answers; False, the default for every model and plugin kind: its tool arguments are
    hostile input and its ``execute_python`` cells run only in the sealed sandbox unless the
    run says ``--unsafe-sandbox``). A plugin kind runs in the trials suite unless it lists
    more (and the suite's code then knows how to run it).

    Hooks a kind overrides: :meth:`check` (validate the argument before any work is mapped),
    :meth:`label` (what the rows of a spec record), :meth:`fingerprint` (what batch keys digest
    beyond the spec), :meth:`trials_per_query` (a number of trials the kind decides),
    :meth:`trial_runner` (the trials suite's per-trial function). The
    built-in kinds are run by each suite's own code; a plugin kind supplies
    :meth:`trial_runner`."""

    name: ClassVar[str] = ""
    takes_arg: ClassVar[bool] = True
    usage: ClassVar[str | dict[str, str]] = ""
    suites: ClassVar[frozenset[str]] = frozenset({"trials"})
    prompted: ClassVar[bool] = True
    trusted: ClassVar[bool] = False

    def usage_for(self, suite: str) -> str:
        """How a spec of this kind is written in ``suite``'s messages."""
        if isinstance(self.usage, dict):
            return self.usage.get(suite) or next(iter(self.usage.values()))
        return self.usage or (f"{self.name}:<arg>" if self.takes_arg else self.name)

    def check(self, arg: str | None, suite: str) -> None:
        """Raise AgentConfigError when ``arg`` cannot be used in ``suite`` (e.g. a missing
        file). Default: any argument is fine."""

    def label(self, arg: str) -> str:
        """The model label the rows of spec ``<kind>:<arg>`` record (``arg`` non-empty).
        Default: the spec itself."""
        return f"{self.name}:{arg}"

    def fingerprint(self, arg: str | None) -> str | None:
        """What identifies spec ``<kind>:<arg>`` beyond its text, digested by batch keys so a
        changed source runs again (e.g. a hash of a file the argument names); None: nothing
        (the default). Raises OSError when that source cannot be read."""
        return None

    def trials_per_query(self, arg: str | None, manifest: dict) -> int | None:
        """Trials per query the trials suite runs of spec ``<kind>:<arg>`` on the dataset of
        ``manifest``, when the kind decides it (a replay file holds as many runs as it
        holds); None (the default): the run's ``n_trials``."""
        return None

    def trial_runner(self, arg: str | None, manifest: dict, options: Any,
                     hints: bool) -> Callable[[dict, int, Any], Any]:
        """The trials suite's runner ``(query dict, trial index, ToolBox) -> TrialOutcome``
        for one dataset (``manifest``: its public manifest; ``options``: AgentOptions)."""
        raise AgentConfigError(f"agent kind {self.name!r} cannot run trials")


def agentkind(name: str) -> Callable[[type[AgentKind]], type[AgentKind]]:
    """Class decorator registering an :class:`AgentKind` under ``name`` (letters, digits,
    ``_``, ``-``). ValueError for a bad name or one already registered by another class."""

    def register(cls: type[AgentKind]) -> type[AgentKind]:
        if not name or not all(c.isalnum() or c in "_-" for c in name):
            raise ValueError(f"agent kind name {name!r}: use letters, digits, '_' or '-'")
        if cls.__module__ != "tasks.agents.kinds":
            import_module("tasks.agents.kinds")  # built-ins first: messages list them first
        check_unclaimed(_KINDS.get(name), cls, "agent kind", name)
        cls.name = name
        _KINDS[name] = cls
        return cls

    return register


def load_plugins() -> None:
    """Register the built-in kinds, then import every module of the ``querylab``
    entry-point group (:func:`tasks.core.registries.load_entry_points`, once per process). A
    plugin that fails to import is logged and skipped (its kinds stay unknown, which the spec
    error then says)."""
    import_module("tasks.agents.kinds")  # (the import system's lock makes other threads wait)
    load_entry_points()


def kind_names(suite: str | None = None) -> list[str]:
    """Registered kind names in registration order (built-ins first), those of ``suite``
    only when given."""
    load_plugins()
    return [n for n, c in _KINDS.items() if suite is None or suite in c.suites]


def usage(suite: str) -> str:
    """The spec forms ``suite`` accepts, e.g. ``'oracle', 'openai:<model>' or 'replay:<path>'``."""
    forms = [f"'{_KINDS[n]().usage_for(suite)}'" for n in kind_names(suite)]
    if not forms:
        return f"an agent kind of the {suite} suite (none is registered)"
    return forms[0] if len(forms) == 1 else ", ".join(forms[:-1]) + " or " + forms[-1]


def agent_kind(name: str) -> AgentKind:
    """The registered kind ``name`` (an instance); KeyError when unknown."""
    load_plugins()
    return _KINDS[name]()


def parse_agent_spec(spec: str, suite: str = "trials", noun: str = "agent",
                     error: type[Exception] = AgentConfigError,
                     check: bool = False) -> tuple[str, str | None]:
    """``spec`` → ``(kind, argument or None)`` for ``suite``: ``"oracle"`` → ("oracle", None),
    ``"openai:gpt-4o"`` → ("openai", "gpt-4o"). With ``check`` the kind's :meth:`AgentKind.check`
    runs too. Raises ``error`` ("unknown <noun> '<spec>'; use <the suite's forms>") for an
    unknown kind, a kind of another suite or a missing/unexpected argument."""
    load_plugins()
    kind, sep, arg = spec.partition(":")
    cls = _KINDS.get(kind)
    if cls is not None and suite in cls.suites and (bool(arg) if cls.takes_arg else not sep):
        if check:
            try:
                cls().check(arg or None, suite)
            except AgentConfigError as exc:
                raise (exc if isinstance(exc, error) else error(str(exc))) from None
        return kind, arg or None
    raise error(f"unknown {noun} {spec!r}; use {usage(suite)}")


def suite_agent(spec: str, suite: str, *, oracle: Callable[[], Any],
                replay: Callable[[str], Any], model: Callable[[str], Any],
                noun: str = "agent", error: type[Exception] = AgentConfigError,
                check: bool = False) -> Any:
    """The agent of ``suite`` that ``spec`` names, built by the suite's constructor of its
    kind: ``oracle()``, ``replay(path)`` or ``model(model name)`` (``openai:``/``local:`` and
    every plugin kind whose spec names a model, :func:`tasks.core.llm.model_spec_name`).
    Parsed as :func:`parse_agent_spec` (``noun``, ``error``, ``check``) does; ``error``
    ``<noun> '<spec>': kind '<kind>' has no <suite> <noun>`` for a kind of the suite that
    names no model (a plugin kind with no agent of this suite)."""
    from tasks.core.llm import model_spec_name

    kind, arg = parse_agent_spec(spec, suite, noun, error, check=check)
    if kind == "oracle":
        return oracle()
    if kind == "replay":
        return replay(arg)
    name = model_spec_name(spec)
    if name is None:
        raise error(f"{noun} {spec!r}: kind {kind!r} has no {suite} {noun}")
    return model(name)


def spec_label(spec: str) -> str:
    """The model label the text2sql and lifecycle rows of agent spec ``spec`` record: its
    kind's :meth:`AgentKind.label` of the argument (``replay:<path>`` → ``replay:<file
    stem>``); the spec itself for a spec with no argument or of no registered kind. Labels
    name batch keys and artifact rows, so a kind's label must not change."""
    load_plugins()
    kind, _, arg = spec.partition(":")
    cls = _KINDS.get(kind)
    return spec if cls is None or not arg else cls().label(arg)
