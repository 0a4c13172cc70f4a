"""Stage flows keyed by ``run_id``: each re-runs one stage of a run from its run record alone.

``runs/<run_id>/run.json`` (:mod:`tasks.runs`) holds what the run was configured with, so
``stage_trials("my-run")`` — or ``querylab rerun --run-id my-run --stage trials``, or
``prefect deployment run stage-trials/trials --param run_id=my-run`` — needs nothing else.
Each stage records its attempt in ``runs/<run_id>/stages/<stage>.json`` and is idempotent on
(run_id, stage, item): finished items are skipped, rows are never duplicated.

- ``datasets``: build and load the run's datasets (content-versioned, so a rebuild is a no-op);
  records the manifests.
- ``trials``: the agent trials (finished batches and checkpointed trials skipped).
- ``report``: the report, from the artifacts alone.
- ``generation``, ``equivalence``, ``lifecycle``: the stand-alone suites
  (:mod:`flows.text2sql`, :mod:`flows.equivalence`, :mod:`flows.lifecycle`); their parameters
  are given the first time and recorded, later runs need only the run id.
"""

from __future__ import annotations

from prefect import flow

from schemas.settings import Settings
from tasks import runs
from tasks.progress import StageProgress


def _root(artifacts_root: str | None) -> str:
    return artifacts_root or Settings.from_env().artifacts


def datasets_stage(run_id: str, root: str) -> list[str]:
    """Body of :func:`stage_datasets` (runs inside any flow: the benchmark runs it inline)."""
    from flows.datasets import dataset_flows

    config = runs.benchmark_config(root, run_id)
    flows = dataset_flows()
    unknown = [n for n in config.datasets if n not in flows]
    if unknown:
        raise ValueError(f"run {run_id!r}: unknown datasets {unknown}; have {sorted(flows)}")
    with runs.stage_run(root, run_id, "datasets") as stage:
        manifests = []
        with StageProgress("datasets", run_id, len(config.datasets), unit="datasets") as bar:
            for name in config.datasets:
                manifests.append(flows[name](artifacts_root=root))
                bar.advance()
        runs.record_manifests(root, run_id, manifests)
        stage.outputs = {"manifests": manifests}
    return manifests


@flow(name="stage-datasets")
def stage_datasets(run_id: str, artifacts_root: str | None = None) -> list[str]:
    """Build and load every dataset of the run's configuration (one subflow per dataset) and
    record their manifests in ``run.json``. Returns the manifest URIs (dataset order).
    Raises RunError when the run has no benchmark configuration, ValueError for a dataset
    that no longer exists."""
    return datasets_stage(run_id, _root(artifacts_root))


def trials_stage(run_id: str, root: str) -> dict[str, str]:
    """Body of :func:`stage_trials` (runs inside any flow: the benchmark runs it inline)."""
    from flows.trials import run_trials

    config = runs.benchmark_config(root, run_id)
    manifests = runs.run_manifests(root, run_id)
    with runs.stage_run(root, run_id, "trials") as stage:
        out = run_trials(
            run_id, manifests, config.agents, config.n_trials, config.batch_size, root,
            config.agent_options, config.hints,
            agent_plans={a: p.model_dump() for a, p in config.agent_plans.items()},
        )
        stage.outputs = dict(out)
    return out


@flow(name="stage-trials")
def stage_trials(run_id: str, artifacts_root: str | None = None) -> dict[str, str]:
    """Run the run's agent trials (:func:`flows.trials.run_trials`) with its recorded agents,
    trials, batch size, options and dataset manifests. Only unfinished batches run. Returns
    the URIs of ``trials``, ``tool_calls``, ``llm_calls`` and ``agents``."""
    return trials_stage(run_id, _root(artifacts_root))


def report_stage(run_id: str, root: str) -> dict:
    """Body of :func:`stage_report` (runs inside any flow: the benchmark runs it inline)."""
    from flows.report import report

    runs.valid_run_id(run_id)
    with runs.stage_run(root, run_id, "report") as stage:
        out = report(run_id, artifacts_root=root)
        stage.outputs = {k: v for k, v in out.items() if isinstance(v, str | int | float | dict)}
    return out


@flow(name="stage-report")
def stage_report(run_id: str, artifacts_root: str | None = None) -> dict:
    """The run's report from its artifacts alone (:func:`flows.report.report`); returns the
    report flow's dict."""
    return report_stage(run_id, _root(artifacts_root))


@flow(name="stage-generation")
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


@flow(name="stage-equivalence")
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


@flow(name="stage-lifecycle")
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
    "generation": stage_generation,
    "equivalence": stage_equivalence,
    "lifecycle": stage_lifecycle,
    "report": stage_report,
}


def run_stage(stage: str, run_id: str, artifacts_root: str | None = None):
    """Run one stage flow of ``run_id`` from its run record; returns the flow's result.
    RunError for an unknown stage or run."""
    runs.check_stage(stage)
    runs.valid_run_id(run_id)
    return STAGE_FLOWS[stage](run_id=run_id, artifacts_root=artifacts_root)
