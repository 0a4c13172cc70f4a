"""The DuckDB engine: :class:`DuckDBDatabase` (``read_only=True`` plus
``enable_external_access=false``; queries run in the query worker), :func:`duckdb_run_local`
(what the worker runs, interruptible at the time limit) and the bulk loader
:func:`load_duckdb` (Arrow tables or streams, memory-capped at :data:`DUCKDB_LOAD_MEMORY`).
Moved verbatim from ``tasks/db/databases.py``; registered as engine ``duckdb`` in
:mod:`tasks.db.engines`.
"""

from __future__ import annotations

import os
import pathlib
import threading
import uuid
from typing import Any
from tasks.db.base import _in_worker, _quote_ident, _Running, _SQLDatabase, _start_worker
from tasks.db.registry import FileEngine, register_engine
from tasks.db.loading import _tmp_sibling
from tasks.db.results import (
    ColumnInfo,
    DEFAULT_TIMEOUT_MS,
    QueryError,
    QueryResult,
    _ResultBuilder,
    ResultLimits,
    _short,
    TableInfo,
)


# ---- DuckDB ---------------------------------------------------------------------------------

_duckdb_lock = threading.Lock()
_duckdb_conns: dict[str, tuple[Any, tuple[int, int]]] = {}
#: Settings of DuckDB instances opened by the query worker (instance-wide, set at open).
_DUCKDB_WORKER_SETTINGS: dict[str, str] = {}
#: The most a query of an agent may spill to disk (DuckDB's ``max_temp_directory_size``).
DUCKDB_AGENT_TEMP_LIMIT = "1GiB"


def _file_id(p: pathlib.Path) -> tuple[int, int]:
    st = p.stat()
    return (st.st_ino, st.st_mtime_ns)


def _duckdb_shared_connection(path: pathlib.Path):
    """The process-wide read-only connection for ``path`` (reopened if the file was replaced)."""
    import duckdb

    key = str(path)
    with _duckdb_lock:
        fid = _file_id(path)
        cached = _duckdb_conns.get(key)
        if cached is not None:
            if cached[1] == fid:
                return cached[0]
            _duckdb_conns.pop(key, None)
            try:
                cached[0].close()
            except Exception:  # pragma: no cover
                pass
        conn = duckdb.connect(key, read_only=True)
        for name, value in _DUCKDB_WORKER_SETTINGS.items():
            conn.execute(f"SET {name} = '{value}'")
        # a big sort or join spills to <db>.tmp beside the file, by default up to 90% of the
        # free disk (a read-only query wrote ~2 GB there: QA adversary): capped as PostgreSQL's
        # temp_file_limit is for the agent role
        conn.execute(f"SET max_temp_directory_size = '{DUCKDB_AGENT_TEMP_LIMIT}'")
        # read_only does not stop COPY ... TO / reading arbitrary files: turn file access off
        # (instance-wide, cannot be turned back on while the database is open).
        conn.execute("SET enable_external_access = false")
        _duckdb_conns[key] = (conn, fid)
        return conn


def _duckdb_forget(path: pathlib.Path) -> None:
    with _duckdb_lock:
        cached = _duckdb_conns.pop(str(path), None)
    if cached is not None:
        try:
            cached[0].close()
        except Exception:  # pragma: no cover
            pass


def _duckdb_cursor(path: pathlib.Path, name: str):
    if not path.is_file():
        raise QueryError(f"DuckDB database file not found: {path}")
    try:
        conn = _duckdb_shared_connection(path)
        with _duckdb_lock:
            return conn.cursor()
    except QueryError:
        raise
    except Exception as e:
        raise QueryError(f"Cannot open DuckDB database {name!r}: {_short(e)}") from None


def duckdb_run_local(path: str | os.PathLike, sql: str, timeout_ms: int,
                     limits: ResultLimits) -> QueryResult:
    """Run ``sql`` (no parser check) on the DuckDB file ``path`` in this process, through the
    shared read-only connection (external access off), interrupted after ``timeout_ms``, rows
    fetched in chunks into a :class:`_ResultBuilder`. What the query worker runs (DuckDB builds
    strings outside its ``memory_limit``, so only a memory-limited process bounds them);
    QueryError on failure."""
    p = pathlib.Path(path).expanduser().resolve()
    cur = _duckdb_cursor(p, p.stem)
    timed_out = threading.Event()

    def interrupt() -> None:
        timed_out.set()
        try:
            cur.interrupt()
        except Exception:  # pragma: no cover
            pass

    timer = threading.Timer(timeout_ms / 1000, interrupt)
    timer.daemon = True
    timer.start()
    running = _Running(cur.interrupt)
    try:
        with running:
            cur.execute(sql)
            builder = _ResultBuilder(limits, [d[0] for d in cur.description or []])
            if cur.description:
                full = False
                while not full:
                    running.check()
                    rows = cur.fetchmany(min(builder.chunk(), limits.max_rows + 1))
                    if not rows:
                        break
                    for row in rows:
                        if not builder.add(row):
                            full = True
                            break
                    del rows
        return builder.result()
    except QueryError:
        raise
    except Exception as e:
        running.check()
        if timed_out.is_set():
            raise QueryError(f"Query timed out after {timeout_ms} ms.") from None
        raise QueryError(f"DuckDB error: {_short(e)}") from None
    finally:
        timer.cancel()
        try:
            cur.close()
        except Exception:  # pragma: no cover
            pass


class DuckDBDatabase(_SQLDatabase):
    """A DuckDB file opened with ``read_only=True`` and ``enable_external_access=false`` (no
    file reads/writes outside the database, no extension installs). Queries run in the query
    worker process (:mod:`tasks.db.db_worker`; one shared connection per file there, a cursor per
    call), :meth:`list_tables` through one shared connection per (process, path) here; both
    thread-safe. ``timeout_ms``: a longer query is interrupted and raises :class:`QueryError`.
    """

    engine = "duckdb"

    def warm_up(self) -> None:
        """The SQL parser, and the query worker its queries run in, started now."""
        super().warm_up()
        _start_worker()

    def __init__(self, name: str, path: str | os.PathLike, timeout_ms: int = DEFAULT_TIMEOUT_MS):
        self.name = name
        self.path = pathlib.Path(path).expanduser().resolve()
        self.timeout_ms = timeout_ms

    def list_tables(self) -> list[TableInfo]:
        """See :meth:`Database.list_tables`; tables outside schema ``main`` are named
        ``schema.table``."""
        cur = _duckdb_cursor(self.path, self.name)
        try:
            rows = cur.execute(
                "SELECT table_schema, table_name, column_name, data_type "
                "FROM information_schema.columns WHERE table_catalog = current_database() "
                "ORDER BY table_schema, table_name, ordinal_position").fetchall()
            tables: dict[tuple[str, str], list[ColumnInfo]] = {}
            for schema, table, col, typ in rows:
                tables.setdefault((schema, table), []).append(ColumnInfo(col, typ))
            out = []
            for (schema, table), cols in tables.items():
                ref = _quote_ident(table) if schema == "main" else f"{_quote_ident(schema)}.{_quote_ident(table)}"
                n = cur.execute(f"SELECT count(*) FROM {ref}").fetchone()[0]
                out.append(TableInfo(table if schema == "main" else f"{schema}.{table}", cols, int(n)))
            return sorted(out, key=lambda t: t.name)
        except Exception as e:
            raise QueryError(f"DuckDB error: {_short(e)}") from None
        finally:
            cur.close()

    def _execute(self, sql: str, limits: ResultLimits | int) -> QueryResult:
        """Run ``sql`` without the parser check (engine-side protections only)."""
        if not self.path.is_file():
            raise QueryError(f"DuckDB database file not found: {self.path}")
        return _in_worker("duckdb", self.path, sql, self.timeout_ms, limits)

    def close(self) -> None:
        """No-op: the shared per-process connection stays open for other instances."""



#: DuckDB's memory limit while it loads a Parquet stream (its buffer pool otherwise keeps the
#: written blocks up to 80 % of RAM; the scan itself streams).
DUCKDB_LOAD_MEMORY = "512MB"


def load_duckdb(path: str | os.PathLike, tables: dict[str, "pa.Table"]) -> None:
    """(Re)create the DuckDB file ``path`` holding ``tables`` (name -> pyarrow Table, a
    ``RecordBatchReader``, or a :class:`tasks.core.storage.ParquetStream` — scanned by DuckDB from
    its file within :data:`DUCKDB_LOAD_MEMORY`), atomically (temporary sibling file, then
    ``os.replace``); column types come from Arrow (int64 -> BIGINT, double -> DOUBLE, string -> VARCHAR, date32 -> DATE, list<string> ->
    VARCHAR[], ...). A cached read-only connection of this process to ``path`` is dropped."""
    import duckdb

    path = pathlib.Path(path).expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(path)
    try:
        conn = duckdb.connect(str(tmp))
        try:
            for name, tbl in tables.items():
                parquet = getattr(tbl, "parquet_path", None)
                if parquet is not None:  # a Parquet stream: DuckDB scans the file itself
                    conn.execute(f"SET memory_limit = '{DUCKDB_LOAD_MEMORY}'")
                    conn.execute(f"CREATE TABLE {_quote_ident(name)} AS SELECT * FROM "
                                 "read_parquet(?)", [parquet])
                    continue
                view = f"__querylab_src_{uuid.uuid4().hex[:8]}"
                conn.register(view, tbl)
                try:
                    conn.execute(f"CREATE TABLE {_quote_ident(name)} AS SELECT * FROM {_quote_ident(view)}")
                finally:
                    conn.unregister(view)
            conn.execute("CHECKPOINT")
        finally:
            conn.close()
        _duckdb_forget(path)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        pathlib.Path(str(tmp) + ".wal").unlink(missing_ok=True)


@register_engine
class DuckDBEngine(FileEngine):
    """Engine ``duckdb``: the file ``<home>/build/<dataset>/<version>/<db>.duckdb``, written by
    :func:`load_duckdb`, opened as :class:`DuckDBDatabase`."""

    name = "duckdb"
    database = DuckDBDatabase

    def write(self, path: pathlib.Path, tables: dict[str, Any]) -> None:
        load_duckdb(path, tables)
