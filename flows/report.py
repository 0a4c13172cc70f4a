"""Report stage: Polars aggregations of a run's artifacts into tables."""

from __future__ import annotations

from prefect import flow

from schemas.settings import Settings
from tasks.report import pass_at_k_report


@flow(name="report")
def report(run_id: str, artifacts_root: str | None = None) -> dict:
    """pass@k tables for ``run_id`` (reads only the run's artifacts)."""
    return pass_at_k_report(run_id, artifacts_root or Settings.from_env().artifacts)
