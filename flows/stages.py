"""Stage flows keyed by ``run_id``: each re-runs one stage of a run from its run record alone.

``runs/<run_id>/run.json`` (:mod:`tasks.core.runs`) holds what the run was configured with, so
``stage_trials("my-run")`` — or ``querylab rerun --run-id my-run --stage trials``, or
``prefect deployment run stage-trials/trials --param run_id=my-run`` — needs nothing else.
Each stage records its attempt in ``runs/<run_id>/stages/<stage>.json`` and is idempotent on
(run_id, stage, item): finished items are skipped, rows are never duplicated.

- ``datasets``: build and load the run's datasets (content-versioned, so a rebuild is a no-op);
  records the manifests.
- ``trials``: the agent trials (finished batches and checkpointed trials skipped;
  ``retry_errors=True`` re-runs exactly the errored ones).
- ``score``: the verdicts and the trace audit (:mod:`tasks.scoring.stage`), from the stored answers;
  re-running it is ``querylab rescore`` and makes no model call.
- ``report``: the report, from the artifacts alone.
- ``generation``, ``equivalence``, ``lifecycle``: the stand-alone suites
  (:mod:`flows.text2sql`, :mod:`flows.equivalence`, :mod:`flows.lifecycle`); their parameters
  are given the first time and recorded, later runs need only the run id.
"""

from __future__ import annotations

from prefect import flow, tags

from schemas.settings import Settings
from tasks.core import runs
from tasks.core.prefect_task import label_flow_run, run_tags
from tasks.core.progress import StageProgress


def _root(artifacts_root: str | None) -> str:
    return artifacts_root or Settings.from_env().artifacts


def _run_tags(root: str, run_id: str) -> list[str]:
    """Tags of a stage flow run of ``run_id`` (agents and datasets from its run record)."""
    record = runs.find_run(root, run_id)
    b = record.benchmark if record is not None else None
    return run_tags(run_id, b.agents if b else None, b.datasets if b else None)


def datasets_stage(run_id: str, root: str) -> list[str]:
    """Body of :func:`stage_datasets` (runs inside any flow: the benchmark runs it inline)."""
    from flows.datasets import dataset_flows

    from flows.datasets.dab_import import load_imported
    from tasks.core import storage
    from tasks.datasets.dab_import import imported_name
    from tasks.scoring.dab_rules import dataset_condition

    config = runs.benchmark_config(root, run_id)
    flows = dataset_flows()
    unknown = [n for n in config.datasets if n not in flows and imported_name(root, n) is None]
    if unknown:
        raise ValueError(f"run {run_id!r}: unknown datasets {unknown}; have {sorted(flows)} "
                         "(and DAB datasets imported with `querylab import-dab`)")
    with runs.stage_run(root, run_id, "datasets") as stage:
        manifests = []
        with StageProgress("datasets", run_id, len(config.datasets), unit="datasets") as bar:
            for name in config.datasets:
                if name in flows:
                    build = flows[name].with_options(flow_run_name=f"build-{name}-{run_id}")
                    manifests.append(build(artifacts_root=root))
                else:  # an imported DAB dataset, by DAB's name
                    manifests.append(load_imported(name, root))
                bar.advance()
        runs.record_manifests(root, run_id, manifests)
        runs.record_conditions(root, run_id, {
            m["name"]: dataset_condition(m, config.agent_options, config.hints,
                                         config.score_no_tool_call)
            for m in (storage.read_json(u) for u in manifests)})
        stage.outputs = {"manifests": manifests}
    return manifests


@flow(name="stage-datasets", flow_run_name="datasets-{run_id}")
def stage_datasets(run_id: str, artifacts_root: str | None = None) -> list[str]:
    """Build and load every dataset of the run's configuration (one subflow per dataset) and
    record their manifests in ``run.json``. Returns the manifest URIs (dataset order).
    Raises RunError when the run has no benchmark configuration, ValueError for a dataset
    that no longer exists."""
    root = _root(artifacts_root)
    label_flow_run(_run_tags(root, run_id))
    with tags(*_run_tags(root, run_id)):
        return datasets_stage(run_id, root)


def trials_stage(run_id: str, root: str, retry_errors: bool = False) -> dict[str, str]:
    """Body of :func:`stage_trials` (runs inside any flow: the benchmark runs it inline)."""
    from flows.trials import run_trials
    from tasks.core.task_runners import EnvTaskRunner

    config = runs.benchmark_config(root, run_id)
    manifests = runs.run_manifests(root, run_id)
    trials_flow = run_trials.with_options(task_runner=EnvTaskRunner(config.max_concurrency))
    with runs.stage_run(root, run_id, "trials") as stage:
        out = trials_flow(
            run_id, manifests, config.agents, config.n_trials, config.batch_size, root,
            config.agent_options, config.hints, retry_errors=retry_errors,
            query_ids=config.query_ids, limit=config.limit,
            agent_plans={a: p.model_dump() for a, p in config.agent_plans.items()},
            max_concurrency=config.max_concurrency, agent_defaults=config.agent_defaults,
        )
        stage.outputs = dict(out)
    return out


@flow(name="stage-trials", flow_run_name="trials-{run_id}")
def stage_trials(
    run_id: str, artifacts_root: str | None = None, retry_errors: bool = False
) -> dict[str, str]:
    """Run the run's agent trials (:func:`flows.trials.run_trials`) with its recorded agents,
    trials, batch size, concurrency, options, query selection and dataset manifests. Only unfinished
    batches run; ``retry_errors``: also the errored trials of finished batches (and nothing
    else). Returns the URIs of ``trials``, ``tool_calls``, ``llm_calls``, ``messages`` and
    ``agents``. Run the score and report stages afterwards (``rerun_errored`` does all
    three)."""
    root = _root(artifacts_root)
    label_flow_run(_run_tags(root, run_id))
    with tags(*_run_tags(root, run_id)):
        return trials_stage(run_id, root, retry_errors)


def score_stage(run_id: str, root: str) -> dict:
    """Body of :func:`stage_score` (runs inside any flow: the benchmark runs it inline)."""
    from tasks.scoring.stage import score_run

    runs.valid_run_id(run_id)
    with runs.stage_run(root, run_id, "score") as stage:
        out = score_run(run_id, root)
        stage.outputs = {k: v for k, v in out.items() if k != "manifests"}
    return out


@flow(name="stage-score", flow_run_name="score-{run_id}")
def stage_score(run_id: str, artifacts_root: str | None = None) -> dict:
    """Score the run's stored answers with the datasets' validators as they are now and audit
    every transcript (:func:`tasks.scoring.stage.score_run`): ``score/scores.parquet``,
    ``score/audit.parquet``, ``score/summary.json``. No model call. Returns the URIs and the
    summary (trials, correct, incorrect, errored, error_share, flagged, scorer_version)."""
    root = _root(artifacts_root)
    label_flow_run(_run_tags(root, run_id))
    return score_stage(run_id, root)


def report_stage(run_id: str, root: str) -> dict:
    """Body of :func:`stage_report` (runs inside any flow: the benchmark runs it inline)."""
    from flows.report import report

    runs.valid_run_id(run_id)
    with runs.stage_run(root, run_id, "report") as stage:
        out = report(run_id, artifacts_root=root)
        stage.outputs = {k: v for k, v in out.items() if isinstance(v, str | int | float | dict)}
    return out


@flow(name="stage-report", flow_run_name="report-{run_id}")
def stage_report(run_id: str, artifacts_root: str | None = None) -> dict:
    """The run's report from its artifacts alone (:func:`flows.report.report`); returns the
    report flow's dict."""
    root = _root(artifacts_root)
    label_flow_run(_run_tags(root, run_id))
    with tags(*_run_tags(root, run_id)):
        return report_stage(run_id, root)


@flow(name="rerun-errored", flow_run_name="rerun-errored-{run_id}")
def rerun_errored(
    run_id: str, artifacts_root: str | None = None, max_error_share: float | None = None
) -> dict:
    """Re-run exactly the run's errored trials (finished trials and cached model responses
    untouched), then score and report it again. Fails with
    :class:`tasks.core.runs.TrialsErrored` when errored trials remain above ``max_error_share``
    (default: the run's recorded one). Returns ``{"trials", "score", "report"}``."""
    root = _root(artifacts_root)
    label_flow_run(_run_tags(root, run_id))
    with tags(*_run_tags(root, run_id)):
        trials = trials_stage(run_id, root, retry_errors=True)
        score = score_stage(run_id, root)
        rep = report_stage(run_id, root)
    out = {"trials": trials, "score": score, "report": rep}
    share = runs.benchmark_config(root, run_id).max_error_share if max_error_share is None \
        else max_error_share
    runs.check_error_share(root, run_id, share, out)
    return out


@flow(name="stage-generation", flow_run_name="generation-{run_id}")
def stage_generation(
    run_id: str,
    artifacts_root: str | None = None,
    generators: list[str] | None = None,
    descriptions_path: str | None = None,
    query_ids: list[str] | None = None,
    config: dict | None = None,
    batch_size: int | None = None,
) -> dict:
    """Text-to-SQL generation (:func:`flows.text2sql.text2sql_generation`) for ``run_id``.
    Parameters given are recorded; omitted ones come from the run record (``generators`` and
    ``descriptions_path`` are required the first time)."""
    from flows.text2sql import text2sql_generation

    root = _root(artifacts_root)
    params = runs.resolve_stage_params(root, run_id, "generation", {
        "generators": generators, "descriptions_path": descriptions_path,
        "query_ids": query_ids, "config": config, "batch_size": batch_size,
    })
    with runs.stage_run(root, run_id, "generation") as stage:
        out = text2sql_generation(run_id=run_id, artifacts_root=root, **params)
        stage.outputs = out
    return out


@flow(name="stage-equivalence", flow_run_name="equivalence-{run_id}")
def stage_equivalence(
    run_id: str,
    artifacts_root: str | None = None,
    pairs_path: str | None = None,
    methods: list[str] | None = None,
    options: dict | None = None,
    batch_size: int | None = None,
) -> dict:
    """SQL-equivalence judging (:func:`flows.equivalence.equivalence`) for ``run_id``.
    Parameters given are recorded; omitted ones come from the run record (``pairs_path`` is
    required the first time)."""
    from flows.equivalence import equivalence

    root = _root(artifacts_root)
    params = runs.resolve_stage_params(root, run_id, "equivalence", {
        "pairs_path": pairs_path, "methods": methods, "options": options,
        "batch_size": batch_size,
    })
    with runs.stage_run(root, run_id, "equivalence") as stage:
        out = equivalence(run_id=run_id, artifacts_root=root, **params)
        stage.outputs = out
    return out


@flow(name="stage-lifecycle", flow_run_name="lifecycle-{run_id}")
def stage_lifecycle(
    run_id: str,
    artifacts_root: str | None = None,
    models: list[str] | None = None,
    spider_dir: str | None = None,
    questions_path: str | None = None,
    chinook_path: str | None = None,
    phases: list[str] | None = None,
    config: dict | None = None,
) -> dict:
    """The database-lifecycle suite (:func:`flows.lifecycle.lifecycle`) for ``run_id``.
    Parameters given are recorded; omitted ones come from the run record (``models``,
    ``spider_dir`` and ``questions_path`` are required the first time)."""
    from flows.lifecycle import lifecycle

    root = _root(artifacts_root)
    params = runs.resolve_stage_params(root, run_id, "lifecycle", {
        "models": models, "spider_dir": spider_dir, "questions_path": questions_path,
        "chinook_path": chinook_path, "phases": phases, "config": config,
    })
    with runs.stage_run(root, run_id, "lifecycle") as stage:
        out = lifecycle(run_id=run_id, artifacts_root=root, **params)
        stage.outputs = out
    return out


#: Stage name → its flow (what ``querylab rerun --stage`` and the deployments run).
STAGE_FLOWS = {
    "datasets": stage_datasets,
    "trials": stage_trials,
    "score": stage_score,
    "generation": stage_generation,
    "equivalence": stage_equivalence,
    "lifecycle": stage_lifecycle,
    "report": stage_report,
}


def run_stage(stage: str, run_id: str, artifacts_root: str | None = None, **params):
    """Run one stage flow of ``run_id`` from its run record; returns the flow's result.
    ``params``: extra flow parameters (``retry_errors`` for the trials stage). RunError for an
    unknown stage or run."""
    runs.check_stage(stage)
    runs.valid_run_id(run_id)
    return STAGE_FLOWS[stage](run_id=run_id, artifacts_root=artifacts_root, **params)
