"""Build the ``github`` dataset (spec: ``data/github.yaml``; sources in the shared data directory,
``$QUERYLAB_SHARED_DATA`` or ``../shared/data``)."""

from __future__ import annotations

from prefect import flow

from flows.datasets import build_shared


@flow(name="build-github")
def build_github(artifacts_root: str | None = None, source_dir: str | None = None) -> str:
    """Extract, perturb and place ``github``; ``source_dir`` defaults to the shared data
    directory. Returns its manifest URI."""
    return build_shared("github", artifacts_root, source_dir)
