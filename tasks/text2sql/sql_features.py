"""Structural features of one SQL query, with sqlglot (the TPC-DS text-to-SQL study's features).

Source: Ma, Pu & Zhu (2024), "Evaluating LLMs for Text-to-SQL Generation With Complex SQL
Workload" (arXiv:2407.19517): bag-valued features compared by Jaccard similarity and numeric
features compared through their means, normalised by the TPC-DS gold means.

How a query is read
-------------------
- It is parsed with ``sqlglot`` in the given dialect and **not** rewritten by the optimiser
  (no qualification, no predicate push-down, no CTE merging): features describe the SQL as it was
  written. The only change made to the text before parsing: TPC-DS-template date arithmetic
  ``<expr> + 30 days`` (which sqlglot and PostgreSQL would read as ``30 AS days``) is read as
  ``<expr> + INTERVAL '30' DAY`` (also ``day``, ``month(s)``, ``year(s)``).
- A **scope** is one query block, as sqlglot's :mod:`sqlglot.optimizer.scope` defines it: the
  outer query, each CTE body, each derived table (a subquery in ``FROM``/``JOIN``, including
  ``LATERAL``), each subquery in an expression (scalar, ``IN``, ``EXISTS``, ``ANY``/``ALL``) and
  each branch of a ``UNION``/``INTERSECT``/``EXCEPT``. Every feature is collected over all
  scopes; each AST node is counted in exactly one scope.
- **Alias normalisation**: a column ``d1.d_date`` is written ``date_dim.d_date`` when ``d1`` is an
  alias of the base table ``date_dim``; a column of a CTE or derived table is written with the
  CTE's name (``customer_total_return.ctr_store_sk``) or the derived table's alias. An unqualified
  column is attributed to the one FROM item of its scope that has a column of that name (using
  ``schema`` for base tables and the output names of CTEs and derived tables), or to the only FROM
  item of the scope, looking outwards through enclosing scopes for correlated references; when
  that is ambiguous or unknown it keeps its bare name. All identifiers are lower-cased (string
  constants keep their case).

Bag features (:class:`SQLFeatures`, sorted tuples that keep duplicates)
---------------------------------------------------------------------
- ``columns`` — selected columns: every column referenced in a SELECT list (inside expressions
  too), normalised as above; ``*`` is ``<relation>.*`` per FROM item. ``COUNT(*)`` has no column.
- ``relations`` — base tables read: one entry per reference in a FROM/JOIN (CTE references are
  not base tables and are left out; self-joins appear twice).
- ``where_predicates`` — WHERE basic predicates: each WHERE condition is split through
  ``AND``/``OR``/parentheses, so a compound condition counts each basic predicate (a comparison,
  ``BETWEEN``, ``IN``, ``LIKE``, ``IS [NOT] NULL``, ``EXISTS``, a boolean column...); a ``NOT``
  over a basic predicate stays part of it. Rendered as PostgreSQL text with normalised columns,
  a nested query shown as ``(subquery)``, and symmetric comparisons put in a canonical order
  (``a = b`` and ``b = a`` are the same predicate; ``a > b`` is written ``b < a`` when ``b``
  sorts first; a side holding a column goes first: ``10 < x`` is ``x > 10``). Comma-join
  conditions in WHERE are predicates too.
- ``join_pairs`` — JOIN table pairs ``"a JOIN b"`` (names sorted): one per pair of FROM items of a
  scope that are connected (a) by an explicit ``JOIN`` (inner/outer/natural/``USING``/``ON``):
  the pairs its ON condition's column = column equalities connect, or else the joined item with
  the item just before it; (b) by a column = column equality in WHERE between columns of two
  different FROM items (TPC-DS mostly joins with commas), including a correlated subquery's
  equality with an item of an enclosing query. Several equalities between the same two items
  (composite keys) make one pair. Items are named by their base table (CTE name, derived-table
  alias), so ``date_dim d1`` joined to ``date_dim d2`` is ``"date_dim JOIN date_dim"``.
- ``aggregations`` — aggregate calls with their argument, e.g. ``sum(store_sales.ss_net_profit)``,
  ``count(*)``, ``count(DISTINCT t.x)``, wherever they occur (SELECT, HAVING, ORDER BY, WHERE
  of a subquery...). Aggregates used as window functions are **not** here.
- ``window_functions`` — functions with an ``OVER`` clause (``rank()``, ``sum(x) OVER (...)``),
  rendered without the window specification; kept apart from ``aggregations``.
- ``functions`` — names of the other (scalar) function calls: ``cast``, ``substring``,
  ``coalesce``, ``round``, ``extract``... including ``CAST``/``::`` and typed literals such as
  ``DATE '2000-01-01'`` (sqlglot reads them as casts). Not functions: ``CASE`` (an expression),
  ``EXISTS`` (a predicate), ``AND``/``OR`` and other operators, aggregates and window
  functions.
- ``constants`` — literal values: numbers (normalised: ``1.20`` → ``1.2``, ``-1`` with its sign),
  strings (quoted), intervals (``interval '30 day'``, counted once). Not constants: ``NULL``,
  booleans, LIMIT/OFFSET/FETCH counts and ORDER BY/GROUP BY position numbers.

Numeric features
----------------
- ``cte_count`` — CTE definitions (``WITH`` items, nested WITHs included).
- ``subquery_count`` — nested query blocks counted by scope: derived tables and subqueries in
  expressions (``EXISTS``, ``IN``, scalar, ``ANY``/``ALL``, ``LATERAL``), in any scope including
  CTE bodies. CTE bodies themselves and set-operation branches are not subqueries; a parenthesised
  ``UNION`` used as a subquery is one subquery.
- ``join_count`` — joins: in each scope, one per FROM item after the first, whether written with a
  comma or with ``JOIN`` (``FROM a, b, c`` and ``FROM a JOIN b JOIN c`` both have 2).
- ``predicate_count`` — number of WHERE basic predicates (``len(where_predicates)``).
- ``column_count`` — number of selected columns (``len(columns)``).
- ``relation_count``, ``function_count``, ``aggregation_count``, ``window_function_count``,
  ``join_pair_count``, ``constant_count`` — sizes of the bags of the same name.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.optimizer.scope import Scope, ScopeType, traverse_scope

from schemas.text2sql import BAG_FEATURES, NUMERIC_FEATURES

__all__ = [
    "BAG_FEATURES",
    "HISTOGRAM_FEATURES",
    "JACCARD_FEATURES",
    "NUMERIC_FEATURES",
    "PAPER_NUMERIC_FEATURES",
    "SQLFeatureError",
    "SQLFeatures",
    "SchemaIndex",
    "extract_features",
    "feature_similarity",
    "jaccard",
    "prepare_schema",
]

#: The bag features the paper compares by Jaccard similarity (its order: tables, columns, WHERE
#: predicates, constants, functions, aggregation, joins).
JACCARD_FEATURES = (
    "relations",
    "columns",
    "where_predicates",
    "constants",
    "functions",
    "aggregations",
    "join_pairs",
)
#: The numeric features of the paper's normalised-means tables (its order: CTE, selected
#: columns, functions, nested selects, aggregation, join count, WHERE predicates, join pairs).
PAPER_NUMERIC_FEATURES = (
    "cte_count",
    "column_count",
    "function_count",
    "subquery_count",
    "aggregation_count",
    "join_count",
    "predicate_count",
    "join_pair_count",
)
#: The six per-query distributions of the complexity comparison (CTEs, subqueries, joins,
#: functions, WHERE predicates, columns).
HISTOGRAM_FEATURES = (
    "cte_count",
    "subquery_count",
    "join_count",
    "function_count",
    "predicate_count",
    "column_count",
)

_BAG_TO_COUNT = {
    "columns": "column_count",
    "relations": "relation_count",
    "where_predicates": "predicate_count",
    "functions": "function_count",
    "aggregations": "aggregation_count",
    "window_functions": "window_function_count",
    "join_pairs": "join_pair_count",
    "constants": "constant_count",
}


class SQLFeatureError(ValueError):
    """The text is not one SQL query sqlglot can read in the given dialect (parse error, several
    statements, or a statement that is not a query); the message says which."""


@dataclass(frozen=True)
class SQLFeatures:
    """Features of one query (definitions in the module docstring).

    Bag features are sorted tuples of strings (duplicates kept); ``cte_count``,
    ``subquery_count`` and ``join_count`` are stored, the other counts are the bag sizes.
    """

    columns: tuple[str, ...]
    relations: tuple[str, ...]
    where_predicates: tuple[str, ...]
    join_pairs: tuple[str, ...]
    aggregations: tuple[str, ...]
    window_functions: tuple[str, ...]
    functions: tuple[str, ...]
    constants: tuple[str, ...]
    cte_count: int
    subquery_count: int
    join_count: int

    @property
    def predicate_count(self) -> int:
        return len(self.where_predicates)

    @property
    def column_count(self) -> int:
        return len(self.columns)

    @property
    def relation_count(self) -> int:
        return len(self.relations)

    @property
    def function_count(self) -> int:
        return len(self.functions)

    @property
    def aggregation_count(self) -> int:
        return len(self.aggregations)

    @property
    def window_function_count(self) -> int:
        return len(self.window_functions)

    @property
    def join_pair_count(self) -> int:
        return len(self.join_pairs)

    @property
    def constant_count(self) -> int:
        return len(self.constants)

    def numeric(self) -> dict[str, int]:
        """``{feature: count}`` for every name in :data:`NUMERIC_FEATURES`."""
        return {name: int(getattr(self, name)) for name in NUMERIC_FEATURES}

    def bags(self) -> dict[str, list[str]]:
        """``{feature: sorted list}`` for every name in :data:`BAG_FEATURES`."""
        return {name: list(getattr(self, name)) for name in BAG_FEATURES}

    def as_row(self) -> dict[str, Any]:
        """One flat row: the numeric features then the bags (lists of str)."""
        return {**self.numeric(), **self.bags()}


# --------------------------------------------------------------------------------------------
# Schema used to attribute unqualified columns
# --------------------------------------------------------------------------------------------


class SchemaIndex:
    """A lower-cased ``{table: frozenset(columns)}`` for column attribution (build it once with
    :func:`prepare_schema` and pass it to many :func:`extract_features` calls)."""

    __slots__ = ("tables",)

    def __init__(self, tables: dict[str, frozenset[str]]):
        self.tables = tables

    def columns(self, table: str) -> frozenset[str] | None:
        return self.tables.get(table)


def prepare_schema(schema: Mapping[str, Iterable[Any]] | SchemaIndex | None) -> SchemaIndex | None:
    """``{table: columns}`` → :class:`SchemaIndex`. Columns may be names or ``(name, type)``
    pairs; table and column names are lower-cased. ``None`` stays ``None``."""
    if schema is None or isinstance(schema, SchemaIndex):
        return schema
    tables: dict[str, frozenset[str]] = {}
    for table, cols in schema.items():
        names = [(c[0] if isinstance(c, (tuple, list)) else c) for c in cols]
        tables[str(table).lower()] = frozenset(str(n).lower() for n in names)
    return SchemaIndex(tables)


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------

_UNIT_WORDS = {
    "day": "DAY",
    "days": "DAY",
    "month": "MONTH",
    "months": "MONTH",
    "year": "YEAR",
    "years": "YEAR",
}
_MAYBE_UNIT = re.compile(r"\d\s+(?:days?|months?|years?)\b", re.IGNORECASE)


def _rewrite_unit_arithmetic(sql: str, dialect: str) -> str:
    """``<expr> + 30 days`` → ``<expr> + INTERVAL '30' DAY`` (token-based, strings untouched)."""
    if not _MAYBE_UNIT.search(sql):
        return sql
    from sqlglot.tokens import TokenType

    try:
        tokens = sqlglot.Dialect.get_or_raise(dialect).tokenize(sql)
    except Exception:  # the parser will report the problem
        return sql
    edits: list[tuple[int, int, str]] = []
    for i in range(1, len(tokens) - 1):
        op, num, unit = tokens[i - 1], tokens[i], tokens[i + 1]
        if (
            op.token_type in (TokenType.PLUS, TokenType.DASH)
            and num.token_type == TokenType.NUMBER
            and unit.text.lower() in _UNIT_WORDS
            and unit.token_type not in (TokenType.STRING, TokenType.IDENTIFIER)
        ):
            edits.append(
                (num.start, unit.end + 1, f"INTERVAL '{num.text}' {_UNIT_WORDS[unit.text.lower()]}")
            )
    for start, end, text in reversed(edits):
        sql = sql[:start] + text + sql[end:]
    return sql


def _parse_query(sql: str, dialect: str) -> exp.Query:
    if not isinstance(sql, str) or not sql.strip():
        raise SQLFeatureError("empty SQL text")
    text = _rewrite_unit_arithmetic(sql, dialect)
    try:
        trees = [t for t in sqlglot.parse(text, read=dialect) if t is not None]
    except (ParseError, TokenError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SQLFeatureError(f"cannot parse SQL ({dialect}): {first[:300]}") from None
    except Exception as e:  # sqlglot can raise other errors on odd input
        raise SQLFeatureError(
            f"cannot parse SQL ({dialect}): {type(e).__name__}: {e}"[:300]
        ) from None
    if len(trees) != 1:
        raise SQLFeatureError(f"expected one SQL statement, found {len(trees)}")
    tree = trees[0]
    if not isinstance(tree, exp.Query):
        raise SQLFeatureError(f"not a query: a {type(tree).__name__.upper()} statement")
    return tree


# --------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------

_RENDER = {"dialect": "postgres", "normalize_functions": "lower"}
# Func subclasses that are not function calls: CASE, EXISTS, AND/OR/XOR, COLLATE
_NOT_FUNCTIONS = (exp.Case, exp.Exists, exp.Connector, exp.Collate)
_SUBQUERY_PLACEHOLDER = "(subquery)"
# comparison flipped when its sides are swapped into canonical order
_FLIP = {
    exp.EQ: exp.EQ,
    exp.NEQ: exp.NEQ,
    exp.GT: exp.LT,
    exp.LT: exp.GT,
    exp.GTE: exp.LTE,
    exp.LTE: exp.GTE,
    exp.NullSafeEQ: exp.NullSafeEQ,
}


@dataclass
class _Source:
    key: tuple[int, str]  # (id of scope, alias): identity of one FROM item
    relation: str  # base table / CTE name / derived-table alias (lower-case)
    columns: frozenset[str] | None  # known column names, None when unknown
    base: bool  # a base table (not a CTE or derived table)


def _from_clause(select: exp.Select) -> exp.From | None:
    return select.args.get("from_") or select.args.get("from")


def _scope_nodes(root: exp.Expression) -> Iterable[exp.Expression]:
    """Nodes of ``root``'s own scope: a DFS that does not enter nested queries."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        for child in node.iter_expressions():
            if isinstance(child, exp.Query):
                continue
            stack.append(child)


class _Extractor:
    def __init__(self, tree: exp.Query, schema: SchemaIndex | None):
        self.tree = tree
        self.schema = schema
        self.sources: dict[int, dict[str, _Source]] = {}
        self.resolved: dict[int, _Source | None] = {}

    # -- sources and column attribution ------------------------------------------------------

    def scope_sources(self, scope: Scope) -> dict[str, _Source]:
        cached = self.sources.get(id(scope))
        if cached is not None:
            return cached
        out: dict[str, _Source] = {}
        for alias, (node, source) in scope.selected_sources.items():
            key = (id(scope), alias.lower())
            if isinstance(source, exp.Table):
                rel = source.name.lower()
                cols = self.schema.columns(rel) if self.schema is not None else None
                out[alias.lower()] = _Source(key, rel, cols, True)
            elif isinstance(source, Scope):
                if source.scope_type == ScopeType.CTE and isinstance(node, exp.Table):
                    rel = node.name.lower()
                else:
                    rel = alias.lower()
                try:
                    names = frozenset(n.lower() for n in source.expression.named_selects)
                except Exception:  # pragma: no cover - exotic sources
                    names = None
                if names is not None and "*" in names:
                    names = None
                out[alias.lower()] = _Source(key, rel, names or None, False)
        self.sources[id(scope)] = out
        return out

    def resolve(self, column: exp.Column, scope: Scope) -> _Source | None:
        qualifier = column.table.lower()
        name = column.name.lower()
        s: Scope | None = scope
        while s is not None:
            srcs = self.scope_sources(s)
            if qualifier:
                if qualifier in srcs:
                    return srcs[qualifier]
            elif srcs:
                known = [v for v in srcs.values() if v.columns is not None and name in v.columns]
                if len(known) == 1:
                    return known[0]
                if len(known) > 1:
                    return None
                unknown = [v for v in srcs.values() if v.columns is None]
                if unknown:
                    return unknown[0] if len(srcs) == 1 else None
            s = s.parent
        return None

    def normalise_columns(self, scopes: list[Scope]) -> None:
        """Attribute every column, then rewrite it in place as ``relation.column`` (lower case);
        interval units are made singular (``'60 days'`` → ``'60' DAY``)."""
        plan: list[tuple[exp.Column, _Source | None, str]] = []
        for scope in scopes:
            for node in _scope_nodes(scope.expression):
                if isinstance(node, exp.Interval):
                    unit = node.args.get("unit")
                    if (
                        isinstance(unit, exp.Var)
                        and len(unit.name) > 1
                        and unit.name.upper().endswith("S")
                    ):
                        node.set("unit", exp.Var(this=unit.name.upper()[:-1]))
                elif isinstance(node, exp.Column):
                    src = self.resolve(node, scope)
                    qualifier = src.relation if src is not None else node.table.lower()
                    plan.append((node, src, qualifier))
        for col, src, qualifier in plan:
            self.resolved[id(col)] = src
            if isinstance(col.this, exp.Star):
                col.set("table", exp.to_identifier(qualifier) if qualifier else None)
            else:
                col.set("this", exp.to_identifier(col.name.lower()))
                col.set("table", exp.to_identifier(qualifier) if qualifier else None)
            col.set("db", None)
            col.set("catalog", None)

    # -- rendering ---------------------------------------------------------------------------

    @staticmethod
    def render(node: exp.Expression) -> str:
        if isinstance(node, exp.Query):
            return _SUBQUERY_PLACEHOLDER
        if node.find(exp.Query) is not None:
            node = node.copy()
            for q in list(node.find_all(exp.Query)):
                if q is node:
                    continue
                parent = q.parent
                if isinstance(parent, exp.Subquery):
                    continue  # replaced with its wrapper
                text = "subquery" if isinstance(parent, exp.Exists) else _SUBQUERY_PLACEHOLDER
                q.replace(exp.Var(this=text))
        return node.sql(**_RENDER)

    def render_predicate(self, pred: exp.Expression) -> str:
        cls = type(pred)
        if cls in _FLIP:
            left, right = self.render(pred.this), self.render(pred.expression)
            # canonical order: a side with a column first, then alphabetical
            lkey = (not _has_column(pred.this), left)
            rkey = (not _has_column(pred.expression), right)
            if rkey < lkey:
                left, right = right, left
                cls = _FLIP[cls]
            op = cls(this=exp.Var(this="\x00L"), expression=exp.Var(this="\x00R")).sql(**_RENDER)
            return op.replace("\x00L", left, 1).replace("\x00R", right, 1)
        return self.render(pred)

    @staticmethod
    def column_text(col: exp.Column) -> str:
        name = "*" if isinstance(col.this, exp.Star) else col.name
        return f"{col.table}.{name}" if col.table else name

    @staticmethod
    def constant_text(lit: exp.Expression) -> str | None:
        if isinstance(lit, exp.Interval):
            value = (
                lit.this.name
                if isinstance(lit.this, exp.Literal)
                else lit.this.sql()
                if lit.this
                else ""
            )
            unit = lit.args.get("unit")
            unit_text = unit.name.lower() if unit is not None else ""
            if unit_text.endswith("s") and len(unit_text) > 1:
                unit_text = unit_text[:-1]
            return f"interval '{value} {unit_text}'" if unit_text else f"interval '{value}'"
        if not isinstance(lit, exp.Literal):
            return None
        if lit.is_string:
            return "'" + lit.this.replace("'", "''") + "'"
        text = lit.this
        try:
            value: float | int = int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                return text
            value = int(f) if f.is_integer() and "e" not in text.lower() and "." not in text else f
        sign = "-" if isinstance(lit.parent, exp.Neg) else ""
        return f"{sign}{value}"

    # -- the walk ----------------------------------------------------------------------------

    def run(self) -> SQLFeatures:
        try:
            scopes = list(traverse_scope(self.tree))
        except Exception as e:
            raise SQLFeatureError(
                f"cannot analyse query blocks: {type(e).__name__}: {e}"[:300]
            ) from None
        self.normalise_columns(scopes)

        columns: list[str] = []
        relations: list[str] = []
        predicates: list[str] = []
        pairs: list[str] = []
        aggs: list[str] = []
        windows: list[str] = []
        funcs: list[str] = []
        consts: list[str] = []
        cte_count = subquery_count = join_count = 0

        for scope in scopes:
            if scope.scope_type == ScopeType.CTE:
                cte_count += 1
            elif scope.scope_type in (ScopeType.SUBQUERY, ScopeType.DERIVED_TABLE):
                subquery_count += 1
            srcs = self.scope_sources(scope)
            relations.extend(s.relation for s in srcs.values() if s.base)
            root = scope.expression
            windowed: set[int] = set()
            for node in _scope_nodes(root):
                if isinstance(node, exp.Window) and isinstance(node.this, exp.Func):
                    fn = node.this
                    windowed.add(id(fn))
                    windows.append(self.render(fn))
                elif isinstance(node, exp.Func):
                    if id(node) in windowed or isinstance(node, _NOT_FUNCTIONS):
                        continue
                    if isinstance(node, exp.AggFunc):
                        aggs.append(self.render(node))
                    else:
                        funcs.append(
                            node.name.lower()
                            if isinstance(node, exp.Anonymous)
                            else node.sql_name().lower()
                        )
                elif isinstance(node, (exp.Literal, exp.Interval)):
                    parent = node.parent
                    if isinstance(node, exp.Literal) and isinstance(parent, exp.Interval):
                        continue
                    if isinstance(parent, (exp.Limit, exp.Offset, exp.Fetch)):
                        continue
                    if (
                        isinstance(parent, (exp.Ordered, exp.Group))
                        and isinstance(node, exp.Literal)
                        and not node.is_string
                    ):
                        continue  # a position number, not a value
                    text = self.constant_text(node)
                    if text is not None:
                        consts.append(text)
            if not isinstance(root, exp.Select):
                continue

            # selected columns
            for proj in root.expressions:
                target = proj.this if isinstance(proj, exp.Alias) else proj
                if isinstance(target, exp.Star):
                    if srcs:
                        columns.extend(f"{s.relation}.*" for s in srcs.values())
                    else:
                        columns.append("*")
                    continue
                for node in _scope_nodes(proj):
                    if isinstance(node, exp.Column):
                        columns.append(self.column_text(node))

            # joins
            joins = root.args.get("joins") or []
            join_count += len(joins)
            add_pair = _PairCollector(pairs)

            from_ = _from_clause(root)
            items = ([from_.this] if from_ is not None else []) + [j.this for j in joins]
            item_src = [srcs.get(it.alias_or_name.lower()) for it in items]
            for i, join in enumerate(joins, start=1):
                on = join.args.get("on")
                explicit = (
                    (join.args.get("kind") or "").upper() not in ("", "CROSS")
                    or join.args.get("side")
                    or join.args.get("method")
                    or join.args.get("using")
                    or on is not None
                )
                found = False
                if on is not None:
                    for pred in _basic_predicates(on):
                        found |= self._equality_pair(pred, scope, add_pair)
                if explicit and not found:
                    add_pair(item_src[i - 1], item_src[i])

            # WHERE
            where = root.args.get("where")
            if where is not None:
                for pred in _basic_predicates(where.this):
                    predicates.append(self.render_predicate(pred))
                    self._equality_pair(pred, scope, add_pair)

        return SQLFeatures(
            columns=tuple(sorted(columns)),
            relations=tuple(sorted(relations)),
            where_predicates=tuple(sorted(predicates)),
            join_pairs=tuple(sorted(pairs)),
            aggregations=tuple(sorted(aggs)),
            window_functions=tuple(sorted(windows)),
            functions=tuple(sorted(funcs)),
            constants=tuple(sorted(consts)),
            cte_count=cte_count,
            subquery_count=subquery_count,
            join_count=join_count,
        )

    def _equality_pair(self, pred: exp.Expression, scope: Scope, add_pair) -> bool:
        if not isinstance(pred, exp.EQ):
            return False
        left, right = pred.this.unnest(), pred.expression.unnest()
        if not (isinstance(left, exp.Column) and isinstance(right, exp.Column)):
            return False
        return add_pair(self.resolved.get(id(left)), self.resolved.get(id(right)))


class _PairCollector:
    """Adds ``"a JOIN b"`` to ``out`` once per pair of FROM items of one scope; calling it
    returns True when the two sources are two different known FROM items."""

    def __init__(self, out: list[str]):
        self.out = out
        self.seen: set[tuple] = set()

    def __call__(self, a: _Source | None, b: _Source | None) -> bool:
        if a is None or b is None or a.key == b.key:
            return False
        k = tuple(sorted((a.key, b.key)))
        if k not in self.seen:
            self.seen.add(k)
            r1, r2 = sorted((a.relation, b.relation))
            self.out.append(f"{r1} JOIN {r2}")
        return True


def _has_column(node: exp.Expression) -> bool:
    """True when ``node`` references a column of its own scope (nested queries not entered)."""
    return any(isinstance(n, exp.Column) for n in _scope_nodes(node))


def _basic_predicates(cond: exp.Expression) -> list[exp.Expression]:
    """Split a condition through AND / OR / parentheses (and NOT over a compound condition)."""
    out: list[exp.Expression] = []
    stack = [cond]
    while stack:
        node = stack.pop()
        if isinstance(node, exp.Paren):
            stack.append(node.this)
        elif isinstance(node, exp.Connector):  # And, Or (, Xor)
            stack.append(node.expression)
            stack.append(node.this)
        elif isinstance(node, exp.Not) and isinstance(node.this.unnest(), exp.Connector):
            stack.append(node.this)
        else:
            out.append(node)
    return out


def extract_features(
    sql: str,
    dialect: str = "postgres",
    schema: Mapping[str, Iterable[Any]] | SchemaIndex | None = None,
) -> SQLFeatures:
    """Features of one SQL query (definitions: module docstring).

    - ``sql``: one query (``SELECT``/``WITH``/set operation), optionally ending with ``;``.
    - ``dialect``: sqlglot dialect to read it in (``"postgres"`` for TPC-DS, ``"sqlite"`` for
      BIRD, ``"mysql"`` for Spider's double-quoted strings...).
    - ``schema``: optional ``{table: [column, ...]}`` (or a :class:`SchemaIndex`) used only to
      attribute unqualified columns to their table.

    Raises :class:`SQLFeatureError` when the text is empty, does not parse, holds several
    statements or is not a query. Pure function; about a millisecond for a TPC-DS query.
    """
    tree = _parse_query(sql, dialect)
    return _Extractor(tree, prepare_schema(schema)).run()


# --------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------


def jaccard(a: Iterable[str], b: Iterable[str], multiset: bool = False) -> float:
    """Jaccard similarity ``|A ∩ B| / |A ∪ B|`` of two bags, in [0, 1].

    By default the bags are compared as sets (distinct elements, as in the paper); with
    ``multiset=True`` multiplicities count (``min``/``max`` of the counts). Two empty bags are
    identical: 1.0.
    """
    if multiset:
        ca, cb = Counter(a), Counter(b)
        union = sum((ca | cb).values())
        return 1.0 if union == 0 else sum((ca & cb).values()) / union
    sa, sb = set(a), set(b)
    union = len(sa | sb)
    return 1.0 if union == 0 else len(sa & sb) / union


def feature_similarity(
    predicted: SQLFeatures, gold: SQLFeatures, features: Iterable[str] = JACCARD_FEATURES
) -> dict[str, float]:
    """``{feature: Jaccard similarity}`` of a predicted query's bags against the gold query's,
    for each name in ``features`` (default :data:`JACCARD_FEATURES`)."""
    return {f: jaccard(getattr(predicted, f), getattr(gold, f)) for f in features}


def feature_names() -> list[str]:
    """All stored field names of :class:`SQLFeatures` (bags and stored counts)."""
    return [f.name for f in fields(SQLFeatures)]
