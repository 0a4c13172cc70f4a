"""End-to-end benchmark: datasets → trials → report, each stage a subflow."""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.datasets import dataset_flows, default_datasets
from flows.report import report
from flows.trials import run_trials
from schemas.settings import Settings


@flow(name="benchmark")
def benchmark(
    run_id: str,
    datasets: list[str] | None = None,
    agents: list[str] | None = None,
    n_trials: int = 5,
    batch_size: int = 25,
    artifacts_root: str | None = None,
    agent_options: dict | None = None,
) -> dict:
    """Build ``datasets`` (default: :func:`flows.datasets.default_datasets` — the PyPI datasets,
    plus the shared-data ones when ``QUERYLAB_SHARED_DATA`` / ``../shared/data`` exists, with a
    warning naming those skipped), run ``agents`` (default: oracle) ``n_trials`` times per
    query, and report pass@k. ``agent_options``: :class:`schemas.models.AgentOptions` fields
    (limits, retries, sampling, cache). Returns the manifest, trial and report URIs."""
    root = artifacts_root or Settings.from_env().artifacts
    flows = dataset_flows()
    names = datasets or default_datasets(get_run_logger().warning)
    unknown = [n for n in names if n not in flows]
    if unknown:
        raise ValueError(f"unknown datasets {unknown}; have {sorted(flows)}")
    manifests = [flows[name](artifacts_root=root) for name in names]
    trials = run_trials(
        run_id, manifests, agents or ["oracle"], n_trials, batch_size, root, agent_options
    )
    return {"manifests": manifests, "trials": trials, "report": report(run_id, root)}
