"""Execution match: do two query results agree? (shared by text-to-SQL EX and SQL equivalence)

Semantics follow the test-suite evaluation of Zhong, Yu & Klein (2020), "Semantic Evaluation for
Text-to-SQL with Distilled Test Suites": results are compared as bags of rows (set semantics
optional); row order matters only when asked (typically: the gold query has a top-level ORDER
BY); columns may be permuted, since a column's position carries no meaning.

Cells are compared after :func:`canonical_value` (``1``, ``1.0``, ``Decimal("1.000")`` and
``True`` are the same number; dates and times are ISO strings); two numbers are equal when
both are integers and equal, or when they are within a relative tolerance of ``REL_TOL`` or an
absolute one of ``ABS_TOL`` (``math.isclose``; :func:`tolerance` changes them for a block) —
so ``x * 0.1`` and ``x / 10``, one ulp apart, are the same value, however close they fall to a
rounding boundary.

The column-permutation search is bounded: identical columns are interchangeable (tried once),
only columns with the same bag of values are paired, and the search is a backtracking over
one-to-one assignments (never a walk over every tuple of candidates); when more than
:data:`MAX_PERMUTATIONS` complete assignments or :data:`MAX_SEARCH_NODES` steps would be needed,
:func:`compare_results` answers ``None`` (undecided) and :func:`results_match` ``False``.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import decimal
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlglot
from sqlglot import exp

#: Complete column assignments tried at most (wide results with many alike columns).
MAX_PERMUTATIONS = 10_000
#: Steps of the column-assignment backtracking at most.
MAX_SEARCH_NODES = 200_000
#: Relative and absolute tolerance for two numbers that are not both integers.
REL_TOL = 1e-9
ABS_TOL = 1e-9
#: Rows in one group of tolerant float matching solved exactly (larger: sorted pairing only).
_MATCHING_LIMIT = 400


_tolerance: contextvars.ContextVar[tuple[float, float]] = contextvars.ContextVar(
    "result_match_tolerance", default=(REL_TOL, ABS_TOL))


@contextlib.contextmanager
def tolerance(rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL) -> Iterator[None]:
    """Compare numbers with another relative / absolute tolerance inside the block (MySQL's
    4-decimal division results: ``abs_tol=1e-4``)."""
    token = _tolerance.set((rel_tol, abs_tol))
    try:
        yield
    finally:
        _tolerance.reset(token)


class _NaN:
    """NaN as a value equal to itself (a query returning NaN twice returns the same thing)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NaN)

    def __hash__(self) -> int:
        return hash("NaN")

    def __repr__(self) -> str:
        return "NaN"


NAN = _NaN()


def normalize_value(value: Any, digits: int = 6) -> Any:
    """A hashable, engine-independent form of one cell, numbers rounded to ``digits`` decimals
    (``1``, ``1.0`` and ``Decimal("1.000")`` are equal; dates/times become ISO strings; bytes
    hex; NULL stays None). Used to *hash* results (the lifecycle suite's checksums); comparing
    results uses :func:`canonical_value` and a tolerance instead."""
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


def canonical_value(value: Any, fold: bool = False) -> Any:
    """The form of one cell that results are compared in: None; numbers as ``int`` (bools,
    integral Decimals) or ``float`` (NaN as :data:`NAN`); dates/times as ISO strings (a space
    between date and time); bytes as hex; lists as tuples; other values as they are. With
    ``fold`` strings are case-folded and lose trailing spaces (MySQL's default collations:
    case-insensitive, PAD SPACE)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return NAN if math.isnan(value) else value
    if isinstance(value, decimal.Decimal):
        if value.is_nan():
            return NAN
        if value.is_finite() and value == value.to_integral_value():
            return int(value)
        return float(value)
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return tuple(canonical_value(v, fold) for v in value)
    if isinstance(value, str):
        return value.rstrip(" ").casefold() if fold else value
    if isinstance(value, dict):
        return tuple(sorted((str(k), canonical_value(v, fold)) for k, v in value.items()))
    return value


def canonical_rows(rows: Sequence[Sequence[Any]], fold: bool = False) -> list[tuple]:
    """Every cell of ``rows`` through :func:`canonical_value`."""
    return [tuple(canonical_value(v, fold) for v in r) for r in rows]


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def values_equal(a: Any, b: Any) -> bool:
    """Two canonical cells are the same value: equal, or numbers within the tolerance (two
    integers must be equal)."""
    if a == b:
        return True
    if _is_num(a) and _is_num(b):
        if isinstance(a, int) and isinstance(b, int):
            return False
        rel, tol = _tolerance.get()
        return math.isclose(a, b, rel_tol=rel, abs_tol=tol)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    return False


def rows_equal(r: tuple, s: tuple) -> bool:
    """Two canonical rows are the same row (cell by cell, :func:`values_equal`)."""
    return len(r) == len(s) and all(values_equal(a, b) for a, b in zip(r, s))


def has_float(rows: Sequence[tuple]) -> bool:
    """Some cell of canonical ``rows`` is a float (or a nested value): equality needs the
    tolerance."""
    return any(isinstance(v, (float, tuple)) for r in rows for v in r)


def _skeleton(r: tuple) -> tuple:
    """The exact part of a row: numbers (and nested tuples) replaced by a marker."""
    return tuple("\x00num" if _is_num(v) else ("\x00tuple" if isinstance(v, tuple) else v) for v in r)


def _num_key(v: Any) -> tuple:
    if _is_num(v):
        return (0, float(v))
    return (1, repr(v))


def _matches_all(adj: list[list[int]], n: int) -> bool:
    """Every left node ``i`` of a bipartite graph (``adj[i]``: its right neighbours among
    ``n``) can be matched to a distinct right node (Kuhn's augmenting paths)."""
    if any(not a for a in adj):
        return False
    match_right = [-1] * n

    def augment(i: int, seen: list[bool]) -> bool:
        for j in adj[i]:
            if not seen[j]:
                seen[j] = True
                if match_right[j] < 0 or augment(match_right[j], seen):
                    match_right[j] = i
                    return True
        return False

    return all(augment(i, [False] * n) for i in range(len(adj)))


def _perfect_matching(left: list[tuple], right: list[tuple], eq: Callable[[tuple, tuple], bool]) -> bool:
    """A perfect matching between two equal-sized lists under ``eq``."""
    n = len(left)
    return _matches_all([[j for j in range(n) if eq(left[i], right[j])] for i in range(n)], n)


def _group_bag_equal(a: list[tuple], b: list[tuple]) -> bool:
    """Tolerant bag equality of rows that share a skeleton: sorted pairing, then an exact
    matching when that fails (up to :data:`_MATCHING_LIMIT` rows)."""
    if len(a) != len(b):
        return False
    key = lambda r: tuple(_num_key(v) for v in r)
    sa, sb = sorted(a, key=key), sorted(b, key=key)
    if all(rows_equal(x, y) for x, y in zip(sa, sb)):
        return True
    if len(a) > _MATCHING_LIMIT:
        return False
    return _perfect_matching(sa, sb, rows_equal)


def bags_equal(a: Sequence[tuple], b: Sequence[tuple]) -> bool:
    """Two lists of canonical rows are the same bag (tolerant numbers)."""
    if len(a) != len(b):
        return False
    if Counter(a) == Counter(b):
        return True
    if not (has_float(a) or has_float(b)):
        return False
    ga: dict[tuple, list[tuple]] = defaultdict(list)
    gb: dict[tuple, list[tuple]] = defaultdict(list)
    for r in a:
        ga[_skeleton(r)].append(r)
    for r in b:
        gb[_skeleton(r)].append(r)
    if ga.keys() != gb.keys():
        return False
    return all(_group_bag_equal(ga[k], gb[k]) for k in ga)


def sets_equal(a: Sequence[tuple], b: Sequence[tuple]) -> bool:
    """Two lists of canonical rows hold the same distinct rows (tolerant numbers)."""
    if set(a) == set(b):
        return True
    if not (has_float(a) or has_float(b)):
        return False
    ga: dict[tuple, list[tuple]] = defaultdict(list)
    gb: dict[tuple, list[tuple]] = defaultdict(list)
    for r in set(a):
        ga[_skeleton(r)].append(r)
    for r in set(b):
        gb[_skeleton(r)].append(r)
    if ga.keys() != gb.keys():
        return False
    for k, left in ga.items():
        right = gb[k]
        if not all(any(rows_equal(x, y) for y in right) for x in left):
            return False
        if not all(any(rows_equal(x, y) for x in left) for y in right):
            return False
    return True


def same_rows(a: Sequence[tuple], b: Sequence[tuple], *, ordered: bool, bag: bool) -> bool:
    """Canonical row lists are the same result: in order, as bags or as sets."""
    if ordered:
        return len(a) == len(b) and all(rows_equal(x, y) for x, y in zip(a, b))
    return bags_equal(a, b) if bag else sets_equal(a, b)


def column_assignments(
    width: int, compatible: Callable[[int, int], bool],
    gold_classes: Sequence[int], pred_classes: Sequence[int],
) -> tuple[list[tuple[int, ...]], bool]:
    """One-to-one assignments ``perm`` (gold column ``i`` ← pred column ``perm[i]``) with
    ``compatible(i, perm[i])``, modulo interchangeable columns (columns of one class, e.g.
    identical columns, are tried in one order only). Returns ``(assignments, complete)``;
    ``complete`` is False when :data:`MAX_PERMUTATIONS` or :data:`MAX_SEARCH_NODES` was
    reached (the list is then a prefix)."""
    cand = [[j for j in range(width) if compatible(i, j)] for i in range(width)]
    if not _matches_all(cand, width):  # no assignment at all: stop at once
        return [], True
    out: list[tuple[int, ...]] = []
    perm = [-1] * width
    used = [False] * width
    nodes = 0
    complete = True

    def dfs(i: int) -> bool:
        # gold columns in index order; of interchangeable pred columns only the first free one
        # is tried, and interchangeable gold columns take increasing pred columns
        nonlocal nodes, complete
        if i == width:
            out.append(tuple(perm))
            if len(out) >= MAX_PERMUTATIONS:
                complete = False
                return False
            return True
        floor = max((perm[k] for k in range(i) if gold_classes[k] == gold_classes[i]), default=-1)
        tried: set[int] = set()
        for j in cand[i]:
            if used[j] or j < floor or pred_classes[j] in tried:
                continue
            nodes += 1
            if nodes > MAX_SEARCH_NODES:
                complete = False
                return False
            tried.add(pred_classes[j])
            used[j] = True
            perm[i] = j
            go_on = dfs(i + 1)
            used[j] = False
            perm[i] = -1
            if not go_on:
                return False
        return True

    dfs(0)
    return out, complete


def _column_classes(rows: Sequence[tuple], width: int) -> list[int]:
    """Columns with identical values in every row share a class number."""
    seen: dict[tuple, int] = {}
    out = []
    for i in range(width):
        col = tuple(r[i] for r in rows)
        out.append(seen.setdefault(col, len(seen)))
    return out


def _column_bag(rows: Sequence[tuple], i: int) -> list[tuple]:
    return [(r[i],) for r in rows]


def compare_results(
    gold: Sequence[Sequence[Any]],
    pred: Sequence[Sequence[Any]],
    *,
    ordered: bool = False,
    bag: bool = True,
    permute_columns: bool = True,
    fold: bool = False,
) -> bool | None:
    """Whether two results (lists of row tuples) are the same result: True, False, or None
    when the column-permutation search hit its bounds before finding a match (undecided).

    - ``ordered``: rows must appear in the same order; otherwise rows are compared as a bag
      (``bag=True``, duplicates count) or as a set (``bag=False``).
    - ``permute_columns``: a column order of ``pred`` that makes the results equal is searched
      (only pairing columns with the same bag — or set — of values; identical columns once).
    - ``fold``: strings compared case-insensitively without trailing spaces (MySQL).
    Results with a different number of columns never match; two empty results always match.
    """
    g = canonical_rows(gold, fold)
    p = canonical_rows(pred, fold)
    if not g and not p:
        return True
    width = len(g[0]) if g else len(p[0])
    if any(len(r) != width for r in g) or any(len(r) != width for r in p):
        return False
    if bag and len(g) != len(p):
        return False
    if same_rows(g, p, ordered=ordered, bag=bag):
        return True
    if not permute_columns or width < 2:
        return False
    gcols = [_column_bag(g, i) for i in range(width)]
    pcols = [_column_bag(p, j) for j in range(width)]
    col_eq = bags_equal if bag else sets_equal
    cache: dict[tuple[int, int], bool] = {}

    def compatible(i: int, j: int) -> bool:
        if (i, j) not in cache:
            cache[(i, j)] = col_eq(gcols[i], pcols[j])
        return cache[(i, j)]

    perms, complete = column_assignments(width, compatible, _column_classes(g, width),
                                         _column_classes(p, width))
    for perm in perms:
        if same_rows(g, [tuple(r[j] for j in perm) for r in p], ordered=ordered, bag=bag):
            return True
    return False if complete else None


def results_match(gold: Sequence[Sequence[Any]], pred: Sequence[Sequence[Any]], **options: bool) -> bool:
    """True when two results (lists of row tuples) are the same result: :func:`compare_results`
    (keyword options ``ordered``, ``bag``, ``permute_columns``, ``fold``) is True; an
    undecided comparison is not a match."""
    return compare_results(gold, pred, **options) is True


def has_top_level_order_by(sql: str, dialect: str | None = None) -> bool:
    """True when the outermost query of ``sql`` has an ORDER BY (so row order is part of the
    answer). Raises sqlglot.errors.ParseError when ``sql`` does not parse."""
    tree = sqlglot.parse_one(sql, read=dialect)
    return tree.args.get("order") is not None if isinstance(tree, exp.Query) else False
