"""Hostile ``query_db`` calls through the agent's ToolBox on all four engines of the shipped
datasets (stocks: DuckDB + SQLite; movies: PostgreSQL + MongoDB): each is a tool error the agent
sees, and every database is byte-for-byte unchanged afterwards. The parser- and engine-level
checks themselves are tested in test_databases.py."""

from __future__ import annotations

import hashlib
import json

import pytest

from tasks.db.engines import open_databases
from tasks.agents.tools import ToolBox

SQL_COMMON = [
    "INSERT INTO {t} SELECT * FROM {t}",
    "UPDATE {t} SET {c} = NULL",
    "DELETE FROM {t}",
    "DROP TABLE {t}",
    "CREATE TABLE evil AS SELECT * FROM {t}",
    "SELECT 1; DROP TABLE {t}",
    "WITH x AS (DELETE FROM {t} RETURNING *) SELECT count(*) FROM x",
]
HOSTILE = {
    "sqlite": SQL_COMMON + ["ATTACH 'evil.db' AS evil", "PRAGMA user_version = 7",
                            "PRAGMA journal_mode = WAL"],
    "duckdb": SQL_COMMON + ["ATTACH 'evil.duckdb' AS evil", "COPY {t} TO '{tmp}/leak.csv'"],
    "postgres": SQL_COMMON + ["COPY {t} TO '{tmp}/leak.csv'",
                              "SELECT set_config('default_transaction_read_only', 'off', false)"],
    "mongodb": [
        {"collection": "{t}", "aggregate": [{"$match": {}}, {"$out": "evil"}]},
        {"collection": "{t}", "aggregate": [{"$merge": {"into": "{t}"}}]},
        {"collection": "{t}", "find": {"$where": "sleep(100) || true"}},
        {"collection": "{t}", "aggregate": [{"$group": {"_id": None, "x": {"$accumulator": {}}}}]},
    ],
}


def _databases(manifest, settings):
    dbs = open_databases(manifest, settings)
    return {d.engine: (name, d) for name, d in dbs.items()}, dbs


def _checksum(db) -> str:
    h = hashlib.sha256()
    for t in sorted(db.list_tables(), key=lambda t: t.name):
        if db.engine == "mongodb":
            q = {"collection": t.name, "sort": [["_id", 1]]}
        else:
            q = f'SELECT * FROM "{t.name}" ORDER BY 1, 2'
        rows = db.query(q, max_rows=10_000_000).rows
        h.update(f"{t.name}:{t.row_count}:{json.dumps(rows, sort_keys=True, default=str)}".encode())
    return h.hexdigest()


@pytest.mark.parametrize("engine", ["sqlite", "duckdb", "postgres", "mongodb"])
def test_hostile_query_db_is_a_tool_error_and_changes_nothing(
    engine, stocks_manifest, movies_manifest, settings, tmp_path
):
    manifest = stocks_manifest if engine in ("sqlite", "duckdb") else movies_manifest
    by_engine, dbs = _databases(manifest, settings)
    name, db = by_engine[engine]
    table = db.list_tables()[0]
    before = {n: _checksum(d) for n, d in dbs.items()}
    box = ToolBox(dbs, tmp_path / "work")
    for i, stmt in enumerate(HOSTILE[engine]):
        text = json.dumps(stmt) if isinstance(stmt, dict) else stmt
        text = text.replace("{t}", table.name).replace("{c}", table.columns[-1].name)
        text = text.replace("{tmp}", str(tmp_path))
        out = box.call("query_db", {"db": name, "query": text}, f"call_{i}")
        assert not out.success, text
        message = json.loads(out.content)["error"]
        assert ("Refused" in message or "read-only" in message) and len(message) < 400, message
    # the trial goes on: a normal query still works afterwards
    ok = box.call("query_db", {"db": name, "query": json.dumps({"collection": table.name, "limit": 1})
                   if engine == "mongodb" else f'SELECT count(*) AS n FROM "{table.name}"'}, "ok")
    assert ok.success
    assert {n: _checksum(d) for n, d in dbs.items()} == before
    assert not list(tmp_path.glob("leak.csv")) and not list(tmp_path.rglob("evil*"))
