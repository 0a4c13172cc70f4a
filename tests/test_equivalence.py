"""SQL equivalence: pairs input, execution match on a database, the flow over pairs × methods
(with judges through the scripted OpenAI-compatible server), the tables, and the CLI."""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
from pathlib import Path

import duckdb
import polars as pl
import pytest

from schemas.equivalence import EquivalenceOptions, MatchOptions, QueryPair
from tasks.equivalence.methods import evaluate, execution_match, parse_method
from tasks.equivalence.pairs import PairsError, load_pairs, resolve_db
from tasks.equivalence.stage import plan_equivalence_batches
from tasks.equivalence.tables import (
    accuracy_table,
    agreement_table,
    counterexample_table,
    time_table,
)
from tests.fakes.openai_server import ScriptedOpenAIServer, message
from tests.helpers import register_model

DATA = Path(__file__).resolve().parents[1] / "data" / "equivalence"
DDL = ("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER);"
       "CREATE TABLE blocked (customer_id INTEGER);")
NOT_IN = "SELECT id FROM orders WHERE customer_id NOT IN (SELECT customer_id FROM blocked)"
NOT_EXISTS = ("SELECT o.id FROM orders o WHERE NOT EXISTS "
              "(SELECT 1 FROM blocked b WHERE b.customer_id = o.customer_id)")


@pytest.fixture
def shop_db(tmp_path) -> Path:
    """A SQLite database with no NULLs: NOT IN and NOT EXISTS agree on it."""
    path = tmp_path / "shop" / "shop.sqlite"
    path.parent.mkdir()
    con = sqlite3.connect(path)
    con.executescript(DDL + """
        INSERT INTO orders VALUES (1, 10), (2, 20), (3, 30);
        INSERT INTO blocked VALUES (20);
    """)
    con.commit()
    con.close()
    return path


def _pair(**kw) -> QueryPair:
    base = {"id": "p", "sql1": NOT_IN, "sql2": NOT_EXISTS, "schema": DDL, "dialect": "sqlite"}
    return QueryPair.model_validate({**base, **kw})


# -- input ------------------------------------------------------------------------------------


def test_fixture_files_are_valid_pairs():
    classic = load_pairs(DATA / "classic_not_equivalent.jsonl")
    rewrites = load_pairs(DATA / "equivalent_rewrites.jsonl")
    assert {p.label_for("semantic") for p in classic} == {False}
    assert {p.label_for("semantic") for p in rewrites} == {True}
    assert {p.label_for("relaxed") for p in rewrites} == {True}
    ids = {p.id for p in classic}
    assert {"count_bug", "distinct_vs_union_all", "order_limit_vs_max_ties", "not_in_with_nulls",
            "left_join_where_on_right", "having_vs_where_on_aggregate"} <= ids


@pytest.mark.parametrize("lines, message", [
    (['{"id": "a", "sql1": "SELECT 1", "sql2": "SELECT 1"}', "{not json"], r":2: not valid JSON"),
    (['{"id": "a", "sql1": "SELECT 1"}'], r":1: sql2: Field required"),
    (['{"id": "a", "sql1": "SELECT 1", "sql2": "SELECT 1", "label": "maybe"}'], r":1: label"),
    (['{"id": "a", "sql1": "SELECT 1", "sql2": "SELECT 1", "colour": 1}'], r":1: colour"),
    (['{"id": "a", "sql1": "SELECT 1", "sql2": "SELECT 1"}'] * 2, r":2: duplicate id 'a'"),
    ([""], r"no pairs"),
])
def test_bad_pairs_files_are_rejected_with_file_and_line(tmp_path, lines, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(PairsError, match=message):
        load_pairs(path)
    with pytest.raises(PairsError, match="cannot read"):
        load_pairs(tmp_path / "missing.jsonl")


def test_labels_per_notion():
    assert _pair(label=True).label_for("relaxed") is True
    assert _pair(label="no").label_for("semantic") is False
    assert _pair(label="not_equivalent").label_for("relaxed") is None
    both = _pair(label={"semantic": "not_equivalent", "relaxed": "equivalent"})
    assert (both.label_for("semantic"), both.label_for("relaxed")) == (False, True)
    assert _pair().label_for("semantic") is None


def test_methods_and_batches():
    m = parse_method("judge:explain_compare:relaxed:ollama:llama3:8b")
    assert (m.kind, m.technique, m.notion, m.model) == ("judge", "explain_compare", "relaxed",
                                                        "ollama:llama3:8b")
    assert parse_method("finder").notion == "semantic"
    for bad in ("judge:explain_compare:gpt", "judge:guess:semantic:m", "oracle"):
        with pytest.raises(ValueError):
            parse_method(bad)
    batches = plan_equivalence_batches([f"p{i}" for i in range(5)], ["finder", "exec_match"], 2)
    assert [len(b["pair_ids"]) for b in batches] == [2, 2, 1, 2, 2, 1]
    assert batches == plan_equivalence_batches([f"p{i}" for i in range(5)],
                                               ["finder", "exec_match"], 2)
    other = plan_equivalence_batches([f"p{i}" for i in range(5)], ["finder", "exec_match"], 2,
                                     EquivalenceOptions(budget={"max_instances": 5}))
    assert {b["key"] for b in other}.isdisjoint({b["key"] for b in batches})


# -- execution match ---------------------------------------------------------------------------


def test_execution_match_agrees_only_because_the_database_has_no_counterexample(shop_db):
    pair = _pair(db=str(shop_db), label="not_equivalent")
    ex = evaluate(pair, parse_method("exec_match"), EquivalenceOptions())
    assert ex["verdict"] == "equivalent" and ex["correct"] is False
    assert json.loads(ex["details"])["engine"] == "sqlite"
    finder = evaluate(pair, parse_method("finder"), EquivalenceOptions())
    assert finder["verdict"] == "not_equivalent" and finder["verified"] is True
    assert finder["correct"] is True and "NULL" in finder["counterexample"]


def test_execution_match_detects_differences_and_honours_options(shop_db, tmp_path):
    def ex(sql1, sql2, match=None, **kw):
        return execution_match(_pair(sql1=sql1, sql2=sql2, db=str(shop_db), **kw), match)

    out = ex("SELECT id FROM orders", "SELECT id FROM orders WHERE id > 1")
    assert out["verdict"] == "not_equivalent" and out["verified"] is True
    # order counts only when both queries sort
    asc, desc = "SELECT id FROM orders ORDER BY id", "SELECT id FROM orders ORDER BY id DESC"
    assert ex(asc, desc)["verdict"] == "not_equivalent"
    assert ex(asc, "SELECT id FROM orders")["verdict"] == "equivalent"
    assert ex(asc, desc, MatchOptions(order="never"))["verdict"] == "equivalent"
    # bag vs set, column permutation
    dup = "SELECT 1 FROM orders"
    assert ex(dup, "SELECT DISTINCT 1 FROM orders")["verdict"] == "not_equivalent"
    assert ex(dup, "SELECT DISTINCT 1 FROM orders", MatchOptions(bag=False))["verdict"] == "equivalent"
    cols = ("SELECT id, customer_id FROM orders", "SELECT customer_id, id FROM orders")
    assert ex(*cols)["verdict"] == "equivalent"
    assert ex(*cols, MatchOptions(permute_columns=False))["verdict"] == "not_equivalent"
    # one query failing is no counterexample (an error is not a result); both failing is an error
    one = ex("SELECT nope FROM orders", asc)
    assert one["verdict"] == "error_on_instance" and not one.get("verified")
    assert one["error"].startswith("sql1 fails on") and "nope" in one["error"]
    assert ex("SELECT nope FROM orders", "SELECT nope2 FROM orders")["verdict"] == "error"
    # queries in another dialect are transpiled to the database's engine
    out = ex("SELECT id FROM orders WHERE customer_id::TEXT = '10'",
             "SELECT id FROM orders WHERE id = 1", dialect="duckdb")
    assert out["verdict"] == "equivalent"
    assert execution_match(_pair())["verdict"] == "skipped"


def test_execution_match_on_duckdb_and_names_under_db_root(tmp_path, shop_db):
    path = tmp_path / "elsewhere" / "shop.duckdb"
    path.parent.mkdir()
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER)")
    con.execute("CREATE TABLE blocked (customer_id INTEGER)")
    con.execute("INSERT INTO orders VALUES (1, 10), (2, NULL); INSERT INTO blocked VALUES (NULL)")
    con.close()
    pair = _pair(db=str(path), dialect="duckdb")
    assert execution_match(pair)["verdict"] == "not_equivalent"  # this one holds the NULLs
    # a name resolves under db_root (Spider layout <root>/<name>/<name>.sqlite)
    assert resolve_db("shop", shop_db.parent.parent) == str(shop_db)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        resolve_db("nowhere", tmp_path)
    named = _pair(db="shop", schema=None)
    out = evaluate(named, parse_method("exec_match"),
                   EquivalenceOptions(db_root=str(shop_db.parent.parent)))
    assert out["verdict"] == "equivalent"
    # without a schema, the finder reads the schema (with keys) from the database
    found = evaluate(named, parse_method("finder"),
                     EquivalenceOptions(db_root=str(shop_db.parent.parent)))
    assert found["verdict"] == "not_equivalent" and found["verified"] is True
    missing = evaluate(_pair(db="nowhere", schema=None), parse_method("finder"), EquivalenceOptions())
    assert missing["verdict"] == "error" and "nowhere" in missing["error"]


# -- tables -----------------------------------------------------------------------------------


def _rows() -> pl.DataFrame:
    rows = []

    def add(pid, method, verdict, label, hardness, verified=None, seconds=1.0, tokens=0):
        correct = None if verdict not in ("equivalent", "not_equivalent") else (
            (verdict == "equivalent") == label)
        rows.append({"pair_id": pid, "method": method, "notion": "semantic", "verdict": verdict,
                     "label": label, "correct": correct, "hardness": hardness,
                     "counterexample": "INSERT ..." if verified is not None else None,
                     "verified": verified, "seconds": seconds, "prompt_tokens": tokens,
                     "completion_tokens": tokens // 2, "cost_usd": tokens / 1e6})

    add("a", "exec_match", "equivalent", False, "easy")
    add("a", "finder", "not_equivalent", False, "easy", verified=True)
    add("a", "judge:counter_example:semantic:m", "not_equivalent", False, "easy", verified=False, tokens=100)
    add("b", "exec_match", "equivalent", True, "hard")
    add("b", "finder", "no_counterexample_within_budget", True, "hard", seconds=3.0)
    add("b", "judge:counter_example:semantic:m", "equivalent", True, "hard", tokens=100)
    add("c", "exec_match", "skipped", False, "hard")
    add("c", "finder", "not_equivalent", False, "hard", verified=True)
    add("c", "judge:counter_example:semantic:m", "unparsed", False, "hard", tokens=100)
    return pl.DataFrame(rows)


def test_tables_in_the_papers_forms():
    df = _rows()
    acc = accuracy_table(df)
    get = lambda m, h: acc.filter(pl.col("method") == m, pl.col("hardness") == h).row(0, named=True)
    assert get("finder", "all")["accuracy"] == pytest.approx(2 / 3)  # undecided counts as wrong
    assert get("finder", "hard")["n"] == 2 and get("finder", "hard")["decided"] == 1
    assert get("exec_match", "all")["n"] == 2  # the skipped pair is left out
    assert get("judge:counter_example:semantic:m", "easy")["accuracy"] == 1.0
    agree = agreement_table(df).filter(pl.col("method") == "finder").row(0, named=True)
    assert (agree["n"], agree["agree"], agree["exec_eq_method_neq"]) == (1, 0, 1)
    judge = agreement_table(df).filter(pl.col("method").str.starts_with("judge")).row(0, named=True)
    assert (judge["n"], judge["agree"]) == (2, 1)
    ce = counterexample_table(df)
    f = ce.filter(pl.col("method") == "finder").row(0, named=True)
    assert (f["n_pairs"], f["flagged"], f["verified"], f["found_rate"]) == (2, 2, 2, 1.0)
    j = ce.filter(pl.col("method").str.starts_with("judge")).row(0, named=True)
    assert (j["flagged"], j["with_counterexample"], j["verified"]) == (1, 1, 0)
    t = time_table(df).filter(pl.col("method") == "finder").row(0, named=True)
    assert (t["n"], t["max_s"], t["total_s"]) == (3, 3.0, 5.0)
    judge_t = time_table(df).filter(pl.col("method").str.starts_with("judge")).row(0, named=True)
    assert judge_t["prompt_tokens"] == 300 and judge_t["cost_usd"] == pytest.approx(3e-4)
    # no labels at all: accuracy is empty, counterexamples are counted over every pair
    unlabelled = df.with_columns(pl.lit(None, dtype=pl.Boolean).alias("label"))
    assert accuracy_table(unlabelled).is_empty()
    assert counterexample_table(unlabelled)["pair_set"][0] == "all pairs (no labels)"


# -- flow and CLI --------------------------------------------------------------------------------


def _judge_reply(body: dict, index: int):
    """Scripted judge: right on the COUNT bug (with a real counterexample), a bogus
    counterexample on DISTINCT vs UNION ALL, 'equivalent' elsewhere."""
    user = body["messages"][-1]["content"]
    if "headcount" in user:
        return message("An empty department has count 0.\n```sql\n"
                       "INSERT INTO dept VALUES (1, 'x', 0);\n```\nVERDICT: NOT EQUIVALENT",
                       usage={"prompt_tokens": 500, "completion_tokens": 120})
    if "UNION ALL" in user:
        return message("```sql\nINSERT INTO product VALUES (1, 'p', 'blue', 50);\n```\n"
                       "VERDICT: NOT EQUIVALENT")
    return message("Same logic.\nVERDICT: EQUIVALENT")


def _pairs_file(tmp_path: Path, shop_db: Path) -> Path:
    lines = (DATA / "classic_not_equivalent.jsonl").read_text().splitlines()[:2]
    lines += (DATA / "equivalent_rewrites.jsonl").read_text().splitlines()[:1]
    lines.append(json.dumps({"id": "not_in_on_db", "sql1": NOT_IN, "sql2": NOT_EXISTS,
                             "dialect": "sqlite", "db": str(shop_db), "label": False,
                             "hardness": "medium"}))
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_flow_over_pairs_and_methods(prefect_harness, tmp_path, shop_db, monkeypatch, settings):
    from flows.equivalence import equivalence

    pairs = _pairs_file(tmp_path, shop_db)
    methods = ["exec_match", "finder", "judge:counter_example:semantic:scripted",
               "judge:explain_compare:relaxed:scripted"]
    options = {"budget": {"max_instances": 150, "time_limit_s": 60}}
    with ScriptedOpenAIServer(_judge_reply) as srv:
        # the judge's prices come from the models table (here a QUERYLAB_MODELS file)
        register_model(srv.base_url, tmp_path, monkeypatch.setenv, name="scripted",
                       key_env="QUERYLAB_OPENAI_API_KEY", key="sk-test-SECRET",
                       prices="{input: 1.0, output: 4.0}")
        out = equivalence(run_id="eq-flow", pairs_path=str(pairs), methods=methods,
                          options=options, batch_size=3, artifacts_root=settings.artifacts)
        assert srv.request_count == 2 * 4 and not srv.errors
        assert all(r["temperature"] == 0 for r in srv.requests)
    df = pl.read_parquet(out["equivalence"])
    assert df.height == 4 * 4 and df.schema["verdict"] == pl.String
    v = {(r["pair_id"], r["method"]): r for r in df.to_dicts()}
    assert v[("count_bug", "finder")]["verdict"] == "not_equivalent"
    assert v[("count_bug", "finder")]["verified"] is True
    assert v[("join_order", "finder")]["verdict"] == "no_counterexample_within_budget"
    assert v[("join_order", "finder")]["instances_tried"] == 150
    assert v[("count_bug", "exec_match")]["verdict"] == "skipped"
    assert v[("not_in_on_db", "exec_match")]["verdict"] == "equivalent"
    assert v[("not_in_on_db", "finder")]["verdict"] == "not_equivalent"
    judge = "judge:counter_example:semantic:scripted"
    assert v[("count_bug", judge)]["verified"] is True
    assert v[("count_bug", judge)]["cost_usd"] == pytest.approx((500 + 4 * 120) / 1e6)
    assert json.loads(v[("count_bug", judge)]["details"])["priced"] is True
    assert v[("distinct_vs_union_all", judge)]["verdict"] == "not_equivalent"
    assert v[("distinct_vs_union_all", judge)]["verified"] is False
    assert v[("join_order", judge)]["verdict"] == "equivalent"
    tables = out["tables"]
    text = tables["text"]
    for heading in ("Accuracy by hardness", "Agreement with execution match",
                    "Counterexamples on the non-equivalent set", "Time per pair"):
        assert heading in text
    assert "| medium" in text or "medium |" in text
    ce = pl.read_parquet(tables["counterexamples"])
    assert ce.filter(pl.col("method") == "finder")["verified"][0] == 3
    assert Path(tables["markdown"]).read_text() == text
    # artifacts carry schema versions and never the key
    import pyarrow.parquet as pq

    assert pq.read_schema(out["equivalence"]).metadata[b"schema_version"] == b"2"
    for f in Path(settings.artifacts, "runs", "eq-flow").rglob("*"):
        if f.is_file():
            assert b"sk-test-SECRET" not in f.read_bytes(), f
    # a re-run of the same run skips finished batches
    batches = sorted(Path(out["equivalence"]).parent.glob("batches/*.parquet"))
    before = {b: b.stat().st_mtime_ns for b in batches}
    again = equivalence(run_id="eq-flow", pairs_path=str(pairs), methods=methods,
                        options=options, batch_size=3, artifacts_root=settings.artifacts)
    assert {b: b.stat().st_mtime_ns for b in batches} == before
    assert pl.read_parquet(again["equivalence"]).equals(df)


def _cli(argv: list[str]) -> int:
    from querylab import cmd_equivalence

    p = argparse.ArgumentParser(prog="querylab")
    sub = p.add_subparsers(dest="command", required=True)
    cmd_equivalence.register(sub)
    args = p.parse_args(argv)
    return args.func(args)


def test_cli_find_run_and_report(prefect_harness, tmp_path, shop_db, capsys, settings):
    assert _cli(["equivalence", "find", "--pairs", str(DATA / "classic_not_equivalent.jsonl"),
                 "--id", "having_vs_where_on_aggregate"]) == 0
    out = capsys.readouterr().out
    assert "verdict: not_equivalent" in out and "verified: True" in out
    assert "CREATE TABLE sale" in out and "INSERT INTO sale" in out
    assert _cli(["equivalence", "find", "--schema", "CREATE TABLE t (a INT)", "--sql1",
                 "SELECT a FROM t", "--sql2", "SELECT DISTINCT a FROM t",
                 "--max-instances", "50"]) == 0
    assert "verdict: not_equivalent" in capsys.readouterr().out
    assert _cli(["equivalence", "find", "--pairs", str(DATA / "classic_not_equivalent.jsonl"),
                 "--id", "nope"]) == 2
    assert "no pair 'nope'" in capsys.readouterr().err

    pairs = _pairs_file(tmp_path, shop_db)
    status = _cli(["equivalence", "run", str(pairs), "--run-id", "eq-cli", "--max-instances", "100",
                   "--artifacts", settings.artifacts])
    out = capsys.readouterr().out
    assert status == 0 and "4 pairs × 2 methods" in out
    assert "Agreement with execution match" in out and "equivalence.parquet" in out
    assert re.search(r"\| finder\s+\|", out)
    assert _cli(["equivalence", "report", "--run-id", "eq-cli", "--artifacts", settings.artifacts]) == 0
    assert "Counterexamples on the non-equivalent set" in capsys.readouterr().out
    assert _cli(["equivalence", "run", str(pairs), "--method", "guess"]) == 2
    assert "unknown method" in capsys.readouterr().err
    assert _cli(["equivalence", "report", "--run-id", "missing-run",
                 "--artifacts", settings.artifacts]) == 2


def test_spider_database_built_by_the_text_to_sql_task(tmp_path):
    """Pairs over a Spider database by name: execution match says *equivalent* on the real
    data, the finder shows why they are not (a singer whose age is NULL)."""
    from tests.helpers import SHARED_DATA

    spider = pytest.importorskip("tasks.text2sql.spider")
    source = SHARED_DATA / "spider" / "databases" / "concert_singer"
    if not source.exists():
        pytest.skip("shared Spider data not present")
    spider.build_spider_database(source, tmp_path / "concert_singer.sqlite")
    pair = QueryPair.model_validate({
        "id": "oldest", "dialect": "sqlite", "db": "concert_singer", "label": False,
        "sql1": "SELECT name FROM singer ORDER BY age DESC LIMIT 1",
        "sql2": "SELECT name FROM singer WHERE age = (SELECT max(age) FROM singer)"})
    options = EquivalenceOptions(db_root=str(tmp_path))
    assert evaluate(pair, parse_method("exec_match"), options)["verdict"] == "equivalent"
    found = evaluate(pair, parse_method("finder"), options)
    assert found["verdict"] == "not_equivalent" and found["verified"] is True
    assert "CREATE TABLE singer" in found["counterexample"]


# -- issue 18: labels, relaxed-only labels, empty results, dialects, the acceptance command ----


def test_published_label_words_and_dialects():
    assert _pair(label="inequivalent").label_for("semantic") is False
    assert _pair(label="Inequivalent").label_for("semantic") is False
    assert _pair(label={"relaxed": "inequivalent"}).label_for("relaxed") is False
    assert _pair(dialect="Calcite").dialect == "calcite"
    with pytest.raises(ValueError, match="unknown SQL dialect 'mysqll'"):
        _pair(dialect="mysqll")
    with pytest.raises(ValueError, match="unknown SQL dialect"):
        _pair(schema_dialect="nosuch")


def test_relaxed_only_labels_are_used_in_the_label_agreement_table(prefect_harness, tmp_path, settings):
    from flows.equivalence import equivalence

    lines = [json.loads(x) for x in (DATA / "classic_not_equivalent.jsonl").read_text().splitlines()[:2]]
    lines += [json.loads(x) for x in (DATA / "equivalent_rewrites.jsonl").read_text().splitlines()[:1]]
    for obj in lines:  # only relaxed labels, as some published sets give
        obj["label"] = {"relaxed": "inequivalent" if obj["label"] == "not_equivalent" else "equivalent"}
    pairs = tmp_path / "relaxed.jsonl"
    pairs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = equivalence(run_id="eq-relaxed", pairs_path=str(pairs), methods=["finder"],
                      options={"budget": {"max_instances": 100, "time_limit_s": 60}},
                      artifacts_root=settings.artifacts)
    df = pl.read_parquet(out["equivalence"])
    assert df["label"].is_null().all() and df["label_relaxed"].to_list().count(False) == 2
    agree = pl.read_parquet(out["tables"]["label_agreement"])
    row = agree.row(0, named=True)
    assert (row["method"], row["notion"], row["label_notion"]) == ("finder", "semantic", "relaxed")
    assert (row["n"], row["agree"], row["label_neq_method_neq"]) == (2, 2, 2)
    text = out["tables"]["text"]
    assert "_no labelled pairs_" not in text and "relaxed labels only" in text
    assert "## Agreement with the labels" in text and "| relaxed" in text
    sizes = pl.read_parquet(out["tables"]["finder_sizes"])
    assert sizes.height == 2 and sizes["found_rows"].min() >= 1 and sizes["found_by"].null_count() == 0
    assert "instance size that separated each pair" in text


def test_execution_match_warns_when_every_result_is_empty(tmp_path, caplog):
    path = tmp_path / "empty.sqlite"
    con = sqlite3.connect(path)
    con.executescript(DDL)
    con.close()
    pair = _pair(db=str(path), label="not_equivalent")
    with caplog.at_level("WARNING"):
        row = evaluate(pair, parse_method("exec_match"), EquivalenceOptions())
    assert row["verdict"] == "equivalent" and row["correct"] is False
    details = json.loads(row["details"])
    assert details["all_empty"] is True and "every compared result is empty" in details["warnings"][0]
    assert "WARNING" in row["explanation"] and "every compared result is empty" in caplog.text
    df = pl.DataFrame([{**row, "run_id": "r"}])
    from tasks.equivalence.tables import empty_result_pairs

    assert empty_result_pairs(df) == ["p"]


@pytest.mark.slow
def test_finder_rows_carry_readings_type_errors_and_error_on_instance():
    pair = QueryPair.model_validate({
        "id": "dname", "dialect": "mysql",
        "schema": "CREATE TABLE `DEPT` (`DEPTNO` int NOT NULL, `DNAME` int, PRIMARY KEY (`DEPTNO`));",
        "sql1": "SELECT DEPTNO FROM DEPT WHERE DNAME = 'SECURITY'", "sql2": "SELECT DEPTNO FROM DEPT WHERE 1 = 0",
        "label": "not_equivalent"})
    row = evaluate(pair, parse_method("finder"),
                   EquivalenceOptions(budget={"max_instances": 100, "time_limit_s": 60}))
    assert row["verdict"] == "error_on_instance" and row["correct"] is None
    assert row["counterexample"] is None and row["verified"] is None
    details = json.loads(row["details"])
    assert "INSERT INTO" in details["error_script"] and details["type_errors"]
    assert details["one_sided_errors"] > 0 and "Conversion Error" in row["error"]


@pytest.mark.slow
def test_cli_find_acceptance_commands(capsys):
    argv = ["equivalence", "find", "--schema",
            ("CREATE TABLE `emp` (`empno` int primary key not null, `deptno` int not null); "
             "CREATE TABLE ANON (c INT);"),
            "--sql1", "SELECT empno FROM emp", "--sql2", "SELECT empno FROM emp WHERE deptno=deptno",
            "--dialect", "duckdb", "--max-instances", "200"]
    assert _cli(argv) == 0
    out = capsys.readouterr().out
    assert "verdict: no_counterexample_within_budget" in out and "no table" not in out
    assert "reading: schema DDL: statement(s) 1, 2 read as mysql, not duckdb" in out
    argv = ["equivalence", "find", "--schema", "CREATE TABLE DEPT (DEPTNO INT PRIMARY KEY, DNAME INT)",
            "--sql1", "SELECT DEPTNO FROM DEPT WHERE DNAME = 'SECURITY'",
            "--sql2", "SELECT DEPTNO FROM DEPT WHERE 1 = 0", "--max-instances", "100"]
    assert _cli(argv) == 0
    out = capsys.readouterr().out
    assert "verdict: error_on_instance" in out and "counterexample (minimal)" not in out
    assert "type error: sql1: type-incorrect comparison" in out
    assert "a minimal database on which one query fails (not a counterexample)" in out
    assert _cli(["equivalence", "find", "--schema", "CREATE TABLE t (a INT); FROBNICATE t;",
                 "--sql1", "SELECT a FROM t", "--sql2", "SELECT a FROM t"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: schema statement 2 does not parse") and "FROBNICATE t" in err
    assert _cli(["equivalence", "find", "--schema", "CREATE TABLE t (a INT)", "--sql1", "SELECT a FROM t",
                 "--sql2", "SELECT a FROM t", "--dialect", "mysqll"]) == 2
    assert "unknown SQL dialect 'mysqll'" in capsys.readouterr().err
