"""End-to-end benchmark: datasets → trials → score → report, each stage a subflow keyed by
run_id."""

from __future__ import annotations

from prefect import flow, get_run_logger, tags

from flows.datasets import dataset_flows, default_datasets
from flows.stages import datasets_stage, report_stage, score_stage, trials_stage
from schemas.settings import Settings
from tasks.agents import local_model
from tasks.core import runs
from tasks.core.concurrency import DEFAULT_MAX_CONCURRENCY
from tasks.datasets.dab_import import imported_datasets, imported_name
from tasks.core.prefect_task import label_flow_run, run_tags
from tasks.trials.stage import agent_options as check_agent_options
from tasks.trials.stage import hint_conditions, model_agent_defaults, parse_agent, preflight_agents


def _benchmark_run_name() -> str:
    from prefect.runtime import flow_run

    return f"benchmark-{flow_run.parameters.get('run_id') or 'new'}"


@flow(name="benchmark", flow_run_name=_benchmark_run_name)
def benchmark(
    run_id: str | None = None,
    datasets: list[str] | None = None,
    agents: list[str] | None = None,
    n_trials: int = 5,
    batch_size: int = 25,
    artifacts_root: str | None = None,
    agent_options: dict | None = None,
    hints: list[str] | None = None,
    query_ids: list[str] | None = None,
    limit: int | None = None,
    max_error_share: float = 0.0,
    preflight: bool = True,
    agent_plans: dict[str, dict] | None = None,
    score_no_tool_call: bool = False,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
) -> dict:
    """Build ``datasets`` (default: :func:`flows.datasets.default_datasets` — the PyPI datasets,
    plus the shared-data ones when ``QUERYLAB_SHARED_DATA`` / ``../shared/data`` exists, with a
    warning naming those skipped), run ``agents`` (default: oracle) ``n_trials`` times per
    query, score the answers and report pass@k. ``agent_options``:
    :class:`schemas.models.AgentOptions` fields (limits, retries, sampling, cache); ``hints``:
    hint conditions, ``["off"]`` (default, as DAB), ``["on"]`` or both
    (:func:`tasks.trials.stage.plan_batches`); ``query_ids`` / ``limit`` run a subset of each
    dataset's queries; ``agent_plans``: per-agent ``datasets`` / ``n_trials``
    (:class:`schemas.runs.AgentPlan`, e.g. a slow model on one dataset only);
    ``score_no_tool_call``: score ``no_tool_call`` texts on DAB datasets (DAB: invalid);
    ``max_concurrency``: trials in flight at once across the trials stage (batch size only
    sets checkpoint granularity; :mod:`tasks.core.concurrency`);
    ``run_id`` default: a new one (scheduled deployments). A dataset name may also be a DAB
    dataset imported into the artifact root (``querylab import-dab``), by DAB's name. A
    ``local:<model>`` server started for the run
    (by the preflight or the trials) is stopped when the run ends, also on failure.

    ``preflight``: before any dataset is built, each LLM agent is checked with one minimal
    real request (:func:`tasks.core.llm.preflight`); a failure raises AgentConfigError naming agent,
    endpoint and problem (the CLI runs the check itself, before Prefect starts, and passes
    False). The configuration is recorded in ``runs/<run_id>/run.json`` first, so any stage can
    be re-run later from the run id alone (:mod:`flows.stages`). When more than
    ``max_error_share`` of the trials errored (``api_error`` / ``error``), the flow fails with
    :class:`tasks.core.runs.TrialsErrored` after the report is written (its ``result`` holds what
    this returns). Returns ``run_id``, the ``manifests``, the ``trials`` URIs, the ``score``
    summary and the ``report`` dict."""
    from tasks.core.llm import AgentConfigError

    root = artifacts_root or Settings.from_env().artifacts
    run_id = runs.valid_run_id(run_id or runs.new_run_id())
    flows = dataset_flows()
    names = list(datasets or default_datasets(get_run_logger().warning))
    names = [n if n in flows else imported_name(root, n) or n for n in names]
    unknown = [n for n in names if n not in flows and imported_name(root, n) is None]
    if unknown:
        raise ValueError(f"unknown datasets {unknown}; have {sorted(flows)} and the imported "
                         f"DAB datasets {sorted(imported_datasets(root))}")
    agents = list(agents or ["oracle"])
    for agent in agents:
        parse_agent(agent)
    check_agent_options(agent_options)
    run_tag_list = run_tags(run_id, agents, names)
    label_flow_run(run_tag_list, name=f"benchmark-{run_id}")
    with runs.run_lease(root, run_id):  # one process per run id, across all the stages
        if preflight:  # under the lease: a run refused by it pays for no request
            checks = preflight_agents(agents, agent_options)
            failed = [r for r in checks if not r.ok]
            if failed:
                raise AgentConfigError("preflight failed: " + "; ".join(r.line() for r in failed))
            runs.record_preflight(root, run_id, checks)  # paid requests: in the report's cost
        runs.record_benchmark(root, run_id, {
            "datasets": names, "agents": agents, "n_trials": n_trials, "batch_size": batch_size,
            "agent_options": agent_options or {}, "hints": hint_conditions(hints),
            "query_ids": list(query_ids or []), "limit": limit, "max_error_share": max_error_share,
            "agent_plans": agent_plans or {}, "score_no_tool_call": score_no_tool_call,
            "max_concurrency": max_concurrency,
            "agent_defaults": model_agent_defaults(agents),
        })
        with local_model.serving(), tags(*run_tag_list):  # local servers live until the run ends
            manifests = datasets_stage(run_id, root)
            trials = trials_stage(run_id, root)
            score = score_stage(run_id, root)
            report = report_stage(run_id, root)
    out = {"run_id": run_id, "manifests": manifests, "trials": trials,
           "score": {k: v for k, v in score.items() if k != "manifests"}, "report": report}
    runs.check_error_share(root, run_id, max_error_share, out)
    return out
