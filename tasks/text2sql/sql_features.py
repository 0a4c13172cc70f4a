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

Code: this module parses the text and compares features; the walk over the query's scopes is
:mod:`tasks.text2sql.sql_feature_extractor`, the value types (:class:`SQLFeatures`,
:class:`SchemaIndex`, :class:`SQLFeatureError`) are :mod:`tasks.text2sql.sql_feature_types`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from schemas.text2sql import BAG_FEATURES, NUMERIC_FEATURES
from tasks.text2sql.sql_feature_extractor import _Extractor
from tasks.text2sql.sql_feature_types import SchemaIndex, SQLFeatureError, SQLFeatures

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


# --------------------------------------------------------------------------------------------
# Schema used to attribute unqualified columns
# --------------------------------------------------------------------------------------------


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
