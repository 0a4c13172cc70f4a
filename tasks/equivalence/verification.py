"""Rendering and verification of counterexamples: :func:`render_instance` writes an instance as
CREATE TABLE + INSERT statements; :func:`verify_counterexample` replays such a script on a fresh
:class:`tasks.equivalence.instance_db.InstanceDB` with the schema's keys declared and checks the two
queries' results are separated (:class:`Verification`).

Split out of :mod:`tasks.equivalence.instances`; the code moved verbatim."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from tasks.equivalence.relschema import RelSchema, SchemaError
from tasks.equivalence.relschema import ident as _ident
from tasks.equivalence.sql_dialects import read_query, sqlglot_dialect, strip_qualifiers
from tasks.equivalence.instances import (
    EngineChoice,
    Outcome,
    _short,
    adapt_to_schema,
    engine_for,
    one_sided_error,
    one_sided_timeout,
    order_matters,
    prepare_query,
    referenced_tables,
    separation,
)
from tasks.equivalence.instance_db import InstanceDB


# --------------------------------------------------------------------------------------------
# Rendering and verification
# --------------------------------------------------------------------------------------------


def instance_rows(instance: Mapping[str, Sequence[tuple]]) -> int:
    """Total number of rows of an instance."""
    return sum(len(r) for r in instance.values())


def render_instance(schema: RelSchema, instance: Mapping[str, Sequence[tuple]],
                    dialect: str | None = "duckdb", tables: Sequence[str] | None = None) -> str:
    """The instance as a SQL script in ``dialect``: enum types, CREATE TABLE (with keys) for
    ``tables`` (default: the instance's tables and the tables they reference), one multi-row
    INSERT per non-empty table (parents first, generated columns left to the engine), then the
    foreign keys that close a cycle or reference their own table (``ALTER TABLE``, checked
    against the rows; on SQLite declared deferred and the inserts wrapped in a transaction; on
    DuckDB a comment says they are not declared). Literals are written by sqlglot."""
    dialect = sqlglot_dialect(dialect)
    names = schema.closure(tables if tables is not None else list(instance))
    out = []
    if dialect in ("postgres", "duckdb"):
        for n, values in schema.enum_types(names).items():
            out.append(f"CREATE TYPE {_ident(n, dialect)} AS ENUM ("
                       + ", ".join(exp.Literal.string(v).sql() for v in values) + ");")
    qualifiers = list(dict.fromkeys(schema.tables[n].qualifier for n in names if schema.tables[n].qualifier))
    out += [f"CREATE SCHEMA IF NOT EXISTS {_ident(q, dialect)};" for q in qualifiers]
    out += [schema.create_sql(n, dialect, tables=names, qualified=True) + ";" for n in names]
    deferred, notes = schema.deferred_fk_sql(names, dialect, qualified=True)
    out += [f"-- {note}" for note in notes]
    for n in names:
        for ux in schema.tables[n].unique_indexes:
            ddl = ux.create_sql(schema.sql_name(schema.tables[n], dialect, True), dialect) + ";"
            out.append(f"-- {ddl} (DuckDB has no partial index; the finder checks it)"
                       if ux.where is not None and sqlglot_dialect(dialect) == "duckdb" else ddl)
    inserts = []
    for n in names:
        rows = instance.get(n) or []
        if not rows:
            continue
        t = schema.tables[n]
        cols = t.inserted
        values = exp.values([tuple(exp.convert(row[i]) for i in cols) for row in rows])
        stmt = exp.insert(values, exp.to_table(schema.sql_name(t, dialect, True), dialect=dialect),
                          columns=[t.columns[i].name for i in cols])
        inserts.append(stmt.sql(dialect=dialect) + ";")
    cycle = dialect == "sqlite" and schema.back_edges(names) and len(inserts) > 1
    out += (["BEGIN;"] + inserts + ["COMMIT;"]) if cycle else inserts
    out += [st + ";" for st in deferred]
    return "\n".join(out) + "\n"


@dataclass
class Verification:
    """Result of executing a database and both queries on it: ``separates`` is True when no
    result one query may return on it equals one the other may return (:func:`separation`,
    checked with the inserts as written and with every INSERT's rows reversed); ``error``
    says why the database could not be built or why it separates nothing (then ``separates``
    is False); ``error_on_instance`` is set when exactly one query raises on the database (a
    runtime error is not a result, so such a database is no counterexample); ``choice``: the
    results differ, but only as an arbitrary choice the SQL leaves may make them differ;
    ``result1``/``result2`` preview what each query returned; ``rows`` inserted."""

    separates: bool
    error: str | None = None
    error_on_instance: str | None = None
    choice: str | None = None
    result1: str | None = None
    result2: str | None = None
    rows: int = 0
    engine: str = "duckdb"


def _split_script(script: str, dialect: str | None) -> list[exp.Expression]:
    try:
        return [s for s in sqlglot.parse(script, read=sqlglot_dialect(dialect)) if s is not None]
    except SqlglotError as exc:
        raise ValueError(f"counterexample script does not parse: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ValueError("counterexample script is nested too deeply to read") from None


def _insert_rows(stmt: exp.Insert) -> int:
    values = stmt.expression
    return len(values.expressions) if isinstance(values, exp.Values) else 1


def _insert_values(stmt: exp.Insert) -> list[exp.Expression]:
    values = stmt.expression
    return list(values.expressions) if isinstance(values, exp.Values) else []


def _reversed_insert(stmt: exp.Insert) -> exp.Insert:
    rows = _insert_values(stmt)
    if len(rows) < 2:
        return stmt
    stmt = stmt.copy()
    stmt.expression.set("expressions", [r.copy() for r in reversed(rows)])
    return stmt


def verify_counterexample(
    sql1: str, sql2: str, script: str, *, dialect: str | None = "duckdb",
    schema: RelSchema | None = None, engine: str | None = None, ordered: bool | None = None,
    bag: bool = True, permute_columns: bool = True, query_timeout_s: float = 5.0,
    pg=None, choice: EngineChoice | None = None,
) -> Verification:
    """Execute a proposed counterexample database and check that it separates two queries.

    ``script`` holds INSERT statements (CREATE TABLE statements in it are used only when no
    ``schema`` is given; with a schema the tables are created from it, keys included, so a
    database that breaks a PRIMARY KEY / UNIQUE / NOT NULL / FOREIGN KEY is rejected; ALTER
    TABLE / BEGIN / COMMIT lines of a rendered script are covered by that). Each statement is
    transpiled from ``dialect`` to the pair's engine (:func:`engine_for`, or ``engine``). The
    database separates the queries when :func:`separation` says *certain* — no result one query
    may return equals one the other may return (ties under ORDER BY, LIMIT choices and other
    arbitrary choices accounted for) — both with the inserts as written and with every
    INSERT's rows reversed (an arbitrary choice the analysis missed shows there).

    Returns a :class:`Verification`; never raises for a bad script (the reason is in
    ``error``)."""
    try:
        choice = choice or engine_for(dialect, engine or "auto")
        dialect = sqlglot_dialect(dialect)
    except ValueError as exc:
        return Verification(False, error=str(exc), engine=engine or "duckdb")
    eng = choice.engine
    if ordered is None:
        try:
            ordered = order_matters(sql1, sql2, dialect, "auto")
        except (SqlglotError, ValueError):
            ordered = False
    try:
        statements = _split_script(script, dialect)
    except ValueError as exc:
        return Verification(False, error=str(exc), engine=eng)
    creates = [s for s in statements if isinstance(s, exp.Create)]
    inserts = [s for s in statements if isinstance(s, exp.Insert)]
    others = [s for s in statements if not isinstance(s, (exp.Create, exp.Insert, exp.Alter, exp.Transaction,
                                                          exp.Commit))]
    if others:
        kinds = sorted({type(s).__name__.upper() for s in others})
        return Verification(False, error=f"only CREATE TABLE and INSERT statements are allowed, got {kinds}",
                            engine=eng)
    if schema is None:
        if not creates:
            return Verification(False, error="no schema and no CREATE TABLE in the script", engine=eng)
        try:
            schema = RelSchema.from_ddl(";\n".join(c.sql(dialect=dialect) for c in creates), dialect)
        except SchemaError as exc:
            return Verification(False, error=str(exc), engine=eng)
    try:
        reads = [adapt_to_schema(read_query(sql1, dialect), schema),
                 adapt_to_schema(read_query(sql2, dialect), schema)]
        tables = schema.closure(
            set(referenced_tables(reads[0].tree)) | set(referenced_tables(reads[1].tree))
            | {schema.table(i.this.this.name if isinstance(i.this, exp.Schema) else i.this.name).name.lower()
               for i in inserts}
        )
    except (ValueError, KeyError) as exc:
        return Verification(False, error=str(exc).strip('"'), engine=eng)
    try:
        q1, q2 = (prepare_query(r, schema, choice) for r in reads)
    except (SqlglotError, ValueError) as exc:
        return Verification(False, error=f"cannot transpile the queries: {exc}", engine=eng)
    n_rows = sum(_insert_rows(i) for i in inserts)
    try:
        box = InstanceDB(schema, tables, eng, constraints=True, query_timeout_s=query_timeout_s,
                      mysql=choice.mysql, integer_division=choice.integer_division, pg=pg)
    except SchemaError as exc:
        return Verification(False, error=str(exc), engine=eng)
    unenforced = [n for n in box.notes if n.startswith("CHECK constraints of table")]
    if unenforced:
        # the database may break a CHECK the engine cannot evaluate: not certified
        box.close()
        return Verification(False, error=f"{unenforced[0]}: a database breaking them is no database "
                            "of the schema, so none is certified", engine=eng)
    first: tuple[Outcome, Outcome] | None = None
    with box:
        for k, order in enumerate(("as written", "reversed")):
            if k:
                box.clear()
            stmts = [strip_qualifiers(_reversed_insert(i) if k else i)[0] for i in inserts]
            try:
                box.execute_all([i.sql(dialect=eng) for i in stmts])
            except box._errors as exc:
                return Verification(False, error=f"the database breaks the schema or does not load: {_short(exc)}",
                                    rows=n_rows, engine=eng)
            o1, o2 = box.run(q1.sql), box.run(q2.sql)
            first = first or (o1, o2)
            a1, a2 = first
            if o1.error is not None and o2.error is not None:
                return Verification(False, error=f"both queries fail: {o1.error}", result1=a1.preview(),
                                    result2=a2.preview(), rows=n_rows, engine=eng)
            if o1.timeout or o2.timeout:
                return Verification(False, error=one_sided_timeout(o1, o2), result1=o1.preview(),
                                    result2=o2.preview(), rows=n_rows, engine=eng)
            one_sided = one_sided_error(o1, o2)
            if one_sided:
                return Verification(False, error=f"{one_sided}: an error is not a result, so this "
                                    "database is no counterexample", error_on_instance=one_sided,
                                    result1=o1.preview(), result2=o2.preview(), rows=n_rows, engine=eng)
            sep = separation(box.run, q1, q2, o1, o2, ordered=ordered, bag=bag,
                             permute_columns=permute_columns, fold=choice.mysql,
                             abs_tol=choice.abs_tol(reads[0].tree, reads[1].tree))
            if not sep.certain:
                return Verification(False, choice=sep.reason if sep.kind == "choice" else None,
                                    result1=a1.preview(), result2=a2.preview(), rows=n_rows, engine=eng)
    assert first is not None
    return Verification(True, result1=first[0].preview(), result2=first[1].preview(), rows=n_rows,
                        engine=eng)
