"""Text-to-SQL on TPC-DS: generation over real HTTP against the scripted OpenAI-compatible server
with EXPLAIN validation on PostgreSQL and retries; replay and oracle generators; the generation
and complexity flows (Prefect) with the paper's tables and plots; the CLI module."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import polars as pl
import pytest

from schemas.settings import Settings
from schemas.text2sql import GenerationConfig
from tasks.text2sql.corpora import tpcds_gold_queries
from tasks.core.llm import ResponseCache
from tasks.text2sql.sql_features import NUMERIC_FEATURES
from tasks.text2sql.generators import (
    RETRY_PROMPT,
    GeneratorConfigError,
    ReplayGenerator,
    extract_sql,
    generate_with_validation,
    make_generator,
)
from tasks.text2sql.stage import plan_generation_batches
from tasks.text2sql.validation import PostgresValidator, tpcds_postgres_dsn
from tests.fakes.openai_server import ScriptedOpenAIServer, error, message
from tests.helpers import SHARED_DATA, TPCDS_VALID_REPLY, register_model, text2sql_generator

QUESTIONS = str(SHARED_DATA / "tpcds" / "business_questions.json")
PNG = b"\x89PNG\r\n\x1a\n"
INVALID = [
    "```sql\nSELECT no_such_column FROM store_sales\n```",
    "Here you go:\n```sql\nSELECT ss_item_sk FROM store_sales WHERE\n```",
    "SELECT * FROM no_such_table;",
    "```sql\nSELECT ss_item_sk FROM store_sales GROUP BY\n```",
]


@pytest.fixture(scope="module")
def validator(pg_server_url):
    with PostgresValidator(tpcds_postgres_dsn(Settings.from_env())) as v:
        yield v


def test_invalid_twice_then_valid_is_a_success_after_three_attempts(
    validator, monkeypatch, tmp_path
):
    usage = {"prompt_tokens": 1000, "completion_tokens": 50}
    script = [message(INVALID[0], usage), message(INVALID[1], usage),
              message(TPCDS_VALID_REPLY, usage)]
    with ScriptedOpenAIServer(script) as srv:
        register_model(srv.base_url, tmp_path, monkeypatch.setenv, name="scripted",
                       prices="{input: 2.0, output: 10.0}", key_env="QUERYLAB_OPENAI_API_KEY",
                       api_key_required=False)
        gen = text2sql_generator(srv, ResponseCache(str(tmp_path / "artifacts")))
        assert gen.resolved.priced and gen.resolved.prices.input == 2.0
        rows = generate_with_validation(gen, "3", "the prompt", validator.validate, max_retries=3)
        requests = srv.requests
        # the same generation again: every attempt is answered from the response cache (each
        # attempt's conversation is its own key, so attempt 1 never got attempt 0's answer)
        again = generate_with_validation(gen, "3", "the prompt", validator.validate, max_retries=3)
        assert srv.request_count == 3
        gen.close()
    assert [r["sql"] for r in again] == [r["sql"] for r in rows]
    assert [r["valid"] for r in again] == [False, False, True]
    assert all(r["cost_usd"] == 0.0 and r["prompt_tokens"] == 1000 for r in again)
    assert [r["attempt"] for r in rows] == [0, 1, 2]
    assert [r["valid"] for r in rows] == [False, False, True]
    assert [r["final"] for r in rows] == [False, False, True]
    assert 'column "no_such_column" does not exist' in rows[0]["error"]
    assert "syntax error" in rows[1]["error"]
    assert (
        rows[2]["sql"]
        == "SELECT ss_item_sk, sum(ss_net_profit) FROM store_sales GROUP BY ss_item_sk"
    )
    assert rows[2]["error"] is None
    assert all(r["prompt_tokens"] == 1000 and r["completion_tokens"] == 50 for r in rows)
    assert rows[0]["cost_usd"] == pytest.approx((1000 * 2.0 + 50 * 10.0) / 1e6)
    # each retry is a new user turn carrying PostgreSQL's error, after the model's reply
    assert len(requests) == 3
    roles = [[m["role"] for m in r["messages"]] for r in requests]
    assert roles[0] == ["system", "user"]
    assert roles[2] == ["system", "user", "assistant", "user", "assistant", "user"]
    third = requests[2]["messages"]
    assert third[2]["content"] == INVALID[0] and third[4]["content"] == INVALID[1]
    assert third[3]["content"] == RETRY_PROMPT.format(error=rows[0]["error"])
    assert "no_such_column" in third[3]["content"] and "syntax error" in third[5]["content"]
    assert requests[0]["model"] == "scripted" and requests[0]["temperature"] == 0.0


def test_invalid_four_times_fails_after_three_retries(validator):
    with ScriptedOpenAIServer([message(s) for s in INVALID] + [message(TPCDS_VALID_REPLY)]) as srv:
        rows = generate_with_validation(
            text2sql_generator(srv), "3", "p", validator.validate, max_retries=3
        )
        n_requests = srv.request_count
    assert n_requests == 4  # 1 try + 3 retries; the valid 5th answer is never asked for
    assert [r["attempt"] for r in rows] == [0, 1, 2, 3]
    assert not any(r["valid"] for r in rows) and rows[-1]["final"]
    assert 'relation "no_such_table" does not exist' in rows[2]["error"]
    assert rows[2]["sql"] == "SELECT * FROM no_such_table"
    assert rows[0]["cost_usd"] is None  # not in the models table: unknown, not free


def test_api_error_is_recorded_and_not_retried_as_a_generation(validator):
    with ScriptedOpenAIServer([error(500), message(TPCDS_VALID_REPLY)]) as srv:
        rows = generate_with_validation(text2sql_generator(srv), "3", "p", validator.validate)
    assert len(rows) == 1 and not rows[0]["valid"]
    assert rows[0]["error"].startswith("api_error: HTTP 500")
    assert "gave up after 1 attempts" in rows[0]["error"]
    # infrastructure errors are retried by the shared model layer, honouring Retry-After,
    # and the call is still one attempt (row) of the generation
    script = [error(429, retry_after=0), error(503, retry_after=0), message(TPCDS_VALID_REPLY)]
    with ScriptedOpenAIServer(script) as srv:
        rows = generate_with_validation(
            text2sql_generator(srv, api_retries=2), "3", "p", validator.validate
        )
        assert srv.request_count == 3
    assert len(rows) == 1 and rows[0]["valid"] and rows[0]["error"] is None
    # a 400 is not retried
    with ScriptedOpenAIServer([error(400, "bad request"), message(TPCDS_VALID_REPLY)]) as srv:
        rows = generate_with_validation(
            text2sql_generator(srv, api_retries=3), "3", "p", validator.validate
        )
        assert srv.request_count == 1
    assert rows[0]["error"].startswith("api_error: HTTP 400") and "bad request" in rows[0]["error"]
    with ScriptedOpenAIServer([message("I cannot answer that.")]) as srv:
        rows = generate_with_validation(
            text2sql_generator(srv), "3", "p", validator.validate, max_retries=0
        )
    assert rows[0]["error"] and rows[0]["sql"] == "I cannot answer that."


def test_extract_sql():
    assert extract_sql("```sql\nSELECT 1;\n```") == "SELECT 1"
    assert extract_sql("first\n```sql\nSELECT 1\n```\nthen\n```SQL\nSELECT 2\n```") == "SELECT 2"
    assert extract_sql("```\nSELECT 3\n```") == "SELECT 3"
    assert extract_sql("  SELECT 4 ;; ") == "SELECT 4"
    assert extract_sql(None) == "" and extract_sql("") == ""


def test_replay_generator_directory_and_jsonl(tmp_path, validator):
    d = tmp_path / "gpt_outputs"
    d.mkdir()
    (d / "query01.sql").write_text("SELECT c_customer_id FROM customer;\n")
    (d / "q3.sql").write_text("SELECT no_such FROM item")
    gen = ReplayGenerator(d)
    assert gen.label == "replay:gpt_outputs" and set(gen.attempts) == {"1", "3"}
    assert generate_with_validation(gen, "1", "p", validator.validate)[0]["valid"]
    rows = generate_with_validation(gen, "3", "p", validator.validate)
    assert len(rows) == 1 and not rows[0]["valid"]  # nothing more to replay: no retry
    missing = generate_with_validation(gen, "7", "p", validator.validate)
    assert missing[0]["error"] == "replay:gpt_outputs has no SQL for query 7"

    jl = tmp_path / "model_x.jsonl"
    jl.write_text(
        "\n".join(
            json.dumps(o)
            for o in [
                {"query_id": 3, "sql": "SELECT i_item_id FROM item", "attempt": 1},
                {"query_id": "3", "sql": "SELECT bad FROM item", "attempt": 0},
            ]
        )
        + "\n"
    )
    rows = generate_with_validation(ReplayGenerator(jl), "3", "p", validator.validate)
    assert [r["valid"] for r in rows] == [False, True]  # the recorded retry is replayed
    jl.write_text('{"sql": "SELECT 1"}\n')
    with pytest.raises(GeneratorConfigError, match=r"model_x\.jsonl:1"):
        ReplayGenerator(jl)
    with pytest.raises(GeneratorConfigError, match="not found"):
        ReplayGenerator(tmp_path / "nope")


def test_generator_specs(tmp_path):
    replay = tmp_path / "y.jsonl"
    replay.write_text('{"query_id": 1, "sql": "SELECT 1"}\n')
    assert make_generator("oracle").label == "oracle"
    with pytest.raises(GeneratorConfigError, match="unknown generator"):
        make_generator("claude")
    with pytest.raises(GeneratorConfigError, match="QUERYLAB_OPENAI_API_KEY"):
        make_generator("openai:gpt-x", Settings())
    with pytest.raises(ValueError, match="models table"):
        GenerationConfig.model_validate({"prices": {"gpt-x": [1.0, 2.0]}})
    batches = plan_generation_batches(["oracle", f"replay:{replay}"], ["1", "2", "3"], 2)
    assert [b["query_ids"] for b in batches] == [["1", "2"], ["3"], ["1", "2"], ["3"]]
    assert batches == plan_generation_batches(["oracle", f"replay:{replay}"], ["1", "2", "3"], 2)
    with pytest.raises(ValueError, match="duplicate"):
        plan_generation_batches(["oracle", "oracle"], ["1"])
    with pytest.raises(ValueError, match=r"unknown query ids \['100'\]"):
        plan_generation_batches(["oracle"], ["1", "100"], known_query_ids=tpcds_gold_queries())
    with pytest.raises(GeneratorConfigError, match="unknown generator 'gpt-4'"):
        plan_generation_batches(["gpt-4"], ["1"])
    with pytest.raises(GeneratorConfigError, match="replay source not found"):
        plan_generation_batches(["replay:/no/such/dir"], ["1"])


# -------------------------------------------------------------------------------- flows


def _responder(body: dict, index: int):
    """Query 1: wrong first, then the gold query; query 3: a short valid query at once."""
    qid = re.search(r"TPC-DS query (\d+)", body["messages"][1]["content"]).group(1)
    retries = sum(m["role"] == "assistant" for m in body["messages"])
    if qid == "1" and retries == 0:
        return message(INVALID[0], {"prompt_tokens": 4000, "completion_tokens": 20})
    sql = (
        tpcds_gold_queries()["1"]
        if qid == "1"
        else (
            "SELECT i_brand_id, sum(ss_ext_sales_price) FROM store_sales, item "
            "WHERE ss_item_sk = i_item_sk GROUP BY i_brand_id"
        )
    )
    return message(f"```sql\n{sql}\n```", {"prompt_tokens": 4000, "completion_tokens": 200})


@pytest.fixture(scope="module")
def generation_run(prefect_harness, settings, tmp_path_factory):
    from flows.text2sql import text2sql_generation

    tmp = tmp_path_factory.mktemp("replay")
    replay = tmp / "elsewhere.jsonl"
    replay.write_text(json.dumps({"query_id": 3, "sql": "SELECT * FROM nowhere"}) + "\n")
    generators = ["openai:scripted", f"replay:{replay}", "oracle"]
    with ScriptedOpenAIServer(_responder) as srv, pytest.MonkeyPatch.context() as mp:
        register_model(srv.base_url, tmp, mp.setenv, name="scripted",
                       prices="{input: 1.0, output: 2.0}", key_env="QUERYLAB_OPENAI_API_KEY",
                       key="sk-test-SECRET", api_key_required=False)
        out = text2sql_generation(
            "t2s-flow",
            generators,
            QUESTIONS,
            query_ids=["1", "3"],
            batch_size=1,
            artifacts_root=settings.artifacts,
        )
        out["n_requests"] = srv.request_count
    out["cache_entries"] = len(list(Path(settings.artifacts, "cache", "llm").rglob("*.json")))
    return {**out, "generators": generators}


def test_generation_flow_records_every_attempt(generation_run):
    gens = pl.read_parquet(generation_run["generations"])
    assert pl.read_parquet_schema(generation_run["generations"])  # readable Parquet
    scripted = gens.filter(pl.col("model") == "openai:scripted")
    assert scripted.select("query_id", "attempt", "valid").rows() == [
        ("1", 0, False),
        ("1", 1, True),
        ("3", 0, True),
    ]
    assert generation_run["n_requests"] == 3
    assert generation_run["cache_entries"] >= 3  # the shared response cache of the artifacts
    assert scripted["prompt_tokens"].sum() == 12000
    assert scripted["cost_usd"].sum() == pytest.approx((12000 * 1.0 + 420 * 2.0) / 1e6)
    replay = gens.filter(pl.col("model") == "replay:elsewhere")
    assert replay.select("query_id", "valid").rows() == [("1", False), ("3", False)]
    assert "no SQL for query 1" in replay["error"][0] and "nowhere" in replay["error"][1]
    assert "SECRET" not in Path(generation_run["generations"]).read_bytes().decode("latin-1")


def test_generation_tables_and_plots(generation_run):
    success = pl.read_parquet(generation_run["success"]).sort("model")
    assert success.select(
        "model", "n_queries", "n_success", "n_first_attempt", "n_after_retry"
    ).rows() == [
        ("openai:scripted", 2, 2, 1, 1),
        ("oracle", 2, 2, 2, 0),
        ("replay:elsewhere", 2, 0, 0, 0),
    ]
    jac = pl.read_parquet(generation_run["jaccard"])
    oracle = jac.filter(pl.col("model") == "oracle")
    assert oracle["jaccard"].to_list() == [1.0] * 8  # 7 bag features + average
    scripted = dict(
        jac.filter(pl.col("model") == "openai:scripted").select("feature", "jaccard").rows()
    )
    assert scripted["relations"] < 1.0  # query 3 is not the gold query 3
    assert scripted["average"] == pytest.approx(
        sum(v for k, v in scripted.items() if k != "average") / 7
    )
    means = pl.read_parquet(generation_run["normalised_means"])
    gold = means.filter(pl.col("model") == "gold")
    assert gold["normalised"].to_list() == [1.0] * 8 and gold["n"].to_list() == [99] * 8
    assert set(means["model"]) == {"gold", "oracle", "openai:scripted"}  # replay had no valid SQL
    feats = pl.read_parquet(generation_run["features"])
    assert feats.filter(pl.col("corpus") == "gold").height == 99
    for key in ("radar_jaccard", "radar_normalised_means"):
        assert Path(generation_run[key]).read_bytes().startswith(PNG)
    md = Path(generation_run["markdown"]).read_text()
    assert "Successful queries (out of 2)" in md and "| openai:scripted" in md


def test_generation_rerun_skips_finished_batches(generation_run, settings):
    from flows.text2sql import text2sql_generation

    batches = sorted(Path(generation_run["generations"]).parent.glob("batches/*.parquet"))
    assert len(batches) == 6  # 3 generators × 2 queries, batch size 1
    before = {b: b.stat().st_mtime_ns for b in batches}
    # no API settings now: a batch that ran again would fail (no key, no base URL)
    out = text2sql_generation(
        "t2s-flow",
        generation_run["generators"],
        QUESTIONS,
        query_ids=["1", "3"],
        batch_size=1,
        artifacts_root=settings.artifacts,
    )
    assert {b: b.stat().st_mtime_ns for b in batches} == before
    assert pl.read_parquet(out["generations"]).equals(
        pl.read_parquet(generation_run["generations"])
    )


@pytest.fixture(scope="module")
def complexity_run(prefect_harness, settings):
    from flows.text2sql import sql_complexity

    return sql_complexity(
        "t2s-complexity",
        [
            {"name": "tpcds"},
            {
                "name": "spider",
                "path": str(SHARED_DATA / "sql_corpora" / "spider_dev_gold.sql"),
                "tables_json": str(SHARED_DATA / "spider" / "tables.json"),
            },
            {"name": "bird", "path": str(SHARED_DATA / "sql_corpora" / "bird_dev_gold.sql")},
        ],
        artifacts_root=settings.artifacts,
    )


def test_tpcds_is_more_complex_than_spider_and_bird_on_every_feature(complexity_run):
    table = pl.read_parquet(complexity_run["complexity"])
    means = {(c, f): m for c, f, m in table.select("corpus", "feature", "mean").iter_rows()}
    n = dict(table.filter(pl.col("feature") == "join_count").select("corpus", "n").iter_rows())
    assert n == {"tpcds": 99, "spider": 1034, "bird": 1534}  # every gold query was read
    assert complexity_run["parse_errors"] == {"tpcds": 0, "spider": 0, "bird": 0}
    for feature in NUMERIC_FEATURES:
        for other in ("spider", "bird"):
            assert means[("tpcds", feature)] > means[(other, feature)], (feature, other)
    tpcds = table.filter(pl.col("corpus") == "tpcds")
    assert tpcds["normalised"].to_list() == [1.0] * len(NUMERIC_FEATURES)
    assert table.filter(pl.col("corpus") != "tpcds")["normalised"].max() < 1.0


def test_complexity_histograms_and_report(complexity_run):
    assert sorted(complexity_run["histograms"]) == sorted(
        [
            "cte_count",
            "subquery_count",
            "join_count",
            "function_count",
            "predicate_count",
            "column_count",
        ]
    )
    for uri in complexity_run["histograms"].values():
        assert Path(uri).read_bytes().startswith(PNG)
    md = Path(complexity_run["markdown"]).read_text()
    assert "normalised by the TPC-DS gold means" in md and "| spider" in md
    feats = pl.read_parquet(complexity_run["features"][0])
    assert feats.height == 99 and feats["error"].null_count() == 99


def test_cli_module(tmp_path, capsys, prefect_harness, settings):
    from querylab.cmd_text2sql import register

    parser = argparse.ArgumentParser(prog="querylab")
    register(parser.add_subparsers(dest="command", required=True))

    def run(*argv: str) -> int:
        args = parser.parse_args(list(argv))
        return args.func(args)

    assert run("text2sql", "features", "SELECT a FROM t WHERE b = 1") == 0
    assert json.loads(capsys.readouterr().out)["where_predicates"] == ["t.b = 1"]
    assert run("text2sql", "features", "SELEC 1") == 2
    preds = tmp_path / "preds.sql"
    preds.write_text(
        "\n".join(
            line.rsplit("\t", 1)[0]
            for line in (SHARED_DATA / "sql_corpora" / "spider_dev_gold.sql")
            .read_text()
            .splitlines()
        )
        + "\n"
    )
    assert (
        run(
            "text2sql",
            "score-spider",
            "--predictions",
            str(preds),
            "--db-dir",
            str(tmp_path / "db"),
            "--run-id",
            "cli-spider",
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "execution accuracy (EX): 1.0000" in out and "wta_1/" in out and "missing_data" in out
    assert (
        run(
            "text2sql",
            "generate",
            "--model",
            "oracle",
            "--query",
            "1",
            "--descriptions",
            QUESTIONS,
            "--run-id",
            "cli-gen",
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| oracle" in out and "generations.parquet" in out
