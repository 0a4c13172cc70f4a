"""Small database instances for SQL equivalence: reading a pair's queries for an engine
(:func:`engine_for`, :func:`prepare_query`), their outcomes, and the decision whether an instance
separates two queries (:func:`separation`: a verified counterexample only when no result the
first query may return equals one the second may return, :mod:`tasks.equivalence.outcomes`). The
instance database to load instances into and run two queries on (in-memory DuckDB or SQLite, or
a scratch PostgreSQL database) is :class:`tasks.equivalence.instance_db.InstanceDB`. Rendering an instance as CREATE TABLE +
INSERT statements and checking that a database really separates two queries
(:func:`tasks.equivalence.verification.verify_counterexample`) live in
:mod:`tasks.equivalence.verification`.

The relational schema itself is :mod:`tasks.equivalence.relschema` (:class:`RelSchema`) over the shared
model of :mod:`tasks.db.relschema` (columns, keys, tables), re-exported here.

Engines follow the pair's dialect (:func:`engine_for`): PostgreSQL pairs run on a real
PostgreSQL server (:mod:`tasks.db.pg_scratch`; its integer division, division-by-zero errors,
collations), SQLite pairs on SQLite, DuckDB pairs on DuckDB; MySQL pairs on DuckDB with MySQL's
comparison rules approximated (:data:`tasks.equivalence.sql_dialects.MYSQL_APPROXIMATION`: case-insensitive
text, PAD SPACE, ``/`` scale), other dialects on DuckDB — every such reading is stated.

Used by the counterexample finder (:mod:`tasks.equivalence.counterexample`), by the LLM judges
(:mod:`tasks.equivalence.judges`, to execute a counterexample a model proposes) and by the equivalence
methods (:mod:`tasks.equivalence.methods`).

An *instance* is ``{table_name_lowercase: [row_tuple, ...]}`` with values in the table's column
order: ``None`` for NULL, ``int``/``float``/``str``/``bool``; dates and timestamps are ISO strings
(inserted as literals, cast by the engine); generated columns hold ``None`` (the engine
computes them; they are never inserted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from tasks.equivalence.outcomes import OutcomeSpace, build_space, certainly_differ, resolve_cuts
from tasks.equivalence.query_plan import QueryPlan, plan_query
from tasks.equivalence.relschema import (  # noqa: F401 - re-exported
    Column,
    ForeignKey,
    RelSchema,
    SchemaError,
    Table,
    database_engine,
    enum_values,
    load_schema,
)
from tasks.db.relschema import type_category  # noqa: F401 - re-exported
from tasks.scoring.result_match import compare_results, tolerance
from tasks.equivalence.sql_dialects import (
    MYSQL_APPROXIMATION,
    ReadQuery,
    engine_tree,
    read_query,
    sqlglot_dialect,
)
from tasks.equivalence.sql_dialects import engine_sql as _engine_sql

Instance = dict[str, list[tuple]]

#: Engines an instance can be run on.
ENGINES = ("duckdb", "sqlite", "postgres")


# --------------------------------------------------------------------------------------------
# Queries
# --------------------------------------------------------------------------------------------


def parse_query(sql: str, dialect: str | None) -> exp.Expression:
    """Parse and normalise one query (:func:`tasks.equivalence.sql_dialects.read_query`); ValueError with a
    short message when it does not parse or is not a single SELECT/WITH/set-operation
    statement."""
    return read_query(sql, dialect).tree


def referenced_tables(tree: exp.Expression) -> list[str]:
    """Base tables a query reads (CTE names excluded), lower-case, in order of appearance; a
    qualified table keeps its qualifier (``hr.emp``)."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    out: list[str] = []
    for t in tree.find_all(exp.Table):
        if not t.name:
            continue
        n = t.name.lower()
        if n in ctes:
            continue
        db = t.args.get("db")
        full = f"{db.name.lower()}.{n}" if isinstance(db, exp.Expression) and db.name else n
        if full not in out:
            out.append(full)
    return out


def engine_sql(sql: str | ReadQuery, dialect: str | None, engine: str) -> str:
    """``sql`` written for ``engine`` (:func:`tasks.equivalence.sql_dialects.engine_sql`: unchanged when
    the dialect is the engine's own and normalising changed nothing)."""
    return _engine_sql(sql, dialect, engine)


def order_matters(sql1: str, sql2: str, dialect: str | None, order: str, both: bool = True) -> bool:
    """Whether row order is compared: ``always``/``never``, or ``auto`` = both queries (or
    either, with ``both=False``) have a top-level ORDER BY."""
    if order != "auto":
        return order == "always"
    flags = [read_query(s, dialect).tree.args.get("order") is not None for s in (sql1, sql2)]
    return all(flags) if both else any(flags)


@dataclass
class EngineChoice:
    """The engine a pair runs on: ``engine``, ``mysql`` (MySQL's comparison rules
    approximated), ``integer_division`` (DuckDB standing in for PostgreSQL), and the
    ``readings`` saying so."""

    engine: str
    mysql: bool = False
    integer_division: bool = False
    readings: list[str] = field(default_factory=list)

    def abs_tol(self, *trees: exp.Expression) -> float | None:
        """The absolute tolerance numbers compare with: 1e-4 for MySQL queries that divide or
        average (MySQL's results keep 4 more decimals, DuckDB's all), else None (the
        default)."""
        if self.mysql and any(next(t.find_all(exp.Div, exp.Avg), None) is not None for t in trees):
            return 1e-4
        return None


def engine_for(dialect: str | None, engine: str = "auto") -> EngineChoice:
    """The engine for a pair's dialect: ``postgres`` → a real PostgreSQL server (DuckDB with
    integer division when none can be started, stated), ``sqlite`` → SQLite, ``duckdb`` →
    DuckDB, ``mysql`` → DuckDB approximating MySQL (stated), other dialects → DuckDB (stated).
    ``engine`` other than ``auto`` forces one."""
    d = sqlglot_dialect(dialect) or "ansi"
    if engine != "auto":
        choice = EngineChoice(engine, mysql=(d == "mysql" and engine != "mysql"))
        if choice.mysql:
            choice.readings.append(MYSQL_APPROXIMATION.format(engine=engine))
        return choice
    if d == "postgres":
        from tasks.db.pg_scratch import PostgresUnavailable, server_url

        try:
            server_url()
            return EngineChoice("postgres")
        except PostgresUnavailable as exc:
            return EngineChoice("duckdb", integer_division=True, readings=[
                (f"PostgreSQL semantics approximated by DuckDB: no PostgreSQL server ({exc}); "
                "integer division is on, but division by zero gives NULL instead of an error "
                "and text sorts bytewise")])
    if d == "sqlite":
        return EngineChoice("sqlite")
    if d == "duckdb":
        return EngineChoice("duckdb")
    if d == "mysql":
        return EngineChoice("duckdb", mysql=True, readings=[MYSQL_APPROXIMATION.format(engine="DuckDB")])
    if d in _INTEGER_DIVISION:
        return EngineChoice("duckdb", integer_division=True, readings=[
            (f"{dialect} semantics approximated by DuckDB (with integer division of integers, as "
            f"{dialect} divides)")])
    return EngineChoice("duckdb", readings=[f"{dialect} semantics approximated by DuckDB"])


#: Dialects whose ``/`` divides integers as integers (PostgreSQL runs on its own server).
_INTEGER_DIVISION = {"tsql", "redshift", "trino", "presto", "athena", "materialize", "risingwave",
                     "fabric", "dremio"}


def _scale_resolver(schema: RelSchema | None):
    """``scale_of(node)`` for :func:`tasks.equivalence.sql_dialects.mysql_approximation`: the scale of an
    exact-number operand (integer columns and literals 0, DECIMAL(p, s) columns s, decimal
    literals their digits), None for approximate or unknown ones."""

    def scale_of(node: exp.Expression) -> int | None:
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.Literal) and not node.is_string:
            text = node.this
            if "e" in text.lower():
                return None
            return len(text.split(".")[1]) if "." in text else 0
        if isinstance(node, exp.Neg):
            return scale_of(node.this)
        if isinstance(node, exp.Cast):
            to = node.to
            if to.is_type(*exp.DataType.INTEGER_TYPES):
                return 0
            if to.this == exp.DataType.Type.DECIMAL:
                params = [int(p.this.this) for p in to.expressions if isinstance(p.this, exp.Literal)]
                return params[1] if len(params) > 1 else 0
            return None
        if isinstance(node, exp.Column) and schema is not None:
            found = set()
            tables = [schema.tables[node.table.lower()]] if node.table and node.table.lower() in schema.tables \
                else schema.tables.values()
            for t in tables:
                for c in t.columns:
                    if c.name.lower() == node.name.lower():
                        if c.category == "int":
                            found.add(0)
                        elif c.category == "decimal":
                            params = [int(p.this.this) for p in c.dtype.expressions
                                      if isinstance(p, exp.DataTypeParam) and isinstance(p.this, exp.Literal)]
                            found.add(params[1] if len(params) > 1 else 0)
                        else:
                            found.add(None)
            return found.pop() if len(found) == 1 else None
        return None

    return scale_of


def adapt_to_schema(q: ReadQuery, schema: RelSchema | None) -> ReadQuery:
    """Readings of a query that need the schema's types (MySQL ``||`` between numeric or
    boolean columns is OR, :func:`tasks.equivalence.sql_dialects.mysql_pipes_numeric`). Returns ``q``."""
    if schema is None or q.dialect != "mysql":
        return q

    def numeric(node: exp.Expression) -> bool:
        while isinstance(node, exp.Paren):
            node = node.this
        if not isinstance(node, exp.Column):
            return False
        cats = {c.category for t in schema.tables.values() for c in t.columns
                if c.name.lower() == node.name.lower()}
        return bool(cats) and cats <= {"int", "bool", "float", "decimal"}

    from tasks.equivalence.sql_dialects import mysql_pipes_numeric

    mysql_pipes_numeric(q, numeric)
    return q


@dataclass
class EngineQuery:
    """One query ready for an engine: ``sql`` to run, its :class:`QueryPlan` (the probe and
    the arbitrary choices its SQL leaves), the ``tree`` it was read as."""

    sql: str
    plan: QueryPlan
    tree: exp.Expression | None = None


def prepare_query(q: ReadQuery, schema: RelSchema | None, choice: EngineChoice) -> EngineQuery:
    """The engine SQL and :class:`QueryPlan` of a read query. Raises sqlglot errors when the
    query cannot be written for the engine."""
    dialect, engine = q.dialect, choice.engine
    scale_of = _scale_resolver(schema) if choice.mysql else None
    sql = _engine_sql(q, dialect, engine, scale_of)
    bare = engine == "sqlite" or dialect in ("mysql", "sqlite")
    plan = plan_query(q.tree, schema, engine=engine, bare_columns=bare, dialect=dialect,
                      to_sql=lambda t: engine_tree(t, dialect, engine, scale_of).sql(dialect=engine))
    return EngineQuery(sql, plan, q.tree)


# --------------------------------------------------------------------------------------------
# Outcomes and their comparison
# --------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one query returned on an instance: ``rows`` (tuples) and ``ncols``, or an
    ``error`` message (``timeout``: the error is the per-query time limit)."""

    rows: list[tuple] | None = None
    error: str | None = None
    timeout: bool = False
    ncols: int | None = None

    def preview(self, n: int = 5) -> str:
        """``ERROR: ...`` or the first ``n`` rows and the row count."""
        if self.error is not None:
            return f"ERROR: {self.error}"
        rows = self.rows or []
        shown = ", ".join(repr(tuple(r)) for r in rows[:n])
        more = f", … (+{len(rows) - n})" if len(rows) > n else ""
        return f"{len(rows)} row{'s' if len(rows) != 1 else ''}: [{shown}{more}]"


def same_outcome(a: Outcome, b: Outcome, *, ordered: bool, bag: bool = True,
                 permute_columns: bool = True, fold: bool = False) -> bool:
    """Two outcomes are the same result: both errors, or rows equal under test-suite
    semantics (:func:`tasks.scoring.result_match.compare_results` is True). One error and one result
    are not the same, but neither is a difference between results: callers treat that case
    apart (:func:`one_sided_error`)."""
    if a.error is not None or b.error is not None:
        return a.error is not None and b.error is not None
    return compare_results(a.rows or [], b.rows or [], ordered=ordered, bag=bag,
                           permute_columns=permute_columns, fold=fold) is True


def one_sided_error(a: Outcome, b: Outcome) -> str | None:
    """``"sql1 fails (sql2 runs): <error>"`` when exactly one of two outcomes is a runtime
    error, else None (a timeout is not a runtime error: :func:`one_sided_timeout`)."""
    if a.timeout or b.timeout or (a.error is None) == (b.error is None):
        return None
    return f"sql1 fails (sql2 runs): {a.error}" if a.error is not None else f"sql2 fails (sql1 runs): {b.error}"


def one_sided_timeout(a: Outcome, b: Outcome) -> str | None:
    """``"sql1 timed out ..."`` when a query hit the per-query time limit, else None."""
    if a.timeout:
        return f"sql1 timed out ({a.error})"
    if b.timeout:
        return f"sql2 timed out ({b.error})"
    return None


@dataclass
class Separation:
    """Whether an instance separates two queries: ``kind`` is ``same`` (the results are
    equal), ``certain`` (no allowed result of one equals an allowed result of the other: a
    counterexample), ``choice`` (they differ here, but the difference may come from an
    arbitrary choice the SQL leaves to the engine — ``reason`` says which) or ``error`` (a
    query failed)."""

    kind: str
    reason: str = ""

    @property
    def certain(self) -> bool:
        """The instance is a counterexample."""
        return self.kind == "certain"


def separation(run, q1: EngineQuery, q2: EngineQuery, o1: Outcome, o2: Outcome, *,
               ordered: bool, bag: bool = True, permute_columns: bool = True,
               fold: bool = False, abs_tol: float | None = None) -> Separation:
    """Decide whether the instance currently loaded separates two queries, given their
    outcomes on it. ``run(sql) -> Outcome`` runs a probe on that instance (the sort keys and
    the rows a top-level LIMIT cuts from, :mod:`tasks.equivalence.outcomes`) when the results differ.
    ``fold``: MySQL text comparison; ``abs_tol``: another absolute tolerance for numbers
    (:meth:`EngineChoice.abs_tol`)."""
    if abs_tol is not None:
        with tolerance(abs_tol=abs_tol):
            return separation(run, q1, q2, o1, o2, ordered=ordered, bag=bag,
                              permute_columns=permute_columns, fold=fold)
    if o1.error is not None or o2.error is not None:
        return Separation("error", o1.error or o2.error or "")
    if compare_results(o1.rows or [], o2.rows or [], ordered=ordered, bag=bag,
                       permute_columns=permute_columns, fold=fold) is True:
        return Separation("same")
    spaces: list[OutcomeSpace] = []
    for eq, o in ((q1, o1), (q2, o2)):
        plan = eq.plan
        why = "; ".join(plan.opaque) or resolve_cuts(plan, run, fold)
        if why:
            spaces.append(OutcomeSpace(opaque=why))
            continue
        probe_rows = probe_width = None
        if plan.needs_probe(ordered):
            p = run(plan.probe)
            if p.error is not None:
                spaces.append(OutcomeSpace(opaque=f"the probe of ORDER BY / LIMIT failed: {p.error}"))
                continue
            probe_rows, probe_width = p.rows, p.ncols
        spaces.append(build_space(plan, o.rows or [], probe_rows=probe_rows, probe_width=probe_width,
                                  width=o.ncols, fold=fold, ordered=ordered))
    if certainly_differ(spaces[0], spaces[1], ordered=ordered, bag=bag, permute_columns=permute_columns):
        return Separation("certain")
    reasons = []
    for n, (eq, s) in enumerate(zip((q1, q2), spaces), start=1):
        if s.opaque:
            reasons.append(f"sql{n}: {s.opaque}")
        else:
            reasons.extend(f"sql{n}: {c}" for c in eq.plan.choices[:2])
    if not reasons:
        reasons.append("the column-order search was undecided" if permute_columns else "undecided")
    return Separation("choice", " | ".join(reasons))


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
