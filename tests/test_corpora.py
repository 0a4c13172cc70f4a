"""Corpora: the SQL<TAB>db_id loader, Spider schemas, TPC-DS from duckdb-ext-tpcds (offline), and
all 99 TPC-DS gold queries passing EXPLAIN on PostgreSQL and yielding features."""

from __future__ import annotations

import pytest
import sqlglot

from tasks.text2sql.corpora import (
    CorpusError,
    load_business_questions,
    load_corpus,
    load_spider_tables,
    load_tpcds_corpus,
    tpcds_ddl,
    tpcds_extension_path,
    tpcds_schema,
)
from tasks.text2sql.sql_features import extract_features
from tests.helpers import SHARED_DATA

SPIDER_GOLD = SHARED_DATA / "sql_corpora" / "spider_dev_gold.sql"
BIRD_GOLD = SHARED_DATA / "sql_corpora" / "bird_dev_gold.sql"
QUESTIONS = SHARED_DATA / "tpcds" / "business_questions.json"


def test_corpus_loader_reads_any_sql_tab_db_file(tmp_path):
    f = tmp_path / "mini_gold.sql"
    f.write_text("SELECT count(*) FROM singer\tconcert_singer\n\nSELECT 'a\tb' FROM t\tdb2\n")
    c = load_corpus(f)
    assert c.name == "mini" and c.dialect == "sqlite"
    assert [(q.query_id, q.sql, q.db_id) for q in c] == [
        ("0", "SELECT count(*) FROM singer", "concert_singer"),
        ("1", "SELECT 'a\tb' FROM t", "db2"),  # the db_id is after the LAST tab
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("SELECT 1\tdb\nSELECT 2 no tab here\n", r"mini\.sql:2: expected 'SQL<TAB>db_id'"),
        ("SELECT 1\t \n", r"mini\.sql:1: empty SQL or db_id"),
        ("\n\n", "no queries"),
    ],
)
def test_corpus_loader_errors_name_file_and_line(tmp_path, text, message):
    f = tmp_path / "mini.sql"
    f.write_text(text)
    with pytest.raises(CorpusError, match=message):
        load_corpus(f)
    with pytest.raises(CorpusError, match="not found"):
        load_corpus(tmp_path / "missing.sql")


@pytest.mark.slow
def test_spider_and_bird_gold_files():
    spider = load_corpus(SPIDER_GOLD, tables_json=SHARED_DATA / "spider" / "tables.json")
    bird = load_corpus(BIRD_GOLD)
    assert (spider.name, spider.dialect, len(spider)) == ("spider", "mysql", 1034)
    assert (bird.name, bird.dialect, len(bird)) == ("bird", "sqlite", 1534)
    assert len({q.db_id for q in spider}) == 20
    assert spider.schema_for("concert_singer")["singer"][:2] == ["Singer_ID", "Name"]
    assert bird.schema_for("california_schools") is None
    # every gold query reads in its corpus's dialect
    for corpus in (spider, bird):
        for q in corpus:
            sqlglot.parse_one(q.sql, read=corpus.dialect)


def test_spider_tables_json_errors(tmp_path):
    bad = tmp_path / "tables.json"
    bad.write_text('[{"db_id": "x"}]')
    with pytest.raises(CorpusError, match="not a Spider tables.json"):
        load_spider_tables(bad)


@pytest.mark.slow
def test_tpcds_schema_and_queries_come_from_the_extension_offline():
    assert tpcds_extension_path().name == "tpcds.duckdb_extension"
    schema = tpcds_schema()
    assert len(schema) == 24
    assert ("ss_sold_date_sk", "BIGINT") in schema["store_sales"]
    assert ddl_tables(tpcds_ddl()) == sorted(schema)
    corpus = load_tpcds_corpus(QUESTIONS)
    assert (corpus.name, corpus.dialect, len(corpus)) == ("tpcds", "postgres", 99)
    assert [q.query_id for q in corpus] == [str(i) for i in range(1, 100)]
    q1 = corpus.by_id()["1"]
    assert q1.description.startswith("Find customers who have returned items more than 20%")
    assert "YEAR.01=2000" in q1.params
    for q in corpus:
        assert q.description and not q.sql.endswith(";")
        sqlglot.parse_one(q.sql, read="postgres")


def ddl_tables(ddl: str) -> list[str]:
    return sorted(s.find(sqlglot.exp.Table).name for s in sqlglot.parse(ddl, read="postgres"))


def test_business_questions_errors(tmp_path):
    partial = tmp_path / "q.json"
    partial.write_text('{"descriptions": {"1": "only one"}}')
    assert load_business_questions(partial) == {"1": {"description": "only one", "params": []}}
    with pytest.raises(CorpusError, match=r"no description for TPC-DS queries \['2', '3'"):
        load_tpcds_corpus(partial)
    partial.write_text("[1, 2]")
    with pytest.raises(CorpusError, match="expected"):
        load_business_questions(partial)


def test_all_99_gold_queries_pass_explain_on_postgres_and_yield_features(pg_server_url, settings):
    from tasks.text2sql.validation import PostgresValidator, tpcds_postgres_dsn

    corpus = load_tpcds_corpus(QUESTIONS)
    schema = corpus.schema_for("tpcds")
    dsn = tpcds_postgres_dsn(settings)
    assert tpcds_postgres_dsn(settings) == dsn  # idempotent
    with PostgresValidator(dsn) as validator:
        errors = {q.query_id: validator.validate(q.sql) for q in corpus}
        assert {k: v for k, v in errors.items() if v} == {}
        # and the validator does reject what PostgreSQL rejects
        assert "does not exist" in validator.validate("SELECT no_such_column FROM store_sales")
    feats = {q.query_id: extract_features(q.sql, "postgres", schema) for q in corpus}
    assert all(
        f.relation_count > 0 and f.column_count + f.aggregation_count > 0 for f in feats.values()
    )
    assert sum(f.cte_count > 0 for f in feats.values()) > 20
    assert feats["1"].cte_count == 1 and feats["1"].subquery_count == 1
