"""Run records and stage bookkeeping: re-run any stage of a run from its run id alone.

Layout under the artifact root (local path or ``s3://``, always through :mod:`tasks.core.storage`;
paths from :class:`tasks.core.layout.RunLayout`):

- ``runs/<run_id>/run.json`` — :class:`schemas.runs.RunRecord`: the benchmark configuration
  (datasets, agents, trials, batch size, agent options), the dataset manifests the datasets stage
  produced, and the parameters of stand-alone stages (generation, equivalence, lifecycle).
- ``runs/<run_id>/stages/<stage>.json`` — :class:`schemas.runs.StageStatus`: the latest attempt
  of the stage (``running`` / ``completed`` / ``failed``), its error and outputs, and the
  earlier attempts. Each stage writes only its own file.
- ``runs/<run_id>/lease.json`` — who is running the run now (:func:`run_lease`): one process
  per run id, so two ``querylab run`` / ``rerun`` of one id never both call (and pay) the model
  (:mod:`tasks.core.run_lease`, re-exported here with :mod:`tasks.core.run_ids` and the batch
  keys and :func:`gather` of :mod:`tasks.core.batching`).

Stages are idempotent on ``(run_id, stage, item)`` (trial batches, dataset versions, generation
and equivalence batches skip finished work), so re-running a stage only does what is missing.
:func:`gather` (:mod:`tasks.core.batching`) waits for every mapped item of a stage before failing, so one failed batch never
throws away the work of the others, and names the failed items.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from schemas.runs import (
    BENCHMARK_STAGES,
    RUN_RECORD_VERSION,
    STAGES,
    STANDALONE_REQUIRED,
    BenchmarkConfig,
    RunRecord,
    StageAttempt,
    StageStatus,
)
from tasks.core import storage
from tasks.core.layout import RunLayout, runs_root

# Re-exported: callers import these from tasks.core.runs.
from tasks.core.batching import batch_key, gather, spec_fingerprint  # noqa: F401
from tasks.core.run_ids import (  # noqa: F401
    MAX_ERROR_CHARS,
    LeaseHeld,
    RunError,
    StageFailed,
    new_run_id,
    now_iso,
    valid_run_id,
)
from tasks.core.run_lease import (  # noqa: F401
    LEASE_RENEW_S,
    LEASE_TTL_S,
    _Lease,
    lease_alive,
    lease_is_stale,
    lease_uri,
    run_lease,
)

log = logging.getLogger("querylab.runs")

def run_uri(artifacts_root: str, run_id: str) -> str:
    """URI of ``runs/<run_id>/run.json``."""
    return RunLayout(artifacts_root, valid_run_id(run_id)).record


def stage_uri(artifacts_root: str, run_id: str, stage: str) -> str:
    """URI of ``runs/<run_id>/stages/<stage>.json``; RunError for an unknown stage."""
    check_stage(stage)
    return RunLayout(artifacts_root, valid_run_id(run_id)).stage_status(stage)


def check_stage(stage: str) -> str:
    """Return ``stage`` when it is one of :data:`schemas.runs.STAGES`; else RunError."""
    if stage not in STAGES:
        raise RunError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    return stage


# --------------------------------------------------------------------------------------------
# run.json
# --------------------------------------------------------------------------------------------


def _parse(model, data: Any, uri: str):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "-"
        raise RunError(f"{uri}: not a valid record: {loc}: {first['msg']}") from None


def find_run(artifacts_root: str, run_id: str) -> RunRecord | None:
    """The run record of ``run_id``, or None when the run has none. RunError for a record of
    another major schema version or one that does not validate."""
    uri = run_uri(artifacts_root, run_id)
    if not storage.exists(uri):
        return None
    data = storage.read_json(uri)
    version = str(data.get("schema_version", "")) if isinstance(data, dict) else ""
    if version.split(".")[0] != RUN_RECORD_VERSION.split(".")[0]:
        raise RunError(f"{uri}: run record schema_version {version!r}, expected "
                       f"{RUN_RECORD_VERSION}")
    return _parse(RunRecord, data, uri)


def load_run(artifacts_root: str, run_id: str) -> RunRecord:
    """The run record of ``run_id``; RunError naming the URI when there is none."""
    record = find_run(artifacts_root, run_id)
    if record is None:
        hint = ""
        if storage.exists(RunLayout(artifacts_root, run_id).trials("trials.parquet")):
            hint = (" The run has trials but no record (it predates run records): run it again "
                    f"with `querylab run --run-id {run_id} ...` and the same options to record it.")
        raise RunError(
            f"no run {run_id!r} under {artifacts_root} (missing {run_uri(artifacts_root, run_id)})."
            + hint
        )
    return record


def save_run(artifacts_root: str, record: RunRecord) -> str:
    """Write ``record`` (``updated_at`` set to now) atomically; returns its URI."""
    record.updated_at = now_iso()
    return storage.write_json(run_uri(artifacts_root, record.run_id), record.model_dump(mode="json"))


def _new_record(run_id: str) -> RunRecord:
    stamp = now_iso()
    return RunRecord(run_id=valid_run_id(run_id), created_at=stamp, updated_at=stamp)


def record_benchmark(
    artifacts_root: str, run_id: str, config: BenchmarkConfig | dict
) -> RunRecord:
    """Create or update ``run.json`` with the benchmark configuration.

    Re-using a run id with the same configuration changes nothing; with a different one the new
    configuration replaces the old (a warning names the fields) and, when the datasets changed,
    the recorded manifests are dropped (the datasets stage records new ones). RunError for a bad
    configuration."""
    try:
        cfg = BenchmarkConfig.model_validate(
            config.model_dump() if isinstance(config, BenchmarkConfig) else config
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "-"
        raise RunError(f"run {run_id!r}: bad configuration: {loc}: {first['msg']}") from None
    record = find_run(artifacts_root, run_id) or _new_record(run_id)
    if record.benchmark == cfg and storage.exists(run_uri(artifacts_root, run_id)):
        return record
    if record.benchmark is not None:
        old, new = record.benchmark.model_dump(), cfg.model_dump()
        changed = sorted(k for k in new if old.get(k) != new[k])
        log.warning("run %s: configuration changed (%s); the new one replaces it",
                    run_id, ", ".join(changed))
        if old["datasets"] != new["datasets"]:
            record.manifests = []
    record.benchmark = cfg
    save_run(artifacts_root, record)
    return record


def record_manifests(artifacts_root: str, run_id: str, manifests: Sequence[str]) -> RunRecord:
    """Record the dataset manifest URIs the datasets stage produced (in dataset order)."""
    record = load_run(artifacts_root, run_id)
    record.manifests = list(manifests)
    save_run(artifacts_root, record)
    return record


def record_conditions(artifacts_root: str, run_id: str, conditions: dict[str, dict]) -> RunRecord:
    """Record the condition each dataset's trials run under (dataset name → hints, effective
    agent options, scoring rules; :func:`tasks.scoring.dab_rules.dataset_condition`)."""
    record = load_run(artifacts_root, run_id)
    record.conditions = dict(conditions)
    save_run(artifacts_root, record)
    return record


def benchmark_config(artifacts_root: str, run_id: str) -> BenchmarkConfig:
    """The run's benchmark configuration; RunError when the run has none (a stand-alone run)."""
    record = load_run(artifacts_root, run_id)
    if record.benchmark is None:
        raise RunError(
            f"run {run_id!r} has no benchmark configuration (it only ran "
            f"{', '.join(record.stages) or 'no'} stages); start it with `querylab run --run-id "
            f"{run_id}`"
        )
    return record.benchmark


def run_manifests(artifacts_root: str, run_id: str) -> list[str]:
    """The dataset manifests of the run; RunError when the datasets stage has not recorded any
    or one of them is missing."""
    record = load_run(artifacts_root, run_id)
    if not record.manifests:
        raise RunError(
            f"run {run_id!r} has no dataset manifests yet: run its datasets stage first "
            f"(`querylab rerun --run-id {run_id} --stage datasets`)"
        )
    missing = [u for u in record.manifests if not storage.exists(u)]
    if missing:
        raise RunError(
            f"run {run_id!r}: dataset manifests missing: {missing}; re-run the datasets stage "
            f"(`querylab rerun --run-id {run_id} --stage datasets`)"
        )
    return list(record.manifests)


def resolve_stage_params(
    artifacts_root: str, run_id: str, stage: str, given: dict[str, Any]
) -> dict[str, Any]:
    """Parameters of a stand-alone stage (generation, equivalence, lifecycle).

    ``given`` (None values ignored) override and are recorded in ``run.json``; with nothing
    given the recorded ones are used, so ``rerun --stage <stage>`` needs only the run id.
    RunError naming the missing parameters when a required one is in neither."""
    if stage not in STANDALONE_REQUIRED:
        raise RunError(f"{stage!r} is not a stand-alone stage ({', '.join(STANDALONE_REQUIRED)})")
    given = {k: v for k, v in given.items() if v is not None}
    record = find_run(artifacts_root, run_id)
    recorded = dict(record.stages.get(stage, {})) if record else {}
    params = {**recorded, **given}
    missing = [p for p in STANDALONE_REQUIRED[stage] if params.get(p) in (None, "", [])]
    if missing:
        raise RunError(
            f"run {run_id!r}: the {stage} stage needs {', '.join(missing)} (none recorded in "
            f"{run_uri(artifacts_root, run_id)}); pass them the first time the stage runs"
        )
    if record is None or params != recorded:
        record = record or _new_record(run_id)
        record.stages[stage] = params
        save_run(artifacts_root, record)
    return params


def configured_stages(record: RunRecord) -> list[str]:
    """The stages ``record`` has the configuration for, in DAG order."""
    have = set(record.stages) | (set(BENCHMARK_STAGES) if record.benchmark else set())
    return [s for s in STAGES if s in have]


# --------------------------------------------------------------------------------------------
# stages/<stage>.json
# --------------------------------------------------------------------------------------------


def stage_status(artifacts_root: str, run_id: str, stage: str) -> StageStatus | None:
    """The latest attempt of ``stage`` in ``run_id`` (None when it never started)."""
    uri = stage_uri(artifacts_root, run_id, stage)
    if not storage.exists(uri):
        return None
    return _parse(StageStatus, storage.read_json(uri), uri)


def stage_statuses(artifacts_root: str, run_id: str) -> dict[str, StageStatus]:
    """Stage → latest attempt, for every stage of ``run_id`` that started (DAG order)."""
    out = {}
    for stage in STAGES:
        status = stage_status(artifacts_root, run_id, stage)
        if status is not None:
            out[stage] = status
    return out


def fail_running_stages(artifacts_root: str, run_id: str, error: str) -> list[str]:
    """Record every ``running`` stage of ``run_id`` as ``failed`` with ``error`` (a process
    that is about to exit without unwinding, :mod:`tasks.core.interrupt`); returns their names."""
    out = []
    for stage, status in stage_statuses(artifacts_root, run_id).items():
        if status.status == "running":
            status.status, status.finished_at = "failed", now_iso()
            status.error = error[:MAX_ERROR_CHARS]
            storage.write_json(stage_uri(artifacts_root, run_id, stage),
                               status.model_dump(mode="json"))
            out.append(stage)
    return out


def pending_stages(artifacts_root: str, run_id: str) -> list[str]:
    """The configured stages of the run that have not completed (failed, interrupted while
    ``running``, or never started), in DAG order."""
    record = load_run(artifacts_root, run_id)
    statuses = stage_statuses(artifacts_root, run_id)
    return [
        s for s in configured_stages(record)
        if s not in statuses or statuses[s].status != "completed"
    ]


def _flow_run_id() -> str | None:
    import sys

    if "prefect" not in sys.modules:  # not inside a flow run; do not import Prefect for nothing
        return None
    try:
        from prefect.runtime import flow_run

        value = flow_run.id
        return str(value) if value else None
    except Exception:  # noqa: BLE001 - bookkeeping must never fail a stage
        return None


class StageHandle:
    """What :func:`stage_run` yields: put the stage's results in ``outputs``."""

    def __init__(self, status: StageStatus):
        self.status = status
        self.outputs: dict[str, Any] = {}


@contextmanager
def stage_run(artifacts_root: str, run_id: str, stage: str) -> Iterator[StageHandle]:
    """Record one attempt of ``stage``: ``running`` on entry, then ``completed`` with the
    handle's ``outputs`` or ``failed`` with the exception's message (re-raised). The run's
    lease (:func:`run_lease`) is held throughout; :class:`LeaseHeld` when another process
    holds it.

    A stage killed while running stays ``running``; the next attempt moves it to the history."""
    with run_lease(artifacts_root, run_id):
        with _stage_attempt(artifacts_root, run_id, stage) as handle:
            yield handle


@contextmanager
def _stage_attempt(artifacts_root: str, run_id: str, stage: str) -> Iterator[StageHandle]:
    uri = stage_uri(artifacts_root, run_id, stage)
    previous = stage_status(artifacts_root, run_id, stage)
    history = []
    if previous is not None:
        history = [*previous.history, StageAttempt(
            attempt=previous.attempt, status=previous.status, started_at=previous.started_at,
            finished_at=previous.finished_at, error=previous.error,
        )]
    status = StageStatus(
        run_id=run_id, stage=stage, status="running",
        attempt=(previous.attempt + 1) if previous else 1, started_at=now_iso(),
        flow_run_id=_flow_run_id(), history=history,
    )
    storage.write_json(uri, status.model_dump(mode="json"))
    handle = StageHandle(status)
    try:
        yield handle
    except BaseException as exc:
        status.status = "failed"
        status.finished_at = now_iso()
        status.error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
        try:
            storage.write_json(uri, status.model_dump(mode="json"))
        except Exception as write_exc:  # noqa: BLE001 - keep the stage's own error
            log.error("could not record the failure of stage %s of run %s: %s",
                      stage, run_id, write_exc)
        raise
    status.status = "completed"
    status.finished_at = now_iso()
    status.outputs = json.loads(json.dumps(handle.outputs, default=str))  # JSON-able, always
    storage.write_json(uri, status.model_dump(mode="json"))


# --------------------------------------------------------------------------------------------
# Errored trials: a run with more than it allows fails, and says how to retry
# --------------------------------------------------------------------------------------------


class TrialsErrored(RuntimeError):
    """Some agent's share of errored trials (``api_error`` / ``error``) is above what the run
    allows.

    ``summary``: the score step's summary (``trials``, ``errored``, ``error_share``,
    ``errored_by_reason``, ``by_agent``); ``max_share``: the allowed share (per agent);
    ``over``: agent → ``{"trials", "errored", "error_share"}`` of the agents above it;
    ``result``: what the flow computed before failing (its report is written). The message
    says how to retry."""

    def __init__(self, run_id: str, summary: dict, max_share: float, result: Any = None,
                 over: dict[str, dict] | None = None):
        self.run_id, self.summary, self.max_share, self.result = run_id, summary, max_share, result
        self.over = over or {}
        reasons = ", ".join(f"{r} {n}" for r, n in summary.get("errored_by_reason", {}).items())
        agents = "; ".join(f"{a}: {c['errored']} of {c['trials']} ({c['error_share']:.1%})"
                           for a, c in self.over.items())
        super().__init__(
            f"run {run_id!r}: {summary['errored']} of {summary['trials']} trials errored "
            f"({reasons or 'no reason recorded'}"
            + (f"; above the allowed {max_share:.1%} per agent: {agents}" if agents else
               f"; {summary['error_share']:.1%} > the allowed {max_share:.1%}")
            + "); they have no verdict and are left out of the scores. Retry "
            f"them with `querylab rerun --run-id {run_id} --retry-errors` (or allow them: "
            "--max-error-share)" + (
                f"; validator_error: a validator gave no verdict (its traceback is the "
                f"score's reason): fix it, then `querylab rescore --run-id {run_id}`"
                if "validator_error" in summary.get("errored_by_reason", {}) else "")
        )


def score_summary(artifacts_root: str, run_id: str) -> dict | None:
    """The score step's ``score/summary.json`` of ``run_id`` (None when not scored)."""
    uri = RunLayout(artifacts_root, valid_run_id(run_id)).score("summary.json")
    return storage.read_json(uri) if storage.exists(uri) else None


def errored_over(summary: dict, max_share: float) -> dict[str, dict]:
    """Agent → its ``{"trials", "errored", "error_share"}`` for every agent of a score
    ``summary`` whose share of errored trials is above ``max_share`` (the share is per agent;
    a summary written before ``by_agent`` existed is judged as one agent, ``*``)."""
    by_agent = summary.get("by_agent") or {"*": {k: summary[k] for k in
                                                 ("trials", "errored", "error_share")}}
    return {a: c for a, c in by_agent.items()
            if c["errored"] and c["error_share"] > max_share + 1e-12}


def check_error_share(
    artifacts_root: str, run_id: str, max_share: float = 0.0, result: Any = None
) -> dict:
    """The run's score summary; :class:`TrialsErrored` when some agent's share of errored
    trials exceeds ``max_share`` (RunError when the run has not been scored)."""
    summary = score_summary(artifacts_root, run_id)
    if summary is None:
        raise RunError(f"run {run_id!r} has not been scored: `querylab rescore --run-id {run_id}`")
    over = errored_over(summary, max_share)
    if over:
        raise TrialsErrored(run_id, summary, max_share, result, over)
    return summary


def preflight_uri(artifacts_root: str, run_id: str) -> str:
    """URI of ``runs/<run_id>/preflight.json``: every preflight check made for the run."""
    return RunLayout(artifacts_root, valid_run_id(run_id)).preflight


def record_preflight(artifacts_root: str, run_id: str, results: list) -> str | None:
    """Append the preflight checks ``results`` (:class:`tasks.core.llm.PreflightResult`) made for
    ``run_id`` to its ``preflight.json`` (one entry per check: ``at``, ``agent``,
    ``model_id``, ``base_url``, ``ok``, ``problem``, ``requests``, ``prompt_tokens``,
    ``completion_tokens``, ``cost_usd``, ``priced``): they are real, paid requests, counted in
    the report's cost. Returns the URI (None when there was nothing to record)."""
    if not results:
        return None
    uri = preflight_uri(artifacts_root, run_id)
    entries = storage.read_json(uri) if storage.exists(uri) else []
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for r in results:
        entries.append({"at": at, "agent": r.agent, "model_id": r.model_id,
                        "base_url": r.base_url, "ok": r.ok, "problem": r.problem,
                        "requests": r.requests, "prompt_tokens": r.prompt_tokens,
                        "completion_tokens": r.completion_tokens, "cost_usd": r.cost_usd,
                        "priced": r.priced})
    return storage.write_json(uri, entries)


def preflight_checks(artifacts_root: str, run_id: str) -> list[dict]:
    """The run's recorded preflight checks (:func:`record_preflight`; [] when none)."""
    uri = preflight_uri(artifacts_root, run_id)
    return storage.read_json(uri) if storage.exists(uri) else []


# --------------------------------------------------------------------------------------------
# The list of runs
# --------------------------------------------------------------------------------------------


def _run_status(record: RunRecord, statuses: dict[str, StageStatus],
                summary: dict | None = None) -> str:
    """``completed`` (every configured stage), ``errored`` (every stage completed but some
    agent's share of errored trials in ``summary`` is above the run's ``max_error_share``:
    the run exits non-zero), ``interrupted`` (a stage failed because the run was stopped by a
    signal), ``failed`` / ``running`` (some stage is), ``partial`` (some stage never ran),
    ``empty``."""
    configured = configured_stages(record)
    if not configured:
        return "empty"
    states = [statuses[s].status if s in statuses else "pending" for s in configured]
    if any(was_interrupted(statuses[s]) for s in configured if s in statuses):
        return "interrupted"
    for state in ("failed", "running"):
        if state in states:
            return state
    if not all(s == "completed" for s in states):
        return "partial"
    allowed = record.benchmark.max_error_share if record.benchmark else 0.0
    return "errored" if summary and errored_over(summary, allowed) else "completed"


def was_interrupted(status: StageStatus) -> bool:
    """True for a stage that failed because the run was stopped (Ctrl-C / SIGTERM:
    :class:`tasks.core.interrupt.RunInterrupted`), not because something went wrong."""
    return status.status == "failed" and "interrupted (SIG" in (status.error or "")


def unsafe_agents(artifacts_root: str, run_id: str) -> dict[str, list[str]]:
    """Agent → the sandbox mechanisms it ran without, for the LLM agents of the run that ran
    with ``--unsafe-sandbox`` on a machine missing some (from ``trials/agents.json``)."""
    uri = RunLayout(artifacts_root, run_id).trials("agents.json")
    try:
        described = storage.read_json(uri) if storage.exists(uri) else []
    except Exception:  # noqa: BLE001 - no record, nothing to mark
        return {}
    return {d["agent"]: list(d["sandbox"].get("missing") or []) for d in described
            if (d.get("sandbox") or {}).get("unsafe_sandbox") and d["sandbox"].get("missing")}


def list_runs(artifacts_root: str) -> list[dict]:
    """Every run under the artifact root with a run record, newest first: ``{"run_id",
    "created_at", "updated_at", "agents", "datasets", "stages", "status", "trials",
    "errored", "pass_at_1": {agent: value}, "unsafe_sandbox": {agent: missing}}`` (status:
    see :func:`_run_status`, ``errored`` when more trials errored than the run allows,
    ``interrupted`` when a stage is recorded running but no live process holds the lease;
    trials/errored from the score summary, pass@1 —
    mean over queries — from the report's ``pass_at_k_summary.parquet``; None when missing). A
    record that cannot be read is listed with ``status`` ``unreadable``."""
    out = []
    for run_id in storage.list_dirs(runs_root(artifacts_root)):
        try:
            valid_run_id(run_id)
            record = find_run(artifacts_root, run_id)
        except RunError as exc:
            out.append({"run_id": run_id, "created_at": "", "updated_at": "", "agents": [],
                        "datasets": [], "stages": [], "status": "unreadable", "trials": None,
                        "errored": None, "pass_at_1": {}, "error": str(exc)})
            continue
        if record is None:
            continue
        statuses = stage_statuses(artifacts_root, run_id)
        summary = score_summary(artifacts_root, run_id) or {}
        b = record.benchmark
        out.append({
            "run_id": run_id,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "agents": list(b.agents) if b else list(record.stages.get("lifecycle", {}).get("models", [])),
            "datasets": list(b.datasets) if b else [],
            "stages": configured_stages(record),
            # a "running" stage nobody runs any more (its process was killed)
            "status": ("interrupted" if _run_status(record, statuses, summary) == "running"
                       and not lease_alive(artifacts_root, run_id)
                       else _run_status(record, statuses, summary)),
            "unsafe_sandbox": unsafe_agents(artifacts_root, run_id),
            "trials": summary.get("trials"),
            "errored": summary.get("errored"),
            "pass_at_1": _pass_at_1(artifacts_root, run_id),
        })
    return sorted(out, key=lambda r: (r["created_at"], r["run_id"]), reverse=True)


def _pass_at_1(artifacts_root: str, run_id: str) -> dict[str, float | None]:
    uri = RunLayout(artifacts_root, run_id).report("pass_at_k_summary.parquet")
    if not storage.exists(uri):
        return {}
    import io

    import pyarrow.parquet as pq

    table = pq.ParquetFile(io.BytesIO(storage.read_bytes(uri))).read(
        columns=["agent", "dataset", "k", "pass_at_k"])
    out: dict[str, float | None] = {}
    for row in table.to_pylist():
        if row["k"] == 1 and row["dataset"] == "ALL (queries)":
            out[row["agent"]] = row["pass_at_k"]
    return out
