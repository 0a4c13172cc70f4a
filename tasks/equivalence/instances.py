"""Small database instances for SQL equivalence: an instance database (:class:`InstanceDB`:
in-memory DuckDB or SQLite, or a scratch PostgreSQL database) to load instances into and run two
queries on, and the decision whether an instance separates two queries (:func:`separation`: a
verified counterexample only when no result the first query may return equals one the second may
return, :mod:`tasks.equivalence.outcomes`). Rendering an instance as CREATE TABLE + INSERT
statements and checking that a database really separates two queries
(:func:`tasks.equivalence.verification.verify_counterexample`) live in
:mod:`tasks.equivalence.verification`.

The relational schema itself (tables, keys, types) is :mod:`tasks.equivalence.relschema`, re-exported here.

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
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import duckdb
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
from tasks.equivalence.relschema import ident as _ident
from tasks.equivalence.relschema_tables import type_category  # noqa: F401 - re-exported
from tasks.scoring.result_match import compare_results, tolerance
from tasks.equivalence.sql_dialects import (
    MYSQL_APPROXIMATION,
    ReadQuery,
    engine_tree,
    read_query,
    sqlglot_dialect,
)
from tasks.equivalence.sql_dialects import engine_sql as _engine_sql
from tasks.db.sqlite_guard import ReadGate, fetch_rows

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


# --------------------------------------------------------------------------------------------
# Instance databases
# --------------------------------------------------------------------------------------------


class UniqueIndexViolation(Exception):
    """An instance breaks a unique index on expressions or a partial one
    (:class:`tasks.equivalence.relschema.UniqueIndex`), checked after it loads."""


_ENGINE_ERRORS: tuple[type[BaseException], ...] = (duckdb.Error, sqlite3.Error, UniqueIndexViolation)


def _pg_errors() -> tuple[type[BaseException], ...]:
    import psycopg

    return (psycopg.Error,)


class InstanceDB:
    """A database holding ``tables`` of ``schema`` — in-memory DuckDB (single thread) or
    SQLite, or a schema of its own in a scratch PostgreSQL database (``pg``: a shared
    :class:`tasks.db.pg_scratch.ScratchDatabase`, else one is created and dropped on close) — to
    load instances into (:meth:`load`) and run queries on (:meth:`run`).

    With ``constraints`` the tables carry their keys (NOT NULL, PK, UNIQUE, FK; SQLite with
    ``PRAGMA foreign_keys=ON``; self-references and cycles deferred to commit on SQLite and
    PostgreSQL, not declared on DuckDB — :attr:`notes`), so inserting an instance that breaks
    one raises; the finder's search sandbox omits them for speed (its generator keeps them),
    the verification sandbox keeps them. ``checks`` (default: ``constraints``) declares the
    CHECK constraints (the finder's search sandbox keeps them, so an instance breaking one does
    not load); when the engine cannot create one, the table is created without and
    :attr:`notes` says so. ``mysql``: text columns compare case-insensitively (MySQL's
    default collations); ``integer_division``: DuckDB's ``/`` divides integers as integers;
    ``many_joins``: DuckDB skips its join-order search (planning dominates on tiny data). A
    query running over its time limit is interrupted and returns an outcome with ``timeout``.
    Use as a context manager or call :meth:`close`.
    """

    def __init__(self, schema: RelSchema, tables: Sequence[str], engine: str = "duckdb",
                 *, constraints: bool = False, checks: bool | None = None,
                 query_timeout_s: float = 5.0, mysql: bool = False,
                 integer_division: bool = False, pg=None, many_joins: bool = False) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: use one of {ENGINES}")
        self.schema = schema
        self.engine = engine
        self.mysql = mysql
        self.tables = schema.closure(tables)
        self.query_timeout_s = query_timeout_s
        self.constraints = constraints
        self._loaded: set[str] = set()
        self._names = {t: _ident(schema.tables[t].name, engine) for t in self.tables}
        self._prefixes: dict[str, str] = {}
        self._current: dict[str, list[tuple]] = {}
        self._deadline: float | None = None
        self._interrupted = False
        self._closed = threading.Event()
        self._own_pg = None
        self._pg_timeout_ms: int | None = None
        self.notes: list[str] = []
        self._errors = _ENGINE_ERRORS
        if engine == "duckdb":
            # a pair's SQL may be a model's: no file, extension or network access, and no
            # setting it can change back (COPY ... TO, read_csv, ATTACH, INSTALL all refused)
            self.con = duckdb.connect(":memory:", config={"threads": 1,
                                                          "enable_external_access": False})
            if integer_division:
                self.con.execute("SET integer_division = true")
            if many_joins:
                # planning a many-way join costs DuckDB ~30 ms, the tiny instances ~1 ms:
                # the join-order search is skipped (the results are the same)
                self.con.execute("SET disabled_optimizers = 'join_order'")
            self.con.execute("SET lock_configuration = true")
            self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                              name="equivalence-sandbox-watchdog")
            self._watchdog.start()
        elif engine == "sqlite":
            self.con = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            self._gate = ReadGate(self.con)  # queries read only; the harness loads
            if constraints:
                self.con.execute("PRAGMA foreign_keys = ON")
        else:
            from tasks.db.pg_scratch import ScratchDatabase

            self._errors = _ENGINE_ERRORS + _pg_errors()
            if pg is None:
                pg = self._own_pg = ScratchDatabase()
            self.con = pg.connect()
        try:
            self._create(checks)
        except SchemaError:
            self.close()
            raise

    def _create(self, checks: bool | None) -> None:
        schema, engine, constraints = self.schema, self.engine, self.constraints
        checks = constraints if checks is None else checks
        if engine in ("duckdb", "postgres"):
            for name, values in schema.enum_types(self.tables).items():
                vals = ", ".join(literal(v, engine) for v in values)
                try:
                    self._exec(f"CREATE TYPE {_ident(name, engine)} AS ENUM ({vals})")
                except self._errors as exc:
                    raise SchemaError(f"cannot create enum type {name} on {engine}: {_short(exc)}") from None
        for name in self.tables:
            attempts = [(False, checks), (True, checks)]
            first_error = ""
            if checks and schema.tables[name].checks:
                attempts.append((True, False))
            for n, (category_types, with_checks) in enumerate(attempts):
                ddl = schema.create_sql(name, engine, constraints=constraints, tables=self.tables,
                                        category_types=category_types, checks=with_checks,
                                        nocase=self.mysql)
                try:
                    self._exec(ddl)
                    if checks and not with_checks:
                        self.notes.append(f"CHECK constraints of table {name} not enforced: "
                                          f"{engine} cannot create them ({first_error})")
                    break
                except self._errors as exc:
                    if n == 0:
                        first_error = _short(exc)
                    if n == len(attempts) - 1:
                        raise SchemaError(f"cannot create table {name} on {engine}: {first_error}") from None
        if constraints:
            statements, notes = schema.deferred_fk_sql(self.tables, engine)
            self.notes.extend(notes)
            for st in statements:
                try:
                    self._exec(st)
                except self._errors as exc:
                    raise SchemaError(f"cannot declare a foreign key on {engine}: {_short(exc)}") from None

    # -- plumbing ----------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._closed.wait(0.02):
            d = self._deadline
            if d is not None and time.monotonic() > d:
                try:
                    self._interrupted = True
                    self.con.interrupt()
                except Exception:  # noqa: BLE001, S110 - connection already closed
                    pass
                self._deadline = None

    def _exec(self, sql: str) -> None:
        self.con.execute(self._gate.trusted(sql) if self.engine == "sqlite" else sql)

    def close(self) -> None:
        """Close the connection (and drop the scratch database this sandbox made)."""
        self._closed.set()
        try:
            self.con.close()
        except Exception:  # noqa: BLE001, S110 - already closed
            pass
        if self._own_pg is not None:
            self._own_pg.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- use ---------------------------------------------------------------------------------

    def _insert(self, t: str, rows: Sequence[tuple]) -> str:
        prefix = self._prefixes.get(t)
        table = self.schema.tables[t]
        cols = table.inserted
        if prefix is None:
            names = ", ".join(_ident(table.columns[i].name, self.engine) for i in cols)
            prefix = self._prefixes[t] = f"INSERT INTO {self._names[t]} ({names}) VALUES "
        engine = self.engine
        return prefix + ", ".join("(" + ", ".join(literal(row[i], engine) for i in cols) + ")" for row in rows)

    def load(self, instance: Mapping[str, Sequence[tuple]]) -> None:
        """Replace the contents of the sandbox's tables with ``instance`` (tables missing from
        it are left empty). Inserts parents before children, in one transaction where foreign
        keys are deferred. Raises the engine's error (e.g. a constraint violation) and
        KeyError for a table outside the sandbox."""
        for t in instance:
            if t not in self.tables:
                raise KeyError(f"table {t!r} is not in this sandbox ({self.tables})")
        want = {t: list(instance.get(t) or []) for t in self.tables}
        # only the tables whose rows change are emptied and refilled (children first / last)
        changed = [t for t in self.tables if want[t] != self._current.get(t, [])]
        if self.constraints:  # a changed parent may be referenced: refill its children too
            changed = list(self.tables) if changed else []
        statements = [f"DELETE FROM {self._names[t]}" for t in reversed(changed) if t in self._loaded]
        for t in changed:
            self._loaded.discard(t)
            if want[t]:
                self._loaded.add(t)
                statements.append(self._insert(t, want[t]))
        self._current = {}
        try:
            self.execute_all(statements)
            self._check_unique_indexes(changed)
        except BaseException:
            self._loaded = set(self.tables)  # unknown state: empty everything next time
            raise
        self._current = want

    def _check_unique_indexes(self, tables: Sequence[str]) -> None:
        """Raise UniqueIndexViolation when a loaded table breaks one of its unique indexes on
        expressions / partial ones (no engine here declares both forms)."""
        for t in tables:
            for ux in self.schema.tables[t].unique_indexes:
                sql = ux.violation_sql(self._names[t], self.engine)
                cur = self.con.execute(self._gate.trusted(sql) if self.engine == "sqlite" else sql)
                if cur.fetchone() is not None:
                    raise UniqueIndexViolation(f"the rows of {self.schema.tables[t].name} break the "
                                               f"unique index {ux.name}")

    def execute_all(self, statements: Sequence[str]) -> None:
        """Run DDL/DML statements in the engine's dialect, in one transaction when the engine
        checks deferred foreign keys at commit; engine errors propagate (and roll back)."""
        if not statements:
            return
        if self.engine == "duckdb":  # one call: DuckDB's per-call overhead dominates tiny loads
            self._exec(";\n".join(statements))
            return
        if self.engine == "postgres":
            body = ";\n".join(statements)
            try:
                self._exec(f"BEGIN;\n{body};\nCOMMIT")
            except self._errors:
                try:
                    self._exec("ROLLBACK")
                except self._errors:
                    pass
                raise
            return
        transaction = self.constraints and len(statements) > 1
        if transaction:
            self._exec("BEGIN")
        try:
            for st in statements:
                self._exec(st)
            if transaction:
                self._exec("COMMIT")
        except self._errors:
            if transaction:
                try:
                    self._exec("ROLLBACK")
                except self._errors:
                    pass
            raise

    def execute(self, sql: str) -> None:
        """Run one statement (DDL/DML) in the engine's dialect; engine errors propagate."""
        self._exec(sql)

    def clear(self) -> None:
        """Delete every row of the sandbox's tables (children first)."""
        self.execute_all([f"DELETE FROM {self._names[t]}" for t in reversed(self.tables)])
        self._loaded.clear()
        self._current = {}

    def run(self, sql: str, timeout_s: float | None = None) -> Outcome:
        """Run one query (in the engine's dialect) and fetch every row; errors and timeouts
        (``timeout_s``, default and at most the sandbox's per-query limit) become an
        :class:`Outcome` with ``error`` (and ``timeout``). On SQLite the query runs under
        :class:`tasks.db.sqlite_guard.ReadGate`: only reads are authorised (no ATTACH, no write,
        no PRAGMA), interrupted after the limit, the result bounded in bytes."""
        limit = self.query_timeout_s if timeout_s is None else max(0.05, min(timeout_s, self.query_timeout_s))
        if self.engine == "sqlite":  # the guarded executor: reads only, time and byte limits
            if sql.startswith(self._gate.tag):  # cannot happen unless the token leaked
                return Outcome(error="not authorized: a harness statement")
            guard = None
            try:
                with self._gate.read_only(limit * 1000, steps=20_000) as guard:
                    cur = self.con.execute(sql)
                    rows = fetch_rows(cur)
                return Outcome(rows=rows, ncols=len(cur.description or ()))
            except (sqlite3.Error, ValueError, OverflowError) as exc:
                timed_out = guard is not None and guard.timed_out
                return Outcome(error=_short(exc) if not timed_out else f"timed out after {limit:.1f} s",
                               timeout=timed_out)
        if self.engine == "postgres":
            ms = max(1, int(limit * 1000))
            try:
                if ms != self._pg_timeout_ms:
                    self.con.execute(f"SET statement_timeout = {ms}")
                    self._pg_timeout_ms = ms
                cur = self.con.execute(sql)
                rows = [tuple(r) for r in cur.fetchall()] if cur.description else []
                return Outcome(rows=rows, ncols=len(cur.description or ()))
            except self._errors as exc:
                import psycopg

                if isinstance(exc, psycopg.errors.QueryCanceled):
                    return Outcome(error=f"timed out after {limit:.1f} s", timeout=True)
                from tasks.db.postgres import _pg_message

                return Outcome(error=_pg_message(exc))
            except (ValueError, OverflowError) as exc:
                return Outcome(error=_short(exc))
        self._interrupted = False
        self._deadline = time.monotonic() + limit
        try:
            res = self.con.execute(sql)
            rows = [tuple(r) for r in res.fetchall()]
            return Outcome(rows=rows, ncols=len(res.description or ()))
        except (duckdb.Error, ValueError, OverflowError, RuntimeError) as exc:
            if self._interrupted:
                return Outcome(error=f"timed out after {limit:.1f} s", timeout=True)
            return Outcome(error=_short(exc))
        finally:
            self._deadline = None


