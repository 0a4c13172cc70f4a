"""Relational schemas for the lifecycle suite: read from SQLite, parsed from model answers,
rendered as DDL / design descriptions, and executed in a sandbox.

A :class:`Schema` is a list of :class:`Table` (name, columns with their declared type, primary
key, foreign keys) — the shared relational-schema model of :mod:`tasks.db.relschema`, whose
names (``Column``, ``ForeignKey``, ``Table``, ``type_class``, ``TYPE_CLASSES``) are re-exported
here. **Type classes** make declared types comparable across dialects
(:func:`tasks.db.relschema.type_class`, SQLite affinity rules refined for dates): ``integer``,
``number`` (REAL, FLOAT, DOUBLE, DECIMAL, NUMERIC, MONEY), ``text`` (CHAR, VARCHAR, NVARCHAR,
TEXT, CLOB, STRING, and an empty or unknown type), ``boolean`` (BOOL, BOOLEAN, BIT), ``date``,
``datetime`` (DATETIME, TIMESTAMP), ``time``, ``blob`` (BLOB, BINARY, BYTEA).

Model DDL is executed by :func:`execute_ddl` in a fresh in-memory SQLite database: ``ATTACH``,
``DETACH`` and ``VACUUM`` are refused (nothing can touch the file system), execution is
interrupted after a timeout, and the created schema is read back with ``PRAGMA table_info`` /
``PRAGMA foreign_key_list`` — what is scored is what SQLite actually created.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.db.relschema import (  # noqa: F401 - the shared model, re-exported
    TYPE_CLASSES,
    Column,
    ForeignKey,
    SchemaError,
    Table,
    type_class,
)
from tasks.db.sqlite_guard import run_file_query, run_sandbox_script

__all__ = [
    "TYPE_CLASSES",
    "Column",
    "DDLError",
    "ForeignKey",
    "Schema",
    "SchemaParseError",
    "Table",
    "execute_ddl",
    "parse_design",
    "read_sqlite_schema",
    "render_ddl",
    "run_readonly",
    "run_script",
    "sandbox_connection",
    "schema_from_ddl",
    "sqlite_ddl",
    "type_class",
]


class SchemaParseError(SchemaError):
    """A model answer holds no schema that can be read (the message says why)."""


class DDLError(SchemaError):
    """DDL did not execute in SQLite (the message is SQLite's)."""


@dataclass
class Schema:
    """A list of tables. ``to_dict``/``from_dict`` give the JSON form used in items and
    answers: ``{"tables": [{"name", "columns": [{"name", "type"}], "primary_key": [...],
    "foreign_keys": [{"columns": [...], "references": {"table", "columns": [...]}}]}]}``."""

    tables: list[Table] = field(default_factory=list)

    def table(self, name: str) -> Table | None:
        """The table called ``name`` (case-insensitive) or None."""
        low = name.lower()
        return next((t for t in self.tables if t.name.lower() == low), None)

    def subset(self, names: Iterable[str]) -> Schema:
        """The tables called ``names`` (in that order), keeping only foreign keys between them."""
        picked = [self.table(n) for n in names]
        if any(t is None for t in picked):
            raise KeyError(f"unknown tables in {list(names)}")
        low = {t.name.lower() for t in picked}
        return Schema(
            [
                Table(
                    t.name,
                    list(t.columns),
                    t.primary_key,
                    [fk for fk in t.foreign_keys if fk.ref_table.lower() in low],
                )
                for t in picked
            ]
        )

    def resolved_ref_columns(self, fk: ForeignKey) -> tuple[str, ...]:
        """``fk.ref_columns``, or the referenced table's primary key when they are empty."""
        if fk.ref_columns:
            return fk.ref_columns
        ref = self.table(fk.ref_table)
        return ref.primary_key if ref is not None else ()

    def to_dict(self) -> dict:
        return {
            "tables": [
                {
                    "name": t.name,
                    "columns": [{"name": c.name, "type": c.type} for c in t.columns],
                    "primary_key": list(t.primary_key),
                    "foreign_keys": [
                        {
                            "columns": list(fk.columns),
                            "references": {"table": fk.ref_table, "columns": list(fk.ref_columns)},
                        }
                        for fk in t.foreign_keys
                    ],
                }
                for t in self.tables
            ]
        }

    @classmethod
    def from_dict(cls, data: Any) -> Schema:
        """Read the JSON form, leniently: ``columns`` may be names or objects; a column object
        may carry ``"primary_key": true`` or ``"references": "table(column)"`` /
        ``{"table", "column(s)"}``; ``primary_key`` may be a string; a foreign key may use
        ``column``/``columns`` and ``references``/``ref_table``+``ref_columns``. Raises
        :class:`SchemaParseError` when there is no list of named tables."""
        if isinstance(data, list):
            data = {"tables": data}
        if not isinstance(data, dict) or not isinstance(data.get("tables"), list):
            raise SchemaParseError("expected a JSON object with a 'tables' list")
        tables = []
        for i, t in enumerate(data["tables"]):
            if not isinstance(t, dict) or not str(t.get("name") or "").strip():
                raise SchemaParseError(f"tables[{i}] has no name")
            cols: list[Column] = []
            pk: list[str] = []
            fks: list[ForeignKey] = []
            for c in t.get("columns") or []:
                if isinstance(c, str):
                    cols.append(Column(c))
                    continue
                if not isinstance(c, dict) or not c.get("name"):
                    raise SchemaParseError(f"tables[{i}] ({t['name']}) has a column without a name")
                cols.append(Column(str(c["name"]), str(c.get("type") or c.get("data_type") or "")))
                if c.get("primary_key") is True or c.get("pk") is True:
                    pk.append(str(c["name"]))
                ref = c.get("references") or c.get("foreign_key")
                if ref:
                    rt, rc = _ref(ref)
                    if rt:
                        fks.append(ForeignKey((str(c["name"]),), rt, rc))
            raw_pk = t.get("primary_key")
            if isinstance(raw_pk, str) and raw_pk:
                pk = [raw_pk]
            elif isinstance(raw_pk, list) and raw_pk:
                pk = [str(x) for x in raw_pk]
            for fk in t.get("foreign_keys") or []:
                if not isinstance(fk, dict):
                    continue
                fcols = fk.get("columns") or fk.get("column") or []
                fcols = [fcols] if isinstance(fcols, str) else list(fcols)
                ref = fk.get("references")
                if ref is not None:
                    rt, rc = _ref(ref)
                else:
                    rt = str(fk.get("ref_table") or fk.get("table") or "")
                    rcols = fk.get("ref_columns") or fk.get("ref_column") or []
                    rc = tuple([rcols] if isinstance(rcols, str) else [str(x) for x in rcols])
                if fcols and rt:
                    fks.append(ForeignKey(tuple(str(x) for x in fcols), rt, rc))
            tables.append(Table(str(t["name"]), cols, tuple(pk), _dedupe(fks)))
        return cls(tables)


def _dedupe(fks: list[ForeignKey]) -> list[ForeignKey]:
    seen, out = set(), []
    for fk in fks:
        if fk not in seen:
            seen.add(fk)
            out.append(fk)
    return out


def _ref(ref: Any) -> tuple[str, tuple[str, ...]]:
    if isinstance(ref, str):
        m = re.match(r"\s*([^\s(.]+)\s*(?:[(.]\s*([^)]*?)\s*\)?)?\s*$", ref)
        if not m:
            return "", ()
        cols = tuple(c.strip() for c in (m.group(2) or "").split(",") if c.strip())
        return m.group(1), cols
    if isinstance(ref, dict):
        rt = str(ref.get("table") or "")
        rc = ref.get("columns") or ref.get("column") or []
        return rt, tuple([rc] if isinstance(rc, str) else [str(x) for x in rc])
    return "", ()


# --------------------------------------------------------------------------------------------
# Reading schemas from SQLite
# --------------------------------------------------------------------------------------------


def _introspect(conn: sqlite3.Connection) -> Schema:
    names = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY rowid"
        )
    ]
    tables = []
    for name in names:
        q = name.replace('"', '""')
        info = conn.execute(f'PRAGMA table_info("{q}")').fetchall()
        cols = [Column(r[1], r[2] or "") for r in info]
        pk = tuple(r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5]))
        groups: dict[int, list[tuple]] = {}
        for r in conn.execute(f'PRAGMA foreign_key_list("{q}")').fetchall():
            groups.setdefault(r[0], []).append(r)
        fks = []
        for _, rows in sorted(groups.items()):
            rows.sort(key=lambda r: r[1])
            ref_cols = tuple(r[4] for r in rows if r[4] is not None)
            fks.append(ForeignKey(tuple(r[3] for r in rows), rows[0][2], ref_cols))
        tables.append(Table(name, cols, pk, _dedupe(fks)))
    return Schema(tables)


def read_sqlite_schema(path: str | Path) -> Schema:
    """The schema of the SQLite file ``path`` (opened read-only), tables in creation order,
    ``sqlite_*`` tables left out. Raises ``sqlite3.Error`` when the file cannot be read."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: SQLite database not found")
    conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    try:
        return _introspect(conn)
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# Sandboxed execution
# --------------------------------------------------------------------------------------------

def sandbox_connection(source: str | Path | None = None) -> sqlite3.Connection:
    """A private in-memory SQLite connection, empty or holding a copy of the database file
    ``source`` (copied with the backup API; the file is opened read-only). Foreign-key
    enforcement is off, as in SQLite's default. Use :func:`run_script` to execute untrusted
    SQL on it."""
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    conn.text_factory = lambda b: b.decode("utf-8", errors="replace")
    if source is not None:
        src = sqlite3.connect(f"file:{Path(source)}?mode=ro", uri=True)
        try:
            src.backup(conn)
        finally:
            src.close()
    return conn


def run_script(conn: sqlite3.Connection, sql: str, timeout_ms: int = 10_000) -> None:
    """Execute untrusted ``sql`` (one or more statements) on a sandbox connection through the
    guarded executor (:func:`tasks.db.sqlite_guard.run_sandbox_script`): ``ATTACH``,
    ``DETACH``, ``VACUUM``, ``load_extension`` and the guard's denied functions are refused,
    values are at most :data:`tasks.db.sqlite_guard.SQLITE_MAX_LENGTH` bytes, the script is
    interrupted after ``timeout_ms``. Raises ``sqlite3.Error`` with SQLite's message
    (``not authorized`` for a refused statement, ``interrupted`` on timeout)."""
    run_sandbox_script(conn, sql, timeout_ms)


def run_readonly(path: str | Path, sql: str, timeout_ms: int = 10_000) -> list[tuple]:
    """All rows of one untrusted query on the SQLite file ``path``, opened read-only
    (``mode=ro``), through the guarded executor (:mod:`tasks.db.sqlite_guard`): the authorizer
    allows only reads (``ATTACH``/``DETACH`` — an ATTACH would create a file even on a
    read-only connection — writes, writes through a CTE, ``PRAGMA``, ``VACUUM`` are refused;
    ``load_extension`` is never enabled), the result is bounded in bytes and the query is
    interrupted after ``timeout_ms``. Raises ``sqlite3.Error`` with SQLite's message
    (``not authorized``, ``interrupted``)."""
    return run_file_query(path, sql, timeout_ms)


def execute_ddl(ddl: str, timeout_ms: int = 10_000) -> Schema:
    """Execute ``ddl`` in a fresh sandboxed in-memory SQLite database and return the schema
    SQLite created. Raises :class:`DDLError` with SQLite's message when it does not execute or
    creates no table."""
    conn = sandbox_connection()
    try:
        try:
            run_script(conn, ddl, timeout_ms)
        except (sqlite3.Error, sqlite3.Warning, ValueError) as e:
            raise DDLError(str(e) or type(e).__name__) from None
        schema = _introspect(conn)
    finally:
        conn.close()
    if not schema.tables:
        raise DDLError("the DDL created no table")
    return schema


# --------------------------------------------------------------------------------------------
# Parsing model answers
# --------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def schema_from_ddl(ddl: str) -> Schema:
    """The tables of ``CREATE TABLE`` statements, read with sqlglot (any dialect it reads as
    SQLite/MySQL/PostgreSQL; the DDL need not execute). Column-level ``PRIMARY KEY`` and
    ``REFERENCES`` constraints and table-level ``PRIMARY KEY``/``FOREIGN KEY`` are read.
    Raises :class:`SchemaParseError` when no ``CREATE TABLE`` can be read."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ParseError, TokenError

    statements = None
    for dialect in ("sqlite", "mysql", "postgres"):
        try:
            statements = [s for s in sqlglot.parse(ddl, read=dialect) if s is not None]
            break
        except (ParseError, TokenError):
            continue
    if statements is None:
        raise SchemaParseError("the DDL cannot be parsed")
    tables = []
    for stmt in statements:
        if not isinstance(stmt, exp.Create) or (stmt.args.get("kind") or "").upper() != "TABLE":
            continue
        schema = stmt.this
        if not isinstance(schema, exp.Schema):
            continue
        name = schema.this.name
        cols: list[Column] = []
        pk: list[str] = []
        fks: list[ForeignKey] = []
        for item in schema.expressions:
            if isinstance(item, exp.ColumnDef):
                kind = item.args.get("kind")
                cols.append(Column(item.name, kind.sql(dialect="sqlite") if kind else ""))
                for cons in item.args.get("constraints") or []:
                    k = cons.args.get("kind")
                    if isinstance(k, exp.PrimaryKeyColumnConstraint):
                        pk.append(item.name)
                    elif isinstance(k, exp.Reference):
                        target = k.this
                        rt = target.this.name if isinstance(target, exp.Schema) else target.name
                        rc = (
                            tuple(e.name for e in target.expressions)
                            if isinstance(target, exp.Schema)
                            else ()
                        )
                        fks.append(ForeignKey((item.name,), rt, rc))
            elif isinstance(item, exp.PrimaryKey):
                pk = [e.name for e in item.expressions]
            elif isinstance(item, exp.ForeignKey):
                ref = item.args.get("reference")
                target = ref.this if ref is not None else None
                if target is None:
                    continue
                rt = target.this.name if isinstance(target, exp.Schema) else target.name
                rc = (
                    tuple(e.name for e in target.expressions)
                    if isinstance(target, exp.Schema)
                    else ()
                )
                fks.append(ForeignKey(tuple(e.name for e in item.expressions), rt, rc))
            elif isinstance(item, exp.Constraint):
                for sub in item.expressions:
                    if isinstance(sub, exp.PrimaryKey):
                        pk = [e.name for e in sub.expressions]
        tables.append(Table(name, cols, tuple(pk), _dedupe(fks)))
    if not tables:
        raise SchemaParseError("no CREATE TABLE statement found")
    return Schema(tables)


def parse_design(text: str | None) -> Schema:
    """The schema in a model's design answer: a JSON object (in a ```json block, any fenced
    block, or the whole reply) in :meth:`Schema.from_dict` form, else ``CREATE TABLE``
    statements (a ```sql block or the whole reply) read by :func:`schema_from_ddl`. Raises
    :class:`SchemaParseError` when neither can be read."""
    if not text or not text.strip():
        raise SchemaParseError("empty answer")
    blocks = _FENCE.findall(text)
    candidates = [b for lang, b in blocks if lang.lower() == "json"]
    candidates += [b for lang, b in blocks if lang.lower() != "json"] + [text]
    for cand in candidates:
        s = cand.strip()
        start = min((i for i in (s.find("{"), s.find("[")) if i >= 0), default=-1)
        if start < 0:
            continue
        try:
            return Schema.from_dict(json.loads(s[start:]))
        except (ValueError, SchemaParseError):
            try:
                obj, _ = json.JSONDecoder().raw_decode(s[start:])
                return Schema.from_dict(obj)
            except (ValueError, SchemaParseError):
                continue
    sql_blocks = [b for lang, b in blocks if lang.lower() in ("sql", "sqlite", "")] or [text]
    errors = []
    for cand in sql_blocks:
        try:
            return schema_from_ddl(cand)
        except SchemaParseError as e:
            errors.append(str(e))
    raise SchemaParseError("no JSON schema and no CREATE TABLE statement in the answer")


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def render_ddl(schema: Schema) -> str:
    """SQLite ``CREATE TABLE`` statements for ``schema`` (quoted identifiers, declared types,
    table-level PRIMARY KEY and FOREIGN KEY clauses), one statement per paragraph."""
    out = []
    for t in schema.tables:
        lines = [f"    {_q(c.name)} {c.type}".rstrip() for c in t.columns]
        if t.primary_key:
            lines.append(f"    PRIMARY KEY ({', '.join(_q(c) for c in t.primary_key)})")
        for fk in t.foreign_keys:
            ref = schema.resolved_ref_columns(fk) or fk.ref_columns
            refs = f" ({', '.join(_q(c) for c in ref)})" if ref else ""
            lines.append(
                f"    FOREIGN KEY ({', '.join(_q(c) for c in fk.columns)}) "
                f"REFERENCES {_q(fk.ref_table)}{refs}"
            )
        out.append(f"CREATE TABLE {_q(t.name)} (\n" + ",\n".join(lines) + "\n);")
    return "\n\n".join(out)


def sqlite_ddl(path: str | Path) -> str:
    """The ``CREATE TABLE`` statements stored in the SQLite file ``path`` (as written when the
    tables were created), ``sqlite_*`` tables left out: the schema part of SQL prompts."""
    conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "AND sql IS NOT NULL ORDER BY rowid"
        ).fetchall()
    finally:
        conn.close()
    return "\n\n".join(r[0].strip() + ";" for r in rows)
