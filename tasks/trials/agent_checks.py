"""Agents of a trials run, before any trial runs: parsing agent specs, validated options, hint
conditions and trial labels, the checks of :func:`check_agents` (models table, replay files,
the sandbox), the one-request :func:`preflight_agents`, the models table's per-agent defaults
and the selection of queries (:func:`select_queries`).

Moved verbatim from :mod:`tasks.trials.stage`, which re-exports every public name.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from schemas.models import AgentOptions
from tasks.agents.registry import agent_kind, parse_agent_spec
from tasks.agents.replay import answers_for, check_matches, load_answers, unmatched_datasets
from tasks.core import storage
from tasks.core.llm import (
    LOCAL_PREFLIGHT_TIMEOUT_S,
    PREFLIGHT_TIMEOUT_S,
    AgentConfigError,
    PreflightResult,
    check_tool_protocol,
    endpoint_warning,
    load_models_config,
    model_label,
    preflight,
    resolve_model,
)
from tasks.sandbox.session import shared_sandbox

__all__ = [
    "HINT_CONDITIONS",
    "PROMPTLESS_KINDS",
    "agent_label",
    "agent_options",
    "check_agents",
    "check_query_selection",
    "check_sandbox",
    "hint_conditions",
    "model_agent_defaults",
    "parse_agent",
    "preflight_agents",
    "select_queries",
]


def parse_agent(agent: str) -> tuple[str, str | None]:
    """``"oracle"`` → ("oracle", None); ``"openai:gpt-4o-mini"`` → ("openai", "gpt-4o-mini");
    ``"local:smollm2-135m"`` → ("local", "smollm2-135m");
    ``"replay:answers.json"`` → ("replay", "answers.json").

    Raises AgentConfigError for anything else (and for a ``|`` in the name, which separates
    trial-key parts).
    """
    if "|" in agent:
        raise AgentConfigError(f"agent {agent!r}: '|' is not allowed in agent names")
    return parse_agent_spec(agent, "trials")


def agent_options(options: dict | AgentOptions | None) -> AgentOptions:
    """Validated :class:`AgentOptions` from a dict (None: defaults); raises AgentConfigError
    naming the bad option."""
    if isinstance(options, AgentOptions):
        return options
    try:
        return AgentOptions.model_validate(options or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "-"
        raise AgentConfigError(f"agent option {loc}: {first['msg']}") from None


#: Hint conditions of a run: ``off`` (DAB's default: the agent sees the question and the
#: database description) and ``on`` (DAB's ``--use_hints``: the dataset's hint text follows).
HINT_CONDITIONS = ("off", "on")

#: Agent kinds that never read a prompt (hints cannot change them): planned once per run, with
#: no hint condition.
PROMPTLESS_KINDS = frozenset({"oracle", "replay"})


def hint_conditions(hints: list[str] | tuple[str, ...] | str | None) -> list[str]:
    """The run's hint conditions, validated and de-duplicated in order (``None`` → ``["off"]``).
    Raises AgentConfigError for anything but ``on`` / ``off``."""
    if hints is None:
        return ["off"]
    values = [hints] if isinstance(hints, str) else list(hints)
    bad = [h for h in values if h not in HINT_CONDITIONS]
    if bad or not values:
        raise AgentConfigError(f"hints {bad or values!r}: use 'on' or 'off' (repeat to run both)")
    return list(dict.fromkeys(values))


def agent_label(agent: str, hints: str | None) -> str:
    """The agent as trial rows and report tables name it: ``agent`` itself with hints off (or
    for an agent that reads no prompt), ``"<agent>+hints"`` with hints on, so one run that
    compares both conditions gets one pass@k row per condition."""
    return f"{agent}+hints" if hints == "on" else agent


def _planned_hints(agent: str, hints: list[str]) -> list[str | None]:
    """The hint conditions an agent is run under: every condition for agents that read a
    prompt, ``[None]`` (once, not applicable) for the oracle and replay agents."""
    return [None] if parse_agent(agent)[0] in PROMPTLESS_KINDS else list(hints)


def check_agents(
    agents: list[str],
    manifest_uris: list[str] | None = None,
    options: dict | None = None,
    env: dict | None = None,
    hints: list[str] | None = None,
    agent_defaults: dict[str, dict] | None = None,
) -> list[dict]:
    """Check that every agent can run before any trial does; return their descriptions.

    ``options`` (explicit) over ``agent_defaults`` (agent → its model's defaults; None: the
    models table's, :func:`model_agent_defaults`) give each LLM agent's ``options`` (all
    fields) and ``model_defaults`` in its description.

    Each description has ``hints``: the hint conditions the agent runs under (``["off"]`` by
    default; ``[]`` for the oracle and replay agents, which read no prompt) and ``labels``:
    the agent names its trial rows carry (:func:`agent_label`).

    ``openai:<model>``: resolved through the models table (key present, endpoint valid);
    ``local:<model>``: its server started (it stays up for the run) and, for tool protocol
    ``auto``, probed once (the description records the protocol used);
    ``warnings`` lists what the user should be told (a named endpoint overriding the table's,
    a model without prices);
    ``replay:<file>``: parsed, and its queries matched against the given datasets (ReplayError
    when no entry is for one of them, or an entry names a query a dataset lacks; entries for
    datasets not in the run are ``ignored_datasets``, with a warning). Any other agent on a
    scoring-only DAB import, or with hints on a DAB dataset without hints, is refused. Returns
    JSON-able dicts ``{"agent", "kind", ...}`` (endpoint, prices, ``priced``; never a key).
    Raises AgentConfigError (or ReplayError) with a message naming the problem.
    """
    opts = agent_options(options)
    conditions = hint_conditions(hints)
    manifests = [storage.read_json(u) for u in manifest_uris or []]
    config = None
    out = []
    for agent in agents:
        kind, arg = parse_agent(agent)
        planned = _planned_hints(agent, conditions)
        desc: dict = {"agent": agent, "kind": kind, "hints": [h for h in planned if h],
                      "labels": [agent_label(agent, h) for h in planned]}
        _check_runnable(agent, kind, manifests, planned)
        if kind in ("openai", "local"):
            config = config or load_models_config(env=env)
            resolved = resolve_model(agent if kind == "local" else arg, config, env)
            desc.update(resolved.describe())
            desc["tool_protocol_configured"] = resolved.tool_protocol  # auto: probed here
            desc["tool_protocol"] = check_tool_protocol(resolved, opts)
            warnings = [endpoint_warning(resolved)]
            if not resolved.priced:
                warnings.append(f"{agent} is not in the models table: its cost is recorded as "
                                "unpriced")
            desc["warnings"] = [w for w in warnings if w]
        elif kind == "replay":
            answers = load_answers(arg)
            for m in manifests:
                answers_for(answers, m)
            check_matches(answers, manifests)
            ignored = unmatched_datasets(answers, manifests) if manifests else {}
            desc.update(
                {"file": str(Path(arg).resolve()), "sha256": answers.sha256,
                 "entries": len(answers.entries),
                 "ignored_datasets": sorted(d.lower() for d in ignored)}
            )
            if ignored:
                desc["warnings"] = [
                    f"{arg}: entries for datasets not in this run are not scored: "
                    + ", ".join(f"{d} ({n})" for d, n in ignored.items())]
        out.append(desc)
    sandbox = check_sandbox(agents, opts)
    if any(d["kind"] in ("openai", "local") for d in out):
        if agent_defaults is None:
            agent_defaults = model_agent_defaults(agents, config)
        for d in out:
            d["options"] = opts.model_dump()
            if d["kind"] in ("openai", "local"):
                own = agent_defaults.get(d["agent"], {})
                d["options"] = agent_options({**own, **(options or {})}).model_dump()
                d["model_defaults"] = dict(own)
                d["sandbox"] = sandbox
    return out


def _check_runnable(agent: str, kind: str, manifests: list[dict], hints: list) -> None:
    """AgentConfigError when ``agent`` cannot run a dataset of the run: a scoring-only DAB
    import (no databases: only replay agents and the oracle), or ``--hints on`` on a DAB
    dataset without a
    ``db_description_withhint.txt`` (DAB's ``--use_hints`` refuses that too)."""
    if kind in PROMPTLESS_KINDS:
        return
    for m in manifests:
        if m.get("scoring_only"):
            raise AgentConfigError(
                f"dataset {m['name']!r} was imported --scoring-only (no databases): only "
                f"replay:<answer file> agents and the oracle can run on it, not {agent}")
        if "on" in hints and m.get("format") == "dab" and not str(m.get("hints") or "").strip():
            raise AgentConfigError(
                f"dataset {m['name']!r} has no db_description_withhint.txt: {agent} cannot run "
                "it with --hints on")


def check_sandbox(agents: list[str], options: dict | AgentOptions | None = None) -> dict | None:
    """Refuse LLM agents where their ``execute_python`` cells cannot be isolated.

    For a run with an agent of an untrusted kind (``openai:``, ``local:``, any plugin kind:
    :attr:`tasks.agents.registry.AgentKind.trusted`) returns what the sandbox provides on this
    machine (:meth:`tasks.sandbox.session.Isolation.describe` plus ``unsafe_sandbox``); raises
    AgentConfigError naming the missing mechanisms unless the option ``unsafe_sandbox`` is set.
    None when every agent is trusted (the oracle and replay agents run their own code).
    """
    opts = agent_options(options)
    if all(agent_kind(parse_agent(a)[0]).trusted for a in agents):
        return None
    iso = shared_sandbox().isolation()
    if not iso.ok and not opts.unsafe_sandbox:
        raise AgentConfigError(
            f"{iso.error()}. LLM agents do not run without it; --unsafe-sandbox runs them "
            "anyway (recorded in the run and its report)"
        )
    return {**iso.describe(), "unsafe_sandbox": opts.unsafe_sandbox}


def preflight_agents(
    agents: list[str], options: dict | None = None, env: dict | None = None
) -> list[PreflightResult]:
    """:func:`tasks.core.llm.preflight` for every ``openai:`` and ``local:`` agent, concurrently (so
    several agents still take one check's time); other agents need no check. A ``local:``
    agent's server is started here (it serves the rest of the run). The model's tool protocol
    decides what the request carries (:func:`tasks.core.llm.check_tool_protocol`: ``auto`` is
    probed first; ``json_schema`` models get no ``tools``, which they are never sent). Raises
    AgentConfigError (naming the agent) when one cannot even be resolved, e.g. its key is not
    set. Results in agent order."""
    from concurrent.futures import ThreadPoolExecutor

    opts = agent_options(options)
    config = None
    resolved = []
    for agent in agents:
        kind, arg = parse_agent(agent)
        if kind in ("openai", "local"):
            config = config or load_models_config(env=env)
            resolved.append(resolve_model(agent if kind == "local" else arg, config, env))
    if not resolved:
        return []

    def check(r) -> PreflightResult:
        try:
            protocol = check_tool_protocol(r, opts)
        except AgentConfigError as exc:
            return PreflightResult(model_label(r.name), r.model_id, r.base_url, ok=False,
                                   problem=str(exc))
        timeout = LOCAL_PREFLIGHT_TIMEOUT_S if r.local is not None else PREFLIGHT_TIMEOUT_S
        return preflight(r, opts, timeout, tools=[] if protocol == "json_schema" else None)

    with ThreadPoolExecutor(max_workers=min(8, len(resolved))) as pool:
        return list(pool.map(check, resolved))


def model_agent_defaults(agents: list[str], config=None) -> dict[str, dict]:
    """Agent → the models table's ``agent_defaults`` of its model (``openai:<name>`` or
    ``local:<name>`` with an entry that sets some; other agents are left out), e.g.
    ``{"local:smollm2-135m": {"max_iterations": 4, "max_wall_time_s": 300}}``. A run's explicit
    options override them (:func:`plan_batches`). AgentConfigError for a bad models table."""
    out: dict[str, dict] = {}
    for agent in agents:
        kind, name = parse_agent(agent)
        if kind not in ("openai", "local") or not name:
            continue
        config = load_models_config() if config is None else config
        entry = config.get(name.split("@", 1)[0] if kind == "openai" else name)
        if entry is not None and entry.agent_defaults:
            out[agent] = dict(entry.agent_defaults)
    return out


def select_queries(
    manifest: dict, query_ids: list[str] | None = None, limit: int | None = None
) -> list[dict]:
    """The queries of ``manifest`` a run asks for, in manifest order: those named in
    ``query_ids`` (``<query id>`` or ``<dataset>/<query id>``; None or empty: all), then the
    first ``limit`` of them (None: all)."""
    queries = list(manifest["queries"])
    if query_ids:
        wanted = set(query_ids)
        queries = [q for q in queries
                   if q["id"] in wanted or f"{manifest['name']}/{q['id']}" in wanted]
    if limit is not None:
        queries = queries[: max(int(limit), 0)]
    return queries


def check_query_selection(manifests: list[dict], query_ids: list[str] | None) -> None:
    """ValueError naming each of ``query_ids`` that no manifest has (so a typo never runs an
    empty benchmark)."""
    if not query_ids:
        return
    have = {q["id"] for m in manifests for q in m["queries"]}
    have |= {f"{m['name']}/{q['id']}" for m in manifests for q in m["queries"]}
    unknown = [q for q in query_ids if q not in have]
    if unknown:
        names = sorted(f"{m['name']}/{q['id']}" for m in manifests for q in m["queries"])
        raise ValueError(f"unknown query id(s) {unknown}; the datasets have {names[:20]}"
                         + (" ..." if len(names) > 20 else ""))
