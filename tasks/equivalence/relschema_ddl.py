"""Reading DDL statements into tables: CREATE TABLE (columns, inline and table constraints,
CHECKs, LIKE), CREATE TYPE, CREATE UNIQUE INDEX and ALTER TABLE, each checked and turned into the
shared :mod:`tasks.db.relschema` model for :meth:`tasks.equivalence.relschema.RelSchema.from_ddl`;
:func:`_engine_type` writes a column's type back for an engine.

Split out of :mod:`tasks.equivalence.relschema`; the code moved verbatim."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from tasks.db.relschema import _T, Column, SchemaError, Table, type_category
from tasks.equivalence.relschema_constraints import _FK, UniqueIndex
from tasks.equivalence.sql_dialects import sqlglot_dialect


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
            table.columns.append(Column(item.name, dtype=exp.DataType.build("TEXT"), category="text",
                                        untyped=True))
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
        copy = Column(c.name, c.type, c.dtype.copy(), c.category, c.not_null,
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
    col = Column(item.name, "" if untyped else dtype.sql(), dtype, type_category(dtype),
                 untyped=untyped)
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
            col.type = col.dtype.sql()
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


def _names(nodes: Iterable[exp.Expression]) -> list[str]:
    return [n.name for n in nodes]


def _reference(ref: exp.Reference) -> tuple[str, tuple[str, ...]]:
    target = ref.this
    if isinstance(target, exp.Schema):
        return target.this.name, tuple(_names(target.expressions))
    return target.name, ()
