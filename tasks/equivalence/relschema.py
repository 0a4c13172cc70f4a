"""A relational schema with its keys, read from DDL in any dialect sqlglot reads, from the
mapping form, or from a SQLite/DuckDB file — and written back as DDL for an engine.

Every clause of a ``CREATE TABLE`` is either read or refused: columns (typed or, as SQLite
allows, untyped), NOT NULL, PRIMARY KEY / UNIQUE (also ``UNIQUE NULLS NOT DISTINCT``, T-SQL
``CLUSTERED`` / ``NONCLUSTERED``, MySQL ``USING BTREE``), FOREIGN KEY (self-references and
cycles included), CHECK, generated columns (the expression is kept and the engine computes
it), PostgreSQL ``EXCLUDE`` with ``=`` (a UNIQUE key), ``LIKE other INCLUDING ...``, enum types
(``CREATE TYPE ... AS ENUM``, MySQL ``ENUM`` / ``SET``), declared lengths and ranges
(``VARCHAR(n)``, ``TINYINT``, unsigned, ``DECIMAL(p, s)``: :meth:`Column.accepts`). A clause
that restricts the data and is not understood is a :class:`SchemaError` naming the statement
and the clause; clauses that do not restrict the data (DEFAULT, COMMENT, AUTO_INCREMENT,
CHARACTER SET, storage options) are skipped. The number of items of each column list is
checked against the text, so an item sqlglot tolerates but drops (``(a INT,, b)``) is an error.
"""

from __future__ import annotations

import decimal
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from tasks.equivalence.sql_dialects import sqlglot_dialect


class SchemaError(ValueError):
    """A schema cannot be read (bad DDL or mapping, unknown table in a key, no CREATE TABLE)."""


_CATEGORY_SQL = {
    "int": "BIGINT", "float": "DOUBLE", "decimal": "DECIMAL(18, 4)", "text": "VARCHAR",
    "date": "DATE", "time": "TIME", "timestamp": "TIMESTAMP", "bool": "BOOLEAN",
    "uuid": "UUID", "json": "JSON", "other": "VARCHAR",
}

_T = exp.DataType.Type
#: Integer ranges of integer types (inclusive).
_INT_RANGES = {
    _T.TINYINT: (-128, 127), _T.UTINYINT: (0, 255), _T.SMALLINT: (-32768, 32767),
    _T.USMALLINT: (0, 65535), _T.MEDIUMINT: (-8388608, 8388607), _T.UMEDIUMINT: (0, 16777215),
    _T.INT: (-2**31, 2**31 - 1), _T.UINT: (0, 2**32 - 1), _T.BIGINT: (-2**63, 2**63 - 1),
    _T.UBIGINT: (0, 2**64 - 1), _T.YEAR: (1901, 2155), _T.BIT: (0, 1),
}


def type_category(dtype: exp.DataType) -> str:
    """``int``, ``float``, ``decimal``, ``text``, ``date``, ``time``, ``timestamp``, ``bool``,
    ``uuid``, ``json`` or ``other`` for a sqlglot data type (used to choose values and
    neighbours of constants)."""
    if dtype.this in (_T.BOOLEAN,):
        return "bool"
    if dtype.this in (_T.UUID,):
        return "uuid"
    if dtype.this in (_T.JSON, _T.JSONB):
        return "json"
    if dtype.this in (_T.TIME, _T.TIMETZ):
        return "time"
    if dtype.is_type(*exp.DataType.INTEGER_TYPES) or dtype.this in (_T.YEAR, _T.BIT):
        return "int"
    if dtype.this in (_T.DECIMAL, _T.MONEY, _T.SMALLMONEY, _T.BIGDECIMAL):
        return "decimal"
    if dtype.is_type(*exp.DataType.REAL_TYPES):
        return "float"
    if dtype.this in (_T.DATE, _T.DATE32):
        return "date"
    if dtype.is_type(*exp.DataType.TEMPORAL_TYPES):
        return "timestamp"
    if dtype.is_type(*exp.DataType.TEXT_TYPES) or dtype.this in (
            _T.CHAR, _T.NCHAR, _T.UNKNOWN, _T.ENUM, _T.SET, _T.USERDEFINED):
        return "text"
    return "other"


def _type_params(dtype: exp.DataType) -> list[int]:
    out = []
    for p in dtype.expressions:
        node = p.this if isinstance(p, exp.DataTypeParam) else p
        if isinstance(node, exp.Literal) and not node.is_string:
            try:
                out.append(int(node.this))
            except ValueError:
                pass
    return out


@dataclass
class Column:
    """One column: declared ``name``, sqlglot ``dtype``, value ``category``, ``not_null``;
    ``generated``: the expression of a generated column (computed by the engine, never
    inserted; ``stored`` as declared); ``collation`` as declared (lower case); ``untyped``: no
    declared type (SQLite); ``enum``: the values an ENUM (or an enum type) allows;
    ``set_members``: the members of a MySQL SET."""

    name: str
    dtype: exp.DataType
    category: str
    not_null: bool = False
    generated: exp.Expression | None = None
    stored: bool = False
    collation: str | None = None
    untyped: bool = False
    enum: list[str] | None = None
    set_members: list[str] | None = None

    @property
    def length(self) -> int | None:
        """The declared maximum length of a string type (``VARCHAR(n)``, ``CHAR(n)``)."""
        if self.category == "text" and self.dtype.this in (
                _T.VARCHAR, _T.CHAR, _T.NVARCHAR, _T.NCHAR, _T.BPCHAR):
            params = _type_params(self.dtype)
            return params[0] if params and params[0] > 0 else None
        return None

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` (a generated Python value; None = NULL) is a value of the declared
        type: within an integer type's range, a DECIMAL(p, s)'s digits, a string type's
        length, an enum's or a SET's values."""
        if value is None:
            return not self.not_null
        if self.enum is not None:
            return value in self.enum
        if self.set_members is not None:
            parts = [] if value == "" else str(value).split(",")
            return len(set(parts)) == len(parts) and all(p in self.set_members for p in parts)
        if self.category == "int":
            if not isinstance(value, int) or isinstance(value, bool):
                return False
            lo, hi = _INT_RANGES.get(self.dtype.this, (-2**63, 2**63 - 1))
            if self.dtype.this == _T.BIT:
                params = _type_params(self.dtype)
                hi = 2 ** (params[0] if params else 1) - 1
            return lo <= value <= hi
        if self.category == "decimal":
            params = _type_params(self.dtype)
            if len(params) >= 1:
                p, s = params[0], params[1] if len(params) > 1 else 0
                try:
                    d = decimal.Decimal(str(value))
                except decimal.InvalidOperation:
                    return False
                if d != round(d, s) or abs(d) >= decimal.Decimal(10) ** (p - s):
                    return False
            return True
        if self.category == "text" and self.length is not None:
            return len(str(value)) <= self.length
        return True


@dataclass
class ForeignKey:
    """``columns`` reference ``ref_columns`` of ``ref_table`` (lower-case table key)."""

    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]


@dataclass
class UniqueIndex:
    """``CREATE UNIQUE INDEX name ON table (keys) [WHERE where]`` whose keys are expressions or
    which is partial: no two rows satisfying ``where`` with every key non-NULL have equal keys.
    Enforced by :meth:`tasks.equivalence.instances.InstanceDB.load` with :meth:`violation_sql` (no engine
    builds both forms: DuckDB has no partial index)."""

    name: str
    keys: list[exp.Expression]
    where: exp.Expression | None = None

    def violation_sql(self, table_sql: str, dialect: str | None) -> str:
        """A query returning a row when the table (``table_sql``, already quoted) breaks it."""
        keys = [k.sql(dialect=dialect) for k in self.keys]
        conds = [f"({k}) IS NOT NULL" for k in keys]
        if self.where is not None:
            conds.append(f"({self.where.sql(dialect=dialect)})")
        return (f"SELECT 1 FROM {table_sql} WHERE {' AND '.join(conds)} GROUP BY {', '.join(keys)} "
                "HAVING COUNT(*) > 1 LIMIT 1")

    def create_sql(self, table_sql: str, dialect: str | None) -> str:
        """The index as DDL in ``dialect``."""
        where = f" WHERE {self.where.sql(dialect=dialect)}" if self.where is not None else ""
        return (f"CREATE UNIQUE INDEX {ident(self.name, dialect)} ON {table_sql} "
                f"({', '.join(k.sql(dialect=dialect) for k in self.keys)}){where}")


@dataclass
class Table:
    """A table with its keys: ``primary_key`` and ``unique`` column-name tuples
    (``nulls_not_distinct``: UNIQUE keys under which two NULLs collide), ``foreign_keys``,
    ``checks`` (CHECK constraint expressions, as parsed); ``qualifier``: the schema it was
    declared in (``hr`` of ``hr.emp``); ``key_prefixes``: MySQL prefix keys (``UNIQUE
    (name(10))``: the first 10 characters must differ), lower-case column → length;
    ``unique_indexes``: unique indexes a key tuple cannot say (on expressions such as
    ``lower(s)``, or partial ``WHERE ...``), as :class:`UniqueIndex`. Column names keep their
    declared spelling; look-ups are case-insensitive."""

    name: str
    columns: list[Column]
    primary_key: tuple[str, ...] = ()
    unique: list[tuple[str, ...]] = field(default_factory=list)
    foreign_keys: list[ForeignKey] = field(default_factory=list)
    checks: list[exp.Expression] = field(default_factory=list)
    nulls_not_distinct: list[tuple[str, ...]] = field(default_factory=list)
    qualifier: str | None = None
    key_prefixes: dict[tuple[str, ...], dict[str, int]] = field(default_factory=dict)
    unique_indexes: list[UniqueIndex] = field(default_factory=list)

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

    @property
    def inserted(self) -> list[int]:
        """Positions of the columns an INSERT gives values for (generated ones excluded)."""
        return [i for i, c in enumerate(self.columns) if c.generated is None]


def ident(name: str, dialect: str | None) -> str:
    """``name`` as an identifier in ``dialect`` (quoted when needed)."""
    return exp.to_identifier(name).sql(dialect=sqlglot_dialect(dialect))


_FK = tuple[tuple[str, ...], str, tuple[str, ...]]


@dataclass
class RelSchema:
    """A relational schema: tables by lower-case name, with PK / UNIQUE / NOT NULL / FK.

    Build with :meth:`from_ddl`, :meth:`from_mapping`, :meth:`from_database` or
    :func:`load_schema`. ``notes`` lists what was decided while reading (another dialect, a
    clause without effect on the data ignored, a foreign key to a missing table dropped);
    ``types``: enum types by lower-case name (their values).
    """

    tables: dict[str, Table]
    notes: list[str] = field(default_factory=list)
    types: dict[str, list[str]] = field(default_factory=dict)

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_ddl(cls, ddl: str, dialect: str | None = None,
                 query_dialect: str | None = None) -> RelSchema:
        """Read the tables of a schema script: ``CREATE TABLE`` (every clause, see the module
        docstring), ``CREATE TYPE ... AS ENUM``, ``CREATE UNIQUE INDEX`` (a UNIQUE key) and
        ``ALTER TABLE`` adding columns or constraints, ``DROP TABLE`` (of a table created before
        it); other statements (INSERT, SET, PRAGMA, plain indexes, ...) do not change the schema
        and are skipped.

        Each statement is parsed with ``dialect`` (the DDL's own, when known), else with the
        dialect its text points to (backticks → MySQL, ...), else with ``query_dialect`` (the
        queries' dialect), else with the others (:func:`tasks.equivalence.sql_dialects.read_ddl`); a
        statement read in another dialect than the one given is listed in :attr:`notes`.
        Raises SchemaError naming the statement (and the clause) when one parses in no
        dialect, loses an item, holds a clause that restricts the data and is not understood,
        when an ALTER TABLE does something other than add a column or a constraint, or when
        no table is defined — a schema is never silently smaller than its DDL.
        """
        from tasks.equivalence.sql_dialects import SQLReadError, read_ddl

        try:
            read = read_ddl(ddl, dialect, query_dialect)
        except SQLReadError as exc:
            raise SchemaError(str(exc)) from None
        except RecursionError:
            raise SchemaError("schema DDL is nested too deeply to read") from None
        raw: dict[str, tuple[Table, list[_FK]]] = {}
        types: dict[str, list[str]] = {}
        notes = list(read.notes)
        for n, st in enumerate(read.statements, start=1):
            tree = st.tree
            kind = (tree.args.get("kind") or "").upper() if isinstance(tree, exp.Create) else ""
            where = f"schema statement {n} ({_short(st.text, 60)})"
            if kind == "TABLE":
                _check_items(tree, st.text, st.dialect, where)
                table, fks = _table_from_create(tree, raw, where, notes)
                if table.name.lower() in raw:
                    raise SchemaError(f"table {table.name} defined twice")
                raw[table.name.lower()] = (table, fks)
            elif kind == "TYPE":
                _create_type(tree, types, where, notes)
            elif kind == "INDEX" and tree.args.get("unique"):
                _unique_index(tree, raw, notes)
            elif kind and kind not in ("INDEX", "SCHEMA", "DATABASE", "SEQUENCE", "EXTENSION"):
                # a view, function, trigger, ...: not a table the finder can fill
                name = tree.this.name if isinstance(tree.this, exp.Expression) else "?"
                notes.append(f"schema DDL: CREATE {kind} {name} not read: it is no table "
                             "(a query reading it is an error naming it)")
            elif isinstance(tree, exp.Alter) and (tree.args.get("kind") or "").upper() == "TABLE":
                _alter_table(tree, st.text, raw)
            elif isinstance(tree, exp.Drop) and (tree.args.get("kind") or "").upper() == "TABLE":
                # DROP TABLE [IF EXISTS] t after its CREATE: t is not in the schema
                for dropped in tree.args.get("tables") or [tree.this]:
                    if isinstance(dropped, exp.Table) and raw.pop(dropped.name.lower(), None) is not None:
                        notes.append(f"schema DDL: table {dropped.name} dropped by {where}")
        if not raw:
            raise SchemaError("schema DDL has no CREATE TABLE statement")
        schema = cls._finish(list(raw.values()), types)
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
                text = f"{ident(cname, 'duckdb')} {ctype or 'TEXT'}"
                if cname.lower() in not_null and "not null" not in str(ctype).lower():
                    text += " NOT NULL"
                parts.append(text)
            known = {c.lower() for c in cols}
            for c in not_null - known:
                raise SchemaError(f"table {tname}: not_null names unknown column {c!r}")
            if spec.get("primary_key"):
                parts.append("PRIMARY KEY (" + ", ".join(ident(c, "duckdb") for c in spec["primary_key"]) + ")")
            for u in spec.get("unique") or []:
                parts.append("UNIQUE (" + ", ".join(ident(c, "duckdb") for c in u) + ")")
            for fk in spec.get("foreign_keys") or []:
                ref_cols = fk.get("ref_columns")
                ref = ident(fk["references"], "duckdb")
                if ref_cols:
                    ref += " (" + ", ".join(ident(c, "duckdb") for c in ref_cols) + ")"
                parts.append("FOREIGN KEY (" + ", ".join(ident(c, "duckdb") for c in fk["columns"]) + f") REFERENCES {ref}")
            statements.append(f"CREATE TABLE {ident(tname, 'duckdb')} (" + ", ".join(parts) + ")")
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
    def _finish(cls, raw, types: dict[str, list[str]] | None = None) -> RelSchema:
        types = types or {}
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
                table.nulls_not_distinct = [tuple(table.column(c).name for c in u)
                                            for u in table.nulls_not_distinct]
                table.key_prefixes = {tuple(table.column(c).name for c in k): v
                                      for k, v in table.key_prefixes.items()}
            except KeyError as exc:
                raise SchemaError(f"key names an unknown column: {exc.args[0]}") from None
            for c in table.primary_key:
                table.column(c).not_null = True
            for col in table.columns:
                if col.dtype.this == _T.USERDEFINED:
                    name = (col.dtype.args.get("kind").name if isinstance(col.dtype.args.get("kind"), exp.Expression)
                            else col.dtype.sql()).lower().split(".")[-1].strip('"')
                    if name not in types:
                        raise SchemaError(f"table {table.name}: column {col.name} has type "
                                          f"{col.dtype.sql()}, which the schema does not define "
                                          "(give its CREATE TYPE ... AS ENUM)")
                    col.enum = list(types[name])
        return cls(tables, notes, dict(types))

    # -- use ---------------------------------------------------------------------------------

    def table(self, name: str) -> Table:
        """The table named ``name`` (case-insensitive). A qualifier (``hr.emp``) must be the
        table's declared schema when it was declared with one (any qualifier is accepted for
        a table declared without). KeyError naming the table otherwise."""
        parts = [p.strip('"`[]') for p in name.lower().split(".")]
        key = parts[-1]
        table = self.tables.get(key)
        if table is None:
            raise KeyError(f"no table {name!r} in the schema (have {sorted(self.tables)})")
        if len(parts) > 1 and table.qualifier and parts[-2] != table.qualifier.lower():
            raise KeyError(f"no table {name!r} in the schema (it has "
                           f"{table.qualifier}.{table.name})")
        return table

    def closure(self, names: Iterable[str]) -> list[str]:
        """``names`` plus every table they reference through foreign keys (transitively), in an
        order where referenced tables come first (a cycle is entered at its first table by
        name; :meth:`back_edges` lists the foreign keys that point forward then)."""
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

    def back_edges(self, tables: Sequence[str]) -> list[tuple[str, ForeignKey]]:
        """Foreign keys among ``tables`` (in that order) that reference the table itself or a
        table later in the order (self-references and the edges closing a cycle)."""
        pos = {t: i for i, t in enumerate(tables)}
        out = []
        for t in tables:
            for fk in self.tables[t].foreign_keys:
                if fk.ref_table in pos and pos[fk.ref_table] >= pos[t]:
                    out.append((t, fk))
        return out

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

    def enum_types(self, tables: Sequence[str]) -> dict[str, list[str]]:
        """Enum types the columns of ``tables`` use (name → values)."""
        used = {}
        for t in tables:
            for c in self.tables[t].columns:
                if c.dtype.this == _T.USERDEFINED and c.enum is not None:
                    used[c.dtype.sql().lower().strip('"')] = c.enum
        return used

    def create_sql(
        self, name: str, dialect: str | None = "duckdb", *, constraints: bool = True,
        tables: Sequence[str] | None = None, category_types: bool = False,
        checks: bool | None = None, nocase: bool = False, qualified: bool = False,
    ) -> str:
        """``CREATE TABLE`` for table ``name`` in ``dialect``: columns with their types (or a
        standard type for their category when ``category_types``; untyped columns stay
        untyped on SQLite), generated columns with their expression (``VIRTUAL`` on DuckDB,
        ``STORED`` on PostgreSQL), and, with ``constraints``, NOT NULL, PRIMARY KEY, UNIQUE and
        the foreign keys to tables among ``tables`` that come before it (the others —
        self-references, cycles — are declared by :meth:`deferred_fk_sql` where the engine can
        check them at commit, and kept by the finder's generator everywhere); CHECK
        constraints with ``checks`` (default: with ``constraints``). ``nocase``: text columns
        compare case-insensitively (``COLLATE NOCASE``, MySQL's default collations) unless
        declared with a binary / case-sensitive collation; ``qualified``: a table declared in a
        schema (``hr.emp``) is named with it."""
        checks = constraints if checks is None else checks
        dialect = sqlglot_dialect(dialect)
        t = self.table(name)
        tables = [x.lower() for x in (tables if tables is not None else self.tables)]
        before = set(tables[:tables.index(t.name.lower())]) if t.name.lower() in tables else set(tables)
        parts = []
        for c in t.columns:
            if c.untyped and dialect == "sqlite" and not category_types:
                typ = ""
            elif category_types:
                typ = _CATEGORY_SQL[c.category]
                if c.category in ("text", "other") and c.enum is None and c.length is None:
                    typ = "TEXT" if dialect in ("sqlite", "postgres") else "VARCHAR"
                if dialect == "sqlite":
                    typ = exp.DataType.build(typ).sql(dialect="sqlite")
            elif c.untyped:
                typ = "TEXT" if dialect == "postgres" else "VARCHAR"
            else:
                typ = _engine_type(c, dialect)
            text = f"{ident(c.name, dialect)} {typ}".rstrip()
            if nocase and c.category == "text" and c.enum is None and not _case_sensitive(c.collation):
                text += " COLLATE NOCASE"
            if c.generated is not None:
                # DuckDB computes virtual columns only (and sqlglot reads no kind there),
                # PostgreSQL stored ones only; SQLite and MySQL keep the declared kind
                kind = {"duckdb": "", "postgres": " STORED"}.get(dialect, " STORED" if c.stored else " VIRTUAL")
                text += f" GENERATED ALWAYS AS ({c.generated.sql(dialect=dialect)}){kind}"
            if constraints and c.not_null:
                text += " NOT NULL"
            parts.append(text)
        if constraints:
            if t.primary_key:
                parts.append("PRIMARY KEY (" + ", ".join(ident(c, dialect) for c in t.primary_key) + ")")
            for u in t.unique:
                nnd = " NULLS NOT DISTINCT" if dialect == "postgres" and u in t.nulls_not_distinct else ""
                parts.append(f"UNIQUE{nnd} (" + ", ".join(ident(c, dialect) for c in u) + ")")
            for fk in self.emittable_fks(t, tables):
                if fk.ref_table not in before and not (dialect == "sqlite" and fk.ref_table in tables):
                    continue
                parent = self.tables[fk.ref_table]
                deferred = " DEFERRABLE INITIALLY DEFERRED" if dialect == "sqlite" and fk.ref_table not in before else ""
                parts.append(
                    "FOREIGN KEY (" + ", ".join(ident(c, dialect) for c in fk.columns)
                    + f") REFERENCES {self.sql_name(parent, dialect, qualified)} ("
                    + ", ".join(ident(c, dialect) for c in fk.ref_columns) + ")" + deferred
                )
        if checks:
            parts.extend(f"CHECK ({c.sql(dialect=dialect)})" for c in t.checks)
            for c in t.columns:  # an inline ENUM where the engine has no such type
                if c.dtype.this == _T.ENUM and c.enum and dialect not in ("mysql", "duckdb") and not category_types:
                    values = ", ".join(exp.Literal.string(v).sql() for v in c.enum)
                    parts.append(f"CHECK ({ident(c.name, dialect)} IN ({values}))")
        return f"CREATE TABLE {self.sql_name(t, dialect, qualified)} (\n  " + ",\n  ".join(parts) + "\n)"

    @staticmethod
    def sql_name(table: Table, dialect: str | None, qualified: bool = False) -> str:
        """The table's name in ``dialect`` (with its schema when ``qualified`` and it has one)."""
        name = ident(table.name, dialect)
        return f"{ident(table.qualifier, dialect)}.{name}" if qualified and table.qualifier else name

    def deferred_fk_sql(self, tables: Sequence[str], dialect: str | None,
                        qualified: bool = False) -> tuple[list[str], list[str]]:
        """``(statements, notes)``: ``ALTER TABLE ... ADD FOREIGN KEY ... DEFERRABLE INITIALLY
        DEFERRED`` for the foreign keys :meth:`create_sql` left out (self-references, cycles)
        where the dialect has them (PostgreSQL, MySQL); SQLite declares them inline; DuckDB
        cannot declare them — a note says which are kept only by the generator."""
        dialect = sqlglot_dialect(dialect)
        out, notes = [], []
        for t, fk in self.back_edges(list(tables)):
            table = self.tables[t]
            if fk not in self.emittable_fks(table, tables):
                continue
            cols = ", ".join(ident(c, dialect) for c in fk.columns)
            ref = ", ".join(ident(c, dialect) for c in fk.ref_columns)
            parent = self.tables[fk.ref_table]
            if dialect == "sqlite":
                continue
            if dialect in ("postgres", "mysql"):
                deferrable = " DEFERRABLE INITIALLY DEFERRED" if dialect == "postgres" else ""
                out.append(f"ALTER TABLE {self.sql_name(table, dialect, qualified)} ADD FOREIGN KEY ({cols}) "
                           f"REFERENCES {self.sql_name(parent, dialect, qualified)} ({ref}){deferrable}")
            else:
                kind = "references its own table" if fk.ref_table == t else "closes a cycle"
                notes.append(f"foreign key {table.name}({cols}) → {parent.name}({ref}) {kind}: "
                             f"not declared on {dialect or 'this engine'} (rows are inserted one "
                             "statement at a time there), kept by the instance generator")
        return out, notes

    def ddl(self, dialect: str | None = "duckdb", tables: Sequence[str] | None = None) -> str:
        """The whole schema (or ``tables`` and the tables they reference) as DDL text."""
        names = self.closure(tables) if tables is not None else self.closure(self.tables)
        statements = [f"CREATE TYPE {ident(n, dialect)} AS ENUM ("
                      + ", ".join(exp.Literal.string(v).sql() for v in vals) + ")"
                      for n, vals in self.enum_types(names).items()
                      if sqlglot_dialect(dialect) in ("postgres", "duckdb")]
        statements += [self.create_sql(n, dialect, tables=names) for n in names]
        statements += self.deferred_fk_sql(names, dialect)[0]
        return ";\n\n".join(statements) + ";\n"


def _case_sensitive(collation: str | None) -> bool:
    c = (collation or "").lower()
    return c.endswith(("_bin", "_cs")) or c in ("binary", "c", "posix", "bin")


def _short(text: str, n: int = 100) -> str:
    one = " ".join(text.split())
    return one if len(one) <= n else one[: n - 1] + "…"


def _check_items(tree: exp.Create, text: str, dialect: str, where: str) -> None:
    """The column list of a CREATE TABLE holds as many items as its text (an item sqlglot
    tolerates but drops, like the empty one in ``(a INT,, b)``, is an error)."""
    target = tree.this
    if not isinstance(target, exp.Schema):
        return
    try:
        tokens = sqlglot.tokenize(text, read=sqlglot_dialect(dialect))
    except SqlglotError:
        return
    depth = 0
    items = 0
    empty = False
    last_was_sep = False
    started = False
    for tok in tokens:
        tt = tok.token_type
        if tt == TokenType.L_PAREN:
            depth += 1
            if depth == 1 and not started:
                started = True
                items = 1
                last_was_sep = True
                continue
        elif tt == TokenType.R_PAREN:
            if depth == 1 and started:
                if last_was_sep:
                    empty = True
                break
            depth -= 1
        elif tt == TokenType.COMMA and depth == 1 and started:
            if last_was_sep:
                empty = True
            items += 1
            last_was_sep = True
            continue
        if started and depth >= 1:
            last_was_sep = False
    if not started:
        return
    if empty:
        raise SchemaError(f"{where}: an empty item in the column list of {target.this.name} "
                          "(two commas in a row, or a comma before the closing parenthesis)")
    if items != len(target.expressions):
        raise SchemaError(f"{where}: the column list of {target.this.name} has {items} items "
                          f"but {len(target.expressions)} were read (an item not understood)")


#: Column clauses without effect on which rows a table may hold.
_HARMLESS_COLUMN_CLAUSES = tuple(getattr(exp, n) for n in (
    "DefaultColumnConstraint", "CommentColumnConstraint", "AutoIncrementColumnConstraint",
    "CharacterSetColumnConstraint", "OnUpdateColumnConstraint",
    "GeneratedAsIdentityColumnConstraint", "GeneratedAsRowColumnConstraint",
    "ZeroFillColumnConstraint", "TitleColumnConstraint", "DateFormatColumnConstraint",
    "CompressColumnConstraint", "EncodeColumnConstraint", "InlineLengthColumnConstraint",
    "CaseSpecificColumnConstraint", "UppercaseColumnConstraint", "PathColumnConstraint",
    "EphemeralColumnConstraint", "TagColumnConstraint", "InvisibleColumnConstraint",
    "StorageColumnConstraint", "SequenceColumnConstraint", "ProjectionPolicyColumnConstraint",
    "MaskingPolicyColumnConstraint", "NotForReplicationColumnConstraint", "IndexColumnConstraint",
    "UnsignedColumnConstraint") if hasattr(exp, n))


def _table_from_create(st: exp.Create, raw: dict, where: str, notes: list[str]) -> tuple[Table, list[_FK]]:
    """A :class:`Table` (and its raw foreign keys) from one parsed CREATE TABLE."""
    target = st.this
    props = st.args.get("properties")
    like = [p for p in (props.expressions if props is not None else []) if isinstance(p, exp.LikeProperty)]
    if any(isinstance(p, exp.InheritsProperty) for p in (props.expressions if props is not None else [])):
        raise SchemaError(f"{where}: INHERITS is not read (the child holds the parent's columns too, "
                          "and a query on the parent also reads the child's rows)")
    if isinstance(target, exp.Table) and like:
        # MySQL: CREATE TABLE b LIKE a copies columns, keys and CHECKs (not foreign keys)
        table = Table(target.name, [], qualifier=target.args.get("db").name if target.args.get("db") else None)
        _like(table, exp.LikeProperty(this=like[0].this, expressions=[
            exp.Property(this="INCLUDING", value=exp.var("ALL"))]), raw, where)
        return table, []
    if not isinstance(target, exp.Schema):
        raise SchemaError(f"{where}: CREATE TABLE without a column list (CREATE TABLE ... AS "
                          "SELECT is not read)")
    tname = target.this
    name = tname.name
    qualifier = tname.args.get("db").name if isinstance(tname, exp.Table) and tname.args.get("db") else None
    table = Table(name, [], qualifier=qualifier)
    fks: list[_FK] = []
    for item in target.expressions:
        if isinstance(item, exp.ColumnDef):
            _add_column(table, item, fks, where)
        elif isinstance(item, exp.Identifier):
            # SQLite: a column without a type (any value, no affinity)
            table.columns.append(Column(item.name, exp.DataType.build("TEXT"), "text", untyped=True))
        elif isinstance(item, exp.LikeProperty):
            _like(table, item, raw, where)
        else:
            _add_table_constraint(table, item, fks, where)
    if not table.columns:
        raise SchemaError(f"{where}: table {name} has no columns")
    names = [c.name.lower() for c in table.columns]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SchemaError(f"{where}: table {name}: column name(s) {twice} given twice (column "
                          "names are compared case-insensitively here)")
    if any(c.untyped for c in table.columns):
        names = [c.name for c in table.columns if c.untyped]
        notes.append(f"schema DDL: table {name}: column(s) {', '.join(names)} have no type "
                     "(SQLite: any value); filled with text values")
    return table, fks


def _like(table: Table, item: exp.LikeProperty, raw: dict, where: str) -> None:
    """PostgreSQL ``LIKE other [INCLUDING ...]``: the other table's columns (and NOT NULL);
    ``INCLUDING CONSTRAINTS`` / ``INDEXES`` / ``ALL`` also copy CHECKs / PK and UNIQUE; a
    generated column's expression with ``INCLUDING GENERATED`` / ``ALL``."""
    src = item.this.name.lower()
    if src not in raw:
        raise SchemaError(f"{where}: LIKE {item.this.name}: no such table defined before it")
    other: Table = raw[src][0]
    options = set()
    for prop in item.expressions:
        word = str(prop.this).upper()
        value = prop.args.get("value")
        options.add((word, value.name.upper() if isinstance(value, exp.Expression) else str(value).upper()))
    including = {v for w, v in options if w == "INCLUDING"}
    excluding = {v for w, v in options if w == "EXCLUDING"}
    everything = "ALL" in including

    def has(opt: str) -> bool:
        return (everything or opt in including) and opt not in excluding

    for c in other.columns:
        copy = Column(c.name, c.dtype.copy(), c.category, c.not_null,
                      c.generated.copy() if c.generated is not None and has("GENERATED") else None,
                      c.stored, c.collation, c.untyped, c.enum, c.set_members)
        table.columns.append(copy)
    if has("CONSTRAINTS"):
        table.checks.extend(ck.copy() for ck in other.checks)
    if has("INDEXES"):
        if other.primary_key:
            table.primary_key = other.primary_key
        table.unique.extend(other.unique)
        table.nulls_not_distinct.extend(other.nulls_not_distinct)
        table.unique_indexes.extend(other.unique_indexes)


def _add_column(table: Table, item: exp.ColumnDef, fks: list[_FK], where: str) -> None:
    kind = item.args.get("kind")
    untyped = not isinstance(kind, exp.DataType)
    dtype = kind if isinstance(kind, exp.DataType) else exp.DataType.build("TEXT")
    col = Column(item.name, dtype, type_category(dtype), untyped=untyped)
    if dtype.this == _T.ENUM:
        col.enum = [e.this for e in dtype.expressions if isinstance(e, exp.Literal)]
    elif dtype.this == _T.SET:
        col.set_members = [e.this for e in dtype.expressions if isinstance(e, exp.Literal)]
    for cons in item.constraints:
        ck = cons.args.get("kind")
        if isinstance(ck, exp.NotNullColumnConstraint):
            col.not_null = not ck.args.get("allow_null")
        elif isinstance(ck, exp.PrimaryKeyColumnConstraint):
            table.primary_key = (item.name,)
        elif isinstance(ck, exp.UniqueColumnConstraint):
            table.unique.append((item.name,))
            if ck.args.get("nulls"):
                table.nulls_not_distinct.append((item.name,))
        elif isinstance(ck, exp.Reference):
            fks.append(((item.name,), *_reference(ck)))
        elif isinstance(ck, exp.CheckColumnConstraint) and ck.this is not None:
            table.checks.append(ck.this.copy())
        elif isinstance(ck, exp.GeneratedAsIdentityColumnConstraint) and ck.args.get("expression"):
            # MySQL / DuckDB ``GENERATED ALWAYS AS (expr)`` without VIRTUAL / STORED: sqlglot
            # reads it as an identity clause holding the expression (a virtual generated column)
            expr = ck.args["expression"]
            while isinstance(expr, exp.Paren):
                expr = expr.this
            col.generated = expr.copy()
            col.stored = False
        elif isinstance(ck, exp.ComputedColumnConstraint):
            expr = ck.this
            while isinstance(expr, exp.Paren):
                expr = expr.this
            col.generated = expr.copy()
            col.stored = bool(ck.args.get("persisted"))
            if ck.args.get("not_null"):
                col.not_null = True
        elif isinstance(ck, exp.CollateColumnConstraint):
            col.collation = ck.this.name.lower() if isinstance(ck.this, exp.Expression) else str(ck.this).lower()
        elif isinstance(ck, _HARMLESS_COLUMN_CLAUSES):
            continue
        else:
            raise SchemaError(f"{where}: column {table.name}.{item.name}: the clause "
                              f"{_short(cons.sql(), 60)} is not understood")
    table.columns.append(col)


def _key_columns(node: exp.Expression | list | None) -> list[str]:
    """Column names of a key's column list (Ordered / Column / Identifier items)."""
    items = node if isinstance(node, list) else (
        node.expressions if isinstance(node, exp.Expression) else [])
    out = []
    for it in items:
        while isinstance(it, exp.Ordered):
            it = it.this
        out.append(it.name)
    return out


def _note_prefixes(table: Table, cols: Sequence[str], items: Sequence[exp.Expression]) -> None:
    """Record the MySQL prefix lengths of a key's columns (``name(10)``)."""
    prefixes = {}
    for it in items:
        while isinstance(it, exp.Ordered):
            it = it.this
        if isinstance(it, exp.ColumnPrefix) and isinstance(it.expression, exp.Literal):
            prefixes[it.name.lower()] = int(it.expression.this)
    if prefixes:
        table.key_prefixes[tuple(cols)] = prefixes


def _add_table_constraint(table: Table, item: exp.Expression, fks: list[_FK], where: str) -> None:
    if isinstance(item, exp.PrimaryKey):
        table.primary_key = tuple(_key_columns(item.expressions))
        _note_prefixes(table, table.primary_key, item.expressions)
    elif isinstance(item, exp.UniqueColumnConstraint):
        inner = item.this
        if isinstance(inner, (exp.ClusteredColumnConstraint, exp.NonClusteredColumnConstraint)):
            cols = _key_columns(inner.this)
        else:
            cols = _key_columns(inner.expressions) if inner is not None else []
        if not cols:
            raise SchemaError(f"{where}: table {table.name}: UNIQUE without columns: {_short(item.sql(), 60)}")
        table.unique.append(tuple(cols))
        if inner is not None and not isinstance(inner, (exp.ClusteredColumnConstraint, exp.NonClusteredColumnConstraint)):
            _note_prefixes(table, cols, inner.expressions)
        if item.args.get("nulls"):
            table.nulls_not_distinct.append(tuple(cols))
    elif isinstance(item, exp.ForeignKey):
        ref = item.args.get("reference")
        if ref is None:
            raise SchemaError(f"{where}: table {table.name}: FOREIGN KEY without REFERENCES")
        fks.append((tuple(_names(item.expressions)), *_reference(ref)))
    elif isinstance(item, exp.CheckColumnConstraint) and item.this is not None:
        table.checks.append(item.this.copy())
    elif isinstance(item, exp.Constraint):
        subs = list(item.expressions)
        if any(isinstance(s, exp.PrimaryKeyColumnConstraint) for s in subs):
            # T-SQL: CONSTRAINT pk PRIMARY KEY CLUSTERED (id ASC)
            cols = [c for s in subs if isinstance(s, (exp.ClusteredColumnConstraint, exp.NonClusteredColumnConstraint))
                    for c in _key_columns(s.this)]
            if not cols:
                raise SchemaError(f"{where}: table {table.name}: PRIMARY KEY without columns: {_short(item.sql(), 60)}")
            table.primary_key = tuple(cols)
            return
        for sub in subs:
            _add_table_constraint(table, sub, fks, where)
    elif isinstance(item, exp.IndexColumnConstraint):
        return  # a plain (non-unique) index: no effect on the rows
    elif isinstance(item, exp.ExcludeColumnConstraint):
        params = item.this
        cols = []
        for w in (params.args.get("columns") or []) if params is not None else []:
            op = w.args.get("op")
            if not isinstance(w, exp.WithOperator) or str(op.name if isinstance(op, exp.Expression) else op) != "=":
                raise SchemaError(f"{where}: table {table.name}: EXCLUDE with an operator other "
                                  f"than = is not read: {_short(item.sql(), 70)}")
            cols.extend(_key_columns([w.this]))
        if not cols or (params is not None and params.args.get("where") is not None):
            raise SchemaError(f"{where}: table {table.name}: EXCLUDE not read: {_short(item.sql(), 70)}")
        table.unique.append(tuple(cols))  # EXCLUDE (a WITH =, b WITH =) is UNIQUE (a, b)
    elif isinstance(item, (exp.PrimaryKeyColumnConstraint,)):
        raise SchemaError(f"{where}: table {table.name}: PRIMARY KEY without columns")
    elif isinstance(item, getattr(exp, "PeriodForSystemTimeConstraint", ())):
        return
    else:
        raise SchemaError(f"{where}: table {table.name}: the clause {_short(item.sql(), 70)} is "
                          "not understood")


def _create_type(tree: exp.Create, types: dict[str, list[str]], where: str, notes: list[str]) -> None:
    body = tree.args.get("expression")
    name = tree.this.name if isinstance(tree.this, exp.Expression) else "?"
    if isinstance(body, exp.DataType) and body.this == _T.ENUM:
        types[name.lower()] = [e.this for e in body.expressions if isinstance(e, exp.Literal)]
        return
    notes.append(f"schema DDL: CREATE TYPE {name} is not an enum and is not read (a column of "
                 "that type is an error naming it)")


def _unique_index(st: exp.Create, raw: dict, notes: list[str]) -> None:
    index = st.this
    params = index.args.get("params") if isinstance(index, exp.Index) else None
    target = index.args.get("table") if isinstance(index, exp.Index) else None
    if params is None or target is None:
        raise SchemaError(f"CREATE UNIQUE INDEX not understood: {st.sql()[:100]}")
    if target.name.lower() not in raw:
        raise SchemaError(f"CREATE UNIQUE INDEX on unknown table {target.name}")
    table: Table = raw[target.name.lower()][0]
    keys = [c.this if isinstance(c, exp.Ordered) else c for c in params.args.get("columns") or []]
    where = params.args.get("where")
    where = where.this if isinstance(where, exp.Where) else where
    if where is not None or not all(isinstance(k, exp.Column) for k in keys):
        # on expressions (lower(s)) or partial: checked on every instance the finder loads
        for node in [*keys, where]:
            for c in (node.find_all(exp.Column) if node is not None else ()):
                if c.name.lower() not in {col.name.lower() for col in table.columns}:
                    raise SchemaError(f"CREATE UNIQUE INDEX {index.name} on {table.name}: no column "
                                      f"{c.name}")
        table.unique_indexes.append(UniqueIndex(index.name or f"{table.name}_uidx",
                                                [k.copy() for k in keys],
                                                where.copy() if where is not None else None))
        return
    if keys:
        table.unique.append(tuple(k.name for k in keys))


def _alter_table(st: exp.Alter, text: str, raw: dict) -> None:
    name = st.this.name
    if name.lower() not in raw:
        raise SchemaError(f"ALTER TABLE of unknown table {name}: {text[:100]}")
    table, fks = raw[name.lower()]
    where = f"ALTER TABLE {name}"
    for action in st.args.get("actions") or []:
        if isinstance(action, exp.ColumnDef):
            _add_column(table, action, fks, where)
        elif isinstance(action, exp.AddConstraint):
            for item in action.expressions:
                _add_table_constraint(table, item, fks, where)
        elif isinstance(action, exp.AlterColumn) and action.args.get("allow_null") is False:
            table.column(action.name).not_null = True
        elif isinstance(action, exp.AlterColumn) and action.args.get("allow_null") is True:
            table.column(action.name).not_null = False  # DROP NOT NULL
        elif isinstance(action, exp.AlterColumn) and isinstance(action.args.get("dtype"), exp.DataType) \
                and not action.args.get("using"):
            col = table.column(action.name)  # ALTER COLUMN ... TYPE
            col.dtype = action.args["dtype"]
            col.category = type_category(col.dtype)
        elif isinstance(action, exp.AlterColumn) and (action.args.get("default") is not None or (
                action.args.get("drop") and action.args.get("allow_null") is None)):
            continue  # SET / DROP DEFAULT: no effect on the rows a table may hold
        else:
            raise SchemaError(f"ALTER TABLE {name}: only ADD COLUMN / ADD CONSTRAINT / ALTER COLUMN "
                              f"(NOT NULL, TYPE, DEFAULT) are read, not {type(action).__name__}: {text[:100]}")


def _engine_type(col: Column, dialect: str | None) -> str:
    """The column's declared type for ``dialect``, without the display widths no engine but
    MySQL reads (``INT(11)``, ``TINYINT(1)``, ``DOUBLE(8,2)``); an ENUM / SET is text on
    engines without it."""
    dtype = col.dtype
    if col.category in ("int", "float") and dtype.expressions:
        dtype = exp.DataType(this=dtype.this)
    if (dtype.this == _T.SET and dialect != "mysql") or (dtype.this == _T.ENUM and dialect not in ("mysql", "duckdb")):
        return "TEXT" if dialect in ("sqlite", "postgres") else "VARCHAR"
    if dtype.this == _T.USERDEFINED and dialect not in ("postgres", "duckdb"):
        return "TEXT" if dialect == "sqlite" else "VARCHAR"
    return dtype.sql(dialect=dialect)


def enum_values(col: Column) -> list[str]:
    """The values an ENUM column (or a column of an enum type) allows (empty for others)."""
    return list(col.enum or [])


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

