"""Agent trials fan-out: (agent × query × trial) batches as mapped Prefect tasks."""

from __future__ import annotations

from prefect import flow, unmapped

from schemas.settings import Settings
from tasks.trials import combine_trials, plan_batches, run_trial_batch


@flow(name="trials")
def run_trials(
    run_id: str,
    manifest_uris: list[str],
    agents: list[str],
    n_trials: int = 5,
    batch_size: int = 25,
    artifacts_root: str | None = None,
) -> dict[str, str]:
    """Run every trial (finished batches are skipped); returns the trials/tool_calls URIs."""
    root = artifacts_root or Settings.from_env().artifacts
    batches = plan_batches(manifest_uris, agents, n_trials, batch_size)
    futures = run_trial_batch.map(unmapped(run_id), unmapped(root), batches)
    for future in futures:
        future.result()
    return combine_trials(run_id, root, [b["key"] for b in batches])
