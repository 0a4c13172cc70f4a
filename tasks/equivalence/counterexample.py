"""Automatic counterexample finder for SQL (non-)equivalence.

Given two queries and a schema with its keys, search small database instances for one on which
the two queries return different results; shrink the first one found to a minimal one; emit it
as CREATE TABLE + INSERT statements. Verdicts:

- ``not_equivalent``: a counterexample was found, shrunk, rendered and *verified* by executing
  the rendered script on a fresh database with the schema's keys declared: no result the first
  query may return on it equals a result the second may return (:func:`tasks.equivalence.instances.separation`);
- ``no_counterexample_within_budget``: the budget (instances, seconds) ran out. Search alone
  never proves equivalence, so the finder never says ``equivalent``;
- ``nondeterministic``: no counterexample, but on some instances the two queries returned
  different results only in a way an arbitrary choice the SQL leaves to the engine explains
  (rows tied under ORDER BY, which tied rows a LIMIT keeps, STRING_AGG's order, a window
  function over peers, a bare column, ``random()``: :mod:`tasks.equivalence.outcomes`); the reason says
  which. Such a difference is never a counterexample;
- ``error_on_instance``: no instance separated the results, but on some instance exactly one
  query raised a runtime error (DuckDB's conversion error for ``DNAME INT = 'SECURITY'``, a
  scalar subquery returning two rows, PostgreSQL's division by zero). An error is not a result:
  such an instance is never a counterexample, the search goes on, and the first one (shrunk) is
  reported with its error. A query that hits the per-query time limit is a *timeout*, counted
  and reported, never a runtime error;
- ``error``: a query does not parse, reads an unknown table, or fails on the empty database.

Engines (:func:`tasks.equivalence.instances.engine_for`): a PostgreSQL pair runs on a real PostgreSQL
server (a scratch database, dropped at the end), SQLite on SQLite, DuckDB on DuckDB, MySQL on
DuckDB with MySQL's comparison rules approximated, other dialects on DuckDB; every
approximation, every non-default reading of the SQL (:mod:`tasks.equivalence.sql_dialects`: rewrite-engine
identifiers, MySQL ``||``, ``GROUP BY`` literals, ``UNIX_TIMESTAMP``, ``now()`` frozen to one
instant) and a fallback from DuckDB to SQLite is listed in :attr:`FinderResult.readings`.
Comparisons of a typed column with a string it cannot hold are listed as ``type_errors``.

How instances are made (deterministic for a given seed):

- tables: the tables both queries read plus those they reference through foreign keys;
- values per column: a small base pool of its type (``-1, 0, 1, 2`` / ``'a', 'b'`` / dates /
  timestamps at midnight and at noon ..., shared by all columns of a type so joins hit), the
  constants of both queries that are compared with the column (directly, through an aggregate,
  in IN / BETWEEN / LIKE, through ``LENGTH``) and their neighbours (``c-1, c, c+1``; a string
  matching a LIKE pattern; the next/previous string; the string with a leading / trailing space
  and in the other case; strings of the length around a ``LENGTH`` constant; ±1 day, ±1 second
  and +12 hours of a date or timestamp), spread over columns linked by equality predicates and
  foreign keys; NULL when the column is nullable — only values the declared type holds
  (``VARCHAR(n)``, unsigned and small integer ranges, ``DECIMAL(p, s)``, enums and SETs);
- instance shapes: empty tables, 1 row per table first and growing to ``max_rows``, profiles
  with no/some/many NULLs and with duplicated rows (copies that differ only in their key
  columns, which also makes ties at MIN/MAX and in ORDER BY); later, now and then, *large*
  instances of up to ``3 × max_rows`` rows per table;
- predicate-guided shapes: ``COUNT`` compared with a constant (in HAVING, a correlated scalar
  subquery, an aggregate's alias tested outside, ``BETWEEN`` and ``IN`` lists of counts),
  ``LIMIT`` / ``OFFSET``, ``NTILE`` / ``LAG`` arguments and long IN lists ask for a number of
  rows (the constant and its neighbours); every third instance then puts that many rows in one
  of the predicate's tables, in one group (its GROUP BY and correlation columns held equal, a
  COUNT(DISTINCT c) column varied), up to the ``row_budget``. The size of the instance that
  separated a pair and how it was made are reported (``rows_before_shrink``, ``found_by``);
- CHECK constraints are declared in the search sandbox too, so an instance breaking one does not
  load (and is not counted as separating); generated columns are computed by the engine;
- keys honoured: PRIMARY KEY and UNIQUE values distinct (NULLs too under ``NULLS NOT
  DISTINCT``; case-insensitively for MySQL), NOT NULL never NULL, FOREIGN KEY values taken from
  the referenced table's rows (or NULL when the column allows it) — a self-reference from the
  table's own rows (a row may reference itself), a foreign key closing a cycle filled once both
  tables have rows.

An instance *separates* the queries when their results differ under the match options (bag
semantics by default, row order only when both queries have a top-level ORDER BY, column order
free, numbers within a relative/absolute tolerance) in a way no arbitrary choice explains
(:func:`tasks.equivalence.instances.separation`: rows tied under ORDER BY compared as bags, the rows a LIMIT
may keep computed from the tie groups, cells an arbitrary choice fills matching anything). A
runtime error in one query while the other returns rows is *not* a difference (see
``error_on_instance``).

Time: the search stops at ``time_limit_s``; each query's own limit is the smaller of
``query_timeout_s`` and the time left; shrinking and verifying a candidate get at most half
the time limit more (a partly shrunk, still verified instance is reported when that runs
out). A run that hit its limit says so (``hit_time_limit``).

Shrinking: delta debugging (``ddmin``, Zeller & Hildebrandt, "Simplifying and Isolating
Failure-Inducing Input", TSE 2002) over the instance's rows, removing rows that reference a
removed row; the result is 1-minimal (removing any one row no longer separates the queries).
Then non-key values are simplified (``0``, ``'a'``, ...) where the queries stay separated. A
large guided instance shrinks the same way (the rows a threshold needs stay).

Why not a property-testing library (hypothesis): its engine shrinks well but is built to run
as a test, with health checks, deadlines, an example database and non-deterministic stopping;
we need a fixed, reported budget (instances and seconds), schema- and key-aware generation,
and the first separating instance. The search here is a deterministic seeded loop; ``ddmin``
is the textbook algorithm (about thirty lines).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp
from sqlglot.errors import SqlglotError

from schemas.equivalence import FinderBudget, MatchOptions
from tasks.equivalence.instances import (
    EngineChoice,
    EngineQuery,
    Instance,
    Outcome,
    RelSchema,
    Sandbox,
    SchemaError,
    Table,
    adapt_to_schema,
    engine_for,
    enum_values,
    instance_rows,
    one_sided_error,
    one_sided_timeout,
    prepare_query,
    referenced_tables,
    render_instance,
    separation,
    verify_counterexample,
)
from tasks.equivalence.sql_dialects import read_query, sqlglot_dialect

_COMPARISONS = (
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like, exp.ILike, exp.In,
    exp.Between, exp.Is, exp.NullSafeEQ, exp.NullSafeNEQ, exp.Glob,
)

_BASE: dict[str, list[Any]] = {
    "int": [-1, 0, 1, 2],
    "float": [0.0, 1.0, 2.5],
    "decimal": [0.0, 1.0, 2.5],
    "text": ["a", "b"],
    "other": ["a", "b"],
    "date": ["2000-01-01", "2000-01-02"],
    "timestamp": ["2000-01-01 00:00:00", "2000-01-01 12:30:00", "2000-01-02 00:00:00"],
    "time": ["00:00:00", "12:00:00"],
    "bool": [False, True],
    "uuid": ["00000000-0000-0000-0000-000000000000", "00000000-0000-0000-0000-000000000001"],
    "json": ["1", '"a"'],
}
_SIMPLE: dict[str, list[Any]] = {
    "int": [0, 1], "float": [0.0, 1.0], "decimal": [0.0, 1.0], "text": ["a"], "other": ["a"],
    "date": ["2000-01-01"], "timestamp": ["2000-01-01 00:00:00"], "time": ["00:00:00"],
    "bool": [], "uuid": [], "json": [],
}


@dataclass
class FinderResult:
    """What the finder concluded for one pair.

    - ``verdict``: ``not_equivalent`` / ``no_counterexample_within_budget`` /
      ``nondeterministic`` (results differed only as an arbitrary choice explains:
      ``choices`` lists the constructs, ``choice_instances`` counts such instances) /
      ``error_on_instance`` (no instance separated the results, but on some instance exactly
      one query raised: ``error`` says which and why, ``error_script`` is a minimal such
      database) / ``error``;
    - ``counterexample``: the minimal instance as a CREATE TABLE + INSERT script (in the pair's
      dialect), ``instance`` the same rows as ``{table: [row, ...]}``, ``rows`` their number;
    - ``verified``: the rendered script, executed on a fresh database with the keys declared,
      separates the queries. Always True with ``not_equivalent``: a candidate that does not
      verify is rejected and the search goes on; ``verify_error`` is kept for callers that
      verify other scripts;
    - ``result1``/``result2``: previews of both results on the counterexample;
    - ``instances_tried``: instances executed during the search (the budget spent),
      ``search_s``/``shrink_s``/``seconds``: wall time in seconds (``seconds`` is all of it);
      ``hit_time_limit``: the search stopped at the time limit; ``timeouts``: instances on
      which a query hit the per-query time limit (never counted as an error or a difference);
      ``found_at``: index of the first separating instance (0 = the empty database);
      ``rows_before_shrink``: the size of the instance that separated the queries (rows over
      all tables), ``found_by`` how it was made (``random``, ``large``, ``guided: <predicate>
      → <n> rows in <table>``);
    - ``size_hints``: the instance shapes the predicates asked for (and those over the row
      budget); ``type_errors``: type-incorrect comparisons in the queries
      (``DNAME INT = 'SECURITY'``); ``readings``: every non-default reading of the SQL (schema
      DDL in another dialect, ``||`` as concatenation, a GROUP BY literal as a constant,
      ``now()`` frozen, the engine and what it approximates) — nothing is decided silently;
    - ``engine``: ``duckdb``, ``sqlite`` or ``postgres``; ``notes``: e.g. constraints the
      schema reader dropped, instances that did not load.
    """

    verdict: str
    counterexample: str | None = None
    instance: dict[str, list[list]] | None = None
    rows: int | None = None
    verified: bool | None = None
    verify_error: str | None = None
    result1: str | None = None
    result2: str | None = None
    instances_tried: int = 0
    found_at: int | None = None
    rows_before_shrink: int | None = None
    found_by: str | None = None
    search_s: float = 0.0
    shrink_s: float = 0.0
    seconds: float = 0.0
    hit_time_limit: bool = False
    timeouts: int = 0
    engine: str = "duckdb"
    error: str | None = None
    error_script: str | None = None
    one_sided_errors: int = 0
    choice_instances: int = 0
    choices: list[str] = field(default_factory=list)
    size_hints: list[str] = field(default_factory=list)
    type_errors: list[str] = field(default_factory=list)
    readings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def _spent(self) -> str:
        limit = " (time limit reached)" if self.hit_time_limit else ""
        timeouts = f", {self.timeouts} query timeout(s)" if self.timeouts else ""
        return f"{self.instances_tried} instance(s), {self.seconds:.2f} s{limit}{timeouts}"

    def summary(self) -> str:
        """One line for logs and the ``explanation`` column."""
        if self.verdict == "not_equivalent":
            return (f"counterexample with {self.rows} row(s) (found at {self.rows_before_shrink} "
                    f"row(s), {self.found_by}) after {self._spent()}: "
                    f"sql1 → {self.result1}; sql2 → {self.result2}")
        if self.verdict == "error":
            return f"error: {self.error}"
        if self.verdict == "error_on_instance":
            extra = f"; {self.type_errors[0]}" if self.type_errors else ""
            return (f"no counterexample in {self._spent()}, but on {self.one_sided_errors} "
                    f"instance(s) one query fails: {self.error}{extra} (an error is not a result)")
        if self.verdict == "nondeterministic":
            why = "; ".join(self.choices[:3]) or "an arbitrary choice"
            return (f"no counterexample in {self._spent()}; on {self.choice_instances} "
                    f"instance(s) the results differed only as the SQL's arbitrary choices allow "
                    f"({why}) — not a counterexample, and not a proof of equivalence")
        return f"no counterexample in {self._spent()} (not a proof of equivalence)"

    def details(self) -> dict[str, Any]:
        """The facts behind the verdict as a JSON-able dict (the ``details`` column)."""
        return {
            "engine": self.engine, "found_at": self.found_at,
            "rows_before_shrink": self.rows_before_shrink, "found_by": self.found_by,
            "search_s": self.search_s, "shrink_s": self.shrink_s, "seconds": self.seconds,
            "hit_time_limit": self.hit_time_limit, "timeouts": self.timeouts,
            "result1": self.result1, "result2": self.result2, "instance": self.instance,
            "one_sided_errors": self.one_sided_errors, "error_script": self.error_script,
            "choice_instances": self.choice_instances, "choices": self.choices,
            "size_hints": self.size_hints, "type_errors": self.type_errors,
            "readings": self.readings, "notes": self.notes,
        }


# --------------------------------------------------------------------------------------------
# Delta debugging
# --------------------------------------------------------------------------------------------


def ddmin(items: Sequence[Any], test: Callable[[list[Any]], bool],
          stop: Callable[[], bool] | None = None) -> list[Any]:
    """Zeller & Hildebrandt's ddmin: a 1-minimal sublist of ``items`` on which ``test`` holds.

    ``test(items)`` must hold. Keeps the order of ``items``; ``test`` results are cached by
    the chosen positions. 1-minimal: removing any single element makes ``test`` fail (the empty
    list is tried too). ``stop()`` True ends the search early with the smallest sublist found
    so far (on which ``test`` holds, but which may not be 1-minimal).
    """
    cache: dict[tuple[int, ...], bool] = {}
    idx = list(range(len(items)))

    def t(sub: list[int]) -> bool:
        key = tuple(sub)
        if key not in cache:
            if stop is not None and stop():
                return False
            cache[key] = bool(test([items[i] for i in sub]))
        return cache[key]

    n = 2
    while len(idx) >= 2:
        size = len(idx)
        chunks = [idx[size * i // n: size * (i + 1) // n] for i in range(n)]
        chunks = [c for c in chunks if c]
        reduced = False
        for c in chunks:
            if t(c):
                idx, n, reduced = c, 2, True
                break
        if not reduced:
            for i in range(len(chunks)):
                comp = [x for j, c in enumerate(chunks) if j != i for x in c]
                if t(comp):
                    idx, n, reduced = comp, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(idx):
                break
            n = min(len(idx), 2 * n)
    if len(idx) == 1 and t([]):
        idx = []
    return [items[i] for i in idx]


# --------------------------------------------------------------------------------------------
# Query analysis: constants and column links
# --------------------------------------------------------------------------------------------

ColKey = tuple[str, int]  # (table lower-case, column index)

#: Value categories a string literal may fail to convert to.
_TYPED = ("int", "float", "decimal", "date", "timestamp", "time", "bool", "uuid")


@dataclass(frozen=True)
class SizeHint:
    """An instance shape a predicate asks for: ``size`` rows in one of ``tables`` (the tables
    the predicate's SELECT reads), all in one group (``hold`` columns kept equal: GROUP BY and
    correlation columns) with the ``distinct`` columns given different values (COUNT(DISTINCT
    c), an IN list); ``reason`` is the predicate's text."""

    size: int
    reason: str
    tables: tuple[str, ...]
    distinct: tuple[ColKey, ...] = ()
    hold: tuple[ColKey, ...] = ()


def _literal_value(lit: exp.Literal) -> Any:
    if lit.is_string:
        return lit.this
    text = lit.this
    try:
        value: Any = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            return text
    return -value if isinstance(lit.parent, exp.Neg) else value


def _local_nodes(node: exp.Expression, kind: type) -> list[exp.Expression]:
    """Nodes of ``kind`` under ``node`` without entering subqueries."""
    prune = lambda n: n is not node and isinstance(n, (exp.Subquery, exp.Select))
    return [n for n in node.walk(prune=prune) if isinstance(n, kind)]


class _Analysis:
    """Tables, column links, constants, size wishes and type-incorrect comparisons of two
    queries over a schema (``dialect``: the queries' sqlglot dialect)."""

    def __init__(self, schema: RelSchema, trees: Sequence[exp.Expression],
                 dialect: str | None = None) -> None:
        self.schema = schema
        self.dialect = dialect
        names: list[str] = []
        for tree in trees:
            for t in referenced_tables(tree):
                schema.table(t)  # KeyError for an unknown table
                if t not in names:
                    names.append(t)
        self.queried = list(dict.fromkeys(schema.table(t).name.lower() for t in names))
        self.tables = schema.closure(self.queried)
        self.constants: dict[ColKey, list[tuple[Any, str]]] = {}
        self.links: list[tuple[ColKey, ColKey]] = []
        self.hints: list[SizeHint] = []
        self.type_errors: list[str] = []
        for n, tree in enumerate(trees, start=1):
            self._scan(tree, f"sql{n}")
            self._size_hints(tree)
        for t in self.tables:
            table = schema.tables[t]
            for check in table.checks:
                self._scan(check, f"CHECK of {table.name}", {t: t})
            for fk in table.foreign_keys:
                if fk.ref_table in self.tables:
                    parent = schema.tables[fk.ref_table]
                    for c, r in zip(fk.columns, fk.ref_columns):
                        self.links.append(((t, table.index(c)), (fk.ref_table, parent.index(r))))

    def _aliases(self, tree: exp.Expression) -> dict[str, str]:
        out = {}
        for t in tree.find_all(exp.Table):
            if t.name.lower() in self.schema.tables:
                out[t.alias_or_name.lower()] = t.name.lower()
                out.setdefault(t.name.lower(), t.name.lower())
        return out

    def _resolve(self, col: exp.Column, aliases: dict[str, str]) -> list[ColKey]:
        name = col.name.lower()
        if not name:
            return []
        qual = col.table.lower() if col.table else ""
        if qual and qual in aliases:
            cands = [aliases[qual]]
        elif len(set(aliases.values())) == 1 and not qual:
            cands = list(set(aliases.values()))
        else:
            cands = self.tables
        out = []
        for t in cands:
            if t not in self.schema.tables:
                continue
            table = self.schema.tables[t]
            for i, c in enumerate(table.columns):
                if c.name.lower() == name:
                    out.append((t, i))
        return out

    def _lengths(self, node: exp.Expression, aliases: dict[str, str]) -> None:
        """``LENGTH(col) <op> n``: strings of about ``n`` characters for ``col``."""
        if not isinstance(node, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Between, exp.In)):
            return
        sides = [node.this] + [node.args.get(k) for k in ("expression", "low", "high") if node.args.get(k) is not None] \
            + list(node.expressions)
        fns = [x for x in sides if isinstance(x, exp.Length)]
        nums = [_int_constant(x) for x in sides if not isinstance(x, exp.Length)]
        for fn in fns:
            cols = [k for c in _local_nodes(fn, exp.Column) for k in self._resolve(c, aliases)]
            for k in cols:
                for n in nums:
                    if n is not None and 0 <= n <= 200:
                        self.constants.setdefault(k, []).append((n, "length"))

    def _scan(self, tree: exp.Expression, where: str, aliases: dict[str, str] | None = None) -> None:
        aliases = aliases if aliases is not None else self._aliases(tree)
        for node in tree.walk():
            if not isinstance(node, _COMPARISONS):
                continue
            self._lengths(node, aliases)
            cols: list[ColKey] = []
            lit_nodes = _local_nodes(node, exp.Literal)
            lits = [_literal_value(lit) for lit in lit_nodes]
            for c in _local_nodes(node, exp.Column):
                found = self._resolve(c, aliases)
                if found:
                    cols.extend(found)
                elif (self.dialect == "sqlite" and not c.table and isinstance(c.this, exp.Identifier)
                      and c.this.quoted):
                    # SQLite reads a double-quoted name that is no column as a string
                    # ("Asia" in Spider's queries)
                    lits.append(c.name)
            kind = "like" if isinstance(node, (exp.Like, exp.ILike, exp.Glob)) else (
                "eq" if isinstance(node, (exp.EQ, exp.In, exp.Is, exp.NullSafeEQ)) else "range")
            for k in cols:
                for v in lits:
                    self.constants.setdefault(k, []).append((v, kind))
            self._type_check(node, aliases, where)
            # columns compared with each other (joins, correlations, IN (SELECT col ...))
            for a, b in itertools.pairwise(cols):
                self.links.append((a, b))
            query = node.args.get("query") if isinstance(node, exp.In) else None
            if query is not None:
                inner = query.this if isinstance(query, exp.Subquery) else query
                if isinstance(inner, exp.Select) and inner.expressions:
                    inner_aliases = {**aliases, **self._aliases(inner)}
                    first = inner.expressions[0]
                    targets = [k for c in _local_nodes(first, exp.Column)
                               for k in self._resolve(c, inner_aliases)]
                    for a in cols[:1]:
                        for b in targets:
                            self.links.append((a, b))

    def _type_check(self, node: exp.Expression, aliases: dict[str, str], where: str) -> None:
        """Record comparisons of a typed column with a string literal that has no value of the
        column's type (``DNAME INT = 'SECURITY'``): engines disagree on them (DuckDB and
        PostgreSQL raise, SQLite compares as unequal, MySQL converts the string to 0)."""
        if isinstance(node, (exp.Like, exp.ILike, exp.Glob, exp.Is)):
            return
        operands = [node.this] + list(node.expressions) + [
            node.args.get(k) for k in ("expression", "low", "high") if node.args.get(k) is not None]
        columns = [o for o in operands if isinstance(o, exp.Column)]
        strings = [o for o in operands if isinstance(o, exp.Literal) and o.is_string]
        if not columns or not strings:
            return
        for c in columns:
            keys = self._resolve(c, aliases)
            cats = {self.schema.tables[t].columns[i].category for t, i in keys}
            if len(cats) != 1:
                continue
            col = self.schema.tables[keys[0][0]].columns[keys[0][1]]
            if col.category not in _TYPED:
                continue
            for s in strings:
                if _convert(s.this, col.category) is None:
                    text = (f"{where}: type-incorrect comparison {node.sql(dialect=self.dialect or None)[:80]} "
                            f"({self.schema.tables[keys[0][0]].name}.{col.name} is "
                            f"{col.dtype.sql()}, {s.sql()} is no {col.category})")
                    if text not in self.type_errors:
                        self.type_errors.append(text)

    # -- size wishes -----------------------------------------------------------------------

    def _select_tables(self, select: exp.Expression) -> tuple[str, ...]:
        local = [t.name.lower() for t in _local_nodes(select, exp.Table)
                 if t.name.lower() in self.schema.tables]
        if not local:
            local = [t.name.lower() for t in select.find_all(exp.Table)
                     if t.name.lower() in self.schema.tables]
        return tuple(dict.fromkeys(t for t in local if t in self.tables))

    def _group_columns(self, select: exp.Expression, aliases: dict[str, str]) -> list[ColKey]:
        out: list[ColKey] = []
        group = select.args.get("group") if isinstance(select, exp.Select) else None
        if group is not None:
            for c in group.find_all(exp.Column):
                out.extend(self._resolve(c, aliases))
        where = select.args.get("where") if isinstance(select, exp.Select) else None
        if where is not None:  # correlation and join columns: keep them equal within a group
            for eq in _local_nodes(where, exp.EQ):
                for c in _local_nodes(eq, exp.Column):
                    out.extend(self._resolve(c, aliases))
        return out

    def _hint(self, sizes: Iterable[int], reason: str, tables: tuple[str, ...],
              distinct: Iterable[ColKey] = (), hold: Iterable[ColKey] = ()) -> None:
        if not tables:
            tables = tuple(self.queried)
        for n in sorted(set(sizes)):
            if n < 3:
                continue  # the random instances cover one and two rows many times over
            hint = SizeHint(n, reason, tables, tuple(dict.fromkeys(distinct)), tuple(dict.fromkeys(hold)))
            if hint not in self.hints:
                self.hints.append(hint)

    def _size_hints(self, tree: exp.Expression) -> None:
        """Sizes the predicates of ``tree`` ask for: ``COUNT`` compared with a constant
        (HAVING, a correlated scalar subquery, an aggregate's alias in an outer query), LIMIT /
        OFFSET, window functions with a row argument (NTILE, LAG) and long IN lists."""
        aliases = self._aliases(tree)
        for select in tree.find_all(exp.Query):
            limit, offset = _int_arg(select.args.get("limit")), _int_arg(select.args.get("offset"))
            if limit is not None or offset is not None:
                n, m = limit or 0, offset or 0
                text = " ".join(x for x in (f"LIMIT {limit}" if limit is not None else "",
                                            f"OFFSET {offset}" if offset is not None else "") if x)
                self._hint([n, n + 1, n + m, n + m + 1, m + 1], text, self._select_tables(select),
                           hold=self._group_columns(select, aliases))
        for node in tree.find_all(exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE):
            sides = [node.this, node.expression]
            for const_side, other in (sides, sides[::-1]):
                c = _int_constant(const_side)
                if c is None:
                    continue
                reason = node.sql(dialect=self.dialect or None)[:80]
                count = _count_in(other)
                if count is not None:
                    select = count.find_ancestor(exp.Select)
                    distinct = []
                    if isinstance(count.this, exp.Distinct):
                        distinct = [k for col in count.this.find_all(exp.Column)
                                    for k in self._resolve(col, aliases)]
                    tables = self._select_tables(select) if select is not None else ()
                    hold = self._group_columns(select, aliases) if select is not None else []
                    self._hint([c - 1, c, c + 1, c + 2], reason, tables, distinct, hold)
                elif isinstance(other, exp.Column) and not self._resolve(other, aliases):
                    # an alias of an aggregate or a window function compared in an outer query
                    self._hint([c, c + 1, c + 2], reason, tuple(self.queried))
                elif isinstance(other, exp.Window):
                    self._hint([c, c + 1, c + 2], reason, tuple(self.queried))
        for node in tree.find_all(exp.Between, exp.In):
            count = _count_in(node.this)
            if count is None:
                continue
            if isinstance(node, exp.Between):
                lo, hi = _int_constant(node.args.get("low")), _int_constant(node.args.get("high"))
                sizes = [x for c in (lo, hi) if c is not None for x in (c - 1, c, c + 1)]
            else:
                sizes = [x for e in node.expressions if (c := _int_constant(e)) is not None
                         for x in (c - 1, c, c + 1)]
            select = count.find_ancestor(exp.Select)
            distinct = []
            if isinstance(count.this, exp.Distinct):
                distinct = [k for col in count.this.find_all(exp.Column) for k in self._resolve(col, aliases)]
            tables = self._select_tables(select) if select is not None else ()
            hold = self._group_columns(select, aliases) if select is not None else []
            self._hint(sizes, node.sql(dialect=self.dialect or None)[:80], tables, distinct, hold)
        for win in tree.find_all(exp.Window):
            fn = win.this
            for arg in [fn.this] + list(fn.expressions) + [fn.args.get("offset")]:
                c = _int_constant(arg) if isinstance(arg, exp.Expression) else None
                if c is not None:
                    self._hint([c, c + 1], win.sql(dialect=self.dialect or None)[:80], tuple(self.queried))
        for node in tree.find_all(exp.In):
            lits = [e for e in node.expressions if isinstance(e, exp.Literal)]
            if len(lits) >= 3:
                cols = [k for col in _local_nodes(node.this, exp.Column) for k in self._resolve(col, aliases)]
                self._hint([len(lits), len(lits) + 1], f"IN list of {len(lits)} values",
                           tuple(dict.fromkeys(t for t, _ in cols)) or tuple(self.queried), distinct=cols)


def _int_constant(node: exp.Expression | None) -> int | None:
    """The integer a literal (or a negated / parenthesised literal) stands for, else None."""
    while isinstance(node, exp.Paren):
        node = node.this
    neg = isinstance(node, exp.Neg)
    if neg:
        node = node.this
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            value = int(node.this)
        except ValueError:
            try:
                value = math.floor(float(node.this))
            except ValueError:
                return None
        return -value if neg else value
    return None


def _int_arg(node: exp.Expression | None) -> int | None:
    """The integer of a LIMIT / OFFSET / FETCH clause (None when absent or not a constant)."""
    if node is None:
        return None
    for key in ("expression", "count", "this"):
        value = node.args.get(key)
        if isinstance(value, exp.Expression):
            c = _int_constant(value)
            if c is not None:
                return c
    return None


def _count_in(node: exp.Expression) -> exp.Count | None:
    """The COUNT a comparison operand computes: ``COUNT(...)`` itself (maybe in arithmetic) or
    the single select item of a scalar subquery."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Subquery):
        node = node.this
    if isinstance(node, exp.Select) and len(node.expressions) == 1:
        node = node.expressions[0]
        if isinstance(node, exp.Alias):
            node = node.this
    if isinstance(node, exp.Count):
        return node
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
        return next((n for n in _local_nodes(node, exp.Count)), None)
    return None


# --------------------------------------------------------------------------------------------
# Value domains
# --------------------------------------------------------------------------------------------


def _convert(value: Any, category: str) -> Any | None:
    """``value`` as a value of ``category``, or None when it has no such reading."""
    try:
        if category == "int":
            if isinstance(value, bool):
                return int(value)
            if isinstance(value, int):
                return value
            if isinstance(value, float):
                return math.floor(value) if math.isfinite(value) else None
            return int(str(value).strip())
        if category in ("float", "decimal"):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            return float(str(value).strip())
        if category in ("text", "other"):
            if isinstance(value, bool):
                return None
            return str(value)
        if category == "date":
            return dt.date.fromisoformat(str(value)[:10]).isoformat()
        if category == "timestamp":
            return dt.datetime.fromisoformat(str(value)).isoformat(sep=" ")
        if category in ("time", "uuid"):
            return str(value)
        if category == "json":
            return json.dumps(value)
        if category == "bool":
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("true", "1"):
                return True
            if str(value).lower() in ("false", "0"):
                return False
    except (ValueError, OverflowError):
        return None
    return None


def _like_examples(pattern: str) -> list[str]:
    matching = pattern.replace("%", "").replace("_", "a").replace("*", "").replace("?", "a")
    longer = pattern.replace("%", "x").replace("_", "a").replace("*", "x").replace("?", "a")
    return [matching, longer]


def _neighbours(value: Any, kind: str, category: str) -> list[Any]:
    """``value`` and its neighbours in ``category`` (see the module docstring)."""
    if kind == "length":
        if category in ("text", "other") and isinstance(value, int):
            return ["a" * n for n in (value - 1, value, value + 1) if n >= 0]
        return []
    if kind == "like" and isinstance(value, str) and category in ("text", "other"):
        return _like_examples(value)
    v = _convert(value, category)
    if v is None:
        # a float constant for an int column: both sides of it
        if category == "int" and isinstance(value, float) and math.isfinite(value):
            return [math.floor(value), math.ceil(value)]
        return []
    if category == "int":
        return [v - 1, v, v + 1]
    if category in ("float", "decimal"):
        return [v - 1.0, v - 0.5, v, v + 0.5, v + 1.0]
    if category in ("text", "other"):
        out = [v]
        if kind == "eq":
            variant = v.lower() if v != v.lower() else v.upper()
            if variant != v:
                out.append(variant)
            if v.strip() == v and v:
                out.extend([" " + v, v + " "])  # TRIM, PAD SPACE
        else:
            out.append(v + "a")
            if len(v) > 1:
                out.append(v[:-1])
        return out
    if category == "date":
        d = dt.date.fromisoformat(v)
        return [(d + dt.timedelta(days=k)).isoformat() for k in (-1, 0, 1)]
    if category == "timestamp":
        t = dt.datetime.fromisoformat(v)
        steps = [dt.timedelta(days=k) for k in (-1, 0, 1)] + [
            dt.timedelta(seconds=-1), dt.timedelta(seconds=1), dt.timedelta(hours=12)]
        return [(t + d).isoformat(sep=" ") for d in steps]
    return [v]


def _sort_key(v: Any) -> tuple:
    return (type(v).__name__, v)


def _fold(v: Any) -> Any:
    return v.rstrip(" ").casefold() if isinstance(v, str) else v


def _type_defaults(col: Any) -> list[Any]:
    """Values of a column's declared type when the base pool holds none (``YEAR``, ``CHAR(1)``
    filled already, a DECIMAL(1, 0), ...)."""
    if col.category == "int":
        from tasks.equivalence.relschema import _INT_RANGES

        lo, hi = _INT_RANGES.get(col.dtype.this, (0, 2))
        return [v for v in (lo, lo + 1, lo + 2, 0, 1) if lo <= v <= hi][:3]
    if col.category == "decimal":
        return [v for v in (0.0, 1.0, 0.1, -1.0) if col.accepts(v)]
    if col.category == "text" and col.length is not None:
        return [c for c in ("a", "b", "c") if len(c) <= col.length] or [""]
    return []


def build_domains(schema: RelSchema, analysis: _Analysis, *, fold: bool = False) -> dict[ColKey, list[Any]]:
    """Candidate non-NULL values for every column of the analysed tables: only values the
    declared type holds (:meth:`tasks.equivalence.relschema.Column.accepts`); with ``fold`` (MySQL) no
    value ends in a space."""
    parent: dict[ColKey, ColKey] = {}

    def find(k: ColKey) -> ColKey:
        parent.setdefault(k, k)
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for a, b in analysis.links:
        if a[0] in analysis.tables and b[0] in analysis.tables:
            parent[find(a)] = find(b)
    groups: dict[ColKey, list[tuple[Any, str]]] = {}
    for k, consts in analysis.constants.items():
        if k[0] in analysis.tables:
            groups.setdefault(find(k), []).extend(consts)
    domains: dict[ColKey, list[Any]] = {}
    for t in analysis.tables:
        table = schema.tables[t]
        for i, col in enumerate(table.columns):
            if enum_values(col):  # an ENUM holds its values and nothing else
                domains[(t, i)] = enum_values(col)
                continue
            if col.set_members is not None:  # a SET: every subset, in declared order
                members = col.set_members[:6]
                domains[(t, i)] = [",".join(c) for n in range(len(members) + 1)
                                   for c in itertools.combinations(members, n)]
                continue
            values = list(_BASE.get(col.category, _BASE["text"]))
            for v, kind in groups.get(find((t, i)), []):
                values.extend(_neighbours(v, kind, col.category))
            seen: set = set()
            uniq = []
            for v in values:
                key = (type(v).__name__, v)
                if key in seen or not col.accepts(v) or (fold and isinstance(v, str) and v != v.rstrip(" ")):
                    continue
                seen.add(key)
                uniq.append(v)
            if not uniq:
                uniq = _type_defaults(col)
            domains[(t, i)] = sorted(uniq, key=_sort_key)
    return domains


# --------------------------------------------------------------------------------------------
# Instance generation
# --------------------------------------------------------------------------------------------


def _fresh(category: str, used: set, domain: list[Any], col: Any = None) -> Any:
    """A value of ``category`` outside ``used`` (and the column's declared type, when ``col``
    is given); None when the type has no such value left."""
    if col is not None and (col.enum is not None or col.set_members is not None):
        options = [v for v in domain if v not in used]
        return options[0] if options else None
    if category == "int":
        n = max([v for v in used if isinstance(v, int)] + [v for v in domain if isinstance(v, int)] + [0]) + 1
        if col is not None and not col.accepts(n):
            n = next((v for v in range(-128, 256) if v not in used and col.accepts(v)), None)
        return n
    if category in ("float", "decimal"):
        v = float(max([v for v in used if isinstance(v, float)] + [0.0]) + 1.0)
        if col is not None and not col.accepts(v):
            v = next((x / 10 for x in range(-9, 10) if x / 10 not in used and col.accepts(x / 10)), None)
        return v
    if category == "date":
        base = dt.date(2001, 1, 1) + dt.timedelta(days=len(used))
        return base.isoformat()
    if category == "timestamp":
        return (dt.datetime(2001, 1, 1) + dt.timedelta(days=len(used))).isoformat(sep=" ")
    if category == "json":
        return json.dumps(f"k{len(used)}")
    if category == "uuid":
        return f"00000000-0000-0000-0000-{len(used) + 100:012d}"
    if category == "time":
        return f"{len(used) % 24:02d}:{len(used) // 24 % 60:02d}:01"
    limit = col.length if col is not None else None
    if limit is not None and limit < 4:
        letters = "cdefghijklmnopqrstuvwxyz"
        for size in range(1, limit + 1):
            for combo in itertools.product(letters, repeat=size):
                v = "".join(combo)
                if v not in used:
                    return v
        return None
    n = len(used)
    while f"k{n}" in used:
        n += 1
    return f"k{n}"


#: A foreign-key value that points forward (a cycle or a self-reference), resolved once the
#: referenced rows exist.
_PENDING = object()


class InstanceGenerator:
    """Seeded generator of key-respecting instances over the analysed tables (see the module
    docstring for the shapes). :meth:`next` returns the next instance; the first is empty;
    :attr:`origin` says how the last one was made (``random``, ``large`` or ``guided: <the
    predicate> → <n> rows in <table>``).

    ``hints`` (:class:`SizeHint`, from the queries' predicates) are served round-robin as every
    third instance from the sixth on, each as ``size`` rows of one table in one group (or two),
    the ``distinct`` columns varied; from instance 150 on, every eighth instance is a *large*
    random one of up to ``3 × max_rows`` rows per table (at most ``row_budget``), half of them
    with fresh values (beyond the column's pool) in half the cells, so that a column can hold
    many distinct values. ``fold``: key values must differ case-insensitively and without
    trailing spaces (MySQL's collations)."""

    def __init__(self, schema: RelSchema, tables: Sequence[str], domains: dict[ColKey, list[Any]],
                 budget: FinderBudget, hints: Sequence[SizeHint] = (), fold: bool = False) -> None:
        self.schema = schema
        self.tables = list(tables)
        self.domains = domains
        self.budget = budget
        self.fold = fold
        self.rng = random.Random(budget.seed)
        self.count = 0
        self.hints = [h for h in hints if h.size <= budget.row_budget and set(h.tables) & set(tables)]
        self.origin = "empty"
        self.fresh_p = 0.0
        self._fresh_used: dict[ColKey, set] = {}
        self._back = {(t, id(fk)) for t, fk in schema.back_edges(self.tables)}
        self.back_edges = schema.back_edges(self.tables)

    def _max_rows(self) -> int:
        k = self.count
        cap = 1 if k < 25 else 2 if k < 100 else 3 if k < 300 else self.budget.max_rows
        return min(cap, self.budget.max_rows)

    def next(self) -> Instance:
        """The next instance (``{table: [row tuples]}``)."""
        k = self.count
        self.count += 1
        if k == 0:
            self.origin = "empty"
            return {t: [] for t in self.tables}
        rng = self.rng
        if self.hints and k >= 5 and k % 3 == 2:
            return self._guided(self.hints[(k // 3) % len(self.hints)])
        null_p = rng.choice((0.0, 0.0, 0.2, 0.5))
        dup_p = rng.choice((0.0, 0.3, 0.6))
        cap = self._max_rows()
        self.origin = "random"
        self.fresh_p = 0.0
        self._fresh_used = {}
        if k >= 150 and k % 8 == 4:
            cap = max(cap, min(self.budget.row_budget, 3 * self.budget.max_rows))
            dup_p = rng.choice((0.0, 0.3, 0.6, 0.9))
            self.fresh_p = rng.choice((0.0, 0.5))
            self.origin = "large"
        sizes = {t: (rng.randint(1, cap) if rng.random() < 0.75 else 0) for t in self.tables}
        return self._fill(sizes, null_p, dup_p)

    def _fill(self, sizes: dict[str, int], null_p: float, dup_p: float,
              special: Callable[[str, int, Instance], list[tuple]] | None = None,
              focus: str | None = None) -> Instance:
        # a child with rows needs rows in the tables its NOT NULL foreign keys reference
        for t in reversed(self.tables):
            table = self.schema.tables[t]
            if not sizes[t]:
                continue
            for fk in table.foreign_keys:
                if fk.ref_table != t and fk.ref_table in sizes and any(
                        table.column(c).not_null for c in fk.columns):
                    sizes[fk.ref_table] = max(sizes[fk.ref_table], 1)
        inst: Instance = {}
        for t in self.tables:
            if t == focus and special is not None:
                inst[t] = special(t, sizes[t], inst)
            else:
                inst[t] = self._rows(t, sizes[t], inst, null_p, dup_p)
        if self.back_edges:
            inst = self._resolve_pending(inst, null_p)
        return inst

    def _resolve_pending(self, inst: Instance, null_p: float) -> Instance:
        """Fill forward-pointing foreign keys (cycles, self-references) from the referenced
        rows, now that every table has its rows; a row whose NOT NULL reference finds no row
        is dropped, and :func:`cascade` and the keys are restored after."""
        rng = self.rng
        for t, fk in self.back_edges:
            table = self.schema.tables[t]
            parent = self.schema.tables[fk.ref_table]
            idx = [table.index(c) for c in fk.columns]
            pidx = [parent.index(c) for c in fk.ref_columns]
            nullable = all(not table.columns[i].not_null for i in idx)
            rows = []
            for ri, row in enumerate(inst.get(t, [])):
                if not any(row[i] is _PENDING for i in idx):
                    rows.append(row)
                    continue
                r = list(row)
                targets = inst.get(fk.ref_table, [])
                if fk.ref_table == t:
                    targets = [x for x in inst[t][:ri + 1]]  # earlier rows or the row itself
                    if targets and targets[-1] is row:
                        targets[-1] = tuple(r)
                targets = [x for x in targets if all(x[j] is not None and x[j] is not _PENDING for j in pidx)]
                if targets and not (nullable and rng.random() < max(null_p, 0.25)):
                    pick = rng.choice(targets)
                    for i, j in zip(idx, pidx):
                        r[i] = pick[j]
                elif nullable:
                    for i in idx:
                        r[i] = None
                else:
                    continue  # no row to reference: the row cannot exist
                rows.append(tuple(r))
            inst[t] = rows
        for t in self.tables:  # any pending value left (a parent row dropped) → drop the row
            inst[t] = [r for r in inst[t] if not any(v is _PENDING for v in r)]
        return self._keys_hold(cascade(self.schema, self.tables, inst))

    def _keys_hold(self, inst: Instance) -> Instance:
        out = {}
        for t, rows in inst.items():
            table = self.schema.tables[t]
            keys = [tuple(table.index(c) for c in key) for key in table.keys]
            seen: list[set] = [set() for _ in keys]
            kept = []
            for r in rows:
                vals = [self._key_value(table, key, r) for key in keys]
                if any(v is not None and v in seen[k] for k, v in enumerate(vals)):
                    continue
                for k, v in enumerate(vals):
                    if v is not None:
                        seen[k].add(v)
                kept.append(r)
            out[t] = kept
        return cascade(self.schema, self.tables, out) if any(len(out[t]) != len(inst[t]) for t in out) else out

    def _key_value(self, table: Table, key: tuple[int, ...], row: Sequence[Any]) -> tuple | None:
        """The value of a key in a row as uniqueness sees it (None: never collides — a NULL
        under a plain UNIQUE key)."""
        value = tuple(row[i] for i in key)
        names = tuple(table.columns[i].name for i in key)
        if any(v is None for v in value) and names not in table.nulls_not_distinct:
            return None
        if any(v is _PENDING for v in value):
            return None
        prefixes = table.key_prefixes.get(names)
        if prefixes:  # MySQL prefix key: the first n characters must differ
            value = tuple(str(v)[:prefixes[c.lower()]] if v is not None and c.lower() in prefixes else v
                          for v, c in zip(value, names))
        return tuple(_fold(v) for v in value) if self.fold else value

    def _guided(self, hint: SizeHint) -> Instance:
        """``hint.size`` rows in one of the hint's tables, mostly one group."""
        rng = self.rng
        focus = rng.choice([t for t in hint.tables if t in self.tables])
        table = self.schema.tables[focus]
        small = min(2, self.budget.max_rows)
        sizes = {t: (rng.randint(1, small) if rng.random() < 0.8 else 0) for t in self.tables}
        sizes[focus] = hint.size
        # rows whose keys are all foreign-key columns need as many distinct parent rows
        fk_cols = {c.lower() for fk in table.foreign_keys for c in fk.columns}
        if any(key and all(c.lower() in fk_cols for c in key) for key in table.keys):
            for fk in table.foreign_keys:
                if fk.ref_table in sizes and fk.ref_table != focus:
                    sizes[fk.ref_table] = max(sizes[fk.ref_table], hint.size)
        dup_p = rng.choice((1.0, 1.0, 0.85))
        null_p = rng.choice((0.0, 0.0, 0.2))
        vary_p = rng.choice((0.0, 0.3))
        hold = {i for t, i in hint.hold if t == focus}
        distinct = [i for t, i in hint.distinct if t == focus]
        keycols = {table.index(c) for key in table.keys for c in key}

        def group(t: str, n: int, inst: Instance) -> list[tuple]:
            rows = [list(r) for r in self._rows(t, n, inst, null_p, dup_p)]
            taken: dict[int, set] = {}
            for r in rows[1:]:
                for i, col in enumerate(table.columns):
                    if i in keycols or i in hold or self._is_fk(table, i) or col.generated is not None:
                        continue
                    if i in distinct:
                        if rng.random() < 0.85:
                            used = taken.setdefault(i, {rows[0][i]})
                            options = [v for v in self.domains[(t, i)] if v not in used]
                            value = options[0] if options else _fresh(col.category, used, self.domains[(t, i)], col)
                            if value is not None:
                                r[i] = value
                                used.add(r[i])
                    elif vary_p and rng.random() < vary_p:
                        r[i] = None if (not col.not_null and rng.random() < null_p) else rng.choice(self.domains[(t, i)])
            return [tuple(r) for r in rows]

        self.fresh_p = 0.0
        inst = self._fill(sizes, null_p, 0.3, group, focus)
        self.origin = f"guided: {hint.reason} → {len(inst[focus])} rows in {table.name}"
        return inst

    def _is_fk(self, table: Table, i: int) -> bool:
        name = table.columns[i].name.lower()
        return any(name == c.lower() for fk in table.foreign_keys for c in fk.columns)

    def _rows(self, t: str, n: int, inst: Instance, null_p: float, dup_p: float) -> list[tuple]:
        rng = self.rng
        table = self.schema.tables[t]
        rows: list[tuple] = []
        keys = [tuple(table.index(c) for c in key) for key in table.keys]
        used: list[set] = [set() for _ in keys]
        fk_cols = {table.index(c) for fk in table.foreign_keys for c in fk.columns}
        for _ in range(n):
            for _attempt in range(8):
                if rows and rng.random() < dup_p:
                    row = list(rng.choice(rows))
                else:
                    row = self._fresh_row(t, table, inst, null_p)
                    if row is None:
                        return rows
                ok = True
                for ki, key in enumerate(keys):
                    value = self._key_value(table, key, row)
                    if value is None:
                        continue  # NULLs never collide in a UNIQUE key (PK columns are NOT NULL)
                    if value in used[ki]:
                        # make the copy distinct on this key: new values for its non-FK columns
                        free = [i for i in key if i not in fk_cols and table.columns[i].generated is None]
                        if not free:
                            # a key made of foreign keys: point the copy at other parent rows
                            fresh = self._fresh_row(t, table, inst, 0.0)
                            if fresh is None or self._key_value(table, key, fresh) in used[ki]:
                                ok = False
                                break
                            for i in fk_cols:
                                row[i] = fresh[i]
                            continue
                        for i in free:
                            col = table.columns[i]
                            taken = {r[i] for r in rows} | ({_fold(r[i]) for r in rows} if self.fold else set())
                            options = [v for v in self.domains[(t, i)]
                                       if v not in taken and (not self.fold or _fold(v) not in taken)]
                            value = rng.choice(options) if options else _fresh(col.category, taken, self.domains[(t, i)], col)
                            if value is None:
                                ok = False
                                break
                            row[i] = value
                        if not ok or self._key_value(table, key, row) in used[ki]:
                            ok = False
                            break
                ok = ok and all(
                    self._key_value(table, key, row) is None or self._key_value(table, key, row) not in used[ki]
                    for ki, key in enumerate(keys)
                )
                if ok:
                    for ki, key in enumerate(keys):
                        value = self._key_value(table, key, row)
                        if value is not None:
                            used[ki].add(value)
                    rows.append(tuple(row))
                    break
        return rows

    def _fresh_row(self, t: str, table: Table, inst: Instance, null_p: float) -> list | None:
        rng = self.rng
        row: list[Any] = [None] * len(table.columns)
        assigned: set[int] = set()
        for fk in table.foreign_keys:
            idx = [table.index(c) for c in fk.columns]
            nullable = all(not table.columns[i].not_null for i in idx)
            parent = self.schema.tables[fk.ref_table]
            if (t, id(fk)) in self._back:
                # the referenced rows come later (a cycle) or are this table's own rows
                for i in idx:
                    row[i] = _PENDING
                assigned.update(idx)
                continue
            prow = inst.get(fk.ref_table) if fk.ref_table in self.tables else None
            if prow and not (nullable and rng.random() < null_p):
                pick = rng.choice(prow)
                for i, rc in zip(idx, fk.ref_columns):
                    row[i] = pick[parent.index(rc)]
            elif nullable:
                for i in idx:
                    row[i] = None
            else:
                return None
            assigned.update(idx)
        for i, col in enumerate(table.columns):
            if i in assigned or col.generated is not None:
                continue
            if not col.not_null and rng.random() < null_p:
                row[i] = None
            elif self.fresh_p and not enum_values(col) and rng.random() < self.fresh_p:
                # a value of its own (large instances: many distinct values in one column)
                used = {r[i] for r in inst.get(t, [])} | set(self._fresh_used.setdefault((t, i), set()))
                value = _fresh(col.category, used, self.domains[(t, i)], col)
                row[i] = value if value is not None else rng.choice(self.domains[(t, i)])
                self._fresh_used[(t, i)].add(row[i])
            else:
                row[i] = rng.choice(self.domains[(t, i)])
        return row


# --------------------------------------------------------------------------------------------
# The finder
# --------------------------------------------------------------------------------------------


def cascade(schema: RelSchema, tables: Sequence[str], instance: Instance) -> Instance:
    """Drop rows whose (non-NULL) foreign-key values are missing from the referenced table,
    parents first, until every foreign key holds."""
    out = {t: list(instance.get(t, [])) for t in tables}
    changed = True
    while changed:
        changed = False
        for t in tables:
            table = schema.tables[t]
            for fk in table.foreign_keys:
                if fk.ref_table not in out:
                    continue
                parent = schema.tables[fk.ref_table]
                pidx = [parent.index(c) for c in fk.ref_columns]
                present = {tuple(r[i] for i in pidx) for r in out[fk.ref_table]}
                idx = [table.index(c) for c in fk.columns]
                keep = [r for r in out[t]
                        if any(r[i] is None for i in idx) or tuple(r[i] for i in idx) in present]
                if len(keep) != len(out[t]):
                    out[t] = keep
                    changed = True
    return out


class _Runner:
    """Runs both queries on instances in one sandbox and decides separation
    (:func:`tasks.equivalence.instances.separation`). An instance on which exactly one query raises
    separates nothing; the first such instance and its error are kept (:attr:`one_sided`).
    A query over the per-query time limit is a timeout (counted, never an error). Each query
    gets at most the time left until :attr:`deadline`."""

    def __init__(self, box: Sandbox, q1: EngineQuery, q2: EngineQuery, match: MatchOptions,
                 ordered: bool, fold: bool, deadline: float, abs_tol: float | None = None) -> None:
        self.box, self.q1, self.q2 = box, q1, q2
        self.opts = {"ordered": ordered, "bag": match.bag, "permute_columns": match.permute_columns,
                     "fold": fold, "abs_tol": abs_tol}
        self.deadline = deadline
        self.runs = 0
        self.load_errors = 0
        self.last_load_error: str | None = None
        self.one_sided: tuple[Instance, str] | None = None
        self.one_sided_count = 0
        self.timeouts = 0
        self.last_timeout: str | None = None
        self.choice_count = 0
        self.choice_reasons: list[str] = []

    def _run(self, sql: str) -> Outcome:
        left = self.deadline - time.perf_counter()
        return self.box.run(sql, timeout_s=max(0.05, left))

    def outcomes(self, inst: Instance) -> tuple[Outcome, Outcome]:
        self.runs += 1
        try:
            self.box.load(inst)
        except self.box._errors as exc:
            # a value the engine refuses for a column type, or a CHECK the instance breaks:
            # not an instance, never separating
            self.load_errors += 1
            self.last_load_error = str(exc).splitlines()[0][:200]
            failed = Outcome(error="instance does not load")
            return failed, failed
        return self._run(self.q1.sql), self._run(self.q2.sql)

    def decide(self, outs: tuple[Outcome, Outcome], count: bool = False):
        """The :class:`tasks.equivalence.instances.Separation` of the loaded instance (``count``: record
        timeouts and choices for the report)."""
        a, b = outs
        if a.timeout or b.timeout:
            if count:
                self.timeouts += 1
                self.last_timeout = one_sided_timeout(a, b)
            return None
        if a.error is not None or b.error is not None:
            return None
        sep = separation(self._run, self.q1, self.q2, a, b, **self.opts)
        if count and sep.kind == "choice":
            self.choice_count += 1
            for part in sep.reason.split(" | "):
                if part not in self.choice_reasons and len(self.choice_reasons) < 6:
                    self.choice_reasons.append(part)
        return sep

    def note_one_sided(self, inst: Instance, outs: tuple[Outcome, Outcome]) -> None:
        """Count a search instance on which exactly one query fails (keep the first)."""
        message = one_sided_error(*outs)
        if message is not None:
            self.one_sided_count += 1
            if self.one_sided is None:
                self.one_sided = (inst, message)

    def separates(self, inst: Instance) -> bool:
        """``inst`` is a counterexample (the results differ in a way no arbitrary choice
        explains)."""
        sep = self.decide(self.outcomes(inst))
        return sep is not None and sep.certain

    def one_side_fails(self, inst: Instance) -> bool:
        """Exactly one query raises on ``inst`` (not counted as a search result)."""
        return one_sided_error(*self.outcomes(inst)) is not None


def _instance_key(inst: Instance) -> tuple:
    return tuple((t, tuple(sorted(rows, key=repr))) for t, rows in sorted(inst.items()))


def find_counterexample(
    sql1: str,
    sql2: str,
    schema: RelSchema,
    *,
    dialect: str | None = "duckdb",
    budget: FinderBudget | None = None,
    match: MatchOptions | None = None,
    engine: str = "auto",
    shrink: bool = True,
) -> FinderResult:
    """Search for a database instance on which ``sql1`` and ``sql2`` return different results
    (see :func:`_find`; a query nested too deeply for sqlglot is an ``error`` verdict, never a
    traceback)."""
    start = time.perf_counter()
    try:
        return _find(sql1, sql2, schema, dialect, budget, match, engine, shrink)
    except RecursionError:
        return FinderResult("error", error="a query is nested too deeply to analyse (sqlglot's "
                            "recursion limit)", seconds=time.perf_counter() - start)


def _find(sql1: str, sql2: str, schema: RelSchema, dialect: str | None, budget: FinderBudget | None,
          match: MatchOptions | None, engine: str, shrink: bool) -> FinderResult:
    """Search for a database instance on which ``sql1`` and ``sql2`` return different results.

    ``schema``: the tables with their keys (:class:`tasks.equivalence.instances.RelSchema`); ``dialect``:
    the sqlglot dialect of both queries (or ``ansi`` / ``calcite``); ``engine``: ``auto``
    (:func:`tasks.equivalence.instances.engine_for`: PostgreSQL for the postgres dialect, SQLite for
    sqlite, else DuckDB, falling back to SQLite — stated in ``readings`` — when DuckDB cannot
    bind a query that SQLite runs), or one of ``duckdb`` / ``sqlite`` / ``postgres``.
    ``budget``/``match``: see :class:`FinderBudget` and :class:`MatchOptions`. Returns a
    :class:`FinderResult` (errors are reported in it, not raised).
    """
    budget = budget or FinderBudget()
    match = match or MatchOptions()
    shown = dialect = dialect or "duckdb"
    start = time.perf_counter()
    deadline = start + budget.time_limit_s
    result = FinderResult("error", notes=[n for n in schema.notes if not n.startswith("schema DDL")],
                          readings=[n for n in schema.notes if n.startswith("schema DDL")])

    def fail(message: str) -> FinderResult:
        result.error = message
        result.seconds = time.perf_counter() - start
        return result

    try:
        dialect = sqlglot_dialect(dialect)  # ansi / calcite → sqlglot's neutral dialect
        reads = []
        for n, sql in enumerate((sql1, sql2), start=1):
            try:
                reads.append(adapt_to_schema(read_query(sql, dialect), schema))
            except ValueError as exc:
                return fail(f"sql{n} {exc}")
    except ValueError as exc:
        return fail(f"query does not parse: {exc}")
    for n, q in enumerate(reads, start=1):
        result.readings.extend(f"sql{n}: {r}" for r in q.readings)
    try:
        analysis = _Analysis(schema, [q.tree for q in reads], dialect)
    except KeyError as exc:
        return fail(str(exc).strip('"'))
    except RecursionError:
        return fail("a query is nested too deeply to analyse")
    for q in reads:
        from tasks.equivalence.sql_dialects import strip_qualifiers

        _, dropped = strip_qualifiers(q.tree)
        if dropped:
            result.readings.append(f"table qualifiers dropped for the sandbox ({', '.join(dropped[:4])} → "
                                   "one schema holds every table)")
            break
    result.type_errors = list(analysis.type_errors)
    ordered = match.order == "always" or (
        match.order == "auto" and all(q.tree.args.get("order") is not None for q in reads))
    first = engine_for(shown, engine)
    result.engine = first.engine
    domains = build_domains(schema, analysis, fold=first.mysql)
    tables = analysis.tables
    result.size_hints = [f"{h.reason} → {h.size} rows" for h in analysis.hints
                         if h.size <= budget.row_budget]
    over = sorted({(h.reason, h.size) for h in analysis.hints if h.size > budget.row_budget})
    if over:
        result.notes.append(f"{len(over)} instance size(s) the predicates ask for exceed the row "
                            f"budget {budget.row_budget} and were not tried (e.g. {over[0][0]} → "
                            f"{over[0][1]} rows)")
    candidates = [first]
    if engine == "auto" and first.engine == "duckdb" and not first.integer_division:
        candidates.append(EngineChoice("sqlite", mysql=first.mysql, readings=[
            r.replace("DuckDB", "SQLite") for r in first.readings]))
    pg = None
    box = runner = None
    chosen: EngineChoice | None = None
    errors = []
    try:
        if first.engine == "postgres":
            from tasks.db.pg_scratch import PostgresUnavailable, ScratchDatabase

            try:
                pg = ScratchDatabase()
            except (PostgresUnavailable, Exception) as exc:  # noqa: BLE001 - stated, then DuckDB
                return fail(f"no scratch PostgreSQL database: {exc}")
        for cand in candidates:
            eng = cand.engine
            try:
                q1, q2 = prepare_query(reads[0], schema, cand), prepare_query(reads[1], schema, cand)
                many = max(sum(1 for _ in q.tree.find_all(exp.Table)) for q in reads) >= 6
                box = Sandbox(schema, tables, eng, checks=True, query_timeout_s=budget.query_timeout_s,
                              mysql=cand.mysql, integer_division=cand.integer_division, pg=pg,
                              many_joins=many)
            except (SqlglotError, SchemaError, ValueError) as exc:
                errors.append(f"{eng}: {exc}")
                continue
            except RecursionError:
                errors.append(f"{eng}: a query is nested too deeply to write for the engine")
                continue
            runner = _Runner(box, q1, q2, match, ordered, cand.mysql, deadline,
                             cand.abs_tol(reads[0].tree, reads[1].tree))
            empty_outcome = runner.outcomes({t: [] for t in tables})
            bad = [(i + 1, o.error) for i, o in enumerate(empty_outcome) if o.error is not None and not o.timeout]
            if not bad:
                chosen = cand
                result.engine = eng
                result.notes.extend(box.notes)
                result.readings.extend(cand.readings)
                if eng != candidates[0].engine:
                    result.readings.append(
                        f"engine fallback: ran on {eng}, whose semantics differ from {shown}'s "
                        f"(type affinity, comparisons), because {errors[-1]}")
                break
            errors.append(f"{eng}: " + "; ".join(f"sql{i} fails on the empty database: {e}" for i, e in bad))
            box.close()
            box = runner = None
        if box is None or runner is None or chosen is None:
            return fail(errors[0] if errors else "no engine")
        for n, q in enumerate((q1, q2), start=1):
            if q.plan.choices:
                result.choices.extend(f"sql{n}: {c}" for c in q.plan.choices if f"sql{n}: {c}" not in result.choices)
        _search(result, runner, schema, tables, analysis, domains, budget, match, ordered, chosen,
                sql1, sql2, dialect, pg, shrink, start, deadline, empty_outcome)
    finally:
        if box is not None:
            box.close()
        if pg is not None:
            pg.close()
    result.seconds = time.perf_counter() - start
    return result


def _search(result: FinderResult, runner: _Runner, schema: RelSchema, tables: list[str],
            analysis: _Analysis, domains, budget: FinderBudget, match: MatchOptions,
            ordered: bool, chosen: EngineChoice, sql1: str, sql2: str, dialect: str, pg,
            shrink: bool, start: float, deadline: float, empty_outcome) -> None:
    """The search loop of :func:`find_counterexample` (fills ``result``)."""
    box = runner.box
    gen = InstanceGenerator(schema, tables, domains, budget, analysis.hints, fold=chosen.mysql)
    seen: set = set()
    tried = misses = rejected = failed_checks = 0
    uncertifiable: str | None = None
    last_check_error = ""
    shrink_s = 0.0
    exhausted = False
    shrink_deadline = deadline

    def verify(inst: Instance):
        script = render_instance(schema, inst, dialect, tables=analysis.queried)
        check = verify_counterexample(
            sql1, sql2, script, dialect=dialect, schema=schema, choice=chosen,
            ordered=ordered, bag=match.bag, permute_columns=match.permute_columns,
            query_timeout_s=budget.query_timeout_s, pg=pg,
        )
        return script, check

    def stop() -> bool:
        return time.perf_counter() > shrink_deadline

    while tried < budget.max_instances and time.perf_counter() < deadline:
        inst = gen.next()
        key = _instance_key(inst)
        if key in seen:
            misses += 1
            if misses > 2000:  # consecutive repeats: the small instance space is used up
                exhausted = True
                result.notes.append("instance space exhausted before the budget")
                break
            continue
        misses = 0
        seen.add(key)
        if tried == 0:
            outs = empty_outcome
            box.load(inst)
        else:
            outs = runner.outcomes(inst)
        tried += 1
        runner.note_one_sided(inst, outs)
        sep = runner.decide(outs, count=True)
        if sep is None or not sep.certain:
            continue
        # a candidate: shrink it, render it, and check the script on a fresh database
        t0 = time.perf_counter()
        shrink_deadline = max(deadline, t0 + budget.time_limit_s / 4)
        runner.deadline = shrink_deadline
        small = _shrink(schema, tables, inst, runner.separates, stop) if shrink else inst
        script, check = verify(small)
        if not check.separates and small is not inst:
            small = inst
            script, check = verify(small)
            if check.separates:
                result.notes.append("the shrunk instance did not verify; reporting it unshrunk")
        runner.deadline = deadline
        shrink_s += time.perf_counter() - t0
        if not check.separates:
            # e.g. an arbitrary choice the fresh database made another way: keep searching
            if check.choice or not check.error:
                rejected += 1
            else:
                failed_checks += 1
                last_check_error = check.error
                if check.error.startswith("CHECK constraints of table"):
                    uncertifiable = check.error
                    break  # no database can be certified on this engine: stop searching
            continue
        if stop():
            result.notes.append("shrinking stopped at the time limit: the counterexample is "
                                "verified but may not be minimal")
        result.verdict = "not_equivalent"
        result.found_at = tried - 1
        result.rows_before_shrink = instance_rows(inst)
        result.found_by = gen.origin
        result.instance = {t: [list(r) for r in rows] for t, rows in small.items() if rows}
        result.rows = instance_rows(small)
        result.counterexample = script
        result.verified = True
        result.result1, result.result2 = check.result1, check.result2
        break
    result.one_sided_errors = runner.one_sided_count
    result.timeouts = runner.timeouts
    result.choice_instances = runner.choice_count
    for r in runner.choice_reasons:
        if r not in result.choices:
            result.choices.append(r)
    result.hit_time_limit = (result.verdict != "not_equivalent" and not exhausted
                             and tried < budget.max_instances and time.perf_counter() >= deadline)
    if result.verdict != "not_equivalent":
        result.verdict = "no_counterexample_within_budget"
        if runner.one_sided is not None:
            t0 = time.perf_counter()
            shrink_deadline = t0 + budget.time_limit_s / 4
            failing, message = runner.one_sided
            runner.deadline = shrink_deadline
            small = _shrink(schema, tables, failing, runner.one_side_fails, stop) if shrink else failing
            shrink_s += time.perf_counter() - t0
            result.verdict = "error_on_instance"
            result.error = message
            result.error_script = render_instance(schema, small, dialect, tables=analysis.queried)
        elif runner.choice_count or rejected:
            result.verdict = "nondeterministic"
            result.choice_instances = runner.choice_count + rejected
        if runner.choice_count and result.verdict == "error_on_instance":
            result.notes.append(f"{runner.choice_count} instance(s) gave results that differ only "
                                "as an arbitrary choice of the SQL allows (not counted as differences)")
    elif runner.one_sided is not None:
        result.notes.append(f"{runner.one_sided_count} instance(s) made one query fail "
                            f"(first: {runner.one_sided[1]}); not counted as differences")
    if runner.timeouts:
        result.notes.append(f"{runner.timeouts} instance(s): a query hit the per-query time limit "
                            f"(last: {runner.last_timeout}); a timeout is neither an error nor a "
                            "result, those instances separate nothing")
    if runner.load_errors:
        result.notes.append(f"{runner.load_errors} instance(s) did not load "
                            f"(last: {runner.last_load_error})")
    if rejected:
        result.notes.append(f"{rejected} candidate(s) did not verify on a fresh database "
                            "(a difference an arbitrary choice explains there)")
    if failed_checks:
        result.notes.append(f"{failed_checks} candidate(s) could not be verified: {last_check_error} "
                            "(not counted as counterexamples)")
    if uncertifiable is not None and result.verdict != "not_equivalent":
        result.verdict = "error"
        result.error = (f"the queries differ on an instance, but {uncertifiable} (the pair needs an "
                        "engine that evaluates them)")
    if result.hit_time_limit:
        result.notes.append(f"the search stopped at its time limit ({budget.time_limit_s:g} s) "
                            f"after {tried} of {budget.max_instances} instance(s)")
    result.instances_tried = tried
    result.shrink_s = shrink_s
    result.search_s = time.perf_counter() - start - shrink_s


def _shrink(schema: RelSchema, tables: Sequence[str], inst: Instance,
            holds: Callable[[Instance], bool], stop: Callable[[], bool] | None = None) -> Instance:
    """ddmin over rows (with FK cascade), then simpler non-key values, keeping ``holds``
    (the instance separates the queries, or makes exactly one fail) true; ``stop()`` ends it
    early with the smallest instance found so far."""
    items = [(t, r) for t in tables for r in inst.get(t, [])]

    def build(sub: list[tuple[str, tuple]]) -> Instance:
        out: Instance = {t: [] for t in tables}
        for t, r in sub:
            out[t].append(r)
        return cascade(schema, tables, out)

    memo: dict[tuple, bool] = {}
    holds_raw = holds

    def holds(inst: Instance) -> bool:
        # many subsets cascade to the same instance (a removed parent takes its children)
        key = _instance_key(inst)
        if key not in memo:
            memo[key] = holds_raw(inst)
        return memo[key]

    kept = ddmin(items, lambda sub: holds(build(sub)), stop)
    best = build(kept)
    # simplify values that no key or foreign key depends on
    protected: set[tuple[str, int]] = set()
    for t in tables:
        table = schema.tables[t]
        for key in table.keys:
            protected.update((t, table.index(c)) for c in key)
        for fk in table.foreign_keys:
            protected.update((t, table.index(c)) for c in fk.columns)
            parent = schema.tables[fk.ref_table]
            protected.update((fk.ref_table, parent.index(c)) for c in fk.ref_columns)
        protected.update((t, i) for i, c in enumerate(table.columns) if c.generated is not None)
    attempts = 0
    changed = False
    for t in tables:
        table = schema.tables[t]
        for ri in range(len(best[t])):
            for ci, col in enumerate(table.columns):
                if (t, ci) in protected or (stop is not None and stop()):
                    continue
                current = best[t][ri][ci]
                if current is None:
                    continue
                for simple in _SIMPLE.get(col.category, []):
                    if simple == current or attempts >= 80 or not col.accepts(simple) or enum_values(col) \
                            or col.set_members is not None:
                        continue
                    attempts += 1
                    row = list(best[t][ri])
                    row[ci] = simple
                    trial = {k: list(v) for k, v in best.items()}
                    trial[t][ri] = tuple(row)
                    if holds(trial):
                        best = trial
                        changed = True
                        break
    if changed and not (stop is not None and stop()):  # a simpler value may make another row unnecessary
        items = [(t, r) for t in tables for r in best.get(t, [])]
        best = build(ddmin(items, lambda sub: holds(build(sub)), stop))
    return best
