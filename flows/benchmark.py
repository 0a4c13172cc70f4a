"""End-to-end benchmark: datasets → trials → report, each stage a subflow."""

from __future__ import annotations

from prefect import flow

from flows.datasets import dataset_flows
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
) -> dict:
    """Build ``datasets`` (default: all shipped), run ``agents`` (default: oracle) ``n_trials``
    times per query, and report pass@k. Returns the manifest, trial and report URIs."""
    root = artifacts_root or Settings.from_env().artifacts
    flows = dataset_flows()
    names = datasets or list(flows)
    unknown = [n for n in names if n not in flows]
    if unknown:
        raise ValueError(f"unknown datasets {unknown}; have {sorted(flows)}")
    manifests = [flows[name](artifacts_root=root) for name in names]
    trials = run_trials(run_id, manifests, agents or ["oracle"], n_trials, batch_size, root)
    return {"manifests": manifests, "trials": trials, "report": report(run_id, root)}
