"""Bounded results and bounded queries on all four engines.

- Byte caps per value and per result (``ResultLimits``): huge values are cut and say so, huge
  results stop at the cap, the tool result says what was cut, a trial's results have a total.
- querylab's own memory stays bounded whatever an agent selects: RSS is sampled while
  ``SELECT zeroblob(40000000) ...`` / ``repeat('x', 100000000)`` run through the ToolBox.
- The query workers: a DuckDB query that needs gigabytes fails inside its memory-limited
  worker (querylab is untouched), a mongomock query past its time limit is killed while
  another one answers, and a killed mongomock worker comes back with its data.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import pyarrow as pa
import pytest

from tasks.db.results import _cap_value
from tasks.db.databases import (
    DuckDBDatabase,
    MongoDatabase,
    PostgresDatabase,
    QueryError,
    QueryResult,
    ResultLimits,
    SQLiteDatabase,
    load_duckdb,
    load_mongo,
    load_postgres,
    load_sqlite,
    mongo_client,
    postgres_database_dsn,
)
from tasks.agents.tools import ToolBox

MiB = 1 << 20
FIVE = "(SELECT 1 AS i UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5)"


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples this process's resident memory every 2 ms while the block runs."""

    def __enter__(self):
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def growth(self) -> int:
        return self.peak - self.start


@pytest.fixture(scope="module")
def engines(tmp_path_factory, pg_server_url):
    tmp = tmp_path_factory.mktemp("limits")
    table = pa.table({"i": list(range(1, 6)), "s": ["a", "b", "c", "d", "e"]})
    load_sqlite(tmp / "l.sqlite", {"t": table})
    load_duckdb(tmp / "l.duckdb", {"t": table})
    dsn = postgres_database_dsn(pg_server_url, f"ql_test_{uuid.uuid4().hex[:8]}", create=True)
    load_postgres(dsn, {"t": table})
    mdb = mongo_client(None)[f"ql_test_{uuid.uuid4().hex[:8]}"]
    load_mongo(mdb, {"t": [{"i": i, "big": "y" * (3 * MiB)} for i in range(1, 6)]})
    dbs = {"sqlite": SQLiteDatabase("sqlite", tmp / "l.sqlite"),
           "duckdb": DuckDBDatabase("duckdb", tmp / "l.duckdb"),
           "postgres": PostgresDatabase("postgres", dsn),
           "mongodb": MongoDatabase("mongodb", mdb, timeout_ms=5000)}
    yield dbs
    dbs["postgres"].close()


HUGE = {
    "sqlite": f"SELECT zeroblob(40000000) AS v FROM {FIVE}",
    "duckdb": "SELECT repeat('x', 100000000) AS v FROM range(5)",
    "postgres": "SELECT repeat('x', 100000000) AS v FROM generate_series(1, 5)",
    "mongodb": '{"collection": "t", "aggregate": [{"$project": {"_id": 0, "v": "$big"}}]}',
}


@pytest.mark.parametrize("engine", list(HUGE))
def test_huge_values_are_cut_and_rss_stays_bounded(engines, engine, tmp_path):
    box = ToolBox({engine: engines[engine]}, tmp_path / "w")
    box.call("query_db", {"db": engine, "query": HUGE[engine]}, "warm")  # start the workers
    with PeakRSS() as rss:
        out = box.call("query_db", {"db": engine, "query": HUGE[engine]}, "huge")
    assert out.success, out.error
    shown = json.loads(out.content)
    assert shown["row_count"] == 5 and "5 values longer than" in shown["values_cut"]
    for row in out.value:
        assert row["v"].endswith("bytes]") and "… [value cut at 1048576 of" in row["v"]
        assert len(row["v"]) < 1_100_000
    # each value is cut to 1 MiB, so the result is ~5 MiB: querylab never held the 200-500 MB
    assert rss.growth < 64 * MiB, f"RSS grew by {rss.growth / MiB:.0f} MiB"


@pytest.mark.parametrize("engine", ["sqlite", "duckdb", "postgres"])
def test_results_stop_at_the_byte_cap(engines, engine, tmp_path):
    many = {"sqlite": "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 5000) "
                      "SELECT n, printf('%.*c', 2000, 'z') AS pad FROM r",
            "duckdb": "SELECT range AS n, repeat('z', 2000) AS pad FROM range(5000)",
            "postgres": "SELECT n, repeat('z', 2000) AS pad FROM generate_series(1, 5000) n"}[engine]
    res = engines[engine].query(many, max_rows=100_000, max_result_bytes=1 * MiB)
    assert res.truncated and res.truncated_by == "bytes" and res.cut_values == 0
    assert 400 < len(res.rows) < 520 and res.result_bytes <= 1 * MiB
    assert [r["n"] for r in res.rows[:3]] == [1, 2, 3] or [r["n"] for r in res.rows[:3]] == [0, 1, 2]
    box = ToolBox({engine: engines[engine]}, tmp_path / "w", max_result_bytes=1 * MiB)
    shown = json.loads(box.call("query_db", {"db": engine, "query": many}, "c").content)
    assert shown["truncated"] and "result cut at" in shown["note"]


def test_many_wide_columns_shrink_the_value_cap(engines):
    cols = ", ".join(f"repeat('w', 1000000) AS c{i}" for i in range(200))
    res = engines["postgres"].query(f"SELECT {cols}", max_result_bytes=4 * MiB)
    assert len(res.rows) == 1 and res.cut_values == 200 and res.result_bytes <= 4 * MiB


def test_a_trial_has_a_result_budget(engines, tmp_path):
    box = ToolBox(engines, tmp_path / "w", max_trial_result_bytes=12 * MiB)
    outs = [box.call("query_db", {"db": "duckdb", "query": HUGE["duckdb"]}, f"c{i}") for i in range(8)]
    ok = [o for o in outs if o.success]
    refused = [o for o in outs if not o.success]
    assert [len(o.value) for o in ok[:2]] == [5, 5] and len(ok[2].value) < 5  # the third is cut
    assert refused and "limit per trial" in refused[0].error and len(ok) < 8
    assert box.result_bytes <= 12 * MiB


@pytest.mark.slow
def test_cap_value_rules():
    assert _cap_value("abc", 10) == ("abc", 5, False)
    text, _, cut = _cap_value("x" * 5000, 1024)
    assert cut and text.startswith("x" * 1024) and text.endswith("[value cut at 1024 of 5000 bytes]")
    hexed, _, cut = _cap_value(b"\x01" * 4000, 2048)
    assert cut and hexed.startswith("01" * 1024) and "of 8000 bytes" in hexed
    nested, _, cut = _cap_value({"a": ["b" * 3000]}, 1024)
    assert cut and nested.startswith('{"a": ["bbb')
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert _cap_value(deep, 1024) == ("[value nested too deeply to show]", 40, True)
    with pytest.raises(ValueError):
        ResultLimits(max_rows=-1)
    assert ResultLimits(max_result_bytes=1 * MiB).value_cap(10_000) == 1024


def test_query_result_json_round_trip():
    res = QueryResult(["a"], [{"a": 1}], True, "bytes", 2, 99)
    assert QueryResult.from_json(json.loads(json.dumps(res.to_json()))) == res
    with pytest.raises(ValueError):
        QueryResult.from_json({"rows": "x"})


# ---- the workers ----------------------------------------------------------------------------------


def test_duckdb_memory_bomb_fails_in_the_worker_not_here(engines):
    with PeakRSS() as rss:
        with pytest.raises(QueryError, match="(?i)memory"):
            engines["duckdb"].query("SELECT repeat('x', 100000000) AS x FROM range(100000)")
    assert rss.growth < 64 * MiB
    assert engines["duckdb"].query("SELECT count(*) AS n FROM t").rows == [{"n": 5}]


def test_duckdb_agent_queries_spill_at_most_the_temp_limit(engines):
    """QA adversary: a read-only sort spilled ~2 GB into <db>.tmp beside the database file
    (DuckDB's default cap is 90% of the free disk); agent connections cap it as PostgreSQL's
    temp_file_limit does."""
    from tasks.db.duckdb import DUCKDB_AGENT_TEMP_LIMIT

    row = engines["duckdb"].query(
        "SELECT current_setting('max_temp_directory_size') AS cap").rows[0]
    assert DUCKDB_AGENT_TEMP_LIMIT == "1GiB" and row["cap"] == "1.0 GiB", row


@pytest.mark.slow
def test_mongomock_timeout_kills_only_that_query(tmp_path):
    mdb = mongo_client(None)[f"ql_test_{uuid.uuid4().hex[:8]}"]
    load_mongo(mdb, {"c": [{"k": i % 3, "i": i} for i in range(600)]})
    db = MongoDatabase("m", mdb, timeout_ms=1500)
    bomb = {"collection": "c", "aggregate": [
        {"$lookup": {"from": "c", "localField": "k", "foreignField": "k", "as": "a"}}, {"$unwind": "$a"},
        {"$lookup": {"from": "c", "localField": "k", "foreignField": "k", "as": "b"}}, {"$unwind": "$b"},
        {"$count": "n"}]}
    errors: list[str] = []

    def run_bomb():
        try:
            db.query(bomb)
        except QueryError as exc:
            errors.append(str(exc))

    start = time.monotonic()
    t = threading.Thread(target=run_bomb)
    t.start()
    time.sleep(0.3)
    answered = time.monotonic()
    assert db.query({"collection": "c", "find": {"i": 7}}).rows == [{"k": 1, "i": 7}]
    answered = time.monotonic() - answered
    t.join(30)
    assert errors == ["Query timed out after 1500 ms."] and 1.4 < time.monotonic() - start < 6
    assert answered < 1.0


@pytest.mark.slow
def test_mongomock_worker_restarts_with_its_data():
    client = mongo_client(None)
    mdb = client[f"ql_test_{uuid.uuid4().hex[:8]}"]
    load_mongo(mdb, {"c": [{"i": 1}, {"i": 2}]})
    db = MongoDatabase("m", mdb)
    pid = client.pid()
    os.kill(pid, 9)
    time.sleep(0.2)
    assert db.query({"collection": "c", "sort": [["i", 1]]}).rows == [{"i": 1}, {"i": 2}]
    assert client.pid() not in (None, pid)


def test_marker_and_system_collections_are_hidden(engines):
    db = engines["mongodb"]
    assert [t.name for t in db.list_tables()] == ["t"]
    for q in ({"collection": "_querylab_loaded"}, {"collection": "system.views"},
              {"collection": "t", "aggregate": [{"$unionWith": "_querylab_x"}]},
              {"collection": "t", "aggregate": [{"$facet": {"x": [
                  {"$lookup": {"from": "system.js", "pipeline": [], "as": "j"}}]}}]}):
        with pytest.raises(QueryError, match="Unknown collection"):
            db.query(q)


def test_sql_worker_has_no_secrets(engines, monkeypatch):
    from tasks.db.db_worker_client import sql_worker

    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    worker = sql_worker()
    worker.kill()
    engines["sqlite"].query("SELECT 1")
    with open(f"/proc/{worker.pid()}/environ", "rb") as fh:
        env = fh.read()
    assert b"sk-must-not-leak" not in env and b"QUERYLAB" not in env
