"""Spider dev databases built into SQLite from MySQL DDL + CSV, and execution accuracy with
test-suite semantics."""

from __future__ import annotations

import json
import sqlite3

import pytest

from tasks.text2sql.corpora import load_corpus
from tasks.text2sql.spider import (
    SpiderError,
    build_spider_databases,
    execution_accuracy_summary,
    load_predictions,
    run_sqlite,
    score_execution_accuracy,
    translate_mysql_ddl,
)
from tests.helpers import SHARED_DATA

SPIDER_DIR = SHARED_DATA / "spider" / "databases"
SPIDER_GOLD = SHARED_DATA / "sql_corpora" / "spider_dev_gold.sql"


@pytest.fixture(scope="module")
def spider_dbs(tmp_path_factory) -> dict:
    """The 20 Spider dev databases, built once for this module."""
    return build_spider_databases(SPIDER_DIR, tmp_path_factory.mktemp("spider"))


@pytest.fixture(scope="module")
def gold():
    return load_corpus(SPIDER_GOLD)


@pytest.mark.slow
def test_builds_the_20_dev_databases_with_their_data(spider_dbs):
    assert len(spider_dbs) == 20
    conn = sqlite3.connect(spider_dbs["world_1"])
    try:
        # CSV "NULL" is NULL; INTEGER affinity turns CSV text into numbers
        assert (
            conn.execute("SELECT count(*) FROM country WHERE IndepYear IS NULL").fetchone()[0] > 0
        )
        assert conn.execute("SELECT typeof(Population) FROM country LIMIT 1").fetchone() == (
            "integer",
        )
        assert conn.execute("SELECT count(*) FROM city").fetchone()[0] > 4000
        # inline MySQL INDEX definitions became CREATE INDEX
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "city_idx_CountryCode" in names
    finally:
        conn.close()


@pytest.mark.slow
def test_up_to_date_databases_are_reused(spider_dbs):
    before = {k: p.stat().st_mtime_ns for k, p in spider_dbs.items()}
    again = build_spider_databases(SPIDER_DIR, next(iter(spider_dbs.values())).parent)
    assert {k: p.stat().st_mtime_ns for k, p in again.items()} == before


def test_translate_mysql_ddl():
    statements, tables = translate_mysql_ddl(
        "CREATE TABLE `db`.`city` (`ID` INTEGER NOT NULL, `Name` CHAR(35) NOT NULL DEFAULT '',\n"
        "  `Pop` FLOAT(10,2), PRIMARY KEY (`ID`), INDEX idx_name (`Name`));"
    )
    assert tables == {"city": [("ID", "INTEGER"), ("Name", "TEXT(35)"), ("Pop", "REAL(10, 2)")]}
    conn = sqlite3.connect(":memory:")
    for s in statements:
        conn.execute(s)
    assert statements[-1].startswith("CREATE INDEX") and '"db"' not in statements[0]
    with pytest.raises(SpiderError, match="no CREATE TABLE"):
        translate_mysql_ddl("SELECT 1;")


def test_bad_sources_are_clear_errors(tmp_path):
    with pytest.raises(SpiderError, match="no Spider databases"):
        build_spider_databases(tmp_path, tmp_path / "out")
    (tmp_path / "db1" / "data").mkdir(parents=True)
    (tmp_path / "db1" / "schema.sql").write_text("CREATE TABLE t (a INT);")
    (tmp_path / "db1" / "data" / "u.csv").write_text("a\n1\n")
    with pytest.raises(SpiderError, match=r"database db1: .*u\.csv: no table 'u'"):
        build_spider_databases(tmp_path, tmp_path / "out")
    with pytest.raises(SpiderError, match=r"no source for databases \['nope'\]"):
        build_spider_databases(tmp_path, tmp_path / "out", ["nope"])


@pytest.mark.slow
def test_gold_predictions_score_one_minus_missing_data(spider_dbs, gold):
    scores = score_execution_accuracy([q.sql for q in gold], gold, spider_dbs)
    summary = execution_accuracy_summary(scores)
    assert summary["ex"] == 1.0
    assert set(summary["by_status"]) == {"match", "missing_data"}
    assert summary["n_scored"] + summary["n_excluded"] == 1034
    # the queries left out are named, with the reason: wta_1.rankings ships without rows
    excluded = summary["excluded"]
    assert 0 < len(excluded) < 20
    assert {e["db_id"] for e in excluded} == {"wta_1"}
    assert all("rankings" in e["error"] for e in excluded)
    assert all("rankings" in gold.by_id()[e["query_id"]].sql.lower() for e in excluded)


@pytest.mark.slow
def test_execution_accuracy_semantics(spider_dbs, gold):
    ids = gold.by_id()
    assert ids["2"].sql == "SELECT name ,  country ,  age FROM singer ORDER BY age DESC"
    items = [ids["0"], ids["2"], ids["2"], ids["2"], ids["0"], ids["0"]]
    preds = [
        "SELECT count(*) FROM singer WHERE age > 1000",  # wrong value
        "SELECT name, country, age FROM singer ORDER BY age ASC",  # gold ORDER BY: order matters
        "SELECT age, name, country FROM singer ORDER BY age DESC",  # permuted columns
        "SELECT name, country FROM singer ORDER BY age DESC",  # a column missing
        "SELECT count(*) FROM singr",  # engine error
        "",  # no prediction
    ]
    gold_items = [type(q)(str(i), q.sql, q.db_id) for i, q in enumerate(items)]
    scores = score_execution_accuracy(preds, gold_items, spider_dbs)
    assert scores["status"].to_list() == [
        "mismatch",
        "mismatch",
        "match",
        "mismatch",
        "pred_error",
        "no_prediction",
    ]
    assert scores["ordered"].to_list() == [False, True, True, True, False, False]
    assert "no such table" in scores["error"][4]
    # without a gold ORDER BY, any row order is right
    unordered = type(ids["0"])("x", "SELECT name FROM singer", "concert_singer")
    s = score_execution_accuracy(
        ["SELECT name FROM singer ORDER BY name DESC"], [unordered], spider_dbs
    )
    assert s["ex"].to_list() == [True]
    # a database that was not built is left out, not counted wrong
    s = score_execution_accuracy(["SELECT 1"], [("SELECT 1", "no_such_db")], spider_dbs)
    assert s["status"].to_list() == ["no_database"] and s["ex"].to_list() == [None]
    with pytest.raises(SpiderError, match="2 predictions for 1 gold"):
        score_execution_accuracy(["SELECT 1", "SELECT 2"], [unordered], spider_dbs)


@pytest.mark.slow
def test_predictions_files(tmp_path, spider_dbs, gold):
    lines = tmp_path / "pred.sql"
    lines.write_text("SELECT count(*) FROM singer\tconcert_singer\nSELECT 1\n\n")
    assert load_predictions(lines) == ["SELECT count(*) FROM singer", "SELECT 1"]
    jl = tmp_path / "pred.jsonl"
    jl.write_text(json.dumps({"query_id": 0, "sql": "SELECT count(*) FROM singer"}) + "\n")
    preds = load_predictions(jl)
    assert preds == {"0": "SELECT count(*) FROM singer"}
    scores = score_execution_accuracy(preds, list(gold)[:2], spider_dbs)
    assert scores["status"].to_list() == ["match", "no_prediction"]
    jl.write_text("{not json}\n")
    with pytest.raises(SpiderError, match=r"pred\.jsonl:1"):
        load_predictions(jl)


@pytest.mark.slow
def test_run_sqlite_is_read_only_and_times_out(spider_dbs):
    path = spider_dbs["concert_singer"]
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        run_sqlite(
            path,
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
            "SELECT count(*) FROM c",
            timeout_ms=100,
        )
    with pytest.raises(sqlite3.DatabaseError, match="not authorized"):
        run_sqlite(path, "DELETE FROM singer")
    target = path.parent / "attached-by-a-query.db"
    with pytest.raises(sqlite3.DatabaseError, match="not authorized|too many attached"):
        run_sqlite(path, f"ATTACH DATABASE '{target}' AS x")
    assert not target.exists()
    assert run_sqlite(path, "SELECT count(*) FROM singer")[0][0] > 0
