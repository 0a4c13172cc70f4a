"""The PostgreSQL engine: :class:`PostgresDatabase` (read-only transactions with a
``statement_timeout``, as a SELECT-only login role from :mod:`tasks.db.pg_roles`; values
measured and cut by the server, fetched in chunks) and the bulk loader :func:`load_postgres`
(``COPY`` in CSV blocks of :data:`COPY_BLOCK_ROWS` rows where the types allow, else row copy).
The server itself lives in :mod:`tasks.db.pg_server`. Moved verbatim from
``tasks/db/databases.py``; registered as engine ``postgres`` in :mod:`tasks.db.engines`.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any
from tasks.db.base import _quote_ident, _SQLDatabase
from tasks.db.registry import Engine, physical_name, placed_tables, register_engine
from tasks.db.loading import _batches, _iter_rows
from tasks.db.results import (
    ColumnInfo,
    _Cut,
    DatabaseUnavailable,
    DEFAULT_TIMEOUT_MS,
    _json_safe,
    _limits,
    QueryError,
    QueryResult,
    _ResultBuilder,
    ResultLimits,
    _short,
    TableInfo,
)


# ---- PostgreSQL -----------------------------------------------------------------------------


def _pg_message(e: Exception, sql: str | None = None, offset: int = 0) -> str:
    """Primary message (+ detail/hint) of a psycopg error, with the error position mapped back
    into the agent's SQL text when known."""
    diag = getattr(e, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    if not primary:
        return _short(e)
    parts = [primary]
    pos = getattr(diag, "statement_position", None)
    if pos and sql:
        try:
            i = int(pos) - 1 - offset
        except ValueError:  # pragma: no cover
            i = -1
        if 0 <= i <= len(sql):
            snippet = sql[i:i + 40].splitlines()[0] if sql[i:i + 40].strip() else sql[i:i + 40]
            parts.append(f"at character {i + 1}: {snippet!r}")
    for label, attr in (("DETAIL", "message_detail"), ("HINT", "message_hint")):
        v = getattr(diag, attr, None)
        if v:
            parts.append(f"{label}: {v}")
    return _short("\n".join(parts), max_lines=4)


#: PostgreSQL type OIDs of fixed, small size (bool, integers, floats, dates and times, uuid,
#: ...): their values are never cut. Every other type (text, bytea, json, arrays, numeric,
#: ...) is measured by the server and cut there.
_PG_FIXED_TYPES = frozenset({
    16, 18, 19, 20, 21, 23, 26, 28, 29, 700, 701, 790, 829, 1082, 1083, 1114, 1184, 1186,
    1266, 2950, 774, 3220, 5069, 650, 869, 600, 601, 603, 718, 628,
})
#: Bytes of rows fetched from the server per round trip, at most (worst case).
_PG_FETCH_BYTES = 32 << 20


def _strip_trailing_semicolons(sql: str, dialect: str) -> str:
    """``sql`` without trailing ``;`` and the comments after them (so it can be wrapped in a
    subquery). Uses sqlglot's tokenizer; the text is returned unchanged if it cannot."""
    import sqlglot

    try:
        tokens = sqlglot.Dialect.get_or_raise(dialect).tokenize(sql)
    except Exception:  # noqa: BLE001 - the parser check already accepted the text
        return sql
    while tokens and tokens[-1].token_type == sqlglot.tokens.TokenType.SEMICOLON:
        tokens.pop()
    if not tokens:
        return sql
    return sql[: tokens[-1].end + 1]


def _pg_wrap(sql: str, types: list[int], cap: int) -> str:
    """``sql`` as a subquery whose variable-size columns come back cut by the server: column
    i is ``NULL`` when its text is longer than ``cap`` bytes, and an extra column holds
    ``'<size>:<first cap characters>'`` for it. Fixed-size columns pass unchanged."""
    cols = [f"c{i}" for i in range(len(types))]
    parts = []
    for c, oid in zip(cols, types):
        if oid in _PG_FIXED_TYPES:
            parts.append(f"q.{c}")
            continue
        size = f"octet_length(q.{c}::text)"
        parts.append(f"CASE WHEN {size} > {cap} THEN NULL ELSE q.{c} END")
        parts.append(f"CASE WHEN {size} > {cap} THEN {size}::text || ':' || left(q.{c}::text, {cap}) END")
    return f"SELECT {', '.join(parts)} FROM (\n{sql}\n) AS q({', '.join(cols)})"


class PostgresDatabase(_SQLDatabase):
    """A PostgreSQL database (schema ``public``) reached through ``dsn`` (URI or key=value).

    Each thread gets its own connection (``threading.local``), opened with
    ``default_transaction_read_only=on`` and ``statement_timeout=<statement_timeout_ms>`` as
    connection options and ``conn.read_only = True``; each query runs in a read-only transaction
    that is rolled back afterwards. Agents reach it through a SELECT-only login role
    (:mod:`tasks.db.pg_roles`), never a superuser.

    Results are bounded without trusting the query: its columns are described first
    (``DECLARE`` plans, runs nothing), then it runs wrapped so the server measures every
    variable-size value and sends at most the per-value cap of it (see :func:`_pg_wrap`),
    through a server-side cursor fetched in chunks that stop at the row and byte caps. A
    timeout raises :class:`QueryError`.
    """

    engine = "postgres"

    def __init__(self, name: str, dsn: str, statement_timeout_ms: int = DEFAULT_TIMEOUT_MS):
        self.name = name
        self.dsn = dsn
        self.statement_timeout_ms = int(statement_timeout_ms)
        self._local = threading.local()
        self._all: list[Any] = []
        self._all_lock = threading.Lock()

    def __getstate__(self):  # never pickle a DSN (it may hold a password)
        raise TypeError("PostgresDatabase cannot be pickled")

    def _conninfo(self) -> str:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = conninfo_to_dict(self.dsn)
        opts = (params.get("options") or "").strip()
        ours = f"-c default_transaction_read_only=on -c statement_timeout={self.statement_timeout_ms}"
        params["options"] = f"{opts} {ours}".strip()
        params.setdefault("application_name", "querylab")
        params.setdefault("connect_timeout", "10")
        return make_conninfo(**params)

    def _conn(self):
        import psycopg

        conn = getattr(self._local, "conn", None)
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        try:
            conn = psycopg.connect(self._conninfo(), autocommit=False)
        except psycopg.OperationalError as e:  # the server: refused, starting up, shut down
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL database {self.name!r}: {_short(e)}") from None
        except psycopg.Error as e:
            raise QueryError(f"Cannot connect to PostgreSQL database {self.name!r}: {_short(e)}") from None
        conn.read_only = True
        self._local.conn = conn
        with self._all_lock:
            self._all = [c for c in self._all if not c.closed] + [conn]
        return conn

    def _run(self, fn, sql: str | None = None, offset: int = 0):
        """``fn(conn)`` on this thread's connection; a connection the server dropped while it
        was idle (a restart, an administrator) is replaced once and ``fn`` run again (harmless:
        every query is read-only); when the server is still gone, DatabaseUnavailable."""
        try:
            return self._run_once(fn, sql, offset)
        except DatabaseUnavailable:
            return self._run_once(fn, sql, offset)

    def _run_once(self, fn, sql: str | None = None, offset: int = 0):
        import psycopg

        conn = self._conn()
        try:
            return fn(conn)
        except psycopg.errors.QueryCanceled as e:
            if "statement timeout" in str(e):
                raise QueryError(f"Query timed out after {self.statement_timeout_ms} ms.") from None
            raise QueryError(f"PostgreSQL error: {_pg_message(e, sql, offset)}") from None
        except psycopg.Error as e:
            if _pg_connection_lost(e, conn):
                raise DatabaseUnavailable(
                    f"PostgreSQL database {self.name!r}: the server connection failed: "
                    f"{_short(e)}") from None
            raise QueryError(f"PostgreSQL error: {_pg_message(e, sql, offset)}") from None
        except MemoryError:
            raise QueryError("PostgreSQL error: the result does not fit in memory") from None
        finally:
            try:
                if not conn.closed:
                    conn.rollback()
            except Exception:
                try:
                    conn.close()
                except Exception:  # pragma: no cover
                    pass

    def list_tables(self) -> list[TableInfo]:
        """See :meth:`Database.list_tables`; tables, views and materialized views of schema
        ``public``, types as ``format_type`` prints them (``bigint``, ``text[]``, ...)."""

        def fn(conn):
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod) "
                    "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = 'public' AND c.relkind IN ('r','v','m','p','f') "
                    "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY c.relname, a.attnum")
                tables: dict[str, list[ColumnInfo]] = {}
                for t, col, typ in cur.fetchall():
                    tables.setdefault(t, []).append(ColumnInfo(col, typ))
                out = []
                for t in sorted(tables):
                    cur.execute(f"SELECT count(*) FROM public.{_quote_ident(t)}")
                    out.append(TableInfo(t, tables[t], int(cur.fetchone()[0])))
                return out

        return self._run(fn)

    def _run_checked(self, sql: str, limits: ResultLimits) -> QueryResult:
        return self._select(sql, limits)

    def _execute(self, sql: str, limits: ResultLimits | int) -> QueryResult:
        """Run ``sql`` without the parser check (engine-side protections only), through a plain
        (client-side) cursor so that any statement kind reaches the server."""
        limits = _limits(limits)

        def fn(conn):
            with conn.cursor() as cur:
                cur.execute(sql)
                if cur.description is None:
                    return QueryResult([], [], False)
                builder = _ResultBuilder(limits, [d.name for d in cur.description])
                for row in cur.fetchmany(limits.max_rows + 1):
                    if not builder.add(row):
                        break
                return builder.result()

        return self._run(fn, sql)

    def _select(self, sql: str, limits: ResultLimits) -> QueryResult:
        """Run a checked SELECT: describe it, then fetch it wrapped by :func:`_pg_wrap` through
        a server-side cursor, in chunks of at most :data:`_PG_FETCH_BYTES` worst-case bytes."""
        body = _strip_trailing_semicolons(sql, "postgres")
        probe = f"querylab_{uuid.uuid4().hex[:12]}"
        name = f"querylab_{uuid.uuid4().hex[:12]}"
        declare = len(f'DECLARE "{name}" CURSOR FOR ')

        def describe(conn):
            with conn.cursor(name=probe) as cur:
                cur.execute(body)  # DECLARE: plans the query, fetches nothing
                return [(d.name, d.type_code) for d in cur.description or []]

        # psycopg sends 'DECLARE "<name>" CURSOR FOR <sql>': error positions are shifted by that.
        desc = self._run(describe, body, offset=declare)
        builder = _ResultBuilder(limits, [n for n, _ in desc])
        types = [int(t) for _, t in desc]
        if not types:  # SELECT FROM t: rows without columns (nothing to cut)
            wrapped = body
        else:
            wrapped = _pg_wrap(body, types, builder.cap)
        cap = builder.cap
        varlen = sum(t not in _PG_FIXED_TYPES for t in types)
        row_bound = 64 * (len(types) + 1) + varlen * 2 * (4 * cap + 32)
        chunk = max(1, min(1000, _PG_FETCH_BYTES // row_bound))
        head = declare + (wrapped.index("(\n") + 2 if types else 0)

        def fn(conn):
            with conn.cursor(name=name) as cur:
                cur.execute(wrapped)
                wanted = limits.max_rows + 1
                got = 0
                while got < wanted:
                    rows = cur.fetchmany(min(chunk, wanted - got))
                    if not rows:
                        break
                    got += len(rows)
                    for raw in rows:
                        if not builder.add(_pg_unwrap(raw, types)):
                            return builder.result()
                return builder.result()

        return self._run(fn, body, offset=head)

    def close(self) -> None:
        """Close the connections of all threads (they are reopened on next use)."""
        with self._all_lock:
            conns, self._all = self._all, []
        for c in conns:
            try:
                c.close()
            except Exception:  # pragma: no cover
                pass


def _pg_unwrap(raw: tuple, types: list[int]) -> list:
    """One row of a :func:`_pg_wrap` query back in the original columns (cut values as
    :class:`_Cut`)."""
    out, i = [], 0
    for oid in types:
        if oid in _PG_FIXED_TYPES:
            out.append(raw[i])
            i += 1
            continue
        value, cut = raw[i], raw[i + 1]
        i += 2
        if cut is None:
            out.append(value)
        else:
            size, _, headtext = str(cut).partition(":")
            out.append(_Cut(headtext, int(size) if size.isdigit() else len(headtext)))
    return out



def _pg_connection_lost(e: Exception, conn) -> bool:
    """True when a psycopg error is the server connection failing (the server shut down,
    crashed, restarted or became unreachable) rather than the query: the connection is broken
    or closed afterwards, or the server said it is shutting down (SQLSTATE class 57P: admin /
    crash shutdown, cannot connect now) or the connection failed (class 08)."""
    import psycopg

    state = getattr(e, "sqlstate", None) or ""
    if state.startswith(("57P", "08")):
        return True
    return isinstance(e, psycopg.OperationalError) and bool(
        getattr(conn, "broken", False) or getattr(conn, "closed", False))



def _pg_type(t: "pa.DataType") -> str:
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        return _pg_type(t.value_type)
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_integer(t):
        if t.bit_width <= 16 and pa.types.is_signed_integer(t):
            return "smallint"
        if t.bit_width < 32 or (t.bit_width == 32 and pa.types.is_signed_integer(t)):
            return "integer"
        if t.bit_width == 64 and pa.types.is_unsigned_integer(t):
            return "numeric"
        return "bigint"
    if pa.types.is_floating(t):
        return "real" if t.bit_width <= 32 else "double precision"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _: False)(t):
        return "text"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamptz" if t.tz else "timestamp"
    if pa.types.is_time(t):
        return "time"
    if pa.types.is_duration(t):
        return "interval"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytea"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = _pg_type(t.value_type)
        return "jsonb" if inner.endswith("[]") or inner == "jsonb" else inner + "[]"
    if pa.types.is_null(t):
        return "text"
    return "jsonb"  # struct, map, ...


def _csv_copyable(t: "pa.DataType") -> bool:
    """True for Arrow types pyarrow's CSV writer renders as PostgreSQL reads them (the bulk
    COPY path of :func:`load_postgres`)."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        return _csv_copyable(t.value_type)
    return (pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_date(t)
            or pa.types.is_timestamp(t) or pa.types.is_null(t))


#: Rows per block of CSV written into one COPY (bounds the text held in memory).
COPY_BLOCK_ROWS = 50_000


def _copy_csv(copy, tbl: "pa.Table | pa.RecordBatchReader") -> None:
    """Feed ``tbl`` (a Table, or a reader streamed batch by batch) to a ``COPY ... (FORMAT
    csv)`` as CSV made by pyarrow's writer, at most :data:`COPY_BLOCK_ROWS` rows at a time (no
    per-row Python). Every valid value is quoted and nulls are not, so PostgreSQL reads an
    empty string as ``''`` and a null as NULL."""
    import io

    import pyarrow as pa
    import pyarrow.csv as pacsv

    plain = pa.schema([
        pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type)
        for f in tbl.schema
    ])
    opts = pacsv.WriteOptions(include_header=False, quoting_style="all_valid")
    for big in _batches(tbl):
        for batch in pa.Table.from_batches([big]).cast(plain).to_batches(COPY_BLOCK_ROWS):
            buf = io.BytesIO()
            pacsv.write_csv(batch, buf, opts)
            copy.write(buf.getbuffer())


def load_postgres(dsn: str, tables: dict[str, "pa.Table"]) -> None:
    """(Re)create ``tables`` (name -> pyarrow Table, or a ``RecordBatchReader``, streamed
    into ``COPY``) in schema ``public`` of ``dsn``, in ONE
    transaction: ``DROP TABLE IF EXISTS`` + ``CREATE TABLE`` with PostgreSQL types mapped from
    Arrow (int64 -> bigint, int32/16 -> integer/smallint, float64 -> double precision, float32 ->
    real, string -> text, bool -> boolean, date -> date, timestamp -> timestamp[tz],
    list<x> -> x[], struct -> jsonb) + ``COPY ... FROM STDIN``, then ``ANALYZE`` once committed
    (the planner's statistics, so plans do not change when autovacuum would analyse the table
    later; a table over 30,000 rows is analysed from PostgreSQL's random sample, so its
    statistics may still differ slightly between two loads). Raises ``psycopg.Error``.

    A table of booleans, numbers, strings, dates and timestamps only is copied in bulk: CSV
    written by pyarrow (:func:`_copy_csv`, no Python per row). A table with any other column
    (lists, structs, binary, decimals, times, durations) is copied row by row through
    psycopg's typed COPY (which adapts arrays and ``jsonb``)."""
    import psycopg
    from psycopg import sql
    from psycopg.types.json import Jsonb

    with psycopg.connect(dsn, autocommit=False) as conn:
        with conn.cursor() as cur:
            for name, tbl in tables.items():
                types = [_pg_type(f.type) for f in tbl.schema]
                ident = sql.Identifier(name)
                cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident))
                cols = sql.SQL(", ").join(
                    sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(t))
                    for f, t in zip(tbl.schema, types)
                )
                cur.execute(sql.SQL("CREATE TABLE {} ({})").format(ident, cols))
                names = sql.SQL(", ").join(sql.Identifier(f.name) for f in tbl.schema)
                if all(_csv_copyable(f.type) for f in tbl.schema):
                    stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(ident, names)
                    with cur.copy(stmt) as copy:
                        _copy_csv(copy, tbl)
                else:
                    _copy_rows(cur, sql.SQL("COPY {} ({}) FROM STDIN").format(ident, names),
                               tbl, types, Jsonb)
        conn.commit()
        # statistics now, not whenever autovacuum gets to the tables: the planner's choice (a
        # sorted or a hashed GROUP BY, so the order of unordered rows an agent sees) must not
        # depend on how soon after the load a query runs. After the commit: the rows COPY
        # inserted count as modifications only then, so an ANALYZE inside the load's
        # transaction left them all pending and autovacuum analysed the table again.
        conn.autocommit = True
        for name in tables:
            conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(name)))


def _copy_rows(cur, stmt, tbl, types: list[str], jsonb) -> None:
    """COPY ``tbl`` row by row through psycopg's typed COPY (arrays, ``jsonb`` values)."""
    json_idx = [i for i, t in enumerate(types) if t == "jsonb"]
    with cur.copy(stmt) as copy:
        copy.set_types([t.split("(")[0] for t in types])
        for row in _iter_rows(tbl):
            if json_idx:
                row = list(row)
                for i in json_idx:
                    if row[i] is not None:
                        row[i] = jsonb(_json_safe(row[i]))
            copy.write_row(row)


@register_engine
class PostgresEngine(Engine):
    """Engine ``postgres``: database ``ql_<dataset>_<db>_<hash>`` on the embedded server (data
    under ``<home>/postgres``) or on ``QUERYLAB_POSTGRES_URL``, loaded as the administrator by
    :func:`load_postgres`; a ``querylab_meta.loaded`` marker table records a finished load.
    Agents connect as the database's SELECT-only login role (:mod:`tasks.db.pg_roles`)."""

    name = "postgres"

    def load(self, manifest: dict, db: str, settings: Any) -> None:
        from pathlib import Path

        import psycopg

        from tasks.db.pg_roles import ensure_agent_role
        from tasks.db.pg_server import postgres_database_dsn, postgres_server_url

        server = postgres_server_url(settings.postgres_url, Path(settings.home))
        dsn = postgres_database_dsn(server, physical_name(manifest, db), create=True)
        with psycopg.connect(dsn, autocommit=True) as conn:
            done = conn.execute(
                "SELECT to_regclass('querylab_meta.loaded') IS NOT NULL"
            ).fetchone()[0]
        if not done:
            with placed_tables(manifest, db) as tables:
                load_postgres(dsn, tables)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE SCHEMA IF NOT EXISTS querylab_meta")
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS querylab_meta.loaded (version text)"
                )
                conn.execute(
                    "INSERT INTO querylab_meta.loaded VALUES (%s)", (manifest["version"],)
                )
        ensure_agent_role(server, physical_name(manifest, db), Path(settings.home),
                          embedded=not settings.postgres_url, force=not done)

    def open(self, manifest: dict, db: str, settings: Any, timeout_ms: int) -> "PostgresDatabase":
        from pathlib import Path

        from tasks.db.pg_roles import agent_dsn
        from tasks.db.pg_server import postgres_server_url

        server = postgres_server_url(settings.postgres_url, Path(settings.home))
        return PostgresDatabase(
            db, agent_dsn(server, physical_name(manifest, db), Path(settings.home)),
            statement_timeout_ms=timeout_ms,
        )
