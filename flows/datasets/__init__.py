"""One flow module per dataset (``build_<name>``). To add a dataset: write ``data/<name>.yaml``
and a module here whose flow calls :func:`build_from_spec` (see ``docs/datasets.md``)."""

from __future__ import annotations

from pathlib import Path

from prefect import unmapped

from schemas.settings import Settings
from tasks import storage
from tasks.build import build_dataset_artifacts
from tasks.engines import load_database


def build_from_spec(
    spec_file: str | Path, artifacts_root: str | None = None, source_dir: str | None = None
) -> str:
    """Build a dataset's artifacts, then load each of its databases (mapped); returns the
    manifest URI. Call from inside a flow."""
    root = artifacts_root or Settings.from_env().artifacts
    manifest_uri = build_dataset_artifacts(str(spec_file), root, source_dir)
    dbs = list(storage.read_json(manifest_uri)["databases"])
    for future in load_database.map(unmapped(manifest_uri), dbs):
        future.result()
    return manifest_uri


def dataset_flows() -> dict:
    """Name → build flow of every shipped dataset."""
    from flows.datasets.movies import build_movies
    from flows.datasets.stocks import build_stocks

    return {"movies": build_movies, "stocks": build_stocks}
