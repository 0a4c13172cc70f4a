"""Execution match: do two query results agree? (shared by text-to-SQL EX and SQL equivalence)

Semantics follow the test-suite evaluation of Zhong, Yu & Klein (2020), "Semantic Evaluation for
Text-to-SQL with Distilled Test Suites": results are compared as bags of rows (set semantics
optional); row order matters only when asked (typically: the gold query has a top-level ORDER
BY); columns may be permuted, since a column's position carries no meaning.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import sqlglot
from sqlglot import exp

#: Upper bound on column permutations tried (wide results with many identical columns).
MAX_PERMUTATIONS = 10_000


def normalize_value(value: Any, digits: int = 6) -> Any:
    """A hashable, engine-independent form of one cell.

    Numbers (int, float, Decimal, bool) become floats rounded to ``digits`` decimals, so ``1``,
    ``1.0`` and ``Decimal("1.000")`` are equal; dates/times become ISO strings; bytes become
    hex; NULL stays None; strings are kept as they are (case and whitespace matter, as in EX).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float, decimal.Decimal)):
        f = float(value)
        return "NaN" if math.isnan(f) else round(f, digits)
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return tuple(normalize_value(v, digits) for v in value)
    return value


def _key(v: Any) -> tuple:
    return (v is None, type(v).__name__, str(v))


def results_match(
    gold: Sequence[Sequence[Any]],
    pred: Sequence[Sequence[Any]],
    *,
    ordered: bool = False,
    bag: bool = True,
    permute_columns: bool = True,
    digits: int = 6,
) -> bool:
    """True when two results (lists of row tuples) are the same result.

    - ``ordered``: rows must appear in the same order (use when the gold query has a top-level
      ORDER BY); otherwise rows are compared as a bag (``bag=True``, duplicates count) or as a
      set (``bag=False``).
    - ``permute_columns``: a column order of ``pred`` that makes the results equal is searched
      (only permutations that map each column to a gold column with the same bag of values; at
      most :data:`MAX_PERMUTATIONS`).
    Results with a different number of columns never match; two empty results always match.
    """
    g = [tuple(normalize_value(v, digits) for v in r) for r in gold]
    p = [tuple(normalize_value(v, digits) for v in r) for r in pred]
    if not g and not p:
        return True
    width = len(g[0]) if g else len(p[0])
    if any(len(r) != width for r in g + p):
        return False
    if bag and len(g) != len(p):
        return False

    def same(rows: list[tuple]) -> bool:
        if ordered:
            return rows == g
        return Counter(rows) == Counter(g) if bag else set(rows) == set(g)

    if same(p):
        return True
    if not permute_columns or width < 2:
        return False
    gold_cols = [sorted(Counter(r[i] for r in g).items(), key=lambda kv: _key(kv[0])) for i in range(width)]
    pred_cols = [sorted(Counter(r[i] for r in p).items(), key=lambda kv: _key(kv[0])) for i in range(width)]
    if bag:
        candidates = [[j for j in range(width) if pred_cols[j] == gold_cols[i]] for i in range(width)]
    else:
        candidates = [
            [j for j in range(width) if {k for k, _ in pred_cols[j]} == {k for k, _ in gold_cols[i]}]
            for i in range(width)
        ]
    tried = 0
    for perm in itertools.product(*candidates):
        if len(set(perm)) != width:
            continue
        tried += 1
        if tried > MAX_PERMUTATIONS:
            return False
        if same([tuple(r[j] for j in perm) for r in p]):
            return True
    return False


def has_top_level_order_by(sql: str, dialect: str | None = None) -> bool:
    """True when the outermost query of ``sql`` has an ORDER BY (so row order is part of the
    answer). Raises sqlglot.errors.ParseError when ``sql`` does not parse."""
    tree = sqlglot.parse_one(sql, read=dialect)
    return tree.args.get("order") is not None if isinstance(tree, exp.Query) else False
