"""Automatic counterexample finder for SQL (non-)equivalence.

Given two queries and a schema with its keys, search small database instances for one on which
the two queries return different results; shrink the first one found to a minimal one; emit it
as CREATE TABLE + INSERT statements. Verdicts:

- ``not_equivalent``: a counterexample was found, shrunk, rendered and *verified* by executing
  the rendered script on a fresh database with the schema's keys declared;
- ``no_counterexample_within_budget``: the budget (instances, seconds) ran out. Search alone
  never proves equivalence, so the finder never says ``equivalent``;
- ``error_on_instance``: no instance separated the results, but on some instance exactly one
  query raised a runtime error (DuckDB's conversion error for ``DNAME INT = 'SECURITY'``, a
  scalar subquery returning two rows). An error is not a result: such an instance is never a
  counterexample, the search goes on, and the first one (shrunk) is reported with its error;
- ``error``: a query does not parse, reads an unknown table, or fails on the empty database.

Queries are read by :mod:`tasks.sql_dialects` (rewrite-engine identifiers, MySQL ``||``,
``GROUP BY`` literals, ``UNIX_TIMESTAMP``); every reading that is not the dialect's plain one,
and a fallback from DuckDB to SQLite, is listed in :attr:`FinderResult.readings`. Comparisons
of a typed column with a string it cannot hold are listed as ``type_errors``.

How instances are made (deterministic for a given seed):

- tables: the tables both queries read plus those they reference through foreign keys;
- values per column: a small base pool of its type (``0, 1, 2`` / ``'a', 'b'`` / two dates ...,
  shared by all columns of a type so joins hit), the constants of both queries that are compared
  with the column (directly, through an aggregate, in IN / BETWEEN / LIKE) and their neighbours
  (``c-1, c, c+1``; a string matching a LIKE pattern; the next/previous string; ±1 day), spread
  over columns linked by equality predicates and foreign keys; NULL when the column is nullable;
- instance shapes: empty tables, 1 row per table first and growing to ``max_rows``, profiles
  with no/some/many NULLs and with duplicated rows (copies that differ only in their key
  columns, which also makes ties at MIN/MAX and in ORDER BY); later, now and then, *large*
  instances of up to ``3 × max_rows`` rows per table;
- predicate-guided shapes: ``COUNT`` compared with a constant (in HAVING, a correlated scalar
  subquery, an aggregate's alias tested outside), ``LIMIT`` / ``OFFSET``, ``NTILE`` / ``LAG``
  arguments and long IN lists ask for a number of rows (the constant and its neighbours); every
  third instance then puts that many rows in one of the predicate's tables, in one group (its
  GROUP BY and correlation columns held equal, a COUNT(DISTINCT c) column varied), up to the
  ``row_budget``. The size of the instance that separated a pair and how it was made are
  reported (``rows_before_shrink``, ``found_by``);
- CHECK constraints are declared in the search sandbox too, so an instance breaking one does not
  load (and is not counted as separating);
- keys honoured: PRIMARY KEY and UNIQUE values distinct, NOT NULL never NULL, FOREIGN KEY
  values taken from the referenced table's rows (or NULL when the column allows it).

An instance *separates* the queries when their results differ under the match options (bag
semantics by default, row order only when both queries have a top-level ORDER BY, column order
free) with its rows inserted in order **and** in reverse order — and, when a query may choose
arbitrarily among rows (LIMIT, window functions, DISTINCT ON, order-dependent aggregates,
SQLite's bare columns: :func:`tasks.instances.arbitrary_choices`), under rotations and shuffles
of the rows too, so that every one of three tied rows gets chosen once — and no result of one
query under some order equals a result of the other under another: a difference coming only
from an arbitrary choice among ties is not reported. A runtime error in one query while the
other returns rows is *not* a difference (see ``error_on_instance``).

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
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
from sqlglot import exp
from sqlglot.errors import SqlglotError

from schemas.equivalence import FinderBudget, MatchOptions
from tasks.instances import (
    Instance,
    Outcome,
    RelSchema,
    Sandbox,
    SchemaError,
    Table,
    arbitrary_choices,
    engine_sql,
    enum_values,
    instance_rows,
    one_sided_error,
    referenced_tables,
    render_instance,
    row_orders,
    same_outcome,
    verify_counterexample,
)
from tasks.sql_dialects import read_query, sqlglot_dialect

_COMPARISONS = (
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like, exp.ILike, exp.In,
    exp.Between, exp.Is, exp.NullSafeEQ, exp.NullSafeNEQ, exp.Glob,
)

_BASE: dict[str, list[Any]] = {
    "int": [0, 1, 2],
    "float": [0.0, 1.0, 2.5],
    "decimal": [0.0, 1.0, 2.5],
    "text": ["a", "b"],
    "other": ["a", "b"],
    "date": ["2000-01-01", "2000-01-02"],
    "timestamp": ["2000-01-01 00:00:00", "2000-01-02 00:00:00"],
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
      ``error_on_instance`` (no instance separated the results, but on some instance exactly
      one query raised: ``error`` says which and why, ``error_script`` is a minimal such
      database) / ``error``;
    - ``counterexample``: the minimal instance as a CREATE TABLE + INSERT script (in the pair's
      dialect), ``instance`` the same rows as ``{table: [row, ...]}``, ``rows`` their number;
    - ``verified``: the rendered script, executed on a fresh database with the keys declared,
      separates the queries. Always True with ``not_equivalent``: a candidate that does not
      verify (its difference came from an arbitrary choice among ties, say) is rejected and
      the search goes on; ``verify_error`` is kept for callers that verify other scripts;
    - ``result1``/``result2``: previews of both results on the counterexample;
    - ``instances_tried``: instances executed during the search (the budget spent),
      ``search_s``/``shrink_s``/``seconds``: wall time in seconds; ``found_at``: index of the
      first separating instance (0 = the empty database); ``rows_before_shrink``: the size of
      the instance that separated the queries (rows over all tables), ``found_by`` how it was
      made (``random``, ``large``, ``guided: <predicate> → <n> rows in <table>``);
    - ``size_hints``: the instance shapes the predicates asked for (and those over the row
      budget); ``type_errors``: type-incorrect comparisons in the queries
      (``DNAME INT = 'SECURITY'``); ``readings``: every non-default reading of the SQL (schema
      DDL in another dialect, ``||`` as concatenation, a GROUP BY literal as a constant, the
      engine fallen back to) — nothing is decided silently;
    - ``engine``: ``duckdb`` or ``sqlite``; ``notes``: e.g. constraints the schema reader dropped.
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
    engine: str = "duckdb"
    error: str | None = None
    error_script: str | None = None
    one_sided_errors: int = 0
    size_hints: list[str] = field(default_factory=list)
    type_errors: list[str] = field(default_factory=list)
    readings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line for logs and the ``explanation`` column."""
        if self.verdict == "not_equivalent":
            return (f"counterexample with {self.rows} row(s) (found at {self.rows_before_shrink} "
                    f"row(s), {self.found_by}) after {self.instances_tried} instance(s): "
                    f"sql1 → {self.result1}; sql2 → {self.result2}")
        if self.verdict == "error":
            return f"error: {self.error}"
        if self.verdict == "error_on_instance":
            extra = f"; {self.type_errors[0]}" if self.type_errors else ""
            return (f"no counterexample in {self.instances_tried} instance(s), but on "
                    f"{self.one_sided_errors} of them one query fails: {self.error}{extra} "
                    "(an error is not a result)")
        return (f"no counterexample in {self.instances_tried} instance(s), "
                f"{self.search_s:.2f} s (not a proof of equivalence)")

    def details(self) -> dict[str, Any]:
        """The facts behind the verdict as a JSON-able dict (the ``details`` column)."""
        return {
            "engine": self.engine, "found_at": self.found_at,
            "rows_before_shrink": self.rows_before_shrink, "found_by": self.found_by,
            "search_s": self.search_s, "shrink_s": self.shrink_s, "result1": self.result1,
            "result2": self.result2, "instance": self.instance,
            "one_sided_errors": self.one_sided_errors, "error_script": self.error_script,
            "size_hints": self.size_hints, "type_errors": self.type_errors,
            "readings": self.readings, "notes": self.notes,
        }


# --------------------------------------------------------------------------------------------
# Delta debugging
# --------------------------------------------------------------------------------------------


def ddmin(items: Sequence[Any], test: Callable[[list[Any]], bool]) -> list[Any]:
    """Zeller & Hildebrandt's ddmin: a 1-minimal sublist of ``items`` on which ``test`` holds.

    ``test(items)`` must hold. Keeps the order of ``items``; ``test`` results are cached by
    the chosen positions. 1-minimal: removing any single element makes ``test`` fail (the empty
    list is tried too).
    """
    cache: dict[tuple[int, ...], bool] = {}
    idx = list(range(len(items)))

    def t(sub: list[int]) -> bool:
        key = tuple(sub)
        if key not in cache:
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
        self.queried = [schema.table(t).name.lower() for t in names]
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

    def _scan(self, tree: exp.Expression, where: str, aliases: dict[str, str] | None = None) -> None:
        aliases = aliases if aliases is not None else self._aliases(tree)
        for node in tree.walk():
            if not isinstance(node, _COMPARISONS):
                continue
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
        return [(t + dt.timedelta(days=k)).isoformat(sep=" ") for k in (-1, 0, 1)]
    return [v]


def _sort_key(v: Any) -> tuple:
    return (type(v).__name__, v)


def build_domains(schema: RelSchema, analysis: _Analysis) -> dict[ColKey, list[Any]]:
    """Candidate non-NULL values for every column of the analysed tables."""
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
            values = list(_BASE.get(col.category, _BASE["text"]))
            for v, kind in groups.get(find((t, i)), []):
                values.extend(_neighbours(v, kind, col.category))
            seen: set = set()
            uniq = []
            for v in values:
                key = (type(v).__name__, v)
                if key not in seen:
                    seen.add(key)
                    uniq.append(v)
            domains[(t, i)] = sorted(uniq, key=_sort_key)
    return domains


# --------------------------------------------------------------------------------------------
# Instance generation
# --------------------------------------------------------------------------------------------


def _fresh(category: str, used: set, domain: list[Any]) -> Any:
    if category == "int":
        n = max([v for v in used if isinstance(v, int)] + [v for v in domain if isinstance(v, int)] + [0]) + 1
        return n
    if category in ("float", "decimal"):
        return float(max([v for v in used if isinstance(v, float)] + [0.0]) + 1.0)
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
    n = len(used)
    while f"k{n}" in used:
        n += 1
    return f"k{n}"


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
    many distinct values."""

    def __init__(self, schema: RelSchema, tables: Sequence[str], domains: dict[ColKey, list[Any]],
                 budget: FinderBudget, hints: Sequence[SizeHint] = ()) -> None:
        self.schema = schema
        self.tables = list(tables)
        self.domains = domains
        self.budget = budget
        self.rng = random.Random(budget.seed)
        self.count = 0
        self.hints = [h for h in hints if h.size <= budget.row_budget and set(h.tables) & set(tables)]
        self.origin = "empty"
        self.fresh_p = 0.0
        self._fresh_used: dict[ColKey, set] = {}

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
        return inst

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
                    if i in keycols or i in hold or self._is_fk(table, i):
                        continue
                    if i in distinct:
                        if rng.random() < 0.85:
                            used = taken.setdefault(i, {rows[0][i]})
                            options = [v for v in self.domains[(t, i)] if v not in used]
                            r[i] = options[0] if options else _fresh(col.category, used, self.domains[(t, i)])
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
                    value = tuple(row[i] for i in key)
                    if any(v is None for v in value):
                        continue  # NULLs never collide in a UNIQUE key (PK columns are NOT NULL)
                    if value in used[ki]:
                        # make the copy distinct on this key: new values for its non-FK columns
                        free = [i for i in key if i not in fk_cols]
                        if not free:
                            # a key made of foreign keys: point the copy at other parent rows
                            fresh = self._fresh_row(t, table, inst, 0.0)
                            if fresh is None or tuple(fresh[i] for i in key) in used[ki]:
                                ok = False
                                break
                            for i in fk_cols:
                                row[i] = fresh[i]
                            continue
                        for i in free:
                            col = table.columns[i]
                            taken = {r[i] for r in rows}
                            options = [v for v in self.domains[(t, i)] if v not in taken]
                            row[i] = rng.choice(options) if options else _fresh(col.category, taken, self.domains[(t, i)])
                        value = tuple(row[i] for i in key)
                        if value in used[ki]:
                            ok = False
                            break
                ok = ok and all(
                    any(row[i] is None for i in key) or tuple(row[i] for i in key) not in used[ki]
                    for ki, key in enumerate(keys)
                )
                if ok:
                    for ki, key in enumerate(keys):
                        used[ki].add(tuple(row[i] for i in key))
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
            prow = inst.get(fk.ref_table) if fk.ref_table != t else None
            if fk.ref_table not in self.tables:
                prow = None
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
            if i in assigned:
                continue
            if not col.not_null and rng.random() < null_p:
                row[i] = None
            elif self.fresh_p and not enum_values(col) and rng.random() < self.fresh_p:
                # a value of its own (large instances: many distinct values in one column)
                used = {r[i] for r in inst.get(t, [])} | set(self._fresh_used.setdefault((t, i), set()))
                row[i] = _fresh(col.category, used, self.domains[(t, i)])
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
    """Runs both queries on instances in one sandbox and decides separation. An instance on
    which exactly one query raises separates nothing; the first such instance and its error
    are kept (:attr:`one_sided`)."""

    def __init__(self, box: Sandbox, q1: str, q2: str, match: MatchOptions, ordered: bool,
                 many_orders: bool = False) -> None:
        self.box, self.q1, self.q2 = box, q1, q2
        self.many_orders = many_orders
        self.opts = {"ordered": ordered, "bag": match.bag, "permute_columns": match.permute_columns}
        self.runs = 0
        self.load_errors = 0
        self.last_load_error: str | None = None
        self.one_sided: tuple[Instance, str] | None = None
        self.one_sided_count = 0

    def outcomes(self, inst: Instance) -> tuple[Outcome, Outcome]:
        self.runs += 1
        try:
            self.box.load(inst)
        except (duckdb.Error, sqlite3.Error) as exc:
            # a value the engine refuses for a column type, or a CHECK the instance breaks:
            # not an instance, never separating
            self.load_errors += 1
            self.last_load_error = str(exc).splitlines()[0][:200]
            failed = Outcome(error="instance does not load")
            return failed, failed
        return self.box.run(self.q1), self.box.run(self.q2)

    def differ(self, a: Outcome, b: Outcome) -> bool:
        if a.error is not None or b.error is not None:
            return False  # both fail, or one does: an error is not a result
        return not same_outcome(a, b, **self.opts)

    def note_one_sided(self, inst: Instance, outs: tuple[Outcome, Outcome]) -> None:
        """Count a search instance on which exactly one query fails (keep the first)."""
        message = one_sided_error(*outs)
        if message is not None:
            self.one_sided_count += 1
            if self.one_sided is None:
                self.one_sided = (inst, message)

    def separates(self, inst: Instance, first: tuple[Outcome, Outcome] | None = None) -> bool:
        """The results differ under every row order tried (:func:`row_orders`: the reversal,
        and rotations and shuffles when a query may choose arbitrarily among rows): no result
        of sql1 under one order equals a result of sql2 under another."""
        a1, a2 = first if first is not None else self.outcomes(inst)
        if not self.differ(a1, a2):
            return False
        names = list(inst)
        seen1, seen2 = [a1], [a2]
        for order in row_orders([len(inst[t]) for t in names], self.many_orders)[1:]:
            b1, b2 = self.outcomes({t: [inst[t][i] for i in p] for t, p in zip(names, order)})
            if b1.error is not None or b2.error is not None:
                return False
            seen1.append(b1)
            seen2.append(b2)
            if not all(self.differ(x, y) for x in seen1 for y in seen2):
                return False
        return True

    def one_side_fails(self, inst: Instance) -> bool:
        """Exactly one query raises on ``inst`` (not counted as a search result)."""
        return one_sided_error(*self.outcomes(inst)) is not None


def _instance_key(inst: Instance) -> tuple:
    return tuple((t, tuple(sorted(rows, key=repr))) for t, rows in sorted(inst.items()))


def _choose_engine(dialect: str | None, engine: str) -> str:
    if engine != "auto":
        return engine
    return "sqlite" if dialect == "sqlite" else "duckdb"


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
    """Search for a database instance on which ``sql1`` and ``sql2`` return different results.

    ``schema``: the tables with their keys (:class:`tasks.instances.RelSchema`); ``dialect``:
    the sqlglot dialect of both queries (or ``ansi`` / ``calcite``); ``engine``: ``auto``
    (SQLite for the sqlite dialect, else DuckDB, falling back to SQLite — stated in
    ``readings`` — when DuckDB cannot bind a query that SQLite runs), ``duckdb`` or
    ``sqlite``. ``budget``/``match``: see :class:`FinderBudget` and :class:`MatchOptions`.
    Returns a :class:`FinderResult` (errors are reported in it, not raised).
    """
    budget = budget or FinderBudget()
    match = match or MatchOptions()
    shown = dialect = dialect or "duckdb"
    start = time.perf_counter()
    result = FinderResult("error", notes=[n for n in schema.notes if not n.startswith("schema DDL")],
                          readings=[n for n in schema.notes if n.startswith("schema DDL")])

    def fail(message: str) -> FinderResult:
        result.error = message
        result.seconds = time.perf_counter() - start
        return result

    try:
        dialect = sqlglot_dialect(dialect)  # ansi / calcite → sqlglot's neutral dialect
        reads = [read_query(sql1, dialect), read_query(sql2, dialect)]
    except ValueError as exc:
        return fail(f"query does not parse: {exc}")
    for n, q in enumerate(reads, start=1):
        result.readings.extend(f"sql{n}: {r}" for r in q.readings)
    try:
        analysis = _Analysis(schema, [q.tree for q in reads], dialect)
    except KeyError as exc:
        return fail(str(exc).strip('"'))
    result.type_errors = list(analysis.type_errors)
    ordered = match.order == "always" or (
        match.order == "auto" and all(q.tree.args.get("order") is not None for q in reads))
    domains = build_domains(schema, analysis)
    tables = analysis.tables
    result.size_hints = [f"{h.reason} → {h.size} rows" for h in analysis.hints
                         if h.size <= budget.row_budget]
    over = sorted({(h.reason, h.size) for h in analysis.hints if h.size > budget.row_budget})
    if over:
        result.notes.append(f"{len(over)} instance size(s) the predicates ask for exceed the row "
                            f"budget {budget.row_budget} and were not tried (e.g. {over[0][0]} → "
                            f"{over[0][1]} rows)")
    candidates = [_choose_engine(dialect, engine)]
    if engine == "auto" and candidates[0] == "duckdb":
        candidates.append("sqlite")
    box = runner = None
    empty_outcome: tuple[Outcome, Outcome] | None = None
    errors = []
    for eng in candidates:
        try:
            q1, q2 = engine_sql(reads[0], dialect, eng), engine_sql(reads[1], dialect, eng)
            box = Sandbox(schema, tables, eng, checks=True, query_timeout_s=budget.query_timeout_s)
        except (SqlglotError, SchemaError, ValueError) as exc:
            errors.append(f"{eng}: {exc}")
            continue
        many = any(arbitrary_choices(q.tree, eng) for q in reads)
        runner = _Runner(box, q1, q2, match, ordered, many)
        empty_outcome = runner.outcomes({t: [] for t in tables})
        bad = [(i + 1, o.error) for i, o in enumerate(empty_outcome) if o.error is not None]
        if not bad:
            result.engine = eng
            result.notes.extend(box.notes)
            if eng != candidates[0]:
                result.readings.append(
                    f"engine fallback: ran on {eng}, whose semantics differ from {shown}'s "
                    f"(type affinity, comparisons), because {errors[-1]}")
            break
        errors.append(f"{eng}: " + "; ".join(f"sql{i} fails on the empty database: {e}" for i, e in bad))
        box.close()
        box = runner = None
    if box is None or runner is None:
        return fail(errors[0] if errors else "no engine")
    try:
        gen = InstanceGenerator(schema, tables, domains, budget, analysis.hints)
        seen: set = set()
        tried = misses = rejected = 0
        shrink_s = 0.0
        deadline = start + budget.time_limit_s

        def verify(inst: Instance):
            script = render_instance(schema, inst, dialect, tables=analysis.queried)
            check = verify_counterexample(
                sql1, sql2, script, dialect=dialect, schema=schema, engine=result.engine,
                ordered=ordered, bag=match.bag, permute_columns=match.permute_columns,
                query_timeout_s=budget.query_timeout_s,
            )
            return script, check

        while tried < budget.max_instances and time.perf_counter() < deadline:
            inst = gen.next()
            key = _instance_key(inst)
            if key in seen:
                misses += 1
                if misses > 2000:  # consecutive repeats: the small instance space is used up
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
            if not (runner.differ(*outs) and runner.separates(inst, outs)):
                continue
            # a candidate: shrink it, render it, and check the script on a fresh database
            t0 = time.perf_counter()
            small = _shrink(schema, tables, inst, runner.separates) if shrink else inst
            script, check = verify(small)
            if not check.separates and small is not inst:
                small = inst
                script, check = verify(small)
                if check.separates:
                    result.notes.append("the shrunk instance did not verify; reporting it unshrunk")
            shrink_s += time.perf_counter() - t0
            if not check.separates:
                # e.g. the difference came from an arbitrary choice among ties that the
                # fresh database made the other way: not a counterexample, keep searching
                rejected += 1
                continue
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
        if result.verdict != "not_equivalent":
            result.verdict = "no_counterexample_within_budget"
            if runner.one_sided is not None:
                t0 = time.perf_counter()
                failing, message = runner.one_sided
                small = _shrink(schema, tables, failing, runner.one_side_fails) if shrink else failing
                shrink_s += time.perf_counter() - t0
                result.verdict = "error_on_instance"
                result.error = message
                result.error_script = render_instance(schema, small, dialect, tables=analysis.queried)
        elif runner.one_sided is not None:
            result.notes.append(f"{runner.one_sided_count} instance(s) made one query fail "
                                f"(first: {runner.one_sided[1]}); not counted as differences")
        if runner.load_errors:
            result.notes.append(f"{runner.load_errors} instance(s) did not load "
                                f"(last: {runner.last_load_error})")
        if rejected:
            result.notes.append(f"{rejected} candidate(s) separated the queries only by an "
                                "arbitrary choice (rejected on a fresh database)")
        result.instances_tried = tried
        result.shrink_s = shrink_s
        result.search_s = time.perf_counter() - start - shrink_s
    finally:
        box.close()
    result.seconds = time.perf_counter() - start
    return result


def _shrink(schema: RelSchema, tables: Sequence[str], inst: Instance,
            holds: Callable[[Instance], bool]) -> Instance:
    """ddmin over rows (with FK cascade), then simpler non-key values, keeping ``holds``
    (the instance separates the queries, or makes exactly one fail) true."""
    items = [(t, r) for t in tables for r in inst.get(t, [])]

    def build(sub: list[tuple[str, tuple]]) -> Instance:
        out: Instance = {t: [] for t in tables}
        for t, r in sub:
            out[t].append(r)
        return cascade(schema, tables, out)

    kept = ddmin(items, lambda sub: holds(build(sub)))
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
    attempts = 0
    changed = False
    for t in tables:
        table = schema.tables[t]
        for ri in range(len(best[t])):
            for ci, col in enumerate(table.columns):
                if (t, ci) in protected:
                    continue
                current = best[t][ri][ci]
                if current is None:
                    continue
                for simple in _SIMPLE.get(col.category, []):
                    if simple == current or attempts >= 80:
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
    if changed:  # a simpler value may make another row unnecessary
        items = [(t, r) for t in tables for r in best.get(t, [])]
        best = build(ddmin(items, lambda sub: holds(build(sub))))
    return best
