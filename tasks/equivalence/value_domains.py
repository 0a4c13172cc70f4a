"""Value domains for the counterexample finder: what it reads off a query's SQL (the constants
each column is compared with, the columns joined or correlated, size hints such as LIMIT and
COUNT thresholds — :class:`_Analysis`) and the candidate values per column built from them
(:func:`build_domains`: the constants, their neighbours, LIKE examples, type defaults).

Split out of :mod:`tasks.equivalence.counterexample`; the code moved verbatim."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from tasks.equivalence.instances import RelSchema, enum_values, referenced_tables


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
        from tasks.db.relschema import _INT_RANGES

        lo, hi = _INT_RANGES.get(col.dtype.this, (0, 2))
        return [v for v in (lo, lo + 1, lo + 2, 0, 1) if lo <= v <= hi][:3]
    if col.category == "decimal":
        return [v for v in (0.0, 1.0, 0.1, -1.0) if col.accepts(v)]
    if col.category == "text" and col.length is not None:
        return [c for c in ("a", "b", "c") if len(c) <= col.length] or [""]
    return []


def build_domains(schema: RelSchema, analysis: _Analysis, *, fold: bool = False) -> dict[ColKey, list[Any]]:
    """Candidate non-NULL values for every column of the analysed tables: only values the
    declared type holds (:meth:`tasks.db.relschema.Column.accepts`); with ``fold`` (MySQL) no
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
