"""Schema variants of the same data, for the robustness of Text2SQL across schemas.

Each variant renames every table and column of a database by a fixed rule and holds exactly the
same rows (:func:`build_variant_database`):

- ``original`` — the database as built;
- ``snake_case`` — lower-case words joined by ``_`` (``Song_release_year`` → ``song_release_year``,
  ``TVChannel`` → ``tv_channel``);
- ``camel_case`` — tables in PascalCase (``SingerInConcert``), columns in camelCase
  (``songReleaseYear``);
- ``prefixed`` — tables ``t_<snake name>``, columns ``<snake table>_<snake column>`` (unless the
  column already starts with the table's name), the naming convention of many warehouses.

Names that would collide after renaming get ``_2``, ``_3``... Gold SQL is translated with
sqlglot (:func:`translate_sql`): table references are renamed, and every column is renamed by
the table it belongs to (its qualifier's table, or the one table of its scope — or an enclosing
scope — that has a column of that name). A translation is kept only when the translated gold
query returns the same result on the variant as the gold query on the original
(:func:`tasks.scoring.result_match.results_match`); questions failing that are left out of the variant
comparison and counted.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.scope import Scope, traverse_scope

from schemas.lifecycle import SCHEMA_VARIANTS
from tasks.db.relschema import Column, ForeignKey, Table
from tasks.lifecycle.naming import split_words
from tasks.lifecycle.schema import Schema, read_sqlite_schema, render_ddl

__all__ = [
    "VARIANTS",
    "TranslationError",
    "VariantMaps",
    "build_variant_database",
    "translate_sql",
    "variant_maps",
]

VARIANTS = SCHEMA_VARIANTS


@dataclass
class VariantMaps:
    """Renaming of one database for one variant: ``tables`` ``{old lower: new}``, ``columns``
    ``{old table lower: {old column lower: new}}``."""

    variant: str
    tables: dict[str, str]
    columns: dict[str, dict[str, str]]


def _snake(name: str) -> str:
    return "_".join(split_words(name)) or name.lower()


def _pascal(name: str) -> str:
    return "".join(w.capitalize() for w in split_words(name)) or name


def _camel(name: str) -> str:
    p = _pascal(name)
    return p[:1].lower() + p[1:]


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        base, k = n, 1
        while n.lower() in seen:
            k += 1
            n = f"{base}_{k}"
        seen[n.lower()] = 1
        out.append(n)
    return out


def variant_maps(schema: Schema, variant: str) -> VariantMaps:
    """The renaming of ``schema`` for ``variant`` (one of :data:`VARIANTS`). Raises ValueError
    for an unknown variant."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown schema variant {variant!r}; expected one of {VARIANTS}")
    old_tables = [t.name for t in schema.tables]
    if variant == "original":
        new_tables = list(old_tables)
    elif variant == "snake_case":
        new_tables = [_snake(t) for t in old_tables]
    elif variant == "camel_case":
        new_tables = [_pascal(t) for t in old_tables]
    else:
        new_tables = ["t_" + _snake(t) for t in old_tables]
    new_tables = _unique(new_tables)
    columns: dict[str, dict[str, str]] = {}
    for t in schema.tables:
        old = [c.name for c in t.columns]
        if variant == "original":
            new = list(old)
        elif variant == "snake_case":
            new = [_snake(c) for c in old]
        elif variant == "camel_case":
            new = [_camel(c) for c in old]
        else:
            ts = _snake(t.name)
            new = [
                _snake(c)
                if _snake(c) == ts or _snake(c).startswith(ts + "_")
                else f"{ts}_{_snake(c)}"
                for c in old
            ]
        columns[t.name.lower()] = dict(zip((c.lower() for c in old), _unique(new)))
    return VariantMaps(variant, dict(zip((t.lower() for t in old_tables), new_tables)), columns)


def _renamed_schema(schema: Schema, maps: VariantMaps) -> Schema:
    tables = []
    for t in schema.tables:
        cm = maps.columns[t.name.lower()]
        fks = []
        for fk in t.foreign_keys:
            ref = fk.ref_table.lower()
            rcm = maps.columns.get(ref, {})
            fks.append(
                ForeignKey(
                    tuple(cm.get(c.lower(), c) for c in fk.columns),
                    maps.tables.get(ref, fk.ref_table),
                    tuple(rcm.get(c.lower(), c) for c in fk.ref_columns),
                )
            )
        tables.append(
            Table(
                maps.tables[t.name.lower()],
                [Column(cm[c.name.lower()], c.type) for c in t.columns],
                tuple(cm[c.lower()] for c in t.primary_key),
                fks,
            )
        )
    return Schema(tables)


def build_variant_database(source: str | Path, out_path: str | Path, variant: str) -> VariantMaps:
    """Write the ``variant`` of the SQLite database ``source`` to ``out_path`` (same rows,
    renamed tables and columns; written to a temporary file and renamed into place; rebuilt
    only when older than ``source``). Returns the renaming. ``original`` is built the same way
    (a copy through the same path)."""
    source, out_path = Path(source), Path(out_path)
    schema = read_sqlite_schema(source)
    maps = variant_maps(schema, variant)
    if out_path.exists() and out_path.stat().st_mtime >= source.stat().st_mtime:
        return maps
    renamed = _renamed_schema(schema, maps)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
        dst = sqlite3.connect(tmp)
        try:
            dst.executescript(render_ddl(renamed))
            for old, new in zip(schema.tables, renamed.tables):
                cols = ", ".join('"' + c.name.replace('"', '""') + '"' for c in old.columns)
                rows = src.execute(f'SELECT {cols} FROM "{old.name}"').fetchall()
                if rows:
                    ncols = ", ".join('"' + c.name.replace('"', '""') + '"' for c in new.columns)
                    marks = ", ".join("?" * len(new.columns))
                    dst.executemany(f'INSERT INTO "{new.name}" ({ncols}) VALUES ({marks})', rows)
            dst.commit()
        finally:
            src.close()
            dst.close()
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return maps


class TranslationError(ValueError):
    """A gold query cannot be translated to a schema variant (ambiguous or unknown column)."""


def _source_table(scope: Scope, qualifier: str) -> exp.Table | None | bool:
    """The base table a qualifier names in ``scope`` (or an enclosing scope); False when it
    names a derived table/CTE; None when unknown."""
    s: Scope | None = scope
    while s is not None:
        for name, src in s.sources.items():
            if name.lower() == qualifier.lower():
                return src if isinstance(src, exp.Table) else False
        s = s.parent
    return None


def translate_sql(sql: str, maps: VariantMaps, schema: Schema, read: str = "mysql") -> str:
    """``sql`` (a gold query over ``schema``) rewritten for a schema variant: tables and
    columns renamed by ``maps`` (see module docstring); output is SQLite with every identifier
    quoted. Raises :class:`TranslationError` for a column that cannot be attributed."""
    tree = sqlglot.parse_one(sql, read=read)
    if maps.variant == "original":
        return tree.sql(dialect="sqlite")
    cols_of = {t.name.lower(): {c.name.lower() for c in t.columns} for t in schema.tables}
    scope_of = {id(sc.expression): sc for sc in traverse_scope(tree)}
    renames: list[tuple[exp.Expression, str]] = []
    for col in list(tree.find_all(exp.Column)):
        owner_q = col.parent
        while owner_q is not None and id(owner_q) not in scope_of:
            owner_q = owner_q.parent
        if owner_q is None:
            continue
        scope = scope_of[id(owner_q)]
        name = col.name.lower()
        if col.table:
            src = _source_table(scope, col.table)
            if src is False:
                continue  # a derived table's output column keeps its name
            if src is None:
                raise TranslationError(f"unknown qualifier {col.table!r} in {col.sql()}")
            table = src.name.lower()
            if name not in cols_of.get(table, set()):
                raise TranslationError(f"{table} has no column {col.name!r}")
            renames.append((col, maps.columns[table][name]))
            continue
        s: Scope | None = scope
        owners: set[str] = set()
        while s is not None and not owners:
            owners = {
                src.name.lower()
                for src in s.sources.values()
                if isinstance(src, exp.Table) and name in cols_of.get(src.name.lower(), set())
            }
            s = s.parent
        if not owners:
            continue  # a select alias or a derived table's column
        new = {maps.columns[o][name] for o in owners}
        if len(new) > 1:
            raise TranslationError(f"ambiguous column {col.name!r} (tables {sorted(owners)})")
        renames.append((col, new.pop()))
    for col, new in renames:
        col.set("this", exp.to_identifier(new))
    for t in tree.find_all(exp.Table):
        low = t.name.lower()
        if low in maps.tables:
            had_alias = bool(t.alias)
            t.set("this", exp.to_identifier(maps.tables[low]))
            if not had_alias:
                # unaliased references like singer.name keep working through an alias
                t.set("alias", exp.TableAlias(this=exp.to_identifier(low)))
    return tree.sql(dialect="sqlite", identify=True)
