"""Shrinking a counterexample: delta debugging (:func:`ddmin`, Zeller & Hildebrandt, TSE 2002)
over an instance's rows with foreign-key cascade, then simpler non-key values (:func:`_shrink`),
keeping the instance separating the queries (or making exactly one fail).

Split out of :mod:`tasks.equivalence.counterexample`; the code moved verbatim."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tasks.equivalence.instance_generator import cascade
from tasks.equivalence.instances import Instance, RelSchema, enum_values


_SIMPLE: dict[str, list[Any]] = {
    "int": [0, 1], "float": [0.0, 1.0], "decimal": [0.0, 1.0], "text": ["a"], "other": ["a"],
    "date": ["2000-01-01"], "timestamp": ["2000-01-01 00:00:00"], "time": ["00:00:00"],
    "bool": [], "uuid": [], "json": [],
}


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


def _instance_key(inst: Instance) -> tuple:
    return tuple((t, tuple(sorted(rows, key=repr))) for t, rows in sorted(inst.items()))


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
