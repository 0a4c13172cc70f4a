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

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
from sqlglot import exp

from tasks.db.relschema import _T, Column, ForeignKey, SchemaError, Table
from tasks.equivalence.relschema_constraints import _CATEGORY_SQL, _FK, ident
from tasks.equivalence.relschema_ddl import (
    _alter_table,
    _case_sensitive,
    _check_items,
    _create_type,
    _engine_type,
    _short,
    _table_from_create,
    _unique_index,
)
from tasks.equivalence.sql_dialects import sqlglot_dialect


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
        queries' dialect), else with the others (:func:`tasks.equivalence.sql_ddl.read_ddl`); a
        statement read in another dialect than the one given is listed in :attr:`notes`.
        Raises SchemaError naming the statement (and the clause) when one parses in no
        dialect, loses an item, holds a clause that restricts the data and is not understood,
        when an ALTER TABLE does something other than add a column or a constraint, or when
        no table is defined — a schema is never silently smaller than its DDL.
        """
        from tasks.equivalence.sql_ddl import read_ddl
        from tasks.equivalence.sql_dialects import SQLReadError

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


def enum_values(col: Column) -> list[str]:
    """The values an ENUM column (or a column of an enum type) allows (empty for others)."""
    return list(col.enum or [])


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

