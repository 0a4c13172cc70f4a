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

The batch machinery every suite shares (keys, checkpoints, writing a batch, combining) is
:mod:`tasks.core.batching`. Beside this module: :mod:`tasks.trials.agent_checks` (agent specs,
options, hint conditions, the checks before a run, preflight, query selection; re-exported
here), :mod:`tasks.trials.agent_runner` (the agent a batch runs) and
:mod:`tasks.trials.trial_rows` (one trial's rows, call journals, scratch directories).
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pyarrow as pa

from schemas import artifacts
from schemas.settings import Settings
from tasks.agents.registry import agent_kind
from tasks.agents.tools import ToolBox
from tasks.core import batching, interrupt, storage
from tasks.core.batching import BatchedStage, label_slug, remove_local
from tasks.core.concurrency import (
    DEFAULT_MAX_CONCURRENCY, as_trial, call_slot, model_trial_slot, resolve_max_trials, trial_slot,
    trials_expected,
)
from tasks.core.layout import RunLayout
from tasks.core.llm import AgentConfigError
from tasks.core.prefect_task import task
from tasks.db.engines import open_databases
from tasks.db.engines import warm_up as warm_up_databases
from tasks.sandbox.session import shared_sandbox
from tasks.scoring.dab_rules import agent_options_for
from tasks.scoring.stage import is_errored
from tasks.trials.agent_checks import (  # re-exported: the trials stage's public names
    HINT_CONDITIONS,
    _planned_hints,
    agent_label,
    agent_options,
    check_agents,
    check_query_selection,
    check_sandbox,
    hint_conditions,
    model_agent_defaults,
    parse_agent,
    preflight_agents,
    select_queries,
)
from tasks.trials.agent_runner import _Agent
from tasks.trials.trial_rows import (
    _earlier_calls,
    _harness_error,
    _journal_uri,
    _llm_row,
    _rows,
    _with_earlier_calls,
    scratch_dir,
    work_root,
)

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
    "model_agent_defaults",
    "parse_agent",
    "plan_batches",
    "run_batch",
    "run_trial_batch",
    "trial_key",
    "warm_up_stage",
    "work_root",
]

log = logging.getLogger(__name__)


def trial_key(agent: str, dataset: str, query_id: str, trial: int) -> str:
    """``"<agent>|<dataset>|<query_id>|<trial>"``: the identity of one trial in a run."""
    return f"{agent}|{dataset}|{query_id}|{trial}"


def _fingerprint(agent: str) -> str | None:
    """Content that identifies an agent beyond its name (its kind's
    :meth:`~tasks.agents.registry.AgentKind.fingerprint`: a replay file's hash);
    AgentConfigError when it cannot be read."""
    kind, arg = parse_agent(agent)
    try:
        return agent_kind(kind).fingerprint(arg)
    except OSError as exc:
        raise AgentConfigError(f"{arg}: cannot read answer file: {exc}") from None


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
        kind, arg = parse_agent(agent)
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
                runs = agent_kind(kind).trials_per_query(arg, manifest)
                if runs is None:
                    runs = plan.get("n_trials") or n_trials
                queries = select_queries(manifest, query_ids, limit)
                items = [[q["id"], t] for q in queries for t in range(runs)]
                material = _material(agent, manifest["version"], opts, fingerprints[agent], hint)
                # these keys predate tasks.core.batching: the label's slug is not stripped and
                # the dataset name follows it
                slug = f"{label_slug(label, strip=False)}-{manifest['name']}"
                for key, chunk in batching.plan(label, items, batch_size, material, slug=slug):
                    batches.append(
                        {"key": key, "agent": agent, "hints": hint, "manifest_uri": uri,
                         "items": chunk, "options": opts}
                    )
    return batches


def _material(agent: str, version: str, opts: dict, fingerprint: str | None,
              hint: str | None) -> Callable[[list], list]:
    """What a trial batch's key digests, for its chunk of ``[query_id, trial]`` items: the
    agent, the dataset version, the items, then only what is set — the options that differ
    from the defaults, the replay file's hash, the hint condition when on (so keys of runs
    from before options / hints existed are unchanged)."""

    def material(chunk: list) -> list:
        out: list = [agent, version, chunk]
        if opts:
            out.append(opts)
        if fingerprint:
            out.append(fingerprint)
        if hint == "on":
            out.append({"hints": hint})
        return out

    return material


#: The trial batches: ``trials/batches/<key>.<part>.parquet`` for the tool-call, model-call and
#: message rows, then the trial rows (written last: the batch is finished); per-trial
#: checkpoints ``<key>.parts/<index:05d>.json`` (each ``{"trial", "tool_calls", "llm_calls",
#: "messages"}``).
TRIAL_BATCHES = BatchedStage("trials", (
    ("tool_calls", artifacts.TOOL_CALLS),
    ("llm_calls", artifacts.LLM_CALLS),
    ("messages", artifacts.MESSAGES),
    ("trials", artifacts.TRIALS),
))


def batch_uri(artifacts_root: str, run_id: str, key: str, what: str) -> str:
    """URI of one batch's ``trials``, ``tool_calls``, ``llm_calls`` or ``messages`` Parquet."""
    return TRIAL_BATCHES.uri(artifacts_root, run_id, key, what)


#: The per-batch artifacts besides ``trials`` (written first; ``trials`` last marks the batch
#: finished), with their schemas.
_BATCH_PARTS = TRIAL_BATCHES.parts[:-1]


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


_FROZEN = threading.Event()


def _freeze_long_lived() -> None:
    """Move every object alive now out of the garbage collector's generations, once per
    process (``gc.freeze``): the modules, Prefect's and the model clients' classes and schemas
    live until the process exits, and every full collection during the trials walked them
    under the GIL, stopping every trial (``bench/latency_bound.py``: 0.4-0.9 s per full
    collection, one or two per run). Objects frozen are still freed when their last reference
    goes; only reference cycles among them that become garbage later are never reclaimed.
    Objects made later (the trials' own) are collected as usual."""
    if not _FROZEN.is_set():
        _FROZEN.set()
        gc.freeze()


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
    _freeze_long_lived()
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
    # cells of an untrusted kind (models, plugins) need the sealed sandbox unless the run
    # said --unsafe-sandbox
    untrusted = not agent_kind(parse_agent(batch["agent"])[0]).trusted
    strict = untrusted and not options.unsafe_sandbox
    if strict:
        check_sandbox([batch["agent"]], options)
    if untrusted:
        # sessions for the batch's concurrent trials, set up while their first calls wait
        shared_sandbox().reserve(trials_expected(run_id, len(batch["items"]), max_trials))
    descriptions = {n: d["description"] for n, d in manifest["databases"].items()}
    databases = open_databases(manifest, settings)
    warm_up_databases(databases)  # parser import, query worker start: while first calls wait
    hints = batch.get("hints")
    label = agent_label(batch["agent"], hints)
    runner = _Agent(batch["agent"], batch["manifest_uri"], manifest, options, artifacts_root,
                    hints == "on")
    batch_dir = scratch_dir(settings, artifacts_root, run_id) / batch["key"]
    checkpoints = TRIAL_BATCHES.checkpoints(artifacts_root, run_id, batch["key"])
    done: dict[int, dict] = {}

    def todo() -> Iterator[tuple[int, str, int, str, int, list[dict]]]:
        """The trials to run, found as they are handed out (rows of finished ones go to
        ``done``)."""
        for index, (query_id, trial) in enumerate(batch["items"]):
            key = trial_key(label, manifest["name"], query_id, trial)
            previous: list[dict] = []  # the llm_calls rows of the errored attempt re-run now
            part = checkpoints.read(index)
            if part is not None:
                if not (retry_errors and is_errored(part["trial"]["terminate_reason"])):
                    done[index] = part
                    continue
                previous = part["llm_calls"]
            elif key in finished:
                if not is_errored(finished[key]["trial"]["terminate_reason"]):
                    done[index] = finished[key]
                    continue
                previous = finished[key]["llm_calls"]
            yield index, query_id, trial, key, index, previous

    def run_one(query_id: str, trial: int, key: str, index: int = 0,
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
        checkpoints.write(index, rows)
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
    trials = [p["trial"] for p in parts]
    rows = {what: [r for p in parts for r in p.get(what, [])] for what, _ in _BATCH_PARTS}

    def with_features(what: str, table: pa.Table) -> pa.Table:
        """Tool calls with their typed per-call features, computed once (the report reads
        them)."""
        if what != "tool_calls":
            return table
        from polars.exceptions import PanicException

        from tasks.report.features import tool_calls_with_features
        try:
            return tool_calls_with_features(table)
        except (Exception, PanicException) as exc:  # noqa: BLE001 - model output is hostile
            # the paid trials are kept: written without the features, which the report
            # then computes from the arguments (its logged fallback for such artifacts)
            log.warning("batch %s: tool calls written without their per-call features "
                        "(%s: %s); the report parses their arguments instead",
                        batch["key"], type(exc).__name__, str(exc)[:200])
            return table

    uri = TRIAL_BATCHES.write(artifacts_root, run_id, batch["key"], {**rows, "trials": trials},
                              transform=with_features)
    remove_local(RunLayout(artifacts_root, run_id).batches(f"{batch['key']}.calls"))
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
    """Run ``run_one(query_id, trial, key, index, previous)`` for every item of ``todo``
    (``(index, query_id, trial, key, index, previous)``, at most ``most`` of them), each inside its
    :func:`tasks.core.concurrency.trial_slot` (at most ``max_trials`` trials of the stage at
    once), each of their model calls inside a :func:`tasks.core.concurrency.call_slot` (at most
    ``max_concurrency`` calls of the stage, and the model's cap, in flight; waiters served by
    their trials' admission order and calls made, :func:`tasks.core.concurrency.call_slot`);
    returns index →
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
    if model is not None and model.startswith("local:") and model_cap is not None:
        # a local server's slots each keep one trial's prompt cache: no more trials of it in
        # flight than it has slots (tasks.core.concurrency.model_trial_slot)
        width = min(width, int(model_cap))

        @contextmanager
        def slot():
            with model_trial_slot(model, base_url, model_cap), \
                    trial_slot(run_id, max_trials) as rank:
                yield rank
    else:
        def slot():
            return trial_slot(run_id, max_trials)

    out: dict[int, dict] = {}

    def as_admitted(rank: int, item: tuple) -> dict:
        as_trial(rank)  # its model calls wait for call slots by rank and calls made
        return run_one(*item)

    if width <= 1:  # no thread: the batch's own (its calls still wait by admission rank)
        for index, *item in todo:
            with slot() as rank:
                out[index] = contextvars.copy_context().run(as_admitted, rank, item)
        return out

    def held(ctx: contextvars.Context, hold, rank: int, item: tuple) -> dict:
        try:
            return ctx.run(as_admitted, rank, item)
        finally:
            hold.__exit__(None, None, None)

    futures = {}
    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="trial") as pool:
        for index, *item in todo:
            hold = slot()
            rank = hold.__enter__()
            try:
                futures[index] = pool.submit(held, contextvars.copy_context(), hold, rank, item)
            except BaseException:
                hold.__exit__(None, None, None)
                raise
    for index, future in futures.items():
        out[index] = future.result()
    return out


def warm_up_stage(agents: list[str]) -> threading.Thread | None:
    """Start, in a daemon thread, the once-per-process set-up the first batches of a trials
    stage would otherwise do on their trials' path: for ``openai:`` / ``local:`` agents, the
    model clients' TLS context and HTTP imports (:func:`tasks.core.llm_clients.warm_up`),
    ~0.1 s of the first batch's start in a fresh process while the other batches wait for it.
    Called as the stage starts, so it overlaps the flow's own first steps (checking the
    agents, Prefect's task-run bookkeeping). Returns the thread, or None when no agent calls
    a model. Errors are ignored: each batch builds its own client and reports what fails."""
    # by prefix: a malformed agent is check_agents' to report, not this warm-up's
    if not any(str(a).partition(":")[0] in ("openai", "local") for a in agents):
        return None
    from tasks.core import llm_clients

    def run() -> None:
        try:
            llm_clients.warm_up()
        except Exception:  # noqa: BLE001 - the batches' own clients report it
            log.debug("model client warm-up failed", exc_info=True)

    thread = threading.Thread(target=run, daemon=True, name="warm-up-trials")
    thread.start()
    return thread


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
    out = {}
    for what, schema, order in (
        ("trials", artifacts.TRIALS, ["trial_key"]),
        ("tool_calls", artifacts.TOOL_CALLS, ["trial_key", "call_index"]),
        ("llm_calls", artifacts.LLM_CALLS, ["trial_key", "trial_attempt", "call_index"]),
        ("messages", artifacts.MESSAGES, ["trial_key", "index"]),
    ):
        uris = [batch_uri(artifacts_root, run_id, k, what) for k in batch_keys]
        if what == "messages":
            uris = [u for u in uris if storage.exists(u)]
        out[what] = batching.combine(  # nulls last: pyarrow's order, as before
            uris, schema, order, RunLayout(artifacts_root, run_id).trials(f"{what}.parquet"),
            nulls_last=True)
    return out
