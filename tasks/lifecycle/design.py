"""P1 Design and P2 Implementation items, generated from real schemas (Spider dev, Chinook).

**Design items** (P1): a group of ``k`` tables of one database (``k`` = 1–5; the paper's
default is 2) is picked by a seeded walk along foreign keys (a table reachable through a foreign
key is preferred; an unconnected table is added when none is left). Its requirements text is
rendered by templates from the schema — one paragraph per table naming the entity, every
attribute with a phrase for its type class, the identifying attributes and the references to
other tables of the group (foreign keys to tables outside the group are left out, their
columns stay plain attributes). Sentence templates are chosen by the seeded RNG. The reference
answer is the group's schema (:meth:`Schema.subset`).

**Implementation items** (P2): the same groups plus one item per whole database; the prompt
gives the designed schema as a structured list (table and column names, type classes, keys) and
asks for SQLite DDL; the reference answer is the schema and its DDL (:func:`render_ddl`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from tasks.db.relschema import type_class
from tasks.lifecycle.naming import split_words
from tasks.lifecycle.schema import Schema, render_ddl

__all__ = [
    "TYPE_PHRASES",
    "describe_design",
    "design_items",
    "design_prompt",
    "implementation_items",
    "implementation_prompt",
    "render_requirements",
    "table_groups",
]

#: How requirements texts name each type class.
TYPE_PHRASES = {
    "integer": "a whole number",
    "number": "a decimal number",
    "text": "text",
    "boolean": "a yes/no flag",
    "date": "a date",
    "datetime": "a date and time",
    "time": "a time of day",
    "blob": "binary data",
}
#: How implementation prompts name each type class.
TYPE_WORDS = {
    "integer": "integer",
    "number": "decimal number",
    "text": "text",
    "boolean": "boolean",
    "date": "date",
    "datetime": "date and time",
    "time": "time of day",
    "blob": "binary data",
}

_OPENERS = (
    "The database keeps track of {e} records.",
    "We need to store every {e}.",
    "Each {e} must be recorded.",
    "The system manages {e} data.",
)
_ATTRS = (
    "For each {e} we record its {attrs}.",
    "{Ae} has the following attributes: {attrs}.",
    "The information kept about {ae} is its {attrs}.",
)
_PK_ONE = (
    "{Ae} is identified by its {a}.",
    "The {a} uniquely identifies {ae}.",
)
_PK_MANY = (
    "The combination of {a} identifies {ae}.",
    "{Ae} is identified by its {a} together.",
)
_FK = (
    "Each {e} refers to {ar} through its {c}, which holds the {rc} of that {r}.",
    "The {c} of {ae} links it to {ar} (it is the {r}'s {rc}).",
)


def _article(phrase: str) -> str:
    return ("an " if phrase[:1].lower() in "aeiou" else "a ") + phrase


def _words(name: str) -> str:
    return " ".join(split_words(name)) or name


def _join(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def render_requirements(group: Schema, rng: random.Random) -> str:
    """Requirements text for the tables of ``group`` (one paragraph per table; see module
    docstring). Deterministic for a given ``rng`` state."""
    names = [_words(t.name) for t in group.tables]
    k = len(group.tables)
    intro = (
        f"The database must hold {k} kinds of records: {_join(names)}."
        if k > 1
        else f"The database must hold one kind of record: {names[0]}."
    )
    paras = [intro]
    for t in group.tables:
        e = _words(t.name)
        art = {"e": e, "ae": _article(e), "Ae": _article(e).capitalize()}
        attrs = [f"{_words(c.name)} ({TYPE_PHRASES[type_class(c.type)]})" for c in t.columns]
        parts = [
            rng.choice(_OPENERS).format(**art),
            rng.choice(_ATTRS).format(**art, attrs=_join(attrs)),
        ]
        if len(t.primary_key) == 1:
            parts.append(rng.choice(_PK_ONE).format(**art, a=_words(t.primary_key[0])))
        elif t.primary_key:
            parts.append(
                rng.choice(_PK_MANY).format(**art, a=_join([_words(c) for c in t.primary_key]))
            )
        for fk in t.foreign_keys:
            ref_cols = group.resolved_ref_columns(fk) or fk.ref_columns
            r = _words(fk.ref_table)
            parts.append(
                rng.choice(_FK).format(
                    **art,
                    r=r,
                    ar=_article(r),
                    c=_join([_words(c) for c in fk.columns]),
                    rc=_join([_words(c) for c in ref_cols]) or "identifier",
                )
            )
        paras.append(" ".join(parts))
    return "\n\n".join(paras)


_DESIGN_FORMAT = (
    '{"tables": [{"name": "...", "columns": [{"name": "...", "type": "..."}], '
    '"primary_key": ["..."], "foreign_keys": [{"columns": ["..."], '
    '"references": {"table": "...", "columns": ["..."]}}]}]}'
)


def design_prompt(requirements: str, k: int) -> str:
    """The user turn of a design item."""
    tables = "exactly 1 table" if k == 1 else f"exactly {k} tables"
    return (
        f"Requirements:\n\n{requirements}\n\n"
        f"Design a relational database schema with {tables} for these requirements. Name every "
        "table and column (use names derived from the requirements), give every column a data "
        "type, and declare the primary key of each table and the foreign keys between tables. "
        f"Answer with one JSON object in a ```json code block, in this form:\n{_DESIGN_FORMAT}"
    )


def describe_design(schema: Schema) -> str:
    """The designed schema as a structured list (one ``Table <name>:`` block per table, one
    ``- <column>: <type words>, primary key, references <table>(<column>)`` line per column):
    the design text of an implementation prompt."""
    lines = []
    for t in schema.tables:
        lines.append(f"Table {t.name}:")
        fk_of = {}
        for fk in t.foreign_keys:
            refs = schema.resolved_ref_columns(fk) or fk.ref_columns
            for c, r in zip(fk.columns, refs or [""] * len(fk.columns)):
                fk_of[c.lower()] = f"{fk.ref_table}({r})" if r else fk.ref_table
        for c in t.columns:
            notes = [TYPE_WORDS[type_class(c.type)]]
            if c.name in t.primary_key and len(t.primary_key) == 1:
                notes.append("primary key")
            if c.name.lower() in fk_of:
                notes.append(f"references {fk_of[c.name.lower()]}")
            lines.append(f"- {c.name}: {', '.join(notes)}")
        if len(t.primary_key) > 1:
            lines.append(f"- primary key: ({', '.join(t.primary_key)})")
        lines.append("")
    return "\n".join(lines).rstrip()


def implementation_prompt(schema: Schema, description: str | None = None) -> str:
    """The user turn of an implementation item: the designed schema as a structured list
    (:func:`describe_design`; ``description`` replaces it, e.g. with a model's paraphrase)."""
    text = describe_design(schema) if description is None else description
    return (
        "Here is a database design:\n\n"
        f"{text}\n\n"
        "Write the SQLite DDL that implements this design: one CREATE TABLE statement per table, "
        "with exactly these table and column names, a SQLite column type for each data type, and "
        "the primary and foreign keys. Answer with the SQL in a ```sql code block."
    )


def table_groups(schema: Schema, k: int, n: int, rng: random.Random) -> list[list[str]]:
    """Up to ``n`` distinct groups of ``k`` table names of ``schema`` (each in schema order),
    grown from seeded start tables along foreign keys (see module docstring). Empty when the
    schema has fewer than ``k`` tables."""
    names = [t.name for t in schema.tables]
    if k < 1 or len(names) < k:
        return []
    adj: dict[str, set[str]] = {t: set() for t in names}
    low = {t.lower(): t for t in names}
    for t in schema.tables:
        for fk in t.foreign_keys:
            ref = low.get(fk.ref_table.lower())
            if ref and ref != t.name:
                adj[t.name].add(ref)
                adj[ref].add(t.name)
    starts = list(names)
    rng.shuffle(starts)
    order = {t: i for i, t in enumerate(names)}
    seen: set[frozenset] = set()
    groups: list[list[str]] = []
    for start in starts:
        group = [start]
        while len(group) < k:
            near = sorted({x for g in group for x in adj[g]} - set(group), key=order.get)
            pool = near or sorted(set(names) - set(group), key=order.get)
            group.append(rng.choice(pool))
        key = frozenset(group)
        if key in seen:
            continue
        seen.add(key)
        groups.append(sorted(group, key=order.get))
        if len(groups) >= n:
            break
    return groups


def _item(
    phase: str,
    item_id: str,
    db_id: str,
    source: str,
    seed: int,
    prompt: str,
    reference: dict,
    context: dict,
) -> dict:
    return {
        "item_id": item_id,
        "phase": phase,
        "base_id": item_id.split("/", 1)[1],
        "source": source,
        "db_id": db_id,
        "variant": "original",
        "level": 0,
        "seed": seed,
        "prompt": prompt,
        "reference": reference,
        "context": context,
    }


def design_items(
    schemas: Mapping[str, Schema],
    table_counts: list[int],
    groups_per_db: int,
    seed: int,
    sources: Mapping[str, str] | None = None,
) -> list[dict]:
    """P1 items: for each database (``{db_id: Schema}``, sorted by id) and each ``k`` in
    ``table_counts``, up to ``groups_per_db`` table groups with their templated requirements.
    ``item_id`` = ``design/<db_id>/k<k>/<n>``; ``reference`` = ``{"schema": ...}``; ``context``
    = ``{"tables": [...], "k": k}``. ``sources`` maps db ids to ``spider``/``chinook``."""
    items = []
    for db_id in sorted(schemas):
        schema = schemas[db_id]
        for k in table_counts:
            rng = random.Random(f"{seed}:design:{db_id}:{k}")
            for n, group in enumerate(table_groups(schema, k, groups_per_db, rng)):
                sub = schema.subset(group)
                text = render_requirements(sub, rng)
                items.append(
                    _item(
                        "design",
                        f"design/{db_id}/k{k}/{n}",
                        db_id,
                        (sources or {}).get(db_id, "spider"),
                        seed,
                        design_prompt(text, k),
                        {"schema": sub.to_dict()},
                        {"tables": group, "k": k, "requirements": text},
                    )
                )
    return items


def implementation_items(
    schemas: Mapping[str, Schema],
    table_counts: list[int],
    groups_per_db: int,
    seed: int,
    sources: Mapping[str, str] | None = None,
) -> list[dict]:
    """P2 items: the design groups (same seeds, so item ``implementation/<db>/k<k>/<n>``
    implements the design of ``design/<db>/k<k>/<n>``) plus ``implementation/<db>/all`` for
    each whole database. ``reference`` = ``{"schema": ..., "ddl": ...}``."""
    items = []
    for db_id in sorted(schemas):
        schema = schemas[db_id]
        groups = []
        for k in table_counts:
            rng = random.Random(f"{seed}:design:{db_id}:{k}")
            groups += [
                (f"k{k}/{n}", g) for n, g in enumerate(table_groups(schema, k, groups_per_db, rng))
            ]
        groups.append(("all", [t.name for t in schema.tables]))
        for suffix, group in groups:
            sub = schema.subset(group)
            items.append(
                _item(
                    "implementation",
                    f"implementation/{db_id}/{suffix}",
                    db_id,
                    (sources or {}).get(db_id, "spider"),
                    seed,
                    implementation_prompt(sub),
                    {"schema": sub.to_dict(), "ddl": render_ddl(sub)},
                    {"tables": group, "k": len(group)},
                )
            )
    return items
