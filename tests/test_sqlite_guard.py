"""The one guarded SQLite executor (:mod:`tasks.db.sqlite_guard`) under hostile SQL, on every path
that runs untrusted SQL on SQLite: the lifecycle suite (``run_readonly``, and a model's answer
through the real lifecycle runner over HTTP), Spider EX (``run_sqlite``), the equivalence
instance databases (``instance_db.InstanceDB``) and the agents' query tool (``SQLiteDatabase``)."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path

import pytest

from tasks.db import sqlite_guard
from tasks.lifecycle.schema import run_readonly
from tests.helpers import SHARED_DATA, register_model

SPIDER_DIR = SHARED_DATA / "spider" / "databases"
QUESTIONS = SHARED_DATA / "spider" / "dev.json"
RUNAWAY = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
           "SELECT count(*) FROM c")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def db(tmp_path) -> Path:
    path = tmp_path / "d.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (a INT, note TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(1, "vacuum cleaner"), (2, "load_extension")])
    conn.commit()
    conn.close()
    return path


def hostile(tmp_path: Path) -> dict[str, str]:
    """Name → a statement the guard must refuse (each would write, attach or load code)."""
    return {
        "attach": f"ATTACH DATABASE '{tmp_path / 'attached.db'}' AS x",
        "attach_after_cte": (f"WITH q AS (SELECT 1) SELECT * FROM q; "
                             f"ATTACH '{tmp_path / 'a2.db'}' AS y"),
        "delete_through_cte": "WITH doomed AS (SELECT a FROM t) DELETE FROM t WHERE a IN doomed",
        "insert_through_cte": "WITH r(x) AS (SELECT 99) INSERT INTO t(a) SELECT x FROM r",
        "update_through_cte": "WITH r AS (SELECT 1) UPDATE t SET a = 0",
        "writable_schema": "PRAGMA writable_schema = ON",
        "writable_schema_read": "PRAGMA writable_schema",
        "pragma_function": "SELECT * FROM pragma_table_info('t')",
        "load_extension": "SELECT load_extension('/tmp/evil.so')",
        "vacuum_into": f"VACUUM INTO '{tmp_path / 'copy.db'}'",
        "create_temp": "CREATE TEMP TABLE s AS SELECT * FROM t",
        "begin": "BEGIN IMMEDIATE",
        "drop": "DROP TABLE t",
    }


def test_lifecycle_readonly_refuses_every_hostile_statement(db, tmp_path):
    before = _digest(db)
    for name, sql in hostile(tmp_path).items():
        with pytest.raises(sqlite3.Error) as info:
            run_readonly(db, sql)
        assert any(w in str(info.value) for w in (
            "not authorized", "authorization denied", "too many attached",
            "one statement at a time")), (name, info.value)
    assert _digest(db) == before
    for leftover in ("attached.db", "a2.db", "copy.db"):
        assert not (tmp_path / leftover).exists(), leftover
    assert run_readonly(db, "SELECT count(*) FROM t") == [(2,)]


def test_lifecycle_readonly_ends_a_runaway_cte_at_the_time_limit(db):
    start = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        run_readonly(db, RUNAWAY, timeout_ms=200)
    assert time.monotonic() - start < 10  # the limit is 0.2 s; ends, not only eventually


def test_words_in_literals_are_data_not_statements(db):
    # the old regex refused any query mentioning "vacuum" or "load_extension"
    assert run_readonly(db, "SELECT a FROM t WHERE note = 'vacuum cleaner'") == [(1,)]
    assert run_readonly(db, "SELECT a FROM t WHERE note LIKE 'load_extension%'") == [(2,)]


def test_results_and_values_are_bounded(db):
    conn = sqlite_guard.open_read_only(db)
    try:
        with pytest.raises(sqlite_guard.ResultTooLarge, match="larger than 1 MiB"):
            sqlite_guard.run_query(
                conn, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
                "LIMIT 100000) SELECT x, printf('%.100c', 'x') FROM c", 10_000,
                max_result_bytes=1 << 20)
        with pytest.raises(sqlite3.Error, match="too big"):
            sqlite_guard.run_query(conn, "SELECT zeroblob(200000000)", 10_000)
        # the guard is off again after each query (limits restored)
        assert conn.getlimit(sqlite3.SQLITE_LIMIT_ATTACHED) > 0
    finally:
        conn.close()


def test_spider_run_sqlite_is_the_same_guard(db, tmp_path):
    from tasks.text2sql.spider import run_sqlite

    for name, sql in hostile(tmp_path).items():
        with pytest.raises(sqlite3.Error):
            run_sqlite(db, sql)
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        run_sqlite(db, RUNAWAY, timeout_ms=200)
    assert not (tmp_path / "attached.db").exists()


def test_lifecycle_script_sandbox_is_the_same_guard(db, tmp_path):
    """A model's DDL/DML script (``run_script``, on a private in-memory copy) may write the
    copy, but goes through the guard: no ATTACH, VACUUM INTO, extension or denied function,
    interrupted at the time limit, the file untouched and the guard removed afterwards."""
    from tasks.lifecycle.schema import run_script, sandbox_connection

    before = _digest(db)
    refused = {
        "attach": f"ATTACH DATABASE '{tmp_path / 'attached.db'}' AS x",
        "attach_in_script": f"CREATE TABLE u (a INT); ATTACH '{tmp_path / 'a2.db'}' AS y",
        "vacuum_into": f"VACUUM INTO '{tmp_path / 'copy.db'}'",
        "load_extension": "SELECT load_extension('/tmp/evil.so')",
        "fts3_tokenizer": "SELECT fts3_tokenizer('simple')",
    }
    for name, sql in refused.items():
        conn = sandbox_connection(db)
        try:
            with pytest.raises(sqlite3.Error, match="not authorized|no such function"):
                run_script(conn, sql)
        finally:
            conn.close()
    conn = sandbox_connection(db)
    try:
        with pytest.raises(sqlite3.OperationalError, match="interrupted"):
            run_script(conn, "CREATE TABLE r (x INT); INSERT INTO r " + RUNAWAY.replace(
                "SELECT count(*) FROM c", "SELECT x FROM c"), timeout_ms=200)
        run_script(conn, "CREATE TABLE s (a INT); INSERT INTO s SELECT a FROM t; DELETE FROM t")
        assert conn.execute("SELECT count(*) FROM s").fetchone() == (2,)
        conn.execute("ATTACH ':memory:' AS harness")  # the guard is gone after the script
    finally:
        conn.close()
    assert _digest(db) == before
    for leftover in ("attached.db", "a2.db", "copy.db"):
        assert not (tmp_path / leftover).exists(), leftover


def test_agent_query_tool_is_the_same_guard(db, tmp_path):
    from tasks.db.databases import QueryError, SQLiteDatabase

    sdb = SQLiteDatabase("d", db, timeout_ms=300)
    for name, sql in hostile(tmp_path).items():
        with pytest.raises(QueryError):
            sdb._execute(sql, 10)  # below the parser check: the engine-side guard alone
    with pytest.raises(QueryError, match="timed out"):
        sdb._execute(RUNAWAY, 10)
    assert not (tmp_path / "attached.db").exists()
    assert sdb._execute("SELECT count(*) AS n FROM t", 10).rows == [{"n": 2}]


def test_instance_sandbox_runs_queries_read_only_and_still_loads(tmp_path):
    from tasks.equivalence.instance_db import InstanceDB
    from tasks.equivalence.instances import RelSchema

    schema = RelSchema.from_ddl("CREATE TABLE t (a INT PRIMARY KEY, b INT)", "sqlite")
    with InstanceDB(schema, ["t"], "sqlite", query_timeout_s=0.2) as box:
        box.load({"t": [(1, 2), (3, 4)]})
        for name, sql in hostile(tmp_path).items():
            out = box.run(sql)
            assert out.error and out.rows is None, (name, out)
        out = box.run(RUNAWAY)  # a timeout, apart from errors (issue 18, M6)
        assert out.timeout and out.error and "timed out" in out.error
        assert box.run("SELECT a, b FROM t ORDER BY a").rows == [(1, 2), (3, 4)]
        box.load({"t": [(5, 6)]})  # the harness can write again between queries
        assert box.run("SELECT a FROM t").rows == [(5,)]
        # a query with the text of a statement the harness prepared gets no write from the
        # statement cache
        box.clear()
        box.load({"t": [(7, 8)]})
        out = box.run(f"DELETE FROM {box._names['t']}")
        assert out.error and "not authorized" in out.error
        assert box.run(f"INSERT INTO {box._names['t']} VALUES (9, 9)").error
        assert box.run("SELECT a FROM t").rows == [(7,)]
    assert not (tmp_path / "attached.db").exists()


@pytest.mark.slow
def test_model_answer_over_http_cannot_touch_the_lifecycle_database(tmp_path, monkeypatch):
    """A model's Text2SQL answers (real HTTP, the scripted server) attack the database; each is
    a wrong answer with SQLite's refusal, and the database file is unchanged."""
    from schemas.lifecycle import LifecycleConfig
    from schemas.settings import Settings
    from tasks.lifecycle.agents import OpenAIAgent
    from tasks.lifecycle.items import generate_phase_items, prepare_databases
    from tasks.lifecycle.runner import RunContext, run_item
    from tests.fakes.openai_server import ScriptedOpenAIServer, message

    cfg = LifecycleConfig(spider_db_ids=["concert_singer"], max_items=1, include_chinook=False,
                          variants=["original"], timeout_ms=300, api_retries=0)
    dbs = prepare_databases(SPIDER_DIR, QUESTIONS, tmp_path / "home", cfg, None)
    (item,) = generate_phase_items("text2sql", dbs, cfg)[0][:1]
    path = Path(dbs["spider"]["concert_singer"])
    before = _digest(path)
    attacks = [
        f"ATTACH DATABASE '{tmp_path / 'attached.db'}' AS x",
        "WITH s AS (SELECT 1) DELETE FROM singer",
        "PRAGMA writable_schema = ON",
        "SELECT load_extension('/tmp/evil.so')",
        RUNAWAY,
    ]
    script = [message(f"```sql\n{sql}\n```") for sql in attacks]
    with ScriptedOpenAIServer(script) as srv:
        register_model(srv.base_url, tmp_path, monkeypatch.setenv, name="scripted",
                       key_env="QUERYLAB_OPENAI_API_KEY", api_key_required=False,
                       prices="{input: 1.0, output: 2.0}")
        agent = OpenAIAgent("scripted", Settings(openai_base_url=srv.base_url,
                                                 openai_api_key="sk-test"), cfg, None)
        ctx = RunContext(dbs, cfg)
        rows = [run_item(agent, item, ctx, "r")[0] for _ in attacks]
        assert srv.request_count == len(attacks) and not srv.errors
    for sql, row in zip(attacks, rows):
        assert row["ex"] == 0.0, sql
        assert any(w in row["error"] for w in ("not authorized", "authorization denied",
                                               "too many attached",
                                               "interrupted")), (sql, row["error"])
    assert "interrupted" in rows[-1]["error"]
    assert _digest(path) == before and not (tmp_path / "attached.db").exists()


def test_duckdb_instances_refuse_files_extensions_and_settings(tmp_path):
    """The finder's DuckDB instances run a pair's (possibly a model's) SQL with no file,
    extension or network access, and the SQL cannot turn that back on."""
    from tasks.equivalence.instance_db import InstanceDB
    from tasks.equivalence.instances import RelSchema

    schema = RelSchema.from_ddl("CREATE TABLE t (a INT PRIMARY KEY, b INT)", "duckdb")
    out_file, db_file = tmp_path / "out.csv", tmp_path / "x.db"
    with InstanceDB(schema, ["t"], "duckdb", query_timeout_s=2) as box:
        box.load({"t": [(1, 2)]})
        for sql in (f"COPY (SELECT 1) TO '{out_file}'", "SELECT * FROM read_csv('/etc/passwd')",
                    f"ATTACH '{db_file}' AS x", "INSTALL httpfs",
                    "SET enable_external_access = true", "SET lock_configuration = false"):
            out = box.run(sql)
            assert out.error and out.rows is None, (sql, out)
        assert box.run("SELECT a, b FROM t").rows == [(1, 2)]
    assert not out_file.exists() and not db_file.exists()
