"""The SQLite engine: :class:`SQLiteDatabase` (``mode=ro`` plus the read-only authorizer
of :mod:`tasks.db.sqlite_guard`; queries run in the query worker), :func:`sqlite_run_local`
(what the worker runs) and the bulk loader :func:`load_sqlite` (Arrow tables or streams →
a new file, written to a temporary sibling and renamed). Moved verbatim from
``tasks/db/databases.py``; registered as engine ``sqlite`` in :mod:`tasks.db.engines`.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
import os
import pathlib
import sqlite3
from typing import Any
from tasks.db import sqlite_guard
from tasks.db.sqlite_guard import SQLITE_MAX_LENGTH
from tasks.db.base import _in_worker, _quote_ident, _Running, _SQLDatabase, _start_worker
from tasks.db.registry import FileEngine, register_engine
from tasks.db.loading import _iter_rows, _tmp_sibling
from tasks.db.results import (
    ColumnInfo,
    DEFAULT_TIMEOUT_MS,
    _json_safe,
    QueryError,
    QueryResult,
    _ResultBuilder,
    ResultLimits,
    _short,
    TableInfo,
)


# ---- SQLite ---------------------------------------------------------------------------------

def _sqlite_connect(path: pathlib.Path, name: str) -> sqlite3.Connection:
    p = path.expanduser().resolve()
    if not p.is_file():
        raise QueryError(f"SQLite database file not found: {p}")
    try:
        return sqlite3.connect(p.as_uri() + "?mode=ro", uri=True, check_same_thread=False,
                               isolation_level=None)
    except sqlite3.Error as e:
        raise QueryError(f"Cannot open SQLite database {name!r}: {_short(e)}") from None


def sqlite_run_local(path: str | os.PathLike, sql: str, timeout_ms: int,
                     limits: ResultLimits) -> QueryResult:
    """Run ``sql`` (no parser check) on the SQLite file ``path`` in this process: opened
    ``mode=ro`` under the guarded executor (:func:`tasks.db.sqlite_guard.guarded`: read-only
    authorizer, no ATTACH, values at most :data:`SQLITE_MAX_LENGTH` bytes, interrupted after
    ``timeout_ms``); rows are fetched one at a time into a :class:`_ResultBuilder`. What the
    query worker runs; QueryError on failure."""
    conn = _sqlite_connect(pathlib.Path(path), pathlib.Path(path).stem)
    running = _Running()
    guard = None
    try:
        with running, sqlite_guard.guarded(conn, timeout_ms,
                                           lambda: running.reason is not None) as guard:
            cur = conn.execute(sql)
            builder = _ResultBuilder(limits, [d[0] for d in cur.description or []])
            if cur.description:
                for row in cur:
                    running.check()
                    if not builder.add(row):
                        break
        return builder.result()
    except sqlite3.Error as e:
        running.check()
        if guard is not None and guard.timed_out:
            raise QueryError(f"Query timed out after {timeout_ms} ms.") from None
        msg = _short(e)
        if "too big" in msg:
            msg += f" (values are limited to {SQLITE_MAX_LENGTH >> 20} MiB)"
        raise QueryError(f"SQLite error: {msg}") from None
    except (ValueError, OverflowError) as e:  # e.g. "You can only execute one statement"
        raise QueryError(f"SQLite error: {_short(e)}") from None
    finally:
        conn.close()


class SQLiteDatabase(_SQLDatabase):
    """A SQLite file, opened read-only (URI ``file:...?mode=ro``) on every call.

    ``path``: the database file (must exist; QueryError otherwise on use).
    ``timeout_ms``: a query running longer is interrupted and raises :class:`QueryError`.
    Queries run in the query worker process (:mod:`tasks.db.db_worker`, memory-limited, so no
    result can grow querylab's own memory past the byte caps) under an authorizer that permits
    only reads (no ATTACH/PRAGMA/VACUUM). Thread-safe: no connection is shared.
    """

    engine = "sqlite"

    def warm_up(self) -> None:
        """The SQL parser, and the query worker its queries run in, started now."""
        super().warm_up()
        _start_worker()

    def __init__(self, name: str, path: str | os.PathLike, timeout_ms: int = DEFAULT_TIMEOUT_MS):
        self.name = name
        self.path = pathlib.Path(path)
        self.timeout_ms = timeout_ms

    def _connect(self) -> sqlite3.Connection:
        return _sqlite_connect(self.path, self.name)

    def list_tables(self) -> list[TableInfo]:
        """See :meth:`Database.list_tables`; types are the declared column types."""
        conn = self._connect()
        try:
            names = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table','view') "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
            out = []
            for t in names:
                cols = [ColumnInfo(r[1], r[2] or "") for r in
                        conn.execute(f"PRAGMA table_info({_quote_ident(t)})")]
                n = conn.execute(f"SELECT count(*) FROM {_quote_ident(t)}").fetchone()[0]
                out.append(TableInfo(t, cols, int(n)))
            return out
        except sqlite3.Error as e:
            raise QueryError(f"SQLite error: {_short(e)}") from None
        finally:
            conn.close()

    def _execute(self, sql: str, limits: ResultLimits | int) -> QueryResult:
        """Run ``sql`` without the parser check (engine-side protections only)."""
        path = self.path.expanduser().resolve()
        if not path.is_file():
            raise QueryError(f"SQLite database file not found: {path}")
        return _in_worker("sqlite", path, sql, self.timeout_ms, limits)



def _sqlite_decl(t: "pa.DataType") -> str:
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        return _sqlite_decl(t.value_type)
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_integer(t):
        return "INTEGER"
    if pa.types.is_floating(t):
        return "REAL"
    if pa.types.is_decimal(t):
        return "NUMERIC"
    if pa.types.is_date(t):
        return "DATE"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP"
    if pa.types.is_time(t):
        return "TIME"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "BLOB"
    return "TEXT"  # strings; lists/structs stored as JSON text


def _sqlite_value(v: Any) -> Any:
    if v is None or isinstance(v, (int, float, str, bytes)):
        return v
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, _dt.datetime):
        return v.isoformat(sep=" ")
    if isinstance(v, (_dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, (list, dict, tuple)):
        return json.dumps(_json_safe(v), ensure_ascii=False)
    return str(v)


def load_sqlite(path: str | os.PathLike, tables: dict[str, "pa.Table"]) -> None:
    """(Re)create the SQLite file ``path`` holding ``tables`` (name -> pyarrow Table, or a
    ``RecordBatchReader``, streamed), atomically:
    written to a temporary sibling file, then ``os.replace``-d over ``path``.

    Types: ints -> INTEGER, floats -> REAL, bool -> BOOLEAN (0/1), date -> DATE (ISO text),
    timestamp -> TIMESTAMP (ISO text ``YYYY-MM-DD HH:MM:SS``), strings -> TEXT, lists/structs ->
    TEXT holding JSON."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(path)
    try:
        conn = sqlite3.connect(tmp)
        try:
            for name, tbl in tables.items():
                cols = ", ".join(f"{_quote_ident(f.name)} {_sqlite_decl(f.type)}" for f in tbl.schema)
                conn.execute(f"CREATE TABLE {_quote_ident(name)} ({cols})")
                marks = ", ".join("?" * len(tbl.schema))
                conn.executemany(
                    f"INSERT INTO {_quote_ident(name)} VALUES ({marks})",
                    (tuple(_sqlite_value(v) for v in row) for row in _iter_rows(tbl)),
                )
            conn.commit()
        finally:
            conn.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@register_engine
class SQLiteEngine(FileEngine):
    """Engine ``sqlite``: the file ``<home>/build/<dataset>/<version>/<db>.sqlite``, written by
    :func:`load_sqlite`, opened as :class:`SQLiteDatabase`."""

    name = "sqlite"
    database = SQLiteDatabase

    def write(self, path: pathlib.Path, tables: dict[str, Any]) -> None:
        load_sqlite(path, tables)
