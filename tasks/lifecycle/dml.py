"""UPDATE/DELETE items (P3 Operation) with their expected post-state, generated from the data.

Four templates, filled with values read from the database by a seeded RNG:

- ``update_by_key`` — set one column of the row with a given primary key to a new value
  (another value of that column, or the old number + 1);
- ``update_relative`` — increase a numeric column by a constant for every row whose text
  column has a given value;
- ``delete_by_value`` — delete every row whose text column has a given value (not all rows);
- ``delete_threshold`` — delete every row whose numeric column is greater than its median.

An item is kept only when its gold statement executes on a private copy of the database and
changes at least one row (and a DELETE leaves at least one row). The expected post-state is
the :func:`tasks.lifecycle.metrics.table_digests` of that copy: a model's statement is scored by
running it on a fresh copy and comparing every table's contents (:func:`dml_state`), never by
its return value. Foreign-key enforcement is off, as in SQLite's default.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from tasks.db.relschema import type_class
from tasks.lifecycle.metrics import state_difference, table_digests
from tasks.lifecycle.naming import split_words
from tasks.lifecycle.schema import (
    Schema,
    read_sqlite_schema,
    run_script,
    sandbox_connection,
)

__all__ = ["DML_TEMPLATES", "dml_items", "dml_state", "state_matches"]

DML_TEMPLATES = ("update_by_key", "delete_by_value", "update_relative", "delete_threshold")


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(v) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return repr(int(v)) if float(v).is_integer() else repr(float(v))
    return "'" + str(v).replace("'", "''") + "'"


def _show(v) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return _lit(v)
    return "'" + str(v) + "'"


def _words(name: str) -> str:
    return " ".join(split_words(name)) or name


def _ok_text(v) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 40 and "\n" not in v and v.strip() == v


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def dml_state(db_path: str | Path, sql: str | None, timeout_ms: int = 10_000) -> dict[str, str]:
    """The :func:`table_digests` of a private in-memory copy of ``db_path`` after executing
    ``sql`` on it (None or empty: the unchanged state). Raises ``sqlite3.Error`` when the SQL
    fails (the copy is discarded; the file is never written)."""
    conn = sandbox_connection(db_path)
    try:
        if sql and sql.strip():
            run_script(conn, sql, timeout_ms)
        return table_digests(conn)
    finally:
        conn.close()


def state_matches(expected: dict[str, str], actual: dict[str, str]) -> bool:
    """True when two database states (table digests) are the same."""
    return not state_difference(expected, actual)


def _candidates(schema: Schema, conn: sqlite3.Connection, template: str, rng: random.Random):
    tables = list(schema.tables)
    rng.shuffle(tables)
    for t in tables:
        qt = _q(t.name)
        n_rows = conn.execute(f"SELECT count(*) FROM {qt}").fetchone()[0]
        if n_rows < 2:
            continue
        e = _words(t.name)
        cols = list(t.columns)
        rng.shuffle(cols)
        pk = t.primary_key[0] if len(t.primary_key) == 1 else None
        if template == "update_by_key" and pk:
            keys = [
                r[0]
                for r in conn.execute(
                    f"SELECT {_q(pk)} FROM {qt} WHERE {_q(pk)} IS NOT NULL ORDER BY 1 LIMIT 200"
                )
            ]
            if not keys:
                continue
            key = rng.choice(keys)
            for c in cols:
                if c.name == pk or c.name in t.primary_key:
                    continue
                cur = conn.execute(
                    f"SELECT {_q(c.name)} FROM {qt} WHERE {_q(pk)} = ?", (key,)
                ).fetchone()
                if cur is None or cur[0] is None:
                    continue
                old = cur[0]
                if _num(old):
                    new = old + 1
                elif _ok_text(old):
                    others = [
                        r[0]
                        for r in conn.execute(
                            f"SELECT DISTINCT {_q(c.name)} FROM {qt} WHERE {_q(c.name)} IS NOT NULL LIMIT 50"
                        )
                        if _ok_text(r[0]) and r[0] != old
                    ]
                    if not others:
                        continue
                    new = rng.choice(sorted(others))
                else:
                    continue
                sql = f"UPDATE {qt} SET {_q(c.name)} = {_lit(new)} WHERE {_q(pk)} = {_lit(key)}"
                text = (
                    f"Change the {_words(c.name)} of the {e} whose {_words(pk)} is {_show(key)} "
                    f"to {_show(new)}."
                )
                yield sql, text, t.name
        elif template == "update_relative":
            nums = [
                c
                for c in cols
                if type_class(c.type) in ("integer", "number") and c.name not in t.primary_key
            ]
            texts = [c for c in cols if type_class(c.type) == "text"]
            for nc in nums:
                for tc in texts:
                    vals = [
                        r[0]
                        for r in conn.execute(
                            f"SELECT {_q(tc.name)}, count(*) FROM {qt} WHERE {_q(nc.name)} IS NOT NULL "
                            f"GROUP BY 1 HAVING count(*) < {n_rows} ORDER BY 1 LIMIT 50"
                        )
                        if _ok_text(r[0])
                    ]
                    if not vals:
                        continue
                    v = rng.choice(vals)
                    inc = rng.choice([1, 2, 5, 10])
                    sql = (
                        f"UPDATE {qt} SET {_q(nc.name)} = {_q(nc.name)} + {inc} "
                        f"WHERE {_q(tc.name)} = {_lit(v)}"
                    )
                    text = (
                        f"Increase the {_words(nc.name)} by {inc} for every {e} whose "
                        f"{_words(tc.name)} is {_show(v)}."
                    )
                    yield sql, text, t.name
        elif template == "delete_by_value":
            for c in cols:
                if type_class(c.type) != "text":
                    continue
                vals = [
                    r[0]
                    for r in conn.execute(
                        f"SELECT {_q(c.name)}, count(*) FROM {qt} GROUP BY 1 HAVING count(*) < {n_rows} "
                        "ORDER BY 2 DESC, 1 LIMIT 20"
                    )
                    if _ok_text(r[0])
                ]
                if not vals:
                    continue
                v = rng.choice(vals)
                sql = f"DELETE FROM {qt} WHERE {_q(c.name)} = {_lit(v)}"
                text = f"Delete every {e} whose {_words(c.name)} is {_show(v)}."
                yield sql, text, t.name
        elif template == "delete_threshold":
            for c in cols:
                if type_class(c.type) not in ("integer", "number") or c.name in t.primary_key:
                    continue
                vals = sorted(
                    r[0]
                    for r in conn.execute(
                        f"SELECT DISTINCT {_q(c.name)} FROM {qt} WHERE typeof({_q(c.name)}) IN ('integer', 'real')"
                    )
                )
                if len(vals) < 3:
                    continue
                v = vals[len(vals) // 2]
                sql = f"DELETE FROM {qt} WHERE {_q(c.name)} > {_lit(v)}"
                text = f"Delete every {e} whose {_words(c.name)} is greater than {_show(v)}."
                yield sql, text, t.name


def dml_items(
    db_id: str,
    db_path: str | Path,
    n: int,
    seed: int,
    source: str = "spider",
    ddl: str | None = None,
    timeout_ms: int = 10_000,
) -> list[dict]:
    """Up to ``n`` UPDATE/DELETE items for one database, cycling through
    :data:`DML_TEMPLATES` (a template that does not apply gives way to the next). Each item:
    ``item_id`` ``dml/<db_id>/<i>``; ``prompt`` (schema DDL + the request); ``reference`` =
    ``{"sql", "template", "table", "rows_changed", "expected_state": {table: digest}}``.
    ``ddl`` is the schema text shown (default: the file's CREATE TABLE statements)."""
    from tasks.lifecycle.schema import sqlite_ddl

    schema = read_sqlite_schema(db_path)
    ddl = ddl if ddl is not None else sqlite_ddl(db_path)
    before = dml_state(db_path, None)
    items: list[dict] = []
    seen: set[str] = set()
    conn = sqlite3.connect(f"file:{Path(db_path)}?mode=ro", uri=True)
    conn.text_factory = lambda b: b.decode("utf-8", errors="replace")
    try:
        for i in range(n * 3):
            if len(items) >= n:
                break
            template = DML_TEMPLATES[i % len(DML_TEMPLATES)]
            rng = random.Random(f"{seed}:dml:{db_id}:{i}")
            for sql, text, table in _candidates(schema, conn, template, rng):
                if sql in seen:
                    continue
                work = sandbox_connection(db_path)
                try:
                    before_n = work.total_changes
                    try:
                        run_script(work, sql, timeout_ms)
                    except sqlite3.Error:
                        continue
                    changed = work.total_changes - before_n
                    left = work.execute(f"SELECT count(*) FROM {_q(table)}").fetchone()[0]
                    after = table_digests(work)
                finally:
                    work.close()
                if changed < 1 or left < 1 or not state_difference(before, after):
                    continue
                seen.add(sql)
                k = len(items)
                items.append(
                    {
                        "item_id": f"dml/{db_id}/{k}",
                        "phase": "dml",
                        "base_id": f"{db_id}/{k}",
                        "source": source,
                        "db_id": db_id,
                        "variant": "original",
                        "level": 0,
                        "seed": seed,
                        "prompt": dml_prompt(ddl, text),
                        "reference": {
                            "sql": sql,
                            "template": template,
                            "table": table,
                            "rows_changed": changed,
                            "expected_state": after,
                        },
                        "context": {"request": text, "template": template},
                    }
                )
                break
    finally:
        conn.close()
    return items


def dml_prompt(ddl: str, request: str) -> str:
    """The user turn of an UPDATE/DELETE item."""
    return (
        f"Database schema (SQLite):\n\n{ddl}\n\n"
        f"Request: {request}\n\n"
        "Write the SQLite UPDATE or DELETE statement that carries out this request on the "
        "database. Answer with the SQL in a ```sql code block."
    )
