"""The :class:`Database` interface every engine adapter implements (``list_tables``,
``query``, ``close``), the SQL base class that runs :func:`tasks.db.guard.check_read_only_sql`
before every query, the hand-off of SQLite/DuckDB queries to the query worker
(:mod:`tasks.db.db_worker`) and :func:`stop_running_queries` (the worker's memory watchdog).
Moved verbatim from ``tasks/db/databases.py``.
"""

from __future__ import annotations

import abc
import pathlib
import threading
from typing import Any, Callable
from tasks.db.guard import check_read_only_sql
from tasks.db.results import (
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_MAX_ROWS,
    DEFAULT_MAX_VALUE_BYTES,
    _limits,
    QueryError,
    QueryResult,
    ResultLimits,
    TableInfo,
)


# --------------------------------------------------------------------------------------------
# Databases
# --------------------------------------------------------------------------------------------


class Database(abc.ABC):
    """A read-only view of one database, shared by the threads of one process.

    Attributes: ``name`` (the dataset's database name) and ``engine`` (``"postgres"``,
    ``"mongodb"``, ``"sqlite"`` or ``"duckdb"``).
    """

    name: str
    engine: str

    @abc.abstractmethod
    def list_tables(self) -> list[TableInfo]:
        """Tables/views (SQL) or collections (Mongo), sorted by name, with column names and
        types and exact row counts. Raises :class:`QueryError` on engine errors."""

    @abc.abstractmethod
    def query(self, query: str | dict, max_rows: int = DEFAULT_MAX_ROWS,
              max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
              max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> QueryResult:
        """Run one read-only query and return at most ``max_rows`` rows and
        ``max_result_bytes`` bytes, each value cut at ``max_value_bytes`` (see
        :class:`ResultLimits`; ``truncated`` / ``truncated_by`` / ``cut_values`` tell what was
        left out). SQL engines take SQL text; Mongo takes a request accepted by
        :func:`parse_mongo_query`. Raises :class:`QueryError` for refused or failing queries,
        unknown tables/collections and timeouts; ValueError for bad limits."""

    def close(self) -> None:
        """Release connections held by this object (idempotent)."""

    def warm_up(self) -> None:
        """Do now, once per process, the set-up the first query would otherwise wait for
        (e.g. importing the SQL parser, starting the query worker); errors are the first
        query's to report, so this one ignores them. Default: nothing."""

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, engine={self.engine!r})"


def _sql_text(query: str | dict) -> str:
    if not isinstance(query, str):
        raise QueryError(f"SQL databases take SQL text, got {type(query).__name__}.")
    return query


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class _SQLDatabase(Database):
    """A SQL engine: ``query`` checks the SQL is read-only (sqlglot, dialect = ``engine``)
    before running it; engines add their own read-only protections in ``_execute``."""

    def query(self, query: str | dict, max_rows: int = DEFAULT_MAX_ROWS,
              max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
              max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> QueryResult:
        """See :meth:`Database.query` (SQL text in the engine's dialect)."""
        sql = _sql_text(query)
        limits = _limits(max_rows, max_result_bytes, max_value_bytes)
        check_read_only_sql(sql, self.engine)
        return self._run_checked(sql, limits)

    def warm_up(self) -> None:
        """Import and run the SQL parser once (:func:`tasks.db.guard.warm_up`)."""
        from tasks.db.guard import warm_up

        warm_up()

    def _run_checked(self, sql: str, limits: ResultLimits) -> QueryResult:
        return self._execute(sql, limits)

    @abc.abstractmethod
    def _execute(self, sql: str, limits: ResultLimits | int) -> QueryResult:
        """Run ``sql`` without the parser check (engine-side protections only); ``limits``
        may be a plain ``max_rows``."""


def _start_worker() -> None:
    """Start this process's SQL query worker unless it runs (SQLite / DuckDB ``warm_up``)."""
    from tasks.db.db_worker_client import sql_worker

    sql_worker().start()


def _in_worker(engine: str, path: pathlib.Path, sql: str, timeout_ms: int,
               limits: ResultLimits | int) -> QueryResult:
    """Run an SQLite/DuckDB query in the query worker process (:mod:`tasks.db.db_worker`)."""
    from tasks.db.db_worker_client import sql_worker

    limits = _limits(limits)
    reply = sql_worker().run(
        {"engine": engine, "path": str(path), "sql": sql, "timeout_ms": int(timeout_ms),
         "limits": [limits.max_rows, limits.max_value_bytes, limits.max_result_bytes]},
        timeout_s=timeout_ms / 1000, reply_limit=limits.max_result_bytes,
    )
    return QueryResult.from_json(reply)


class _Running:
    """A query running in this process that a memory watchdog may stop
    (:func:`stop_running_queries`): ``stop`` interrupts the engine, ``reason`` says why."""

    def __init__(self, stop: Callable[[], None] | None = None):
        self.stop, self.reason = stop, None

    def __enter__(self) -> "_Running":
        with _running_lock:
            _running.add(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        with _running_lock:
            _running.discard(self)

    def check(self) -> None:
        """Raise QueryError if the query was stopped (called between fetched rows)."""
        if self.reason is not None:
            raise QueryError(self.reason)


_running: set[_Running] = set()
_running_lock = threading.Lock()


def stop_running_queries(reason: str) -> int:
    """Interrupt every SQLite/DuckDB query running in this process; each fails with
    QueryError ``reason``. Returns how many were running (the query worker's memory
    watchdog calls this)."""
    with _running_lock:
        running = list(_running)
    for r in running:
        r.reason = reason
        if r.stop is not None:
            try:
                r.stop()
            except Exception:  # noqa: BLE001 - it may have just finished
                pass
    return len(running)
