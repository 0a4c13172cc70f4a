"""A placement's table, built deterministically from the canonical tables: its rows
(:func:`_base_table`: columns, ``derive`` columns, ``where``, order), its perturbations
(:func:`perturb_placement`: text templates, composed clauses, fuzzy keys (:func:`fuzz_value`),
split lists; numbers in words, :func:`number_words`) and, for a shard placement, the tables it
is cut into (:func:`shard_tables`).

Split out of :mod:`tasks.datasets.build`; the code moved verbatim."""

from __future__ import annotations

import random
import re
import string
from pathlib import Path

import duckdb
import pyarrow as pa

from schemas.spec import ComposeOp, DatasetSpec, FormatOp, FuzzOp, SplitOp
from tasks.datasets.spec import SpecError, template_fields


_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "- - twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> str:
    """An integer in English words: ``149`` → ``"one hundred forty-nine"``, ``-3`` →
    ``"minus three"``, ``2013`` → ``"two thousand thirteen"`` (up to the billions)."""
    n = int(n)
    if n < 0:
        return "minus " + number_words(-n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    for size, word in ((10**9, "billion"), (10**6, "million"), (1000, "thousand"),
                       (100, "hundred")):
        if n >= size:
            head, rest = divmod(n, size)
            return number_words(head) + " " + word + ("" if rest == 0 else " " + number_words(rest))
    raise AssertionError(n)  # pragma: no cover


class _Formatter(string.Formatter):
    """``str.format`` that renders NULL as ``unknown`` and ignores format specs on NULL, plus the
    format specs ``words`` / ``Words`` (an integer in English words, see :func:`number_words`)."""

    def format_field(self, value, format_spec):
        if value is None:
            return "unknown"
        if format_spec in ("words", "Words"):
            text = number_words(value)
            return text[:1].upper() + text[1:] if format_spec == "Words" else text
        return super().format_field(value, format_spec)


_FMT = _Formatter()


_CASES = ("upper", "lower", "title", "keep")
_SPACES = ("lead", "trail", "both", "inner")


def fuzz_value(value: str | None, op: FuzzOp, rng: random.Random) -> str | None:
    """One fuzzy key (see :class:`schemas.spec.FuzzOp`); draws from ``rng`` in a fixed order so
    the same seed gives the same keys. NULL stays NULL."""
    hit = rng.random() < op.rate
    case, space = rng.choice(_CASES), rng.choice(_SPACES)
    if value is None or not hit:
        return value
    v = str(value)
    if "abbreviate" in op.kinds:
        for word in sorted(op.abbreviations, key=len, reverse=True):
            v = re.sub(rf"(?<!\w){re.escape(word)}(?!\w)", op.abbreviations[word], v)
    if "truncate" in op.kinds and op.length:
        v = v[: op.length]
    if "case" in op.kinds:
        v = {"upper": v.upper(), "lower": v.lower(), "title": v.title(), "keep": v}[case]
    if "whitespace" in op.kinds:
        if space == "inner" and " " in v.strip():
            v = v.replace(" ", "  ", 1)
        elif space in ("lead", "inner"):
            v = "  " + v
        elif space == "trail":
            v = v + " "
        else:
            v = " " + v + "  "
    return v


def _compose(op: ComposeOp, row: dict, rng: random.Random, fields: dict[str, list[str]]) -> str:
    """One row's text of a :class:`schemas.spec.ComposeOp` (draws from ``rng`` in a fixed
    order: one choice per clause, then one shuffle)."""
    parts: list[tuple[int, str]] = []
    for i, clause in enumerate(op.clauses):
        tmpl = rng.choice(clause)
        if all(row[f] is not None for f in fields[tmpl]):
            parts.append((i, _FMT.format(tmpl, **row)))
    head = [t for i, t in parts if i < op.keep_first]
    rest = [t for i, t in parts if i >= op.keep_first]
    if op.shuffle:
        rng.shuffle(rest)
    return op.sep.join(head + rest)


def _base_table(spec: DatasetSpec, index: int, canonical: dict[str, pa.Table],
                spec_file: str | Path) -> pa.Table:
    """Placement ``index``'s rows before the transforms: its columns and ``derive`` columns,
    ``where`` filter and order (a shard placement: ordered by its shard column first, NULLs
    left out). Raises SpecError naming the ``derive`` entry or ``where`` that fails."""
    pl = spec.placements[index]
    con = duckdb.connect()
    con.register("t", canonical[pl.source])
    select = [f'"{c}"' for c in pl.columns]
    select += [f'({expr}) AS "{name}"' for name, expr in pl.derive.items()]
    where = [f"({pl.where})"] if pl.where else []
    order = list(pl.order_by)
    if pl.shard is not None:
        where.append(f'"{pl.shard.by}" IS NOT NULL')
        order = [pl.shard.by] + [c for c in order if c != pl.shard.by]
    sql = f"SELECT {', '.join(select)} FROM t"
    if where:
        sql += " WHERE " + " AND ".join(where)
    if order:
        sql += " ORDER BY " + ", ".join(f'"{c}"' for c in order)
    try:
        return con.sql(sql).to_arrow_table()
    except duckdb.Error as exc:
        for name, expr in pl.derive.items():
            try:
                con.sql(f"SELECT ({expr}) FROM t LIMIT 0")
            except duckdb.Error as bad:
                raise SpecError(spec_file, f"placements[{index}].derive.{name}",
                                str(bad).splitlines()[0]) from exc
        raise SpecError(spec_file, f"placements[{index}].where",
                        str(exc).splitlines()[0]) from exc


def perturb_placement(
    spec: DatasetSpec, index: int, canonical: dict[str, pa.Table], spec_file: str | Path = "<spec>"
) -> pa.Table:
    """Apply placement ``index``'s row filter, column selection, derived columns and transforms.

    Seeded and deterministic: random choices (text templates, composed clauses, fuzzy keys)
    come from ``random.Random`` seeded with ``"<spec.seed>:<database>:<name>"``. Returns the
    placed pyarrow Table (for a shard placement: all shards in one table, ordered by the shard
    column, which is kept; see :func:`shard_tables`). A placement without transforms stays
    columnar (large tables are cheap). Raises SpecError for a failing ``derive`` or ``where``.
    """
    pl = spec.placements[index]
    base = _base_table(spec, index, canonical, spec_file)
    if not pl.transforms:
        return base.rename_columns([pl.rename.get(c, c) for c in base.column_names])
    types = {f.name: f.type for f in base.schema}
    rows = base.to_pylist()
    order = list(base.column_names)
    rng = random.Random(f"{spec.seed}:{pl.database}:{pl.name}")
    for op in pl.transforms:
        if isinstance(op, SplitOp):
            for r in rows:
                v = r[op.column]
                r[op.column] = [s.strip() for s in v.split(op.sep) if s.strip()] if v else []
            types[op.column] = pa.list_(pa.string())
            continue
        if isinstance(op, FuzzOp):
            target = op.into or op.column
            for r in rows:
                r[target] = fuzz_value(r[op.column], op, rng)
        elif isinstance(op, ComposeOp):
            target = op.column
            fields = {t: template_fields(t) for clause in op.clauses for t in clause}
            for r in rows:
                r[target] = _compose(op, r, rng, fields)
        else:
            target = op.column
            for r in rows:
                tmpl = op.template if isinstance(op, FormatOp) else rng.choice(op.templates)
                r[target] = _FMT.format(tmpl, **r)
        types[target] = pa.string()
        if target not in order:
            order.append(target)
        for c in op.drop:
            order.remove(c)
            for r in rows:
                r.pop(c, None)
    schema = pa.schema([(pl.rename.get(c, c), types[c]) for c in order])
    data = {pl.rename.get(c, c): [r[c] for r in rows] for c in order}
    return pa.table(data, schema=schema)


_TABLE_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def shard_tables(
    spec: DatasetSpec, index: int, placed: pa.Table, spec_file: str | Path = "<spec>"
) -> list[tuple[str, str, int, int]]:
    """The tables of shard placement ``index``: ``(table name, shard value, offset, rows)`` per
    distinct value of its shard column, in the order of ``placed`` (the output of
    :func:`perturb_placement`, ordered by that column), so each table is the zero-copy slice
    ``placed.slice(offset, rows)`` without the shard column. Raises SpecError naming
    ``placements[i].shard.table`` when two values give the same table name or a name has
    characters other than letters, digits and ``_``."""
    pl = spec.placements[index]
    assert pl.shard is not None
    by = pl.shard.by
    template = pl.shard.table or "{" + by + "}"
    values = placed.column(by).to_pylist()
    out: list[tuple[str, str, int, int]] = []
    seen: dict[str, str] = {}
    start = 0
    for i in range(1, len(values) + 1):
        if i < len(values) and values[i] == values[start]:
            continue
        value = values[start]
        name = _FMT.format(template, **{by: value})
        name = {"lower": name.lower(), "upper": name.upper(), "keep": name}[pl.shard.case]
        if not _TABLE_NAME.match(name) or name in seen:
            why = (f"values {seen[name]!r} and {value!r} both give table {name!r}" if name in seen
                   else f"table name {name!r} (from {value!r}) is not letters, digits and _")
            raise SpecError(spec_file, f"placements[{index}].shard.table",
                            f"{why}; fix: change `table` or `case`, or filter with `where`")
        seen[name] = str(value)
        out.append((name, str(value), start, i - start))
        start = i
    return out
