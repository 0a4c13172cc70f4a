"""What a query may return on one database: the results its SQL allows, when the SQL leaves
choices to the engine — and when two queries *certainly* return different results.

A counterexample to the equivalence of two queries is a database on which no result the first
query may return equals a result the second may return. One run of each query gives one
allowed result each; when they differ, the difference may come only from a choice the engine
was free to make (rows tied under ``ORDER BY a`` in any order, which tied rows a ``LIMIT``
keeps, the order ``STRING_AGG`` concatenates in). This module describes the allowed results as
an :class:`OutcomeSpace` and decides disjointness soundly (:func:`certainly_differ`): a "yes" is
a proof that the two sets of allowed results share no element; "no" means they may share one.

How the allowed results are found (:func:`tasks.equivalence.query_plan.plan_query`, then :func:`build_space`):

- **top-level ORDER BY / LIMIT / OFFSET / FETCH** (exact): a *probe* runs the query without its
  LIMIT/OFFSET and with its sort keys appended as extra columns; consecutive rows with equal
  keys (numbers within the tolerance of :mod:`tasks.scoring.result_match`) form a *tie group*. The
  allowed results are: each tie group's rows in any order, and, where LIMIT/OFFSET cut through
  a tie group, any subset of it of the size the cut leaves (``FETCH ... WITH TIES`` keeps the
  whole group). Without ORDER BY every row ties. Sort keys that cannot be computed (an
  expression under ``SELECT DISTINCT``, a position after ``*``) make every row tie — never a
  stricter order than the SQL promises;
- **cell-confined choices** in the select list of the outermost SELECT: an order-sensitive
  aggregate without a determining ORDER BY (``STRING_AGG``, ``GROUP_CONCAT``, ``LIST``,
  ``ARRAY_AGG``, ``JSON_AGG``, ``ANY_VALUE``, ``FIRST``, ``ARG_MAX``, ``MODE``, ...), a window
  function whose result depends on the order of peers (``ROW_NUMBER``, ``LAG``/``LEAD``,
  ``FIRST_VALUE``, ``NTILE``, ROWS frames) without a total order of its partition, ``DISTINCT
  ON`` without a total order, a MySQL/SQLite *bare column* (neither grouped nor aggregated), and
  ``random()`` / ``uuid()``: such a column is a *wildcard* (any value matches it);
- **choices elsewhere** (in a WHERE, a subquery, a CTE, a set-operation branch, under a
  top-level DISTINCT, a LIMIT in a subquery without a total order, ``TABLESAMPLE``): the
  query's result is *opaque* — no difference can be certified, the reason is reported.

An order is *total* when it determines the rows: its keys hold every GROUP BY expression, or,
for every base table of the FROM clause, a primary key or a UNIQUE key of NOT NULL columns; or
(for LIMIT and DISTINCT ON) its keys hold every output expression, so tied rows are identical.

``now()`` / ``CURRENT_TIMESTAMP`` & co. are frozen to one instant for both queries by
:mod:`tasks.equivalence.sql_dialects` (a reading says so), so they are no choice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tasks.scoring.result_match import (
    MAX_PERMUTATIONS,
    bags_equal,
    canonical_rows,
    column_assignments,
    has_float,
    sets_equal,
    values_equal,
)
from tasks.equivalence.query_plan import QueryPlan

# --------------------------------------------------------------------------------------------
# Allowed results and their disjointness
# --------------------------------------------------------------------------------------------


@dataclass
class OutcomeSpace:
    """The results a query may return on one database: ``blocks`` in order, each a list of
    canonical rows and how many of them are taken (any subset of that size, in any order);
    ``ordered``: the blocks' order is part of the result (the query sorts, with known keys);
    ``wildcards``: output columns whose values are free; ``opaque``: why nothing is known."""

    blocks: list[tuple[list[tuple], int]] = field(default_factory=list)
    ordered: bool = False
    wildcards: frozenset[int] = frozenset()
    width: int | None = None
    opaque: str | None = None

    @property
    def size(self) -> int:
        """Rows in every allowed result."""
        return sum(take for _, take in self.blocks)

    @property
    def full(self) -> bool:
        """Every block is taken whole (the bag of rows is fixed)."""
        return all(take == len(rows) for rows, take in self.blocks)

    @property
    def rows(self) -> list[tuple]:
        """Every row of every block."""
        return [r for rows, _ in self.blocks for r in rows]

    def wild_kinds(self) -> dict[int, frozenset[str]]:
        """Per wildcard column, the kinds of value it holds (``num``, ``str``, ...; from the
        values seen there — an aggregate of strings stays a string whatever the order): a
        wildcard matches NULL and any value of those kinds (any value when none was seen)."""
        rows = self.rows
        return {i: frozenset(_kind(r[i]) for r in rows if r[i] is not None) for i in self.wildcards}


def fixed_space(rows: Sequence[Sequence[Any]], *, ordered: bool = False, fold: bool = False,
                wildcards: frozenset[int] = frozenset(), width: int | None = None) -> OutcomeSpace:
    """The space of a result with no choice in it (the result itself; ``ordered``: as a
    sequence)."""
    canon = canonical_rows(rows, fold)
    w = len(canon[0]) if canon else width
    if ordered:
        blocks = [([r], 1) for r in canon]
    else:
        blocks = [(canon, len(canon))] if canon else []
    return OutcomeSpace(blocks, ordered, wildcards, w)


def build_space(plan: QueryPlan, rows: Sequence[Sequence[Any]] | None, *,
                probe_rows: Sequence[Sequence[Any]] | None = None,
                probe_width: int | None = None, width: int | None = None,
                fold: bool = False, ordered: bool = False) -> OutcomeSpace:
    """The :class:`OutcomeSpace` of a query from its result ``rows`` and, when
    :meth:`QueryPlan.needs_probe`, the probe's rows and width."""
    if plan.opaque:
        return OutcomeSpace(opaque="; ".join(plan.opaque))
    if not plan.needs_probe(ordered):
        return fixed_space(rows or [], fold=fold, wildcards=plan.wildcards, width=width)
    if probe_rows is None:
        return OutcomeSpace(opaque="the probe of the query's ORDER BY / LIMIT did not run")
    canon = canonical_rows(probe_rows, fold)
    w = (probe_width if probe_width is not None else (len(canon[0]) if canon else 0)) - plan.extra_keys
    out = [r[:w] for r in canon]

    def key(r: tuple) -> tuple:
        return tuple(r[w + i] if kind == "extra" else r[i] for kind, i in plan.keys)

    known = plan.order and plan.order_known
    groups: list[list[int]] = []
    if known:
        prev = None
        for i, r in enumerate(canon):
            k = key(r)
            if prev is not None and all(values_equal(a, b) for a, b in zip(k, prev)):
                groups[-1].append(i)
            else:
                groups.append([i])
            prev = k
        # equal keys that are not adjacent (a collation the engine sorts by differently): the
        # order is not what the keys say, so every row ties
        firsts = [key(canon[g[0]]) for g in groups]
        seen_keys: list[tuple] = []
        for k in firsts:
            if any(all(values_equal(a, b) for a, b in zip(k, s)) for s in seen_keys[:-1]):
                known = False
                break
            seen_keys.append(k)
    if not known:
        groups = [list(range(len(canon)))] if canon else []
    start = plan.offset
    end = len(canon) if plan.limit is None else min(len(canon), start + plan.limit)
    if plan.with_ties and plan.limit is not None and end > start and known:
        for g in groups:
            if g[0] <= end - 1 <= g[-1]:
                end = g[-1] + 1
    blocks = []
    for g in groups:
        lo, hi = g[0], g[-1] + 1
        take = max(0, min(hi, end) - max(lo, start))
        if take:
            blocks.append(([out[i] for i in g], take))
    space = OutcomeSpace(blocks, known, plan.wildcards, w if canon or probe_width is not None else width)
    if rows is not None:
        seen = fixed_space(rows, ordered=known, fold=fold, width=space.width)
        if certainly_differ(seen, space, ordered=known, bag=True, permute_columns=False):
            return OutcomeSpace(opaque="the query's result is not among those its ORDER BY / "
                                       "LIMIT allow (an arbitrary choice not modelled)")
    return space


def _kind(v: Any) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return "num"
    return type(v).__name__


def _free(value: Any, kinds: frozenset[str]) -> bool:
    """A wildcard of ``kinds`` may take ``value``."""
    return value is None or not kinds or _kind(value) in kinds


Wild = tuple[dict[int, frozenset[str]], dict[int, frozenset[str]]]


def resolve_cuts(plan: QueryPlan, run, fold: bool = False) -> str | None:
    """None when, on the database ``run(sql) -> Outcome`` reads, every subquery LIMIT of
    ``plan`` (:attr:`QueryPlan.cuts`, recursively) keeps the same rows whichever tied rows it
    takes; else the reason the query's result depends on a choice there."""
    for sub in plan.cuts:
        if sub.opaque or sub.wildcards:
            return "; ".join(sub.opaque) or "a subquery with a LIMIT and arbitrary values"
        why = resolve_cuts(sub, run, fold)
        if why:
            return why
        if sub.probe is None:
            continue
        out = run(sub.probe)
        if out.error is not None:
            return f"the probe of a subquery's LIMIT failed: {out.error}"
        space = build_space(sub, None, probe_rows=out.rows, probe_width=out.ncols, fold=fold)
        if space.opaque or not all(take == len(rows) or len(set(rows)) == 1 for rows, take in space.blocks):
            return "a LIMIT in a subquery keeps one of several different tied rows on this database"
    return None


def _compatible(r: tuple, s: tuple, wild: Wild) -> bool:
    """Row ``r`` of one space and ``s`` of the other may be the same row (``wild``: the
    wildcard columns of each with their kinds)."""
    ak, bk = wild
    for i, (x, y) in enumerate(zip(r, s)):
        if i in ak:
            if i in bk or _free(y, ak[i]):
                continue
            return False
        if i in bk:
            if _free(x, bk[i]):
                continue
            return False
        if not values_equal(x, y):
            return False
    return True


def _max_flow_ok(a: OutcomeSpace, b: OutcomeSpace, wild: Wild) -> bool:
    """Is there a choice in each space making the two bags equal? (max flow from A's blocks
    through compatible rows to B's blocks = the size)."""
    # nodes: 0 source, 1 sink, then A blocks, A classes, B classes, B blocks
    graph: list[dict[int, int]] = [{}, {}]

    def node() -> int:
        graph.append({})
        return len(graph) - 1

    def edge(u: int, v: int, c: int) -> None:
        graph[u][v] = graph[u].get(v, 0) + c
        graph[v].setdefault(u, 0)

    a_classes: list[tuple[tuple, int]] = []
    for rows, take in a.blocks:
        bn = node()
        edge(0, bn, take)
        for r, n in Counter(rows).items():
            cn = node()
            edge(bn, cn, n)
            a_classes.append((r, cn))
    b_classes: list[tuple[tuple, int]] = []
    for rows, take in b.blocks:
        bn = node()
        edge(bn, 1, take)
        for r, n in Counter(rows).items():
            cn = node()
            edge(cn, bn, n)
            b_classes.append((r, cn))
    big = a.size + b.size + 1
    for r, an in a_classes:
        for s, bn in b_classes:
            if _compatible(r, s, wild):
                edge(an, bn, big)
    flow = 0
    target = a.size
    while flow < target:
        # BFS augmenting path (Edmonds-Karp)
        parent = {0: -1}
        queue = [0]
        for u in queue:
            if u == 1:
                break
            for v, cap in graph[u].items():
                if cap > 0 and v not in parent:
                    parent[v] = u
                    queue.append(v)
        if 1 not in parent:
            break
        path = []
        v = 1
        while v != 0:
            path.append((parent[v], v))
            v = parent[v]
        push = min(graph[u][v] for u, v in path)
        for u, v in path:
            graph[u][v] -= push
            graph[v][u] += push
        flow += push
    return flow >= target


def _positions(space: OutcomeSpace) -> list[list[tuple]]:
    """Per position of an allowed result, the rows that may stand there."""
    if not space.ordered:
        cands = list(dict.fromkeys(space.rows))
        return [cands] * space.size
    out = []
    for rows, take in space.blocks:
        cands = list(dict.fromkeys(rows))
        out.extend([cands] * take)
    return out


def _chain_ok(a: OutcomeSpace, b: OutcomeSpace) -> bool:
    """Exact test for two ordered spaces of whole blocks without floats or wildcards: is one
    sequence allowed by both? Each boundary of the common refinement of the blocks closes a
    block of one side, whose remaining rows must then all come from the other's block."""
    ablocks = [Counter(rows) for rows, _ in a.blocks] if a.ordered else [Counter(a.rows)]
    bblocks = [Counter(rows) for rows, _ in b.blocks] if b.ordered else [Counter(b.rows)]
    ia = ib = 0
    rem_a = ablocks[0].copy() if ablocks else Counter()
    rem_b = bblocks[0].copy() if bblocks else Counter()
    while ia < len(ablocks) and ib < len(bblocks):
        na, nb = rem_a.total(), rem_b.total()
        if na <= nb:
            if not rem_a <= rem_b:
                return False
            rem_b -= rem_a
            ia += 1
            rem_a = ablocks[ia].copy() if ia < len(ablocks) else Counter()
            if na == nb:
                ib += 1
                rem_b = bblocks[ib].copy() if ib < len(bblocks) else Counter()
        else:
            if not rem_b <= rem_a:
                return False
            rem_a -= rem_b
            ib += 1
            rem_b = bblocks[ib].copy() if ib < len(bblocks) else Counter()
    return True


def _disjoint(a: OutcomeSpace, b: OutcomeSpace, *, ordered: bool, bag: bool) -> bool:
    """The two spaces (same width, columns aligned) share no allowed result."""
    wild = (a.wild_kinds(), b.wild_kinds())
    if (ordered or bag) and a.size != b.size:
        return True
    if a.full and b.full and not (a.wildcards or b.wildcards):
        if not (bags_equal(a.rows, b.rows) if (bag or ordered) else sets_equal(a.rows, b.rows)):
            return True
        if not ordered:
            return False
        if not (a.ordered or b.ordered):
            return False
        if not (has_float(a.rows) or has_float(b.rows)):
            return not _chain_ok(a, b)
    elif bag or ordered:
        if not _max_flow_ok(a, b, wild):
            return True
    else:
        # sets: a row every allowed result of one side holds has no counterpart on the other
        for x, y in ((a, b), (b, a)):
            certain = [r for rows, take in x.blocks if take == len(rows) for r in rows]
            possible = y.rows
            for r in certain:
                if not any(_compatible(r, s, wild) for s in possible):
                    return True
        if (a.size == 0) != (b.size == 0):
            return True
    if ordered:
        for ca, cb in zip(_positions(a), _positions(b)):
            if not any(_compatible(r, s, wild) for r in ca for s in cb):
                return True
    return False


def _permuted(space: OutcomeSpace, perm: Sequence[int]) -> OutcomeSpace:
    inverse = {j: i for i, j in enumerate(perm)}
    return OutcomeSpace([([tuple(r[j] for j in perm) for r in rows], take) for rows, take in space.blocks],
                        space.ordered, frozenset(inverse[j] for j in space.wildcards if j in inverse),
                        space.width, space.opaque)


def certainly_differ(a: OutcomeSpace, b: OutcomeSpace, *, ordered: bool, bag: bool = True,
                     permute_columns: bool = True) -> bool:
    """True only when no allowed result of ``a`` equals an allowed result of ``b`` under the
    match options (row order when ``ordered``, bag or set, any column order with
    ``permute_columns``). False when they may be equal, when either space is opaque, or when
    the column-order search hit its bounds."""
    if a.opaque or b.opaque:
        return False
    if a.size == 0 and b.size == 0:
        return False
    if a.size and b.size and a.width != b.width:
        return True
    if (bag or ordered) and a.size != b.size:
        return True
    if a.size == 0 or b.size == 0:
        return (a.size == 0) != (b.size == 0)
    width = a.width or 0
    if not permute_columns or width < 2:
        return _disjoint(a, b, ordered=ordered, bag=bag)
    if not _disjoint(a, b, ordered=ordered, bag=bag):
        return False
    arows, brows = a.rows, b.rows
    fixed = a.full and b.full
    col_eq = bags_equal if bag or ordered else sets_equal
    cache: dict[tuple[int, int], bool] = {}

    akinds, bkinds = a.wild_kinds(), b.wild_kinds()

    def compatible(i: int, j: int) -> bool:
        if i in akinds and j in bkinds:
            return True
        if i in akinds:  # a wildcard takes only values of its kinds
            return all(_free(r[j], akinds[i]) for r in brows)
        if j in bkinds:
            return all(_free(r[i], bkinds[j]) for r in arows)
        if not fixed:
            return True
        if (i, j) not in cache:
            cache[(i, j)] = col_eq([(r[i],) for r in arows], [(r[j],) for r in brows])
        return cache[(i, j)]

    def classes(rows: list[tuple], wild: frozenset[int]) -> list[int]:
        seen: dict[tuple, int] = {}
        return [seen.setdefault((i in wild, tuple(r[i] for r in rows)), len(seen)) for i in range(width)]

    perms, complete = column_assignments(width, compatible, classes(arows, a.wildcards),
                                         classes(brows, b.wildcards))
    if not complete or len(perms) >= MAX_PERMUTATIONS:
        return False
    return all(_disjoint(a, _permuted(b, perm), ordered=ordered, bag=bag) for perm in perms)
