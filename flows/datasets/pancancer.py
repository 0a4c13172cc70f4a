"""Build the ``pancancer`` dataset (spec: ``data/pancancer.yaml``; sources in the shared data directory,
``$QUERYLAB_SHARED_DATA`` or ``../shared/data``)."""

from __future__ import annotations

from prefect import flow

from flows.datasets import build_shared


@flow(name="build-pancancer")
def build_pancancer(artifacts_root: str | None = None, source_dir: str | None = None) -> str:
    """Extract, perturb and place ``pancancer``; ``source_dir`` defaults to the shared data
    directory. Returns its manifest URI."""
    return build_shared("pancancer", artifacts_root, source_dir)
