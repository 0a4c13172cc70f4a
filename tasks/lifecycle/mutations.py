"""P4 Debugging items: deterministic mutations of gold SQL that make it fail with an error.

Five mutation kinds, each producing candidate flawed queries in a seeded order; the first
candidate that **fails with an SQLite error** is kept (with that error message), else the next
kind is tried, else the question yields no debugging item:

- ``wrong_alias`` — a qualified column gets the qualifier of another FROM item that lacks the
  column, or an undefined alias (``T9.name``);
- ``missing_table`` — a joined table (and its join condition) is removed, so its columns no
  longer resolve; a single-table query reads a table name the database does not have;
- ``misspelt_column`` — a column name loses, doubles or swaps a letter (checked to be no
  column of the database);
- ``syntax_error`` — a keyword is misspelt (``SELEC``, ``FORM``, ``WHER``), ``GROUP BY`` loses
  ``BY``, a closing parenthesis is dropped or a stray comma inserted;
- ``type_error`` — SQLite is dynamically typed and raises no error for most type mismatches,
  so the errors it does raise for misused values stand in: an aggregate called with the wrong
  number of arguments (``wrong number of arguments to function avg()``) or a row value compared
  with a scalar (``row value misused``).

The reference correction is the gold query itself; items keep only mutations whose flawed SQL
fails while the reference executes (:func:`make_debug_item`).
"""

from __future__ import annotations

import random
import re
import sqlite3
from collections.abc import Iterable
from pathlib import Path

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from tasks.text2sql.spider import run_sqlite

__all__ = ["MUTATION_KINDS", "debug_candidates", "make_debug_item", "misspell"]

MUTATION_KINDS = ("wrong_alias", "missing_table", "misspelt_column", "syntax_error", "type_error")

_FROM = "from_" if "from_" in exp.Select.arg_types else "from"


def _sql(e: exp.Expression) -> str:
    return e.sql(dialect="sqlite")


def misspell(name: str, rng: random.Random, avoid: Iterable[str] = ()) -> str:
    """A misspelling of ``name`` (a letter dropped, doubled or two letters swapped) that is not
    in ``avoid`` (case-insensitive); ``name + "x"`` when every edit collides."""
    bad = {a.lower() for a in avoid} | {name.lower()}
    edits = []
    for i in range(1, len(name)):
        edits.append(name[:i] + name[i + 1 :])  # drop
        edits.append(name[:i] + name[i] + name[i:])  # double
        if i < len(name) - 1 and name[i] != name[i + 1]:
            edits.append(name[:i] + name[i + 1] + name[i] + name[i + 2 :])  # swap
    rng.shuffle(edits)
    for e in edits:
        if e and e.lower() not in bad and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", e):
            return e
    return name + "x"


def _wrong_alias(tree: exp.Expression, rng: random.Random) -> list[str]:
    out = []
    aliases = sorted({t.alias_or_name for t in tree.find_all(exp.Table)})
    cols = [c for c in tree.find_all(exp.Column) if c.table]
    rng.shuffle(cols)
    for c in cols[:4]:
        others = [a for a in aliases if a.lower() != c.table.lower()]
        undefined = next(
            f"T{i}" for i in range(9, 100) if f"T{i}".lower() not in {a.lower() for a in aliases}
        )
        for alias in [rng.choice(others)] if others else []:
            t = tree.copy()
            target = next(x for x in t.find_all(exp.Column) if x.meta.get("_m") == id(c))
            target.set("table", exp.to_identifier(alias))
            out.append(_sql(t))
        t = tree.copy()
        target = next(x for x in t.find_all(exp.Column) if x.meta.get("_m") == id(c))
        target.set("table", exp.to_identifier(undefined))
        out.append(_sql(t))
    if not cols:
        plain = [c for c in tree.find_all(exp.Column) if not c.table]
        if plain:
            c = rng.choice(plain)
            t = tree.copy()
            target = next(x for x in t.find_all(exp.Column) if x.meta.get("_m") == id(c))
            target.set("table", exp.to_identifier("T9"))
            out.append(_sql(t))
    return out


def _missing_table(tree: exp.Expression, rng: random.Random, tables: set[str]) -> list[str]:
    out = []
    joins = [j for j in tree.find_all(exp.Join)]
    rng.shuffle(joins)
    for j in joins:
        t = tree.copy()
        target = next(x for x in t.find_all(exp.Join) if x.meta.get("_m") == id(j))
        target.pop()
        out.append(_sql(t))
    refs = [t for t in tree.find_all(exp.Table)]
    rng.shuffle(refs)
    for ref in refs[:2]:
        name = ref.name
        new = name[:-1] if name.lower().endswith("s") else name + "s"
        if new.lower() in tables:
            new = name + "_list"
        t = tree.copy()
        target = next(x for x in t.find_all(exp.Table) if x.meta.get("_m") == id(ref))
        target.set("this", exp.to_identifier(new))
        if not ref.alias:
            target.set("alias", exp.TableAlias(this=exp.to_identifier(name)))
        out.append(_sql(t))
    return out


def _misspelt_column(tree: exp.Expression, rng: random.Random, columns: set[str]) -> list[str]:
    out = []
    cols = [c for c in tree.find_all(exp.Column) if c.name and c.name.lower() in columns]
    rng.shuffle(cols)
    for c in cols[:4]:
        t = tree.copy()
        target = next(x for x in t.find_all(exp.Column) if x.meta.get("_m") == id(c))
        target.set("this", exp.to_identifier(misspell(c.name, rng, columns)))
        out.append(_sql(t))
    return out


_SYNTAX = (
    (re.compile(r"\bSELECT\b", re.IGNORECASE), "SELEC"),
    (re.compile(r"\bFROM\b", re.IGNORECASE), "FORM"),
    (re.compile(r"\bWHERE\b", re.IGNORECASE), "WHER"),
    (re.compile(r"\bGROUP BY\b", re.IGNORECASE), "GROUP"),
    (re.compile(r"\)"), ""),
    (re.compile(r"\bSELECT\b", re.IGNORECASE), "SELECT ,"),
)
_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`")


def _syntax_error(tree: exp.Expression, rng: random.Random) -> list[str]:
    sql = _sql(tree)
    spans = [m.span() for m in _QUOTED.finditer(sql)]
    out = []
    edits = list(_SYNTAX)
    rng.shuffle(edits)
    for rx, text in edits:
        for m in rx.finditer(sql):
            if not any(a <= m.start() < b for a, b in spans):
                out.append(sql[: m.start()] + text + sql[m.end() :])
                break
    return out


def _type_error(tree: exp.Expression, rng: random.Random) -> list[str]:
    out = []
    aggs = [
        a
        for a in tree.find_all(exp.AggFunc)
        if isinstance(a.this, exp.Expression) and not isinstance(a.this, exp.Star)
    ]
    rng.shuffle(aggs)
    for a in aggs[:2]:
        t = tree.copy()
        target = next(x for x in t.find_all(exp.AggFunc) if x.meta.get("_m") == id(a))
        arg = target.this
        if isinstance(arg, exp.Distinct):
            arg = arg.expressions[0] if arg.expressions else arg
        name = target.sql_name() if hasattr(target, "sql_name") else type(target).__name__.upper()
        target.replace(exp.Anonymous(this=name, expressions=[arg.copy(), arg.copy()]))
        out.append(_sql(t))
    comps = [
        c
        for c in tree.find_all(exp.EQ, exp.GT, exp.LT, exp.GTE, exp.LTE, exp.NEQ)
        if isinstance(c.expression, exp.Literal)
    ]
    rng.shuffle(comps)
    for c in comps[:2]:
        t = tree.copy()
        target = next(x for x in t.find_all(type(c)) if x.meta.get("_m") == id(c))
        lit = target.expression
        target.set("expression", exp.Tuple(expressions=[lit.copy(), lit.copy()]))
        out.append(_sql(t))
    sel = tree if isinstance(tree, exp.Select) else next(tree.find_all(exp.Select), None)
    if sel is not None:
        cols = [e for e in sel.expressions if isinstance(e, exp.Column)]
        if cols:
            t = tree.copy()
            target = next(x for x in t.find_all(exp.Column) if x.meta.get("_m") == id(cols[0]))
            target.replace(exp.Tuple(expressions=[target.copy(), target.copy()]))
            out.append(_sql(t))
    return out


def debug_candidates(
    sql: str,
    kind: str,
    rng: random.Random,
    tables: set[str],
    columns: set[str],
    read: str = "mysql",
) -> list[str]:
    """Candidate flawed versions of ``sql`` for one mutation ``kind`` (SQLite text, in seeded
    order). ``tables``/``columns``: the database's names, lower-case. Raises ValueError for an
    unknown kind; an unparsable ``sql`` gives no candidates."""
    if kind not in MUTATION_KINDS:
        raise ValueError(f"unknown mutation kind {kind!r}; expected one of {MUTATION_KINDS}")
    try:
        tree = sqlglot.parse_one(sql, read=read)
    except (ParseError, TokenError):
        return []
    for node in tree.walk():  # stable markers to find a node again in a copy
        node.meta["_m"] = id(node)
    if kind == "wrong_alias":
        cands = _wrong_alias(tree, rng)
    elif kind == "missing_table":
        cands = _missing_table(tree, rng, tables)
    elif kind == "misspelt_column":
        cands = _misspelt_column(tree, rng, columns)
    elif kind == "syntax_error":
        cands = _syntax_error(tree, rng)
    else:
        cands = _type_error(tree, rng)
    seen, out = set(), []
    for c in cands:
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def make_debug_item(
    sql: str,
    db_path: str | Path,
    index: int,
    seed: int,
    key: str,
    tables: set[str],
    columns: set[str],
    timeout_ms: int = 10_000,
) -> dict | None:
    """The debugging mutation of gold ``sql`` for question number ``index``: kinds are tried
    from ``MUTATION_KINDS[index % 5]`` on (so kinds are balanced), each kind's candidates in the
    order of an RNG seeded with ``"<seed>:debug:<key>:<kind>"``. Returns ``{"kind",
    "flawed_sql", "error"}`` for the first candidate that fails on ``db_path`` with an SQLite
    error, or None (also when the gold query itself fails)."""
    try:
        run_sqlite(db_path, sql, timeout_ms)
    except (sqlite3.Error, sqlite3.Warning):
        return None
    n = len(MUTATION_KINDS)
    for i in range(n):
        kind = MUTATION_KINDS[(index + i) % n]
        rng = random.Random(f"{seed}:debug:{key}:{kind}")
        for cand in debug_candidates(sql, kind, rng, tables, columns):
            try:
                run_sqlite(db_path, cand, timeout_ms)
            except sqlite3.Error as e:
                return {"kind": kind, "flawed_sql": cand, "error": str(e)}
            except (sqlite3.Warning, ValueError):
                continue
    return None
