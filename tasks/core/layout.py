"""Where every artifact of a run and a dataset lives under the artifact root.

One object owns each tree, so no other module builds a ``runs/...`` or ``datasets/...`` path:

- :class:`RunLayout`: ``<root>/runs/<run_id>/`` — ``run.json`` (the run record),
  ``lease.json``, ``preflight.json``, ``stages/<stage>.json``, and one directory per stage
  (``trials/`` with ``batches/``, ``score/``, ``report/``, ``generation/``, ``equivalence/``,
  ``lifecycle/``, ...).
- :class:`DatasetLayout`: ``<root>/datasets/<name>/<version>/`` (``manifest.json`` and the
  tables), and ``<root>/datasets/_dab`` for DAB import state.

Paths are plain URI strings joined by :func:`tasks.core.storage.join` (local path or
``s3://bucket/prefix``), byte-identical to what the stages wrote before this module existed.
Run ids are not validated here: callers that accept a user's run id validate it
(:func:`tasks.core.runs.valid_run_id`) before building its layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.core import storage


def runs_root(artifacts_root: str) -> str:
    """``<artifacts_root>/runs``: the directory holding one directory per run id."""
    return storage.join(artifacts_root, "runs")


def datasets_root(artifacts_root: str) -> str:
    """``<artifacts_root>/datasets``: one directory per dataset name."""
    return storage.join(artifacts_root, "datasets")


@dataclass(frozen=True)
class RunLayout:
    """The artifact paths of run ``run_id`` under ``artifacts_root``."""

    artifacts_root: str
    run_id: str

    @property
    def root(self) -> str:
        """``runs/<run_id>``."""
        return storage.join(self.artifacts_root, "runs", self.run_id)

    def path(self, *parts: str) -> str:
        """``runs/<run_id>/<parts...>``."""
        return storage.join(self.root, *parts)

    def stage_dir(self, stage: str) -> str:
        """``runs/<run_id>/<stage>`` (``trials``, ``score``, ``report``, ``generation``, ...)."""
        return self.path(stage)

    @property
    def record(self) -> str:
        """``runs/<run_id>/run.json``: the run record."""
        return self.path("run.json")

    @property
    def lease(self) -> str:
        """``runs/<run_id>/lease.json``: the lease of the process running the run."""
        return self.path("lease.json")

    @property
    def preflight(self) -> str:
        """``runs/<run_id>/preflight.json``."""
        return self.path("preflight.json")

    def stage_status(self, stage: str) -> str:
        """``runs/<run_id>/stages/<stage>.json``: one stage's status record."""
        return self.path("stages", f"{stage}.json")

    def trials(self, *parts: str) -> str:
        """``runs/<run_id>/trials/<parts...>``."""
        return self.path("trials", *parts)

    def batches(self, *parts: str) -> str:
        """``runs/<run_id>/trials/batches/<parts...>``: per-batch results and checkpoints."""
        return self.path("trials", "batches", *parts)

    def score(self, *parts: str) -> str:
        """``runs/<run_id>/score/<parts...>``."""
        return self.path("score", *parts)

    def report(self, *parts: str) -> str:
        """``runs/<run_id>/report/<parts...>``."""
        return self.path("report", *parts)


@dataclass(frozen=True)
class DatasetLayout:
    """The artifact paths of dataset ``name`` (optionally one ``version``) under
    ``artifacts_root``."""

    artifacts_root: str
    name: str
    version: str | None = None

    @property
    def name_dir(self) -> str:
        """``datasets/<name>``: every version of the dataset."""
        return storage.join(self.artifacts_root, "datasets", self.name)

    @property
    def root(self) -> str:
        """``datasets/<name>/<version>``; ValueError when the layout has no version."""
        if self.version is None:
            raise ValueError(f"dataset {self.name!r}: no version given for its layout")
        return storage.join(self.name_dir, self.version)

    def path(self, *parts: str) -> str:
        """``datasets/<name>/<version>/<parts...>``."""
        return storage.join(self.root, *parts)

    @property
    def manifest(self) -> str:
        """``datasets/<name>/<version>/manifest.json``."""
        return self.path("manifest.json")


def dab_import_root(artifacts_root: str) -> str:
    """``datasets/_dab``: state of DAB imports (shared by every imported dataset)."""
    return storage.join(artifacts_root, "datasets", "_dab")
