"""Build the ``stocks`` dataset (spec: ``data/stocks.yaml``)."""

from __future__ import annotations

from prefect import flow

from flows.datasets import build_from_spec
from tasks.datasets.spec import spec_path


@flow(name="build-stocks")
def build_stocks(artifacts_root: str | None = None, source_dir: str | None = None) -> str:
    """Extract, perturb and place ``stocks``; returns its manifest URI."""
    return build_from_spec(spec_path("stocks"), artifacts_root, source_dir)
