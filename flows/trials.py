"""Agent trials fan-out: (agent × query × trial) batches as mapped Prefect tasks."""

from __future__ import annotations

from prefect import flow, unmapped

from schemas.settings import Settings
from tasks.agents import local_model
from tasks.core.concurrency import DEFAULT_MAX_CONCURRENCY
from tasks.core.progress import StageProgress, count_finished_trials
from tasks.core.runs import gather
from tasks.core.task_runners import EnvTaskRunner
from tasks.trials.stage import (
    combine_trials, describe_agents, plan_batches, run_trial_batch, warm_up_stage,
)


@flow(name="trials", flow_run_name="trials-batches-{run_id}", task_runner=EnvTaskRunner())
def run_trials(
    run_id: str,
    manifest_uris: list[str],
    agents: list[str],
    n_trials: int = 5,
    batch_size: int = 25,
    artifacts_root: str | None = None,
    agent_options: dict | None = None,
    hints: list[str] | None = None,
    retry_errors: bool = False,
    query_ids: list[str] | None = None,
    limit: int | None = None,
    agent_plans: dict[str, dict] | None = None,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    max_trials: int | None = None,
    agent_defaults: dict[str, dict] | None = None,
) -> dict[str, str]:
    """Check the agents (fails before any trial when one cannot run), run every trial
    (finished batches and checkpointed trials are skipped) and combine the batches.

    Every batch runs to its end even when another fails; then the flow fails with
    :class:`tasks.core.runs.StageFailed` naming the failed batches (re-running skips the finished
    ones). ``hints``: hint conditions (default ``["off"]``, see
    :func:`tasks.trials.stage.plan_batches`). ``retry_errors``: finished batches re-run their errored
    trials (``api_error`` / ``error``) and keep every other row. ``query_ids`` / ``limit``
    select a subset of each dataset's queries (:func:`tasks.trials.stage.select_queries`);
    ``agent_plans``: per-agent datasets and trials (:class:`schemas.runs.AgentPlan` dicts).
    ``agent_defaults``: agent → its model's default options (the run record's; None: the
    models table's now; :func:`tasks.trials.stage.plan_batches`).
    ``max_concurrency``: model calls in flight at once across every batch; ``max_trials``:
    trials admitted at once across every batch (None: ``2 * max_concurrency``; each batch runs
    its trials concurrently; the models table's ``max_concurrency`` caps a model's calls
    further, see :mod:`tasks.core.concurrency`); the batches run on the task runner ``QUERYLAB_TASK_RUNNER``
    names (:mod:`tasks.core.task_runners`: Prefect's thread pool, or Dask).
    Progress (trials done, counted from checkpoints) goes to a Prefect progress artifact and
    the CLI's bar. ``agent_options``: :class:`schemas.models.AgentOptions` fields (limits,
    retries, sampling, cache, sandbox limits). A ``local:<model>`` server is shared by the
    batches and stopped at the end (:func:`tasks.agents.local_model.serving`). Returns the URIs of
    ``trials``, ``tool_calls``, ``llm_calls``, ``messages`` and ``agents`` (agents.json). Trial
    rows carry no verdict: the score stage (:mod:`tasks.scoring.stage`) judges them.
    """
    root = artifacts_root or Settings.from_env().artifacts
    warm_up_stage(agents)  # model clients' TLS context, in the background
    with local_model.serving():
        agents_uri = describe_agents(run_id, root, agents, manifest_uris, agent_options, hints,
                                     agent_defaults)
        batches = plan_batches(manifest_uris, agents, n_trials, batch_size, agent_options,
                               hints, query_ids=query_ids, limit=limit,
                               agent_plans=agent_plans, agent_defaults=agent_defaults)
        keys = [b["key"] for b in batches]
        total = sum(len(b["items"]) for b in batches)
        with StageProgress("trials", run_id, total, unit="trials") as progress:
            progress.poll(lambda: count_finished_trials(root, run_id, batches))
            futures = run_trial_batch.map(
                unmapped(run_id), unmapped(root), batches, unmapped(retry_errors),
                unmapped(max_concurrency), unmapped(max_trials),
            )
            gather(futures, keys, run_id, "trials")
    return {**combine_trials(run_id, root, keys), "agents": agents_uri}
