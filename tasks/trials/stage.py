"""Agent trials: plan (agent × query × trial) batches, run a batch, combine batch artifacts.

A batch is the unit Prefect maps over (25–100 trials each, not thousands of tiny tasks) and the
unit of idempotence: ``runs/<run_id>/trials/batches/<key>.trials.parquet`` is written last, so
its presence means the batch finished and a re-run skips it. Inside a batch every finished trial
is checkpointed at once (``batches/<key>.parts/<i>.json``, its trial, tool-call and model-call
rows), so a run killed mid-batch resumes with exactly the unfinished trials: none is lost or run
twice. Model responses are also kept in the response cache (:mod:`tasks.core.llm`), so even the
interrupted trial replays its finished model calls without HTTP requests.

Agents: ``oracle``, ``openai:<model>`` (a model of the models table, see ``data/models.yaml``;
``openai:<model>@<base url>`` names the endpoint), ``local:<model>`` (a local GGUF model of the
table, served by querylab: :mod:`tasks.agents.local_model`) and ``replay:<answer file>``.

The trial side never sees answers: a batch reads the dataset's public ``manifest.json`` only
(questions, databases, hints). Its rows carry each trial's answer and terminate reason but no
verdict; the score step (:mod:`tasks.scoring.stage`) judges them. The one exception is the trusted
``oracle``, which reads its reference solutions from the private scoring file.

Errored trials (``api_error`` / ``error``: infrastructure or harness failures) count as finished
for resume, and are re-run only when asked (``retry_errors``, ``querylab rerun --retry-errors``):
the batch then runs exactly its errored trials again and keeps every other row as it was.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
from pydantic import ValidationError

from schemas import artifacts
from schemas.models import AgentOptions
from schemas.settings import Settings
from tasks.core import interrupt
from tasks.core import storage
from tasks.scoring.dab_rules import agent_options_for
from tasks.agents.react import (
    Transcript,
    TrialOutcome,
    run_oracle,
    run_react,
    system_prompt,
    user_prompt,
)
from tasks.core.concurrency import (
    DEFAULT_MAX_CONCURRENCY, call_slot, resolve_max_trials, trial_slot, trials_expected,
)
from tasks.db.engines import open_databases
from tasks.core.llm import (
    AgentConfigError,
    ChatModel,
    PreflightResult,
    ResponseCache,
    check_tool_protocol,
    endpoint_warning,
    model_label,
    load_models_config,
    preflight,
    resolve_model,
)
from tasks.core.llm import LOCAL_PREFLIGHT_TIMEOUT_S, PREFLIGHT_TIMEOUT_S
from tasks.core.prefect_task import task
from tasks.agents.replay import (
    answers_for,
    check_matches,
    load_answers,
    run_replay,
    unmatched_datasets,
)
from tasks.sandbox.session import shared_sandbox
from tasks.scoring.stage import is_errored, load_scoring
from tasks.agents.tools import ToolBox
from tasks.agents.registry import agent_kind, parse_agent_spec
from tasks.core.settings import env_get
from tasks.core.layout import RunLayout

__all__ = [
    "AgentConfigError",
    "HINT_CONDITIONS",
    "agent_label",
    "batch_errored",
    "check_query_selection",
    "preflight_agents",
    "select_queries",
    "agent_options",
    "batch_uri",
    "check_agents",
    "check_sandbox",
    "combine_trials",
    "describe_agents",
    "hint_conditions",
    "parse_agent",
    "plan_batches",
    "run_batch",
    "run_trial_batch",
    "trial_key",
    "work_root",
]

log = logging.getLogger(__name__)


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

    For a run with an ``openai:`` agent returns what the sandbox provides on this machine
    (:meth:`tasks.sandbox.session.Isolation.describe` plus ``unsafe_sandbox``); raises
    AgentConfigError naming the missing mechanisms unless the option ``unsafe_sandbox`` is set.
    None when no agent runs model-written code (the oracle and replay agents run their own).
    """
    opts = agent_options(options)
    if not any(parse_agent(a)[0] in ("openai", "local") for a in agents):
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


def trial_key(agent: str, dataset: str, query_id: str, trial: int) -> str:
    """``"<agent>|<dataset>|<query_id>|<trial>"``: the identity of one trial in a run."""
    return f"{agent}|{dataset}|{query_id}|{trial}"


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


def _fingerprint(agent: str) -> str | None:
    """Content that identifies an agent beyond its name (a replay file's hash)."""
    kind, arg = parse_agent(agent)
    if kind == "replay":
        try:
            return hashlib.sha256(Path(arg).read_bytes()).hexdigest()
        except OSError as exc:
            raise AgentConfigError(f"{arg}: cannot read answer file: {exc}") from None
    return None


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


def plan_batches(
    manifest_uris: list[str],
    agents: list[str],
    n_trials: int,
    batch_size: int = 25,
    options: dict | None = None,
    hints: list[str] | None = None,
    query_ids: list[str] | None = None,
    limit: int | None = None,
    agent_plans: dict[str, dict] | None = None,
    agent_defaults: dict[str, dict] | None = None,
) -> list[dict]:
    """Expand agents × hint conditions × datasets × queries × trials into batches of at most
    ``batch_size``.

    ``agent_defaults``: agent → its model's own default options (the run record's, see
    :func:`model_agent_defaults`; None: read from the models table now); ``options`` (the
    run's explicit ones) override them.

    ``hints``: the run's hint conditions (:func:`hint_conditions`; default ``["off"]``). An
    agent that reads a prompt is planned once per condition (its trials are labelled
    :func:`agent_label`); the oracle and replay agents once, with condition ``None``.

    ``agent_plans`` (:class:`schemas.runs.AgentPlan` dicts by agent) narrow one agent to some
    datasets (by name) and/or give it its own trials per query instead of ``n_trials``.

    ``query_ids`` / ``limit`` select a subset of each dataset's queries
    (:func:`select_queries`; an id no dataset has raises ValueError). A ``replay:<file>``
    agent's trials come from its file, not from ``n_trials``: for each dataset the file
    answers, every query gets as many trials as the file's largest run number for that dataset
    + 1 (a missing run is a ``no_answer`` trial, an incorrect answer, not a runtime failure);
    datasets the file does not answer are not planned for that agent.

    Returns JSON-able dicts ``{"key", "agent", "hints", "manifest_uri", "items": [[query_id,
    trial]], "options": {...}}`` (``hints``: ``"on"``, ``"off"`` or None; ``options``: the
    :class:`AgentOptions` that differ from the defaults). Keys are stable for the same inputs
    (so re-runs find finished batches) and change with the options, the hint condition (when
    on) or a replay file's content. On a dataset imported in DAB's format the options are
    DAB's limits overlaid with ``options`` (:func:`tasks.scoring.dab_rules.agent_options_for`).
    Raises AgentConfigError for an unknown agent, bad options
    or a bad hint condition, ValueError for ``n_trials`` < 1 or ``batch_size`` < 1.
    """
    if n_trials < 1 or batch_size < 1:
        raise ValueError(f"n_trials and batch_size must be >= 1, got {n_trials}, {batch_size}")
    agent_options(options)  # the options given are valid
    conditions = hint_conditions(hints)
    fingerprints = {agent: _fingerprint(agent) for agent in agents}
    if agent_defaults is None:
        agent_defaults = model_agent_defaults(agents)
    manifests = {uri: storage.read_json(uri) for uri in manifest_uris}
    check_query_selection(list(manifests.values()), query_ids)
    batches = []
    for agent in agents:
        plan = (agent_plans or {}).get(agent) or {}
        for hint in _planned_hints(agent, conditions):
            label = agent_label(agent, hint)
            for uri, manifest in manifests.items():
                if plan.get("datasets") is not None and manifest["name"] not in plan["datasets"]:
                    continue
                # DAB datasets: DAB's limits unless given (tasks.scoring.dab_rules)
                explicit = {**agent_defaults.get(agent, {}), **(options or {})}
                opts = agent_options(agent_options_for(manifest, explicit)).model_dump(
                    exclude_defaults=True)
                runs = (_replay_runs(agent, manifest) if agent.startswith("replay:")
                        else plan.get("n_trials") or n_trials)
                queries = select_queries(manifest, query_ids, limit)
                items = [[q["id"], t] for q in queries for t in range(runs)]
                for start in range(0, len(items), batch_size):
                    chunk = items[start : start + batch_size]
                    material: list = [agent, manifest["version"], chunk]
                    if opts:
                        material.append(opts)
                    if fingerprints[agent]:
                        material.append(fingerprints[agent])
                    if hint == "on":
                        material.append({"hints": hint})
                    digest = hashlib.sha256(
                        json.dumps(material, sort_keys=True).encode()
                    ).hexdigest()
                    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", label)[:60]
                    key = f"{slug}-{manifest['name']}-{start // batch_size:04d}-{digest[:10]}"
                    batches.append(
                        {"key": key, "agent": agent, "hints": hint, "manifest_uri": uri,
                         "items": chunk, "options": opts}
                    )
    return batches


def _replay_runs(agent: str, manifest: dict) -> int:
    """Trials per query of a replay agent on one dataset: 1 + the largest run the answer file
    has for the dataset (0 when it answers none of its queries)."""
    answers = answers_for(load_answers(parse_agent(agent)[1]), manifest)
    return 1 + max((run for _, run in answers), default=-1)


def batch_uri(artifacts_root: str, run_id: str, key: str, what: str) -> str:
    """URI of one batch's ``trials``, ``tool_calls``, ``llm_calls`` or ``messages`` Parquet."""
    return RunLayout(artifacts_root, run_id).batches(f"{key}.{what}.parquet")


def _parts_uri(artifacts_root: str, run_id: str, key: str, index: int | None = None) -> str:
    base = RunLayout(artifacts_root, run_id).batches(f"{key}.parts")
    return base if index is None else storage.join(base, f"{index:05d}.json")


# --------------------------------------------------------------------------------------------
# Runners: (query, trial, toolbox) -> TrialOutcome for each agent kind
# --------------------------------------------------------------------------------------------

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


def _llm_row(run_id: str, key: str, c, attempt: int) -> dict:
    """One ``llm_calls`` row of trial ``key`` for the call record ``c``
    (:class:`tasks.core.llm.LLMCallRecord`) made by attempt ``attempt`` of the trial."""
    return {
        "run_id": run_id, "trial_key": key, "call_index": c.call_index, "model": c.model,
        "base_url": c.base_url, "prompt_tokens": c.prompt_tokens,
        "cached_tokens": c.cached_tokens, "completion_tokens": c.completion_tokens,
        "cost_usd": c.cost_usd, "latency_s": c.latency_s, "finish_reason": c.finish_reason,
        "n_tool_calls": c.n_tool_calls, "attempts": c.attempts, "cache_hit": c.cache_hit,
        "error": c.error, "priced": c.priced, "trial_attempt": attempt, "queue_s": c.queue_s,
    }


def _journal_uri(artifacts_root: str, run_id: str, key: str, index: int) -> str:
    """The model calls of the attempt of batch item ``index`` running now (rewritten after
    every call; ``<key>.calls/`` beside the checkpoints, removed with them): what an
    interrupted attempt paid for, read back on resume."""
    return RunLayout(artifacts_root, run_id).batches(f"{key}.calls", f"{index:05d}.json")


def _earlier_calls(journal_uri: str, previous: list[dict]) -> tuple[list[dict], int]:
    """The ``llm_calls`` rows of a trial's earlier attempts that reached the API (cache hits
    cost nothing and are dropped), and the number of the attempt about to run.

    ``previous``: the rows of the trial's last recorded (errored) attempt, earlier attempts'
    rows included; the journal adds an attempt that was interrupted before it was recorded
    (a killed process)."""
    attempts = {r.get("trial_attempt") or 0 for r in previous}
    rows = [{**r, "trial_attempt": r.get("trial_attempt") or 0}
            for r in previous if not r["cache_hit"]]
    if storage.exists(journal_uri):
        journal = storage.read_json(journal_uri)
        if journal["attempt"] not in attempts:
            attempts.add(journal["attempt"])
            rows += [r for r in journal["calls"] if not r["cache_hit"]]
    return rows, (max(attempts) + 1 if attempts else 0)


def _with_earlier_calls(rows: dict, earlier: list[dict]) -> dict:
    """A trial's rows with the paid calls of its earlier attempts: their ``llm_calls`` rows
    first, their cost and tokens added to the trial row (what the trial cost in all)."""
    if not earlier:
        return rows
    trial = dict(rows["trial"])
    for col in ("cost_usd", "prompt_tokens", "completion_tokens", "cached_tokens"):
        trial[col] += sum(r[col] for r in earlier)
    return {**rows, "trial": trial, "llm_calls": earlier + rows["llm_calls"]}


def _rows(run_id: str, key: str, agent: str, model: str | None, manifest: dict, query: dict,
          trial: int, outcome: TrialOutcome, hints: str | None = None, attempt: int = 0) -> dict:
    """The artifact rows of one finished trial: ``{"trial": row, "tool_calls": [...],
    "llm_calls": [...], "messages": [...]}`` (the checkpoint of the trial; ``attempt``: the
    trial attempt that made the model calls). No verdict."""
    trial_row = {
        "run_id": run_id,
        "trial_key": key,
        "agent": agent,
        "hints": hints,
        "model": model,
        "dataset": manifest["name"],
        "query_id": query["id"],
        "trial": trial,
        "answer": outcome.answer,
        "terminate_reason": outcome.terminate_reason,
        "error": outcome.error,
        "n_llm_calls": outcome.n_llm_calls,
        "n_tool_calls": len(outcome.tool_calls),
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "cached_tokens": outcome.cached_tokens,
        "cost_usd": outcome.cost_usd,
        "latency_s": outcome.latency_s,
        "dataset_version": manifest["version"],
    }
    tool_rows = []
    for i, rec in enumerate(outcome.tool_calls):
        o = rec.outcome
        tool_rows.append(
            {
                "run_id": run_id,
                "trial_key": key,
                "call_index": i,
                "turn": rec.turn,
                "call_id": o.call_id,
                "tool": o.tool,
                "arguments": o.arguments,
                "success": o.success,
                "error": o.error,
                "result_size": o.result_size,
                "duration_s": o.duration_s,
            }
        )
    llm_rows = [_llm_row(run_id, key, c, attempt) for c in outcome.llm_calls]
    message_rows = [{"run_id": run_id, "trial_key": key, **m} for m in outcome.messages]
    return {"trial": trial_row, "tool_calls": tool_rows, "llm_calls": llm_rows,
            "messages": message_rows}


def work_root(settings: Settings) -> Path:
    """Where per-trial working directories go (scratch, removed after each trial):
    ``QUERYLAB_WORK_DIR`` when set; else ``/dev/shm/querylab-<uid>`` when ``/dev/shm`` is a
    writable RAM file system (no disk I/O for scratch files); else ``<QUERYLAB_HOME>/work``."""
    explicit = env_get("QUERYLAB_WORK_DIR")
    if explicit:
        return Path(explicit)
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm / f"querylab-{os.getuid()}"
    return Path(settings.home) / "work"


def scratch_dir(settings: Settings, artifacts_root: str, run_id: str) -> Path:
    """A run's scratch directory: ``<work root>/<run_id>-<8 hex of the artifact root>``, so two
    runs with the same id under different artifact roots (two checkouts, two test sessions on
    one machine) never share — or delete — each other's trial work directories."""
    digest = hashlib.sha256(artifacts_root.encode()).hexdigest()[:8]
    return work_root(settings) / f"{run_id}-{digest}"


def _remove_local(uri: str) -> None:
    if "://" not in uri or uri.startswith("file://"):
        shutil.rmtree(uri.removeprefix("file://"), ignore_errors=True)


#: The per-batch artifacts besides ``trials`` (written first; ``trials`` last marks the batch
#: finished), with their schemas.
_BATCH_PARTS = (
    ("tool_calls", artifacts.TOOL_CALLS),
    ("llm_calls", artifacts.LLM_CALLS),
    ("messages", artifacts.MESSAGES),
)


def _finished_rows(artifacts_root: str, run_id: str, key: str) -> dict[str, dict]:
    """A finished batch's rows regrouped per trial key, each like a checkpoint part
    (``{"trial", "tool_calls", "llm_calls", "messages"}``); a part artifact missing (a batch
    from before transcripts) gives empty lists."""
    trials = storage.read_parquet(batch_uri(artifacts_root, run_id, key, "trials"),
                                  artifacts.TRIALS).to_pylist()
    out = {t["trial_key"]: {"trial": t, **{w: [] for w, _ in _BATCH_PARTS}} for t in trials}
    for what, schema in _BATCH_PARTS:
        uri = batch_uri(artifacts_root, run_id, key, what)
        if not storage.exists(uri):
            continue
        for row in storage.read_parquet(uri, schema).to_pylist():
            if row["trial_key"] in out:
                out[row["trial_key"]][what].append(row)
    return out


def batch_errored(artifacts_root: str, run_id: str, key: str) -> int:
    """Errored trials (``api_error`` / ``error``) in a finished batch (0 when unfinished)."""
    uri = batch_uri(artifacts_root, run_id, key, "trials")
    if not storage.exists(uri):
        return 0
    reasons = storage.read_parquet(uri, artifacts.TRIALS).column("terminate_reason").to_pylist()
    return sum(is_errored(r) for r in reasons)


def _harness_error(exc: BaseException) -> TrialOutcome:
    """An errored trial for an exception the harness did not expect (a bug or a broken
    database connection): the batch goes on, the trial can be retried."""
    text = str(exc).strip().splitlines()
    return TrialOutcome(None, "error",
                        f"harness error: {type(exc).__name__}: {text[0][:500] if text else ''}")


def run_batch(
    run_id: str,
    artifacts_root: str,
    batch: dict,
    toolbox_factory: Callable[..., ToolBox] = ToolBox,
    retry_errors: bool = False,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    max_trials: int | None = None,
) -> str:
    """Run every unfinished trial of one batch and write its four Parquet artifacts.

    Plain-function body of :func:`run_trial_batch` (``toolbox_factory`` lets benchmarks swap
    the tool executor). Returns the batch's trials URI; does nothing when it exists, unless
    ``retry_errors``: then the batch's errored trials (terminate reason ``api_error`` or
    ``error``) run again and every other trial's rows are kept as they were (a batch without
    errored trials is left untouched). An exception from one trial (a harness failure) makes
    that trial errored; the batch goes on.

    The batch's trials run concurrently, each holding one of the stage's ``max_trials`` trial
    slots while it runs (None: :func:`tasks.core.concurrency.default_max_trials` of
    ``max_concurrency``; :func:`tasks.core.concurrency.trial_slot`), and each model call holds a
    slot of the stage's ``max_concurrency`` calls in flight across every batch of the run's
    trials stage and of its model's (``max_concurrency`` of the models table) while its
    request is in flight (:func:`tasks.core.concurrency.call_slot`); each trial is checkpointed
    as it finishes, and the batch's rows are written in item order whatever order they finished
    in. ValueError for ``max_concurrency`` or ``max_trials`` < 1.
    """
    if int(max_concurrency) < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    max_trials = resolve_max_trials(max_concurrency, max_trials)
    out_uri = batch_uri(artifacts_root, run_id, batch["key"], "trials")
    finished: dict[str, dict] = {}
    if storage.exists(out_uri):
        if not retry_errors or not batch_errored(artifacts_root, run_id, batch["key"]):
            return out_uri
        finished = _finished_rows(artifacts_root, run_id, batch["key"])
    settings = Settings.from_env()
    manifest = storage.read_json(batch["manifest_uri"])
    queries = {q["id"]: q for q in manifest["queries"]}
    options = agent_options(batch.get("options"))
    # model-written cells need the sealed sandbox unless the run said --unsafe-sandbox
    strict = parse_agent(batch["agent"])[0] in ("openai", "local") and not options.unsafe_sandbox
    if strict:
        check_sandbox([batch["agent"]], options)
    if parse_agent(batch["agent"])[0] in ("openai", "local"):
        # sessions for the batch's concurrent trials, set up while their first calls wait
        shared_sandbox().reserve(trials_expected(run_id, len(batch["items"]), max_trials))
    descriptions = {n: d["description"] for n, d in manifest["databases"].items()}
    databases = open_databases(manifest, settings)
    hints = batch.get("hints")
    label = agent_label(batch["agent"], hints)
    runner = _Agent(batch["agent"], batch["manifest_uri"], manifest, options, artifacts_root,
                    hints == "on")
    batch_dir = scratch_dir(settings, artifacts_root, run_id) / batch["key"]
    done: dict[int, dict] = {}

    def todo() -> Iterator[tuple[int, str, int, str, str]]:
        """The trials to run, found as they are handed out (rows of finished ones go to
        ``done``)."""
        for index, (query_id, trial) in enumerate(batch["items"]):
            part_uri = _parts_uri(artifacts_root, run_id, batch["key"], index)
            key = trial_key(label, manifest["name"], query_id, trial)
            previous: list[dict] = []  # the llm_calls rows of the errored attempt re-run now
            if storage.exists(part_uri):
                part = storage.read_json(part_uri)
                if not (retry_errors and is_errored(part["trial"]["terminate_reason"])):
                    done[index] = part
                    continue
                previous = part["llm_calls"]
            elif key in finished:
                if not is_errored(finished[key]["trial"]["terminate_reason"]):
                    done[index] = finished[key]
                    continue
                previous = finished[key]["llm_calls"]
            yield index, query_id, trial, part_uri, key, index, previous

    def run_one(query_id: str, trial: int, part_uri: str, key: str, index: int = 0,
                previous: list[dict] | None = None) -> dict:
        journal = _journal_uri(artifacts_root, run_id, batch["key"], index)
        earlier, attempt = _earlier_calls(journal, previous or [])

        def on_call(calls) -> None:  # what this attempt paid for, in case it is cut short
            storage.write_bytes(journal, json.dumps({
                "attempt": attempt,
                "calls": [_llm_row(run_id, key, c, attempt) for c in calls],
            }, default=str).encode())

        query = queries[query_id]
        workdir = batch_dir / f"{query_id}-{trial}"
        if workdir.exists():  # left by a killed run
            shutil.rmtree(workdir, ignore_errors=True)
        toolbox = None
        try:
            toolbox = toolbox_factory(
                databases, workdir, descriptions=descriptions,
                python_timeout_s=options.python_timeout_s,
                python_memory_mb=options.python_memory_mb, python_cpu_s=options.python_cpu_s,
                python_disk_mb=options.python_disk_mb,
                python_max_procs=options.python_max_procs, require_isolation=strict,
                max_content_chars=options.preview_chars, preview_rows=options.preview_rows,
                preview_value_chars=options.preview_value_chars,
            )
            outcome = runner.run(query, trial, toolbox, on_call)
        except interrupt.RunInterrupted as exc:  # not checkpointed: a rerun runs it again
            raise interrupt.RunInterrupted(f"trial {key}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - one trial's harness failure is recorded
            log.exception("trial %s failed in the harness", key)
            outcome = _harness_error(exc)
            made = storage.read_json(journal) if storage.exists(journal) else {}
            if made.get("attempt") == attempt:  # the calls it made before it failed
                earlier += made["calls"]
        finally:
            if toolbox is not None:
                toolbox.close()  # the trial's sandbox session (back to the warm pool)
            shutil.rmtree(workdir, ignore_errors=True)
        rows = _with_earlier_calls(_rows(
            run_id, key, label, runner.model, manifest, query, trial, outcome, hints, attempt
        ), earlier)
        storage.write_bytes(part_uri, json.dumps(rows, default=str).encode())
        return rows

    ran: dict[int, dict] = {}
    try:
        ran = _run_concurrently(run_id, todo(), len(batch["items"]), run_one, max_concurrency,
                                max_trials, runner)
    finally:
        runner.close()
        shutil.rmtree(batch_dir, ignore_errors=True)
        try:
            batch_dir.parent.rmdir()  # the run's scratch directory, once no batch uses it
        except OSError:
            pass
    done.update(ran)
    parts = [done[i] for i in sorted(done)]
    for what, schema in _BATCH_PARTS:
        rows = [r for p in parts for r in p.get(what, [])]
        table = pa.Table.from_pylist(rows, schema=schema)
        if what == "tool_calls":  # typed per-call features, computed once (the report reads them)
            from polars.exceptions import PanicException

            from tasks.report.tool_use import tool_calls_with_features
            try:
                table = tool_calls_with_features(table)
            except (Exception, PanicException) as exc:  # noqa: BLE001 - model output is hostile
                # the paid trials are kept: written without the features, which the report
                # then computes from the arguments (its logged fallback for such artifacts)
                log.warning("batch %s: tool calls written without their per-call features "
                            "(%s: %s); the report parses their arguments instead",
                            batch["key"], type(exc).__name__, str(exc)[:200])
        storage.write_parquet(batch_uri(artifacts_root, run_id, batch["key"], what), table, schema)
    trials = [p["trial"] for p in parts]
    uri = storage.write_parquet(
        out_uri, pa.Table.from_pylist(trials, schema=artifacts.TRIALS), artifacts.TRIALS
    )
    _remove_local(_parts_uri(artifacts_root, run_id, batch["key"]))
    _remove_local(RunLayout(artifacts_root, run_id).batches(f"{batch['key']}.calls"))
    log.info(
        "batch %s: %d trials (%d run now, %d kept), %d errored, $%.4f",
        batch["key"], len(trials), len(ran), len(trials) - len(ran),
        sum(is_errored(t["terminate_reason"]) for t in trials), sum(t["cost_usd"] for t in trials),
    )
    return uri


def _run_concurrently(
    run_id: str, todo: Iterator[tuple], most: int, run_one: Callable[..., dict],
    max_concurrency: int, max_trials: int, runner: _Agent,
) -> dict[int, dict]:
    """Run ``run_one(query_id, trial, part_uri, key)`` for every item of ``todo`` (``(index,
    query_id, trial, part_uri, key)``, at most ``most`` of them), each inside its
    :func:`tasks.core.concurrency.trial_slot` (at most ``max_trials`` trials of the stage at
    once), each of their model calls inside a :func:`tasks.core.concurrency.call_slot` (at most
    ``max_concurrency`` calls of the stage, and the model's cap, in flight); returns index →
    rows. The batch's thread takes the slots and hands the trial to a
    pool thread (which gives them back), so a batch never holds more threads than trials in
    flight. Each trial runs in a copy of the batch's context (Prefect's settings and run
    context). An exception (from ``todo`` or a checkpoint that cannot be written) is raised
    once the trials already started have ended (their checkpoints are kept)."""
    import contextvars
    from concurrent.futures import ThreadPoolExecutor

    model_cap, model, base_url = runner.concurrency_cap()
    if runner.chat is not None:
        runner.chat.call_slot = lambda: call_slot(run_id, max_concurrency, model, base_url,
                                                  model_cap)
    width = min(most, int(max_trials))

    def slot():
        return trial_slot(run_id, max_trials)

    out: dict[int, dict] = {}
    if width <= 1:  # no thread: the batch's own
        for index, *item in todo:
            with slot():
                out[index] = run_one(*item)
        return out

    def held(ctx: contextvars.Context, hold, item: tuple) -> dict:
        try:
            return ctx.run(run_one, *item)
        finally:
            hold.__exit__(None, None, None)

    futures = {}
    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="trial") as pool:
        for index, *item in todo:
            hold = slot()
            hold.__enter__()
            try:
                futures[index] = pool.submit(held, contextvars.copy_context(), hold, item)
            except BaseException:
                hold.__exit__(None, None, None)
                raise
    for index, future in futures.items():
        out[index] = future.result()
    return out


def _batch_run_name(parameters: dict) -> str:
    """Task-run name of a mapped batch: ``batch-<batch key>``."""
    return f"batch-{parameters['batch']['key']}"


@task(name="run-trial-batch", persist_result=False, retries=0, task_run_name=_batch_run_name)
def run_trial_batch(
    run_id: str, artifacts_root: str, batch: dict, retry_errors: bool = False,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY, max_trials: int | None = None,
) -> str:
    """Run every trial of one batch and write its trials, tool-call, model-call and message
    rows.

    Returns the batch's trials URI. Skips all work when that artifact already exists (unless
    ``retry_errors``: then only its errored trials run again), and trials already checkpointed
    by an interrupted attempt. Its trials run concurrently within the stage's ``max_trials``
    trials admitted, their model calls within the stage's ``max_concurrency`` calls in flight
    and their model's cap (:func:`run_batch`). Other settings (database
    servers, API keys) come from the environment, never from parameters.
    """
    return run_batch(run_id, artifacts_root, batch, retry_errors=retry_errors,
                     max_concurrency=max_concurrency, max_trials=max_trials)


@task(name="check-agents", persist_result=False)
def describe_agents(
    run_id: str, artifacts_root: str, agents: list[str], manifest_uris: list[str],
    options: dict | None = None, hints: list[str] | None = None,
    agent_defaults: dict[str, dict] | None = None,
) -> str:
    """:func:`check_agents` (with the run's hint conditions) and write the descriptions to
    ``runs/<run_id>/trials/agents.json`` (endpoints actually called, prices, ``priced``,
    options; never a key), and the dataset manifests of the trials to
    ``trials/manifests.json`` (what the score step reads). Returns the agents.json URI; raises
    AgentConfigError before any trial runs when an agent cannot."""
    described = check_agents(agents, manifest_uris, options, hints=hints,
                             agent_defaults=agent_defaults)
    for d in described:
        for warning in d.get("warnings", []):
            log.warning("%s", warning)
    prefix = RunLayout(artifacts_root, run_id).trials()
    storage.write_json(storage.join(prefix, "manifests.json"), list(manifest_uris))
    return storage.write_json(storage.join(prefix, "agents.json"), described)


@task(name="combine-trials", persist_result=False)
def combine_trials(run_id: str, artifacts_root: str, batch_keys: list[str]) -> dict[str, str]:
    """Concatenate the given batches into ``trials``, ``tool_calls``, ``llm_calls`` and
    ``messages`` Parquet.

    Rows are sorted by trial key (and call or message index); returns ``{"trials": uri,
    "tool_calls": uri, "llm_calls": uri, "messages": uri}``. Raises StorageError naming a batch
    whose trials artifact is missing (a batch from before transcripts adds no messages).
    """
    by_call = [("trial_key", "ascending"), ("call_index", "ascending")]
    by_attempt = [("trial_key", "ascending"), ("trial_attempt", "ascending"),
                  ("call_index", "ascending")]
    out = {}
    for what, schema, order in (
        ("trials", artifacts.TRIALS, [("trial_key", "ascending")]),
        ("tool_calls", artifacts.TOOL_CALLS, by_call),
        ("llm_calls", artifacts.LLM_CALLS, by_attempt),
        ("messages", artifacts.MESSAGES, [("trial_key", "ascending"), ("index", "ascending")]),
    ):
        uris = [batch_uri(artifacts_root, run_id, k, what) for k in batch_keys]
        if what == "messages":
            uris = [u for u in uris if storage.exists(u)]
        parts = [storage.read_parquet(u, schema) for u in uris]
        table = pa.concat_tables(parts) if parts else schema.empty_table()
        table = table.sort_by(order)
        out[what] = storage.write_parquet(
            RunLayout(artifacts_root, run_id).trials(f"{what}.parquet"), table, schema
        )
    return out
