"""Instance generation for the counterexample finder: :class:`InstanceGenerator` enumerates
small database instances over the value domains (:mod:`tasks.equivalence.value_domains`) that
honour the schema's keys, CHECK constraints and foreign keys; :func:`cascade` drops the rows a
removal left without their referenced row.

Split out of :mod:`tasks.equivalence.counterexample`; the code moved verbatim."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from schemas.equivalence import FinderBudget
from tasks.equivalence.instances import Instance, RelSchema, Table, enum_values
from tasks.equivalence.value_domains import ColKey, SizeHint, _fold


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
