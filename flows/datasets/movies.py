"""Build the ``movies`` dataset (spec: ``data/movies.yaml``)."""

from __future__ import annotations

from prefect import flow

from flows.datasets import build_from_spec
from tasks.datasets.spec import spec_path


@flow(name="build-movies")
def build_movies(artifacts_root: str | None = None, source_dir: str | None = None) -> str:
    """Extract, perturb and place ``movies``; returns its manifest URI."""
    return build_from_spec(spec_path("movies"), artifacts_root, source_dir)
