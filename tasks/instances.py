"""Small database instances for SQL equivalence: a relational schema with its keys, an in-memory
sandbox (DuckDB or SQLite) to load instances into and run two queries on, rendering an instance
as CREATE TABLE + INSERT statements, and checking that a database really separates two queries.

Used by the counterexample finder (:mod:`tasks.counterexample`), by the LLM judges
(:mod:`tasks.judges`, to execute a counterexample a model proposes) and by the equivalence
tasks (:mod:`tasks.equivalence`).

An *instance* is ``{table_name_lowercase: [row_tuple, ...]}`` with values in the table's column
order: ``None`` for NULL, ``int``/``float``/``str``/``bool``; dates and timestamps are ISO strings
(inserted as literals, cast by the engine).
"""

from __future__ import annotations

import random
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from tasks.result_match import results_match
from tasks.sql_dialects import ReadQuery, read_query, sqlglot_dialect
from tasks.sql_dialects import engine_sql as _engine_sql
from tasks.sqlite_guard import ReadGate

Instance = dict[str, list[tuple]]

#: Engines an instance can be run on.
ENGINES = ("duckdb", "sqlite")


class SchemaError(ValueError):
    """A schema cannot be read (bad DDL or mapping, unknown table in a key, no CREATE TABLE)."""


# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------

_CATEGORY_SQL = {
    "int": "BIGINT", "float": "DOUBLE", "decimal": "DECIMAL(18, 4)", "text": "VARCHAR",
    "date": "DATE", "time": "TIME", "timestamp": "TIMESTAMP", "bool": "BOOLEAN",
    "uuid": "UUID", "json": "JSON", "other": "VARCHAR",
}


def type_category(dtype: exp.DataType) -> str:
    """``int``, ``float``, ``decimal``, ``text``, ``date``, ``time``, ``timestamp``, ``bool``,
    ``uuid``, ``json`` or ``other`` for a sqlglot data type (used to choose values and neighbours of
    constants)."""
    T = exp.DataType.Type
    if dtype.this in (T.BOOLEAN,):
        return "bool"
    if dtype.this in (T.UUID,):
        return "uuid"
    if dtype.this in (T.JSON, T.JSONB):
        return "json"
    if dtype.this in (T.TIME, T.TIMETZ):
        return "time"
    if dtype.is_type(*exp.DataType.INTEGER_TYPES) or dtype.this in (T.YEAR,):
        return "int"
    if dtype.this in (T.DECIMAL, T.MONEY, T.SMALLMONEY, T.BIGDECIMAL):
        return "decimal"
    if dtype.is_type(*exp.DataType.REAL_TYPES):
        return "float"
    if dtype.this in (T.DATE, T.DATE32):
        return "date"
    if dtype.is_type(*exp.DataType.TEMPORAL_TYPES):
        return "timestamp"
    if dtype.is_type(*exp.DataType.TEXT_TYPES) or dtype.this in (T.CHAR, T.NCHAR, T.UNKNOWN, T.ENUM):
        return "text"
    return "other"


@dataclass
class Column:
    """One column: declared ``name``, sqlglot ``dtype``, value ``category``, ``not_null``."""

    name: str
    dtype: exp.DataType
    category: str
    not_null: bool = False


@dataclass
class ForeignKey:
    """``columns`` reference ``ref_columns`` of ``ref_table`` (lower-case table key)."""

    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]


@dataclass
class Table:
    """A table with its keys: ``primary_key`` and ``unique`` column-name tuples, ``foreign_keys``,
    ``checks`` (CHECK constraint expressions, as parsed). Column names keep their declared
    spelling; look-ups are case-insensitive."""

    name: str
    columns: list[Column]
    primary_key: tuple[str, ...] = ()
    unique: list[tuple[str, ...]] = field(default_factory=list)
    foreign_keys: list[ForeignKey] = field(default_factory=list)
    checks: list[exp.Expression] = field(default_factory=list)

    def index(self, column: str) -> int:
        """Position of ``column`` (case-insensitive); KeyError naming the table otherwise."""
        low = column.lower()
        for i, c in enumerate(self.columns):
            if c.name.lower() == low:
                return i
        raise KeyError(f"table {self.name}: no column {column!r}")

    def column(self, column: str) -> Column:
        """The :class:`Column` named ``column`` (case-insensitive)."""
        return self.columns[self.index(column)]

    @property
    def keys(self) -> list[tuple[str, ...]]:
        """Every uniqueness constraint: the primary key (if any) and the UNIQUE sets."""
        return ([self.primary_key] if self.primary_key else []) + list(self.unique)


def _ident(name: str, dialect: str | None) -> str:
    return exp.to_identifier(name).sql(dialect=sqlglot_dialect(dialect))


@dataclass
class RelSchema:
    """A relational schema: tables by lower-case name, with PK / UNIQUE / NOT NULL / FK.

    Build with :meth:`from_ddl`, :meth:`from_mapping`, :meth:`from_database` or
    :func:`load_schema`. ``notes`` lists constraints that were dropped while reading (e.g. a
    foreign key to a table the schema does not have).
    """

    tables: dict[str, Table]
    notes: list[str] = field(default_factory=list)

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_ddl(cls, ddl: str, dialect: str | None = None,
                 query_dialect: str | None = None) -> RelSchema:
        """Read the tables of a schema script: ``CREATE TABLE`` (columns, types, NOT NULL,
        PRIMARY KEY, UNIQUE, FOREIGN KEY, CHECK), ``CREATE UNIQUE INDEX`` (a UNIQUE key) and
        ``ALTER TABLE`` adding columns or constraints; other statements (INSERT, DROP, SET,
        PRAGMA, plain indexes, ...) do not change the schema and are skipped.

        Each statement is parsed with ``dialect`` (the DDL's own, when known), else with the
        dialect its text points to (backticks → MySQL, ...), else with ``query_dialect`` (the
        queries' dialect), else with the others (:func:`tasks.sql_dialects.read_ddl`); a
        statement read in another dialect than the one given is listed in :attr:`notes`.
        Database qualifiers (``db.table``) are dropped. Raises SchemaError naming the statement
        when one parses in no dialect, when an ALTER TABLE does something other than add a
        column or a constraint, or when no table is defined — a schema is never silently
        smaller than its DDL.
        """
        from tasks.sql_dialects import SQLReadError, read_ddl

        try:
            read = read_ddl(ddl, dialect, query_dialect)
        except SQLReadError as exc:
            raise SchemaError(str(exc)) from None
        raw: dict[str, tuple[Table, list[_FK]]] = {}
        notes = list(read.notes)
        for st in read.statements:
            tree = st.tree
            kind = (tree.args.get("kind") or "").upper() if isinstance(tree, exp.Create) else ""
            if kind == "TABLE":
                table, fks = _table_from_create(tree)
                if table.name.lower() in raw:
                    raise SchemaError(f"table {table.name} defined twice")
                raw[table.name.lower()] = (table, fks)
            elif kind == "INDEX" and tree.args.get("unique"):
                _unique_index(tree, raw, notes)
            elif kind and kind not in ("INDEX", "SCHEMA", "DATABASE", "SEQUENCE"):
                # a view, function, trigger, ...: not a table the finder can fill
                name = tree.this.name if isinstance(tree.this, exp.Expression) else "?"
                notes.append(f"schema DDL: CREATE {kind} {name} not read (a query reading it "
                             "fails with 'no table')")
            elif isinstance(tree, exp.Alter) and (tree.args.get("kind") or "").upper() == "TABLE":
                _alter_table(tree, st.text, raw)
        if not raw:
            raise SchemaError("schema DDL has no CREATE TABLE statement")
        schema = cls._finish(list(raw.values()))
        schema.notes[:0] = notes
        return schema

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> RelSchema:
        """Read the mapping form ``{table: {"columns": {name: "TYPE [constraints]"} | [names],
        "primary_key": [...], "unique": [[...]], "not_null": [...], "foreign_keys": [{"columns",
        "references", "ref_columns"}]}}`` (values may be pydantic ``TableSpec`` models). It is
        rendered as DDL and read with :meth:`from_ddl`, so both forms mean the same."""
        if not mapping:
            raise SchemaError("schema mapping has no tables")
        statements = []
        for tname, spec in mapping.items():
            spec = spec.model_dump() if hasattr(spec, "model_dump") else dict(spec)
            unknown = set(spec) - {"columns", "primary_key", "unique", "not_null", "foreign_keys"}
            if unknown:
                raise SchemaError(f"table {tname}: unknown keys {sorted(unknown)}")
            cols = spec.get("columns") or {}
            if isinstance(cols, list):
                cols = {c: "TEXT" for c in cols}
            if not cols:
                raise SchemaError(f"table {tname}: no columns")
            not_null = {c.lower() for c in spec.get("not_null") or []}
            parts = []
            for cname, ctype in cols.items():
                text = f"{_ident(cname, 'duckdb')} {ctype or 'TEXT'}"
                if cname.lower() in not_null and "not null" not in str(ctype).lower():
                    text += " NOT NULL"
                parts.append(text)
            known = {c.lower() for c in cols}
            for c in not_null - known:
                raise SchemaError(f"table {tname}: not_null names unknown column {c!r}")
            if spec.get("primary_key"):
                parts.append("PRIMARY KEY (" + ", ".join(_ident(c, "duckdb") for c in spec["primary_key"]) + ")")
            for u in spec.get("unique") or []:
                parts.append("UNIQUE (" + ", ".join(_ident(c, "duckdb") for c in u) + ")")
            for fk in spec.get("foreign_keys") or []:
                ref_cols = fk.get("ref_columns")
                ref = _ident(fk["references"], "duckdb")
                if ref_cols:
                    ref += " (" + ", ".join(_ident(c, "duckdb") for c in ref_cols) + ")"
                parts.append("FOREIGN KEY (" + ", ".join(_ident(c, "duckdb") for c in fk["columns"]) + f") REFERENCES {ref}")
            statements.append(f"CREATE TABLE {_ident(tname, 'duckdb')} (" + ", ".join(parts) + ")")
        try:
            return cls.from_ddl(";\n".join(statements), "duckdb")
        except SchemaError as exc:
            raise SchemaError(f"schema mapping: {exc}") from None

    @classmethod
    def from_database(cls, path: str | Path) -> RelSchema:
        """Read the schema (with keys) of a SQLite or DuckDB file, opened read-only.

        Raises SchemaError when the file is missing or is neither engine's format."""
        p = Path(path).expanduser()
        if not p.is_file():
            raise SchemaError(f"database file not found: {p}")
        if database_engine(p) == "duckdb":
            try:
                con = duckdb.connect(str(p), read_only=True)
                try:
                    rows = con.execute(
                        "SELECT sql FROM duckdb_tables() WHERE database_name = current_database() "
                        "AND NOT internal ORDER BY table_name").fetchall()
                finally:
                    con.close()
            except duckdb.Error as exc:
                raise SchemaError(f"{p}: cannot read DuckDB schema: {exc}") from None
            return cls.from_ddl(";\n".join(r[0] for r in rows), "duckdb")
        try:
            con = sqlite3.connect(p.resolve().as_uri() + "?mode=ro", uri=True)
            try:
                rows = con.execute(
                    "SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL "
                    "AND name NOT LIKE 'sqlite_%' ORDER BY name").fetchall()
            finally:
                con.close()
        except sqlite3.Error as exc:
            raise SchemaError(f"{p}: cannot read SQLite schema: {exc}") from None
        return cls.from_ddl(";\n".join(r[0] for r in rows), "sqlite")

    @classmethod
    def _finish(cls, raw) -> RelSchema:
        tables: dict[str, Table] = {}
        for table, _ in raw:
            if table.name.lower() in tables:
                raise SchemaError(f"table {table.name} defined twice")
            tables[table.name.lower()] = table
        notes: list[str] = []
        for table, fks in raw:
            for cols, ref_table, ref_cols in fks:
                parent = tables.get(ref_table.lower())
                if parent is None:
                    notes.append(f"{table.name}: foreign key to unknown table {ref_table} ignored")
                    continue
                if not ref_cols:
                    ref_cols = parent.primary_key
                try:
                    cols = tuple(table.column(c).name for c in cols)
                    ref_cols = tuple(parent.column(c).name for c in ref_cols)
                except KeyError as exc:
                    notes.append(f"{table.name}: foreign key ignored ({exc.args[0]})")
                    continue
                if len(cols) != len(ref_cols) or not cols:
                    notes.append(f"{table.name}: foreign key {cols} → {ref_table} ignored (arity)")
                    continue
                table.foreign_keys.append(ForeignKey(cols, parent.name.lower(), ref_cols))
        for table in tables.values():
            try:
                table.primary_key = tuple(table.column(c).name for c in table.primary_key)
                table.unique = [tuple(table.column(c).name for c in u) for u in table.unique]
            except KeyError as exc:
                raise SchemaError(f"key names an unknown column: {exc.args[0]}") from None
            for c in table.primary_key:
                table.column(c).not_null = True
        return cls(tables, notes)

    # -- use ---------------------------------------------------------------------------------

    def table(self, name: str) -> Table:
        """The table named ``name`` (case-insensitive; a ``db.`` qualifier is ignored)."""
        key = name.lower().rsplit(".", 1)[-1]
        try:
            return self.tables[key]
        except KeyError:
            raise KeyError(f"no table {name!r} in the schema (have {sorted(self.tables)})") from None

    def closure(self, names: Iterable[str]) -> list[str]:
        """``names`` plus every table they reference through foreign keys (transitively), in an
        order where referenced tables come first (cycles broken arbitrarily)."""
        want: set[str] = set()
        stack = [self.table(n).name.lower() for n in names]
        while stack:
            t = stack.pop()
            if t in want:
                continue
            want.add(t)
            stack.extend(fk.ref_table for fk in self.tables[t].foreign_keys)
        order: list[str] = []
        visiting: set[str] = set()

        def visit(t: str) -> None:
            if t in order or t in visiting:
                return
            visiting.add(t)
            for fk in self.tables[t].foreign_keys:
                if fk.ref_table in want and fk.ref_table != t:
                    visit(fk.ref_table)
            visiting.discard(t)
            order.append(t)

        for t in sorted(want):
            visit(t)
        return order

    def emittable_fks(self, table: Table, tables: Sequence[str]) -> list[ForeignKey]:
        """Foreign keys an engine can declare: the parent is among ``tables`` and the
        referenced columns are its primary key or a UNIQUE set (DuckDB and SQLite both need
        that). Other foreign keys are still honoured by the finder's generator."""
        out = []
        for fk in table.foreign_keys:
            parent = self.tables[fk.ref_table]
            if fk.ref_table not in tables:
                continue
            if {c.lower() for c in fk.ref_columns} in [{c.lower() for c in k} for k in parent.keys]:
                out.append(fk)
        return out

    def create_sql(
        self, name: str, dialect: str | None = "duckdb", *, constraints: bool = True,
        tables: Sequence[str] | None = None, category_types: bool = False,
        checks: bool | None = None,
    ) -> str:
        """``CREATE TABLE`` for table ``name`` in ``dialect``: columns with their types (or a
        standard type for their category when ``category_types``), and, with ``constraints``,
        NOT NULL, PRIMARY KEY, UNIQUE and the foreign keys to tables among ``tables``; CHECK
        constraints with ``checks`` (default: with ``constraints``)."""
        checks = constraints if checks is None else checks
        dialect = sqlglot_dialect(dialect)
        t = self.table(name)
        tables = [x.lower() for x in (tables if tables is not None else self.tables)]
        parts = []
        for c in t.columns:
            typ = _CATEGORY_SQL[c.category] if category_types else _engine_type(c, dialect)
            if category_types and dialect == "sqlite":
                typ = exp.DataType.build(typ).sql(dialect="sqlite")
            text = f"{_ident(c.name, dialect)} {typ}"
            if constraints and c.not_null:
                text += " NOT NULL"
            parts.append(text)
        if constraints:
            if t.primary_key:
                parts.append("PRIMARY KEY (" + ", ".join(_ident(c, dialect) for c in t.primary_key) + ")")
            for u in t.unique:
                parts.append("UNIQUE (" + ", ".join(_ident(c, dialect) for c in u) + ")")
            for fk in self.emittable_fks(t, tables):
                parent = self.tables[fk.ref_table]
                parts.append(
                    "FOREIGN KEY (" + ", ".join(_ident(c, dialect) for c in fk.columns)
                    + f") REFERENCES {_ident(parent.name, dialect)} ("
                    + ", ".join(_ident(c, dialect) for c in fk.ref_columns) + ")"
                )
        if checks:
            parts.extend(f"CHECK ({c.sql(dialect=dialect)})" for c in t.checks)
        return f"CREATE TABLE {_ident(t.name, dialect)} (\n  " + ",\n  ".join(parts) + "\n)"

    def ddl(self, dialect: str | None = "duckdb", tables: Sequence[str] | None = None) -> str:
        """The whole schema (or ``tables`` and the tables they reference) as DDL text."""
        names = self.closure(tables) if tables is not None else self.closure(self.tables)
        return ";\n\n".join(self.create_sql(n, dialect, tables=names) for n in names) + ";\n"


_FK = tuple[tuple[str, ...], str, tuple[str, ...]]


def _table_from_create(st: exp.Create) -> tuple[Table, list[_FK]]:
    """A :class:`Table` (and its raw foreign keys) from one parsed CREATE TABLE."""
    target = st.this
    if not isinstance(target, exp.Schema):
        raise SchemaError(f"CREATE TABLE without a column list: {st.sql()[:80]}")
    name = target.this.name
    table = Table(name, [])
    fks: list[_FK] = []
    for item in target.expressions:
        if isinstance(item, exp.ColumnDef):
            _add_column(table, item, fks)
        else:
            _add_table_constraint(table, item, fks)
    if not table.columns:
        raise SchemaError(f"table {name}: no columns")
    return table, fks


def _add_column(table: Table, item: exp.ColumnDef, fks: list[_FK]) -> None:
    kind = item.args.get("kind")
    dtype = kind if isinstance(kind, exp.DataType) else exp.DataType.build("TEXT")
    col = Column(item.name, dtype, type_category(dtype))
    for cons in item.constraints:
        ck = cons.args.get("kind")
        if isinstance(ck, exp.NotNullColumnConstraint) and not ck.args.get("allow_null"):
            col.not_null = True
        elif isinstance(ck, exp.PrimaryKeyColumnConstraint):
            table.primary_key = (item.name,)
        elif isinstance(ck, exp.UniqueColumnConstraint):
            table.unique.append((item.name,))
        elif isinstance(ck, exp.Reference):
            fks.append(((item.name,), *_reference(ck)))
        elif isinstance(ck, exp.CheckColumnConstraint) and ck.this is not None:
            table.checks.append(ck.this.copy())
    table.columns.append(col)


def _add_table_constraint(table: Table, item: exp.Expression, fks: list[_FK]) -> None:
    if isinstance(item, exp.PrimaryKey):
        table.primary_key = tuple(_names(item.expressions))
    elif isinstance(item, exp.UniqueColumnConstraint):
        schema_node = item.this
        cols = _names(schema_node.expressions) if schema_node is not None else []
        if cols:
            table.unique.append(tuple(cols))
    elif isinstance(item, exp.ForeignKey):
        ref = item.args.get("reference")
        if ref is not None:
            fks.append((tuple(_names(item.expressions)), *_reference(ref)))
    elif isinstance(item, exp.CheckColumnConstraint) and item.this is not None:
        table.checks.append(item.this.copy())
    elif isinstance(item, exp.Constraint):
        for sub in item.expressions:
            _add_table_constraint(table, sub, fks)


def _unique_index(st: exp.Create, raw: dict, notes: list[str]) -> None:
    index = st.this
    params = index.args.get("params") if isinstance(index, exp.Index) else None
    target = index.args.get("table") if isinstance(index, exp.Index) else None
    if params is None or target is None:
        raise SchemaError(f"CREATE UNIQUE INDEX not understood: {st.sql()[:100]}")
    if target.name.lower() not in raw:
        raise SchemaError(f"CREATE UNIQUE INDEX on unknown table {target.name}")
    if params.args.get("where") is not None:
        notes.append(f"schema DDL: partial unique index {index.name} on {target.name} not "
                     "enforced (its rows are not all distinct)")
        return
    cols = []
    for c in params.args.get("columns") or []:
        inner = c.this if isinstance(c, exp.Ordered) else c
        if not isinstance(inner, exp.Column):
            notes.append(f"schema DDL: unique index {index.name} on an expression not enforced")
            return
        cols.append(inner.name)
    if cols:
        raw[target.name.lower()][0].unique.append(tuple(cols))


def _alter_table(st: exp.Alter, text: str, raw: dict) -> None:
    name = st.this.name
    if name.lower() not in raw:
        raise SchemaError(f"ALTER TABLE of unknown table {name}: {text[:100]}")
    table, fks = raw[name.lower()]
    for action in st.args.get("actions") or []:
        if isinstance(action, exp.ColumnDef):
            _add_column(table, action, fks)
        elif isinstance(action, exp.AddConstraint):
            for item in action.expressions:
                _add_table_constraint(table, item, fks)
        elif isinstance(action, exp.AlterColumn) and action.args.get("allow_null") is False:
            table.column(action.name).not_null = True
        else:
            raise SchemaError(f"ALTER TABLE {name}: only ADD COLUMN / ADD CONSTRAINT / SET NOT "
                              f"NULL are read, not {type(action).__name__}: {text[:100]}")


def _engine_type(col: Column, dialect: str | None) -> str:
    """The column's declared type for ``dialect``, without the display widths no engine but
    MySQL reads (``INT(11)``, ``TINYINT(1)``, ``DOUBLE(8,2)``)."""
    dtype = col.dtype
    if col.category in ("int", "float") and dtype.expressions:
        dtype = exp.DataType(this=dtype.this)
    return dtype.sql(dialect=dialect)


def enum_values(col: Column) -> list[str]:
    """The values of an ENUM column (empty for other types)."""
    if col.dtype.this != exp.DataType.Type.ENUM:
        return []
    return [e.this for e in col.dtype.expressions if isinstance(e, exp.Literal)]


def _names(nodes: Iterable[exp.Expression]) -> list[str]:
    return [n.name for n in nodes]


def _reference(ref: exp.Reference) -> tuple[str, tuple[str, ...]]:
    target = ref.this
    if isinstance(target, exp.Schema):
        return target.this.name, tuple(_names(target.expressions))
    return target.name, ()


def load_schema(schema: str | Mapping[str, Any] | None, dialect: str | None = None,
                db_path: str | Path | None = None, query_dialect: str | None = None) -> RelSchema:
    """A :class:`RelSchema` from DDL text (``dialect``: the DDL's own, ``query_dialect``: the
    queries', a weaker hint; see :meth:`RelSchema.from_ddl`), the mapping form, or (when
    ``schema`` is None) the SQLite/DuckDB file ``db_path``. Raises SchemaError when there is
    nothing to read."""
    if isinstance(schema, str):
        return RelSchema.from_ddl(schema, dialect, query_dialect)
    if isinstance(schema, Mapping):
        return RelSchema.from_mapping(schema)
    if db_path is not None:
        return RelSchema.from_database(db_path)
    raise SchemaError("the pair has neither a schema nor a SQLite/DuckDB database to read one from")


def database_engine(path: str | Path) -> str:
    """``sqlite`` or ``duckdb`` for a database file, from its header (suffix as fallback)."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            head = fh.read(16)
    except OSError:
        head = b""
    if head.startswith(b"SQLite format 3"):
        return "sqlite"
    if len(head) >= 12 and head[8:12] == b"DUCK":
        return "duckdb"
    return "duckdb" if p.suffix.lower() in (".duckdb", ".ddb") else "sqlite"


# --------------------------------------------------------------------------------------------
# Queries
# --------------------------------------------------------------------------------------------


def parse_query(sql: str, dialect: str | None) -> exp.Expression:
    """Parse and normalise one query (:func:`tasks.sql_dialects.read_query`); ValueError with a
    short message when it does not parse or is not a single SELECT/WITH/set-operation
    statement."""
    return read_query(sql, dialect).tree


def referenced_tables(tree: exp.Expression) -> list[str]:
    """Base tables a query reads (CTE names excluded), lower-case, in order of appearance."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    out: list[str] = []
    for t in tree.find_all(exp.Table):
        if not t.name:
            continue
        n = t.name.lower()
        if n not in ctes and n not in out:
            out.append(n)
    return out


def engine_sql(sql: str | ReadQuery, dialect: str | None, engine: str) -> str:
    """``sql`` written for ``engine`` (:func:`tasks.sql_dialects.engine_sql`: unchanged when
    the dialect is the engine's own and normalising changed nothing)."""
    return _engine_sql(sql, dialect, engine)


def order_matters(sql1: str, sql2: str, dialect: str | None, order: str, both: bool = True) -> bool:
    """Whether row order is compared: ``always``/``never``, or ``auto`` = both queries (or
    either, with ``both=False``) have a top-level ORDER BY."""
    if order != "auto":
        return order == "always"
    flags = [read_query(s, dialect).tree.args.get("order") is not None for s in (sql1, sql2)]
    return all(flags) if both else any(flags)


#: Aggregates whose value depends on the order rows arrive in.
_ORDER_DEPENDENT = (exp.ArrayAgg, exp.GroupConcat, exp.AnyValue, exp.First, exp.Last,
                    exp.FirstValue, exp.LastValue, exp.NthValue, exp.ArgMax, exp.ArgMin)
_ORDER_DEPENDENT_NAMES = {"STRING_AGG", "LISTAGG", "LIST", "ARBITRARY", "ANY_VALUE", "FIRST", "LAST"}


def arbitrary_choices(tree: exp.Expression, engine: str = "duckdb") -> bool:
    """Whether a query's result may depend on an arbitrary choice the engine makes among rows:
    LIMIT / OFFSET / FETCH (ties at the boundary), window functions, DISTINCT ON,
    order-dependent aggregates (STRING_AGG, ARRAY_AGG, ANY_VALUE, FIRST, ...) and, on SQLite, a
    bare column next to an aggregate. Such queries are compared under many row orders
    (:func:`row_orders`)."""
    if next(tree.find_all(exp.Limit, exp.Offset, exp.Fetch, exp.Window, *_ORDER_DEPENDENT), None):
        return True
    for d in tree.find_all(exp.Distinct):
        if d.args.get("on") is not None:
            return True
    for f in tree.find_all(exp.Anonymous):
        if str(f.this).upper() in _ORDER_DEPENDENT_NAMES:
            return True
    if engine == "sqlite":
        for select in tree.find_all(exp.Select):
            items = select.expressions
            if not any(isinstance(n, exp.AggFunc) for e in items for n in e.walk()):
                continue
            group = select.args.get("group")
            grouped = {c.sql() for c in group.find_all(exp.Column)} if group is not None else set()
            for e in items:
                for c in e.find_all(exp.Column):
                    if c.find_ancestor(exp.AggFunc) is None and c.sql() not in grouped:
                        return True
    return False


def row_orders(lengths: Sequence[int], many: bool, seed: int = 0) -> list[list[list[int]]]:
    """Orders to insert rows in: each order holds one permutation (a list of positions) per
    row list of the given ``lengths``. Always the identity and the reversal; with ``many``
    also rotations (every row first once, up to 12 of them), their reversals and four seeded
    shuffles, so that every row of a group of ties gets to be chosen by an arbitrary choice
    (the identity stays first; duplicates are removed)."""
    ident = [list(range(n)) for n in lengths]
    orders = [ident, [list(reversed(p)) for p in ident]]
    longest = max(lengths, default=0)
    if many and longest > 2:
        steps = sorted({round(i * longest / min(longest, 12)) for i in range(1, min(longest, 12))})
        for r in steps:
            rot = [[(i + r) % n for i in range(n)] if n else [] for n in lengths]
            orders.append(rot)
            orders.append([list(reversed(p)) for p in rot])
        rng = random.Random(seed)
        for _ in range(4):
            orders.append([rng.sample(range(n), n) for n in lengths])
    out, seen = [], set()
    for o in orders:
        key = tuple(tuple(p) for p in o)
        if key not in seen:
            seen.add(key)
            out.append(o)
    return out


# --------------------------------------------------------------------------------------------
# Sandbox
# --------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one query returned on an instance: ``rows`` (tuples) or an ``error`` message."""

    rows: list[tuple] | None = None
    error: str | None = None

    def preview(self, n: int = 5) -> str:
        """``ERROR: ...`` or the first ``n`` rows and the row count."""
        if self.error is not None:
            return f"ERROR: {self.error}"
        rows = self.rows or []
        shown = ", ".join(repr(tuple(r)) for r in rows[:n])
        more = f", … (+{len(rows) - n})" if len(rows) > n else ""
        return f"{len(rows)} row{'s' if len(rows) != 1 else ''}: [{shown}{more}]"


def same_outcome(a: Outcome, b: Outcome, *, ordered: bool, bag: bool = True,
                 permute_columns: bool = True) -> bool:
    """Two outcomes are the same result: both errors, or rows equal under test-suite
    semantics (:func:`tasks.result_match.results_match`). One error and one result are not the
    same, but neither is a difference between results: callers treat that case apart
    (:func:`one_sided_error`)."""
    if a.error is not None or b.error is not None:
        return a.error is not None and b.error is not None
    return results_match(a.rows or [], b.rows or [], ordered=ordered, bag=bag,
                         permute_columns=permute_columns)


def one_sided_error(a: Outcome, b: Outcome) -> str | None:
    """``"sql1 fails (sql2 runs): <error>"`` when exactly one of two outcomes is an error, else
    None."""
    if (a.error is None) == (b.error is None):
        return None
    return f"sql1 fails (sql2 runs): {a.error}" if a.error is not None else f"sql2 fails (sql1 runs): {b.error}"


def _short(msg: object) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(msg)).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    out = " ".join(lines[:2])
    return out[:300]


def literal(value: Any, engine: str) -> str:
    """A SQL literal for ``value`` in ``engine`` (NULL, numbers, quoted strings, booleans)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return ("1" if value else "0") if engine == "sqlite" else ("TRUE" if value else "FALSE")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


class Sandbox:
    """An in-memory DuckDB (single thread) or SQLite database holding ``tables`` of
    ``schema``, to load instances into (:meth:`load`) and run queries on (:meth:`run`).

    With ``constraints`` the tables carry their keys (NOT NULL, PK, UNIQUE, FK; SQLite with
    ``PRAGMA foreign_keys=ON``), so inserting an instance that breaks one raises; the finder's
    search sandbox omits them for speed (its generator keeps them), the verification sandbox
    keeps them. ``checks`` (default: ``constraints``) declares the CHECK constraints (the
    finder's search sandbox keeps them, so an instance breaking one does not load); when the
    engine cannot create one, the table is created without and :attr:`notes` says so. A query
    running over ``query_timeout_s`` is interrupted and returns an error outcome. Use as a
    context manager or call :meth:`close`.
    """

    def __init__(self, schema: RelSchema, tables: Sequence[str], engine: str = "duckdb",
                 *, constraints: bool = False, checks: bool | None = None,
                 query_timeout_s: float = 5.0) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: use one of {ENGINES}")
        self.schema = schema
        self.engine = engine
        self.tables = schema.closure(tables)
        self.query_timeout_s = query_timeout_s
        self._loaded: set[str] = set()
        self._names = {t: _ident(schema.tables[t].name, engine) for t in self.tables}
        self._deadline: float | None = None
        self._closed = threading.Event()
        if engine == "duckdb":
            self.con = duckdb.connect(":memory:", config={"threads": 1})
            self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                              name="equivalence-sandbox-watchdog")
            self._watchdog.start()
        else:
            self.con = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            self._gate = ReadGate(self.con)  # queries read only; the harness loads
            if constraints:
                self.con.execute("PRAGMA foreign_keys = ON")
        checks = constraints if checks is None else checks
        self.notes: list[str] = []
        for name in self.tables:
            attempts = [(False, checks), (True, checks)]
            first_error = ""
            if checks and schema.tables[name].checks:
                attempts.append((True, False))
            for n, (category_types, with_checks) in enumerate(attempts):
                ddl = schema.create_sql(name, engine, constraints=constraints, tables=self.tables,
                                        category_types=category_types, checks=with_checks)
                try:
                    self._exec(ddl)
                    if checks and not with_checks:
                        self.notes.append(f"CHECK constraints of table {name} not enforced: "
                                          f"{engine} cannot create them ({first_error})")
                    break
                except (duckdb.Error, sqlite3.Error) as exc:
                    if n == 0:
                        first_error = _short(exc)
                    if n == len(attempts) - 1:
                        self.close()
                        raise SchemaError(f"cannot create table {name} on {engine}: {first_error}") from None

    # -- plumbing ----------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._closed.wait(0.05):
            d = self._deadline
            if d is not None and time.monotonic() > d:
                try:
                    self.con.interrupt()
                except Exception:  # noqa: BLE001, S110 - connection already closed
                    pass
                self._deadline = None

    def _exec(self, sql: str) -> None:
        self.con.execute(self._gate.trusted(sql) if self.engine == "sqlite" else sql)

    def close(self) -> None:
        """Close the connection and stop the watchdog thread."""
        self._closed.set()
        try:
            self.con.close()
        except Exception:  # noqa: BLE001, S110 - already closed
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- use ---------------------------------------------------------------------------------

    def load(self, instance: Mapping[str, Sequence[tuple]]) -> None:
        """Replace the contents of the sandbox's tables with ``instance`` (tables missing from
        it are left empty). Inserts parents before children. Raises the engine's error (e.g. a
        constraint violation) and KeyError for a table outside the sandbox."""
        for t in instance:
            if t not in self.tables:
                raise KeyError(f"table {t!r} is not in this sandbox ({self.tables})")
        statements = [f"DELETE FROM {self._names[t]}" for t in reversed(self.tables) if t in self._loaded]
        self._loaded.clear()
        for t in self.tables:
            rows = instance.get(t) or []
            if not rows:
                continue
            values = ", ".join(
                "(" + ", ".join(literal(v, self.engine) for v in row) + ")" for row in rows
            )
            self._loaded.add(t)
            statements.append(f"INSERT INTO {self._names[t]} VALUES {values}")
        if not statements:
            return
        if self.engine == "duckdb":  # one call: DuckDB's per-call overhead dominates tiny loads
            self._exec(";\n".join(statements))
        else:
            for st in statements:
                self._exec(st)

    def execute(self, sql: str) -> None:
        """Run one statement (DDL/DML) in the engine's dialect; engine errors propagate."""
        self._exec(sql)

    def clear(self) -> None:
        """Delete every row of the sandbox's tables (children first)."""
        for t in reversed(self.tables):
            self._exec(f"DELETE FROM {self._names[t]}")
        self._loaded.clear()

    def run(self, sql: str) -> Outcome:
        """Run one query (in the engine's dialect) and fetch every row; errors and timeouts
        become an :class:`Outcome` with ``error``. On SQLite the query runs under
        :class:`tasks.sqlite_guard.ReadGate`: only reads are authorised (no ATTACH, no write,
        no PRAGMA), interrupted after ``query_timeout_s``, the result bounded in bytes."""
        if self.engine == "sqlite":  # the guarded executor: reads only, time and byte limits
            try:
                return Outcome(rows=self._gate.query(sql, self.query_timeout_s * 1000,
                                                     steps=20_000))
            except (sqlite3.Error, ValueError, OverflowError) as exc:
                return Outcome(error=_short(exc))
        self._deadline = time.monotonic() + self.query_timeout_s
        try:
            return Outcome(rows=[tuple(r) for r in self.con.execute(sql).fetchall()])
        except (duckdb.Error, ValueError, OverflowError, RuntimeError) as exc:
            return Outcome(error=_short(exc))
        finally:
            self._deadline = None


# --------------------------------------------------------------------------------------------
# Rendering and verification
# --------------------------------------------------------------------------------------------


def instance_rows(instance: Mapping[str, Sequence[tuple]]) -> int:
    """Total number of rows of an instance."""
    return sum(len(r) for r in instance.values())


def render_instance(schema: RelSchema, instance: Mapping[str, Sequence[tuple]],
                    dialect: str | None = "duckdb", tables: Sequence[str] | None = None) -> str:
    """The instance as a SQL script in ``dialect``: CREATE TABLE (with keys) for ``tables``
    (default: the instance's tables and the tables they reference), then one multi-row INSERT
    per non-empty table, parents first. Literals are written by sqlglot."""
    dialect = sqlglot_dialect(dialect)
    names = schema.closure(tables if tables is not None else list(instance))
    out = [schema.create_sql(n, dialect, tables=names) + ";" for n in names]
    for n in names:
        rows = instance.get(n) or []
        if not rows:
            continue
        t = schema.tables[n]
        values = exp.values([tuple(exp.convert(v) for v in row) for row in rows])
        stmt = exp.insert(values, exp.to_table(_ident(t.name, dialect), dialect=dialect),
                          columns=[c.name for c in t.columns])
        out.append(stmt.sql(dialect=dialect) + ";")
    return "\n".join(out) + "\n"


@dataclass
class Verification:
    """Result of executing a database and both queries on it: ``separates`` is True when the
    two results differ (on both row orders of the inserts, see :func:`verify_counterexample`),
    ``error`` says why the database could not be built or why it separates nothing (then
    ``separates`` is False); ``error_on_instance`` is set when exactly one query raises on the
    database (a runtime error is not a result, so such a database is no counterexample);
    ``result1``/``result2`` preview what each query returned; ``rows`` inserted."""

    separates: bool
    error: str | None = None
    error_on_instance: str | None = None
    result1: str | None = None
    result2: str | None = None
    rows: int = 0
    engine: str = "duckdb"


def _split_script(script: str, dialect: str | None) -> list[exp.Expression]:
    try:
        return [s for s in sqlglot.parse(script, read=sqlglot_dialect(dialect)) if s is not None]
    except SqlglotError as exc:
        raise ValueError(f"counterexample script does not parse: {str(exc).splitlines()[0]}") from None


def _insert_rows(stmt: exp.Insert) -> int:
    values = stmt.expression
    return len(values.expressions) if isinstance(values, exp.Values) else 1


def _insert_values(stmt: exp.Insert) -> list[exp.Expression]:
    values = stmt.expression
    return list(values.expressions) if isinstance(values, exp.Values) else []


def _permute_insert(stmt: exp.Insert, perm: list[int]) -> exp.Insert:
    rows = _insert_values(stmt)
    if len(rows) < 2:
        return stmt
    stmt = stmt.copy()
    stmt.expression.set("expressions", [rows[i].copy() for i in perm])
    return stmt


def verify_counterexample(
    sql1: str, sql2: str, script: str, *, dialect: str | None = "duckdb",
    schema: RelSchema | None = None, engine: str | None = None, ordered: bool | None = None,
    bag: bool = True, permute_columns: bool = True, query_timeout_s: float = 5.0,
) -> Verification:
    """Execute a proposed counterexample database and check that it separates two queries.

    ``script`` holds INSERT statements (CREATE TABLE statements in it are used only when no
    ``schema`` is given; with a schema the tables are created from it, keys included, so a
    database that breaks a PRIMARY KEY / UNIQUE / NOT NULL / FOREIGN KEY is rejected). Each
    statement is transpiled from ``dialect`` to the engine (``sqlite`` for the sqlite dialect,
    else DuckDB). The database separates the queries when their results differ under the match
    options (``ordered`` default: both queries have a top-level ORDER BY) under every row
    order tried — the inserts as written and with every INSERT's rows reversed, and, when a
    query may choose arbitrarily among rows (:func:`arbitrary_choices`: ``LIMIT`` without a
    total order, ...), rotations and shuffles (:func:`row_orders`) — so that a difference
    that depends only on an arbitrary choice among ties is not accepted: no result sql1 gave
    under some order may equal one sql2 gave under some order.

    Returns a :class:`Verification`; never raises for a bad script (the reason is in
    ``error``).
    """
    engine = engine or ("sqlite" if dialect == "sqlite" else "duckdb")
    try:
        dialect = sqlglot_dialect(dialect)
    except ValueError as exc:
        return Verification(False, error=str(exc), engine=engine)
    if ordered is None:
        try:
            ordered = order_matters(sql1, sql2, dialect, "auto")
        except (SqlglotError, ValueError):
            ordered = False
    try:
        statements = _split_script(script, dialect)
    except ValueError as exc:
        return Verification(False, error=str(exc), engine=engine)
    creates = [s for s in statements if isinstance(s, exp.Create)]
    inserts = [s for s in statements if isinstance(s, exp.Insert)]
    others = [s for s in statements if not isinstance(s, (exp.Create, exp.Insert))]
    if others:
        kinds = sorted({type(s).__name__.upper() for s in others})
        return Verification(False, error=f"only CREATE TABLE and INSERT statements are allowed, got {kinds}",
                            engine=engine)
    if schema is None:
        if not creates:
            return Verification(False, error="no schema and no CREATE TABLE in the script", engine=engine)
        try:
            schema = RelSchema.from_ddl(";\n".join(c.sql(dialect=dialect) for c in creates), dialect)
        except SchemaError as exc:
            return Verification(False, error=str(exc), engine=engine)
    try:
        tables = schema.closure(
            set(referenced_tables(parse_query(sql1, dialect)))
            | set(referenced_tables(parse_query(sql2, dialect)))
            | {schema.table(i.this.this.name if isinstance(i.this, exp.Schema) else i.this.name).name.lower()
               for i in inserts}
        )
    except (ValueError, KeyError) as exc:
        return Verification(False, error=str(exc).strip('"'), engine=engine)
    try:
        q1, q2 = engine_sql(sql1, dialect, engine), engine_sql(sql2, dialect, engine)
    except (SqlglotError, ValueError) as exc:
        return Verification(False, error=f"cannot transpile the queries: {exc}", engine=engine)
    n_rows = sum(_insert_rows(i) for i in inserts)
    many = any(arbitrary_choices(read_query(q, dialect).tree, engine) for q in (sql1, sql2))
    orders = row_orders([len(_insert_values(i)) for i in inserts], many)
    opts = {"ordered": ordered, "bag": bag, "permute_columns": permute_columns}
    try:
        box = Sandbox(schema, tables, engine, constraints=True, query_timeout_s=query_timeout_s)
    except SchemaError as exc:
        return Verification(False, error=str(exc), engine=engine)
    seen1: list[Outcome] = []
    seen2: list[Outcome] = []
    with box:
        for k, order in enumerate(orders):
            if k:
                box.clear()
            for ins, perm in zip(inserts, order):
                try:
                    box.execute(_permute_insert(ins, perm).sql(dialect=engine))
                except (duckdb.Error, sqlite3.Error) as exc:
                    return Verification(False, error=f"the database breaks the schema or does not load: {_short(exc)}",
                                        rows=n_rows, engine=engine)
            o1, o2 = box.run(q1), box.run(q2)
            a1, a2 = (seen1 or [o1])[0], (seen2 or [o2])[0]
            if o1.error is not None and o2.error is not None:
                return Verification(False, error=f"both queries fail: {o1.error}", result1=a1.preview(),
                                    result2=a2.preview(), rows=n_rows, engine=engine)
            one_sided = one_sided_error(o1, o2)
            if one_sided:
                return Verification(False, error=f"{one_sided}: an error is not a result, so this "
                                    "database is no counterexample", error_on_instance=one_sided,
                                    result1=o1.preview(), result2=o2.preview(), rows=n_rows, engine=engine)
            seen1.append(o1)
            seen2.append(o2)
            if any(same_outcome(x, y, **opts) for x in seen1 for y in seen2):
                return Verification(False, result1=a1.preview(), result2=a2.preview(), rows=n_rows,
                                    engine=engine)
    return Verification(True, result1=seen1[0].preview(), result2=seen2[0].preview(), rows=n_rows,
                        engine=engine)
