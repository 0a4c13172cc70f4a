"""Build the ``music`` dataset (spec: ``data/music.yaml``; sources in the shared data directory,
``$QUERYLAB_SHARED_DATA`` or ``../shared/data``)."""

from __future__ import annotations

from prefect import flow

from flows.datasets import build_shared


@flow(name="build-music")
def build_music(artifacts_root: str | None = None, source_dir: str | None = None) -> str:
    """Extract, perturb and place ``music``; ``source_dir`` defaults to the shared data
    directory. Returns its manifest URI."""
    return build_shared("music", artifacts_root, source_dir)
