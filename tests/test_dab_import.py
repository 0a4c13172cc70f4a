"""DAB-format import (issue 15, points 1, 4, 5): hand-made DAB checkouts (all four engines,
DAB's upper-case names, gaps in the query numbers, validators that read ground_truth.csv or
crash, a broken dataset) are imported under DAB's names, streamed in chunks, loaded and run
through the real trials, score and report stages; validate.py runs out of process with its
own query folder."""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from tasks.datasets import dab_stream
from tasks.core import storage
from tasks.datasets.dab_import import (
    DabImportError,
    dataset_name,
    find_dab_datasets,
    import_dab_dataset,
    imported_datasets,
    read_db_config,
    resolve_imported,
    run_validate_script,
)
from tasks.db.engines import open_databases
from tasks.scoring.scoring_file import load_scoring
from tasks.scoring.stage import score_rows, summarise, scores_frame
from tests.fakes.dab import make_dab_checkout, make_dab_suite


@pytest.fixture(scope="module")
def dab_root(tmp_path_factory) -> Path:
    return make_dab_checkout(tmp_path_factory.mktemp("dab"))


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    return make_dab_suite(tmp_path_factory.mktemp("suite"), broken=True)


@pytest.fixture(scope="module")
def dab_manifest(dab_root, settings) -> dict:
    uri = import_dab_dataset.fn(str(dab_root / "query_tinyshop"), settings.artifacts)
    return storage.read_json(uri)


def _parser():
    from querylab import cmd_datasets

    parser = argparse.ArgumentParser()
    cmd_datasets.register(parser.add_subparsers(dest="command"))
    return parser


@pytest.mark.slow
def test_import_reads_all_four_engines(dab_manifest, settings):
    m = dab_manifest
    assert m["name"] == "tinyshop" and m["format"] == "dab" and not m["scoring_only"]
    engines = {db: d["engine"] for db, d in m["databases"].items()}
    assert engines == {"orders_database": "sqlite", "catalog_database": "duckdb",
                       "customer_database": "postgres", "review_database": "mongodb"}
    tables = {db: {t: v["rows"] for t, v in d["tables"].items()} for db, d in m["databases"].items()}
    assert tables == {"orders_database": {"orders": 4}, "catalog_database": {"products": 2},
                      "customer_database": {"customers": 4},
                      "review_database": {"notes": 2, "reviews": 3}}
    # DAB appends db_description_withhint.txt as it is
    assert m["hints"] == (Path(m["source"]) / "db_description_withhint.txt").read_text().strip()
    assert "tiny shop" in m["schema_description"]
    assert [q["id"] for q in m["queries"]] == ["query1", "query2", "query3"]
    assert m["queries"][2]["question"] == "What is the average review rating of the Lamp?"
    # the public manifest has questions only; validators and ground truth are the scorer's
    assert all(set(q) == {"id", "question"} for q in m["queries"])
    uri = storage.join(settings.artifacts, "datasets", m["name"], m["version"], "manifest.json")
    private = load_scoring(uri)["queries"]
    assert {q["validator"]["kind"] for q in private.values()} == {"dab_script"}
    assert private["query1"]["ground_truth"] == "151.25"
    # the loaded databases answer real queries through querylab's engines
    dbs = open_databases(m, settings)
    berkeley = dbs["customer_database"].query(
        "SELECT customer_id FROM customers WHERE city = 'Berkeley' ORDER BY customer_id").rows
    assert [r["customer_id"] for r in berkeley] == [1, 3]
    assert dbs["customer_database"].query(
        "SELECT count(*) AS n FROM customers WHERE city IS NULL").rows == [{"n": 1}]
    reviews = dbs["review_database"].query(
        '{"collection": "reviews", "aggregate": [{"$match": {"sku": "P1"}}, '
        '{"$group": {"_id": null, "avg": {"$avg": "$stars"}}}]}').rows
    assert reviews[0]["avg"] == 4.5
    notes = dbs["review_database"].query('{"collection": "notes", "find": {"qty": 3}}').rows
    assert [n["note"] for n in notes] == ["restock"]
    assert dbs["catalog_database"].query("SELECT max(price) AS p FROM products").rows == [{"p": 180.0}]
    assert dbs["orders_database"].query("SELECT sum(amount) AS s FROM orders").rows == [{"s": 171.25}]


# -- names ---------------------------------------------------------------------------------------


def test_datasets_keep_dab_names_and_are_registered(suite, tmp_path, settings):
    root = str(tmp_path / "art")
    found = find_dab_datasets(suite)
    assert [p.name for p in found] == ["query_PATENTS", "query_agnews", "query_broken",
                                       "query_tinyshop"]
    assert [dataset_name(p) for p in found] == ["PATENTS", "agnews", "broken", "tinyshop"]
    for bad in ("dab_x", "query_a b", "query_..", "query_"):
        with pytest.raises(DabImportError, match="folder name"):
            dataset_name(tmp_path / bad)
    uri = import_dab_dataset.fn(str(suite / "query_PATENTS"), root)
    m = storage.read_json(uri)
    assert m["name"] == "PATENTS" and "/datasets/PATENTS/" in uri
    # a query is its folder: query4 stays query4 without a query3
    assert [q["id"] for q in m["queries"]] == ["query1", "query2", "query4"]
    assert set(imported_datasets(root)) == {"PATENTS"}
    assert resolve_imported(root, "patents")["manifest"] == uri  # case-insensitive lookup
    assert resolve_imported(root, "PATENTS")["source"] == str(suite / "query_PATENTS")
    assert resolve_imported(root, "nope") is None
    # a DAB folder named like one of querylab's own datasets would be ambiguous
    clash = tmp_path / "query_Stocks"
    clash.mkdir()
    with pytest.raises(DabImportError, match="querylab's own dataset 'stocks'"):
        import_dab_dataset.fn(str(clash), root)


# -- streaming -----------------------------------------------------------------------------------


def test_tables_stream_in_chunks_with_one_schema(tmp_path, monkeypatch):
    """A SQLite table read in many small chunks: the chunks' types are unified (int + float,
    nulls first, mixed kinds → JSON text), every row arrives once, and the Parquet file holds
    one row group per chunk (no chunk ever held the table)."""
    monkeypatch.setattr(dab_stream, "CHUNK_ROWS", 100)
    monkeypatch.setattr(dab_stream, "MIN_CHUNK_ROWS", 10)
    db = tmp_path / "t.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE t (id INTEGER, x, label TEXT, mixed)")
        rows = [(i, i if i < 500 else i + 0.5, None if i < 300 else f"l{i}",
                 i if i % 2 else f"s{i}") for i in range(2_500)]
        con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    with dab_stream.sqlite_tables(db) as tables:
        schema, batches = tables["t"]
        assert {f.name: str(f.type) for f in schema} == {
            "id": "int64", "x": "double", "label": "string", "mixed": "string"}
        sizes = []

        def counted():
            for b in batches():
                sizes.append(b.num_rows)
                yield b

        entry = dab_stream.write_table(str(tmp_path / "t.parquet"), schema, counted())
    assert entry["rows"] == 2_500 and len(sizes) >= 25 and max(sizes) <= 100
    back = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert [r["id"] for r in back] == list(range(2_500))
    assert back[0]["label"] is None and back[300]["label"] == "l300" and back[600]["x"] == 600.5
    assert back[1]["mixed"] == "1" and back[2]["mixed"] == "s2"  # number kept as JSON text


def test_mongo_dumps_stream_and_unify_documents(tmp_path, monkeypatch):
    import bson

    monkeypatch.setattr(dab_stream, "CHUNK_ROWS", 50)
    monkeypatch.setattr(dab_stream, "MIN_CHUNK_ROWS", 5)
    f = tmp_path / "c.bson"
    with f.open("wb") as fh:
        for i in range(400):
            doc = {"_id": bson.ObjectId(), "n": i, "meta": {"a": i}}
            if i >= 200:
                doc["meta"] = {"a": i, "b": f"x{i}"}  # a field first seen late
                doc["tags"] = ["t", str(i)]
            fh.write(bson.encode(doc))
    schema, batches = dab_stream.mongo_collection(f)
    assert str(schema.field("meta").type) == "struct<a: int64, b: string>"
    rows = [r for b in batches() for r in b.to_pylist()]
    assert len(rows) == 400 and "_id" not in rows[0]
    assert rows[0]["meta"] == {"a": 0, "b": None} and rows[399]["tags"] == ["t", "399"]
    # a JSON array is read element by element (elements spanning reads included)
    arr = tmp_path / "a.json"
    arr.write_text("[" + ",\n".join(json.dumps({"k": i, "s": "y" * (i % 7)})
                                     for i in range(300)) + "]")
    with arr.open() as fh:
        texts = list(dab_stream.iter_json_array(fh, read_size=64))
    assert [json.loads(t)["k"] for t in texts] == list(range(300))
    arr.write_text("[{\"k\": 1}, {\"k\": ")
    with pytest.raises(dab_stream.StreamError, match="not valid JSON|unterminated"):
        with arr.open() as fh:
            list(dab_stream.iter_json_array(fh, read_size=8))


@pytest.mark.slow
def test_imported_tables_load_from_parquet_streams(suite, tmp_path, settings):
    """The engines load a placed table batch by batch from its Parquet file (a reader, not a
    table) and give the same rows."""
    root = str(tmp_path / "art")
    m = storage.read_json(import_dab_dataset.fn(str(suite / "query_agnews"), root))
    dbs = open_databases(m, settings)
    rows = dbs["articles_database"].query(
        '{"collection": "articles", "find": {"article_id": 1}, "projection": {"title": 1}}').rows
    assert rows[0]["title"] == "The Rundown"
    authors = dbs["articles_database"].query('{"collection": "authors", "find": {}}').rows
    assert sorted(a["name"] for a in authors) == ["Ada Byron", "Matthew Smith"]
    assert dbs["metadata_database"].query(
        "SELECT count(*) AS n FROM article_metadata WHERE region = 'Europe'").rows == [{"n": 2}]


@pytest.mark.slow
def test_the_file_loaders_take_a_parquet_stream_whole(tmp_path):
    """A :class:`tasks.core.storage.ParquetStream` of several batches loads into SQLite (batch by
    batch) and DuckDB (scanned from its file within a memory limit) with every row, its nulls
    and its types: dates stay dates, lists stay lists in DuckDB."""
    import datetime as dt

    import duckdb
    import pyarrow as pa

    from tasks.db.databases import load_duckdb, load_sqlite

    n = 25_000  # three batches of ParquetStream's 10,000 rows
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "label": pa.array([None if i % 7 == 0 else f"r{i}" for i in range(n)]),
        "day": pa.array([dt.date(2020, 1, 1) + dt.timedelta(days=i % 366) for i in range(n)]),
        "tags": pa.array([["a", "b"][: i % 3] for i in range(n)], pa.list_(pa.string())),
    })
    uri = storage.write_parquet(str(tmp_path / "t.parquet"), table)
    stream = storage.ParquetStream(uri)
    assert len(list(stream)) == 3 and stream.num_rows == n
    load_duckdb(tmp_path / "t.duckdb", {"t": stream})
    load_sqlite(tmp_path / "t.db", {"t": storage.ParquetStream(uri)})
    con = duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True)
    assert con.execute("SELECT count(*), count(label), max(day), sum(len(tags)) FROM t").fetchone() \
        == (n, n - (n + 6) // 7, dt.date(2020, 12, 31), sum(i % 3 for i in range(n)))
    types = dict(con.execute("SELECT column_name, data_type FROM information_schema.columns "
                             "WHERE table_name = 't'").fetchall())
    assert types == {"id": "BIGINT", "label": "VARCHAR", "day": "DATE", "tags": "VARCHAR[]"}
    con.close()
    with sqlite3.connect(tmp_path / "t.db") as lite:
        assert lite.execute("SELECT count(*), count(label), max(day) FROM t").fetchone() == (
            n, n - (n + 6) // 7, "2020-12-31")


# -- robust import ---------------------------------------------------------------------------------


def test_a_broken_dataset_does_not_stop_the_others(suite, tmp_path, prefect_harness, capsys):
    parser = _parser()
    root = str(tmp_path / "art")
    args = parser.parse_args(["import-dab", str(suite), "--no-run", "--artifacts", root])
    assert args.func(args) == 1  # a dataset failed
    out, err = capsys.readouterr()
    assert "dataset:   PATENTS" in out and "dataset:   agnews" in out and "tinyshop" in out
    failed = [line for line in err.splitlines() if line.startswith("  ")]
    assert len(failed) == 1 and "query_broken" in failed[0] and "missing.db does not exist" \
        in failed[0]
    assert set(imported_datasets(root)) == {"PATENTS", "agnews", "tinyshop"}  # usable
    args = parser.parse_args(["import-dab", str(tmp_path / "nope"), "--no-run"])
    assert args.func(args) == 2
    assert "not a directory" in capsys.readouterr().err


def test_bad_layouts_name_the_file_and_problem(tmp_path, dab_root):
    with pytest.raises(DabImportError, match="no DAB dataset here"):
        find_dab_datasets(tmp_path)
    assert find_dab_datasets(dab_root) == [dab_root / "query_tinyshop"]
    bad = tmp_path / "query_bad"
    bad.mkdir()
    (bad / "db_config.yaml").write_text("db_clients:\n  x:\n    db_type: oracle\n")
    with pytest.raises(DabImportError) as err:
        read_db_config(bad)
    assert "db_config.yaml" in str(err.value) and "db_clients.x.db_type" in str(err.value)
    (bad / "db_config.yaml").write_text(
        "db_clients:\n  x:\n    db_type: sqlite\n    db_path: query_dataset/missing.db\n")
    with pytest.raises(DabImportError, match="db_clients.x.db_path: .*missing.db does not exist"):
        import_dab_dataset.fn(str(bad), str(tmp_path / "art"))
    assert not (tmp_path / "art").exists()  # nothing half-written
    (bad / "query_dataset").mkdir()
    (bad / "query_dataset" / "missing.db").write_text("this is not a database")
    (bad / "db_description.txt").write_text("x")
    (bad / "query1").mkdir()
    (bad / "query1" / "query.json").write_text('"q"')
    (bad / "query1" / "validate.py").write_text("def validate(a):\n    return True, ''\n")
    with pytest.raises(DabImportError, match="missing.db") as err:
        import_dab_dataset.fn(str(bad), str(tmp_path / "art"))
    assert "\n" not in str(err.value)
    assert not list((tmp_path / "art").rglob("*.parquet"))  # a failed import leaves no tables


# -- validators ------------------------------------------------------------------------------------


def test_validate_py_judges_out_of_process(dab_root):
    q1 = dab_root / "query_tinyshop" / "query1" / "validate.py"
    assert run_validate_script(q1, "The total is 151.25 dollars.") == (True, "OK")
    ok, reason = run_validate_script(q1, "About 150.")
    assert ok is False and "151.25 not found" in reason
    assert run_validate_script(q1, None) == (False, "no answer")
    # helpers of the DAB checkout (common_scaffold) import through search_path only
    q2 = dab_root / "query_tinyshop" / "query2" / "validate.py"
    assert run_validate_script(q2, "Lovelace and Hoper", [str(dab_root)])[0]
    ok, reason = run_validate_script(q2, "Lovelace and Hopper")
    assert ok is None and "ModuleNotFoundError" in reason  # no verdict: errored


@pytest.mark.slow
def test_validators_run_in_their_query_folder(suite, tmp_path, settings):
    """``Path(__file__).parent / "ground_truth.csv"`` and ``open("ground_truth.csv")`` both
    find the query's own ground truth (in the sandbox's copy of the folder)."""
    uri = import_dab_dataset.fn(str(suite / "query_PATENTS"), str(tmp_path / "art"))
    queries = load_scoring(uri)["queries"]

    def judge(qid, answer):
        v = queries[qid]["validator"]
        return run_validate_script(v["script"], answer, folder=v["folder"], support=v["support"])

    assert judge("query1", "There are 3 of them.") == (True, "3 found")
    assert judge("query1", "There are 4.") == (False, "3 not in ['4']")
    assert judge("query2", "It is 'soil working'.") == (True, "found Soil working")
    assert judge("query4", "In 2019.") == (True, "year 2019")
    ok, reason = judge("query4", "I could not tell.")
    assert ok is None and "IndexError" in reason and "validate.py" in reason


def test_a_crashing_validator_is_an_errored_verdict(suite, tmp_path):
    uri = import_dab_dataset.fn(str(suite / "query_PATENTS"), str(tmp_path / "art"))
    scoring = load_scoring(uri)
    base = {"run_id": "r", "agent": "a", "dataset": "PATENTS", "query_id": "query4",
            "error": None, "dataset_version": scoring["version"]}
    trials = [{**base, "trial_key": f"a|PATENTS|query4|{i}", "trial": i,
               "terminate_reason": "return_answer", "answer": answer}
              for i, answer in enumerate(["2019", "2020", "no idea"])]
    rows = score_rows(trials, {"PATENTS": scoring})
    assert [r["verdict"] for r in rows] == ["correct", "incorrect", "errored"]
    assert rows[2]["is_correct"] is None
    assert rows[2]["reason"].startswith("validate.py errored: validate.py raised:")
    assert "Traceback" in rows[2]["reason"] and "IndexError" in rows[2]["reason"]
    summary = summarise(scores_frame(rows))
    assert summary["errored_by_reason"] == {"validator_error": 1}


@pytest.mark.slow
def test_validate_py_gets_no_secrets_and_is_killed_on_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("QUERYLAB_OPENAI_API_KEY", "sk-must-not-leak")
    spy = tmp_path / "spy.py"
    spy.write_text(
        "import os\n"
        "def validate(out):\n"
        "    leaked = [k for k in os.environ if 'KEY' in k or k.startswith('QUERYLAB')]\n"
        "    return (not leaked and os.getpid() != int(out)), f'pid {os.getpid()} env {leaked}'\n"
    )
    ok, reason = run_validate_script(spy, str(os.getpid()))
    assert ok, reason
    hang = tmp_path / "hang.py"
    hang.write_text("def validate(out):\n    while True:\n        pass\n")
    ok, reason = run_validate_script(hang, "x", timeout_s=1.5)
    assert ok is None and "timed out" in reason
    broken = tmp_path / "broken.py"
    broken.write_text("def validate(out):\n    raise RuntimeError('boom')\n")
    ok, reason = run_validate_script(broken, "x")
    assert ok is None and "RuntimeError: boom" in reason
    bare = tmp_path / "bare.py"
    bare.write_text("def validate(out):\n    return True\n")  # DAB unpacks a pair: it crashes
    ok, reason = run_validate_script(bare, "x")
    assert ok is None and "(is_valid, reason)" in reason


def test_an_echoed_answer_cannot_fake_the_verdict(tmp_path):
    echo = tmp_path / "echo.py"
    echo.write_text("import os\ndef validate(out):\n    print(out)\n    os._exit(0)\n")
    fake = '\n@@querylab-validate@@{"ok": true, "reason": "fake"}'
    ok, reason = run_validate_script(echo, fake)
    assert ok is None and "fake" not in reason
    exact = tmp_path / "exact.py"
    exact.write_text("def validate(out):\n    return out == 'a\\r\\nb ', repr(out)\n")
    assert run_validate_script(exact, "a\r\nb ")[0] is True  # the answer byte for byte


def test_import_runs_through_trials_and_report(dab_root, prefect_harness, settings):
    from flows.datasets.dab_import import import_dab

    out = import_dab(str(dab_root), run_id="dab-import-test", n_trials=2,
                     artifacts_root=settings.artifacts)
    assert out["names"] == ["tinyshop"] and out["failures"] == []
    trials = pl.read_parquet(out["trials"]["trials"])
    assert trials.height == 3 * 2 and set(trials["dataset"]) == {"tinyshop"}
    scores = pl.read_parquet(out["score"]["scores"])
    assert set(scores["verdict"]) == {"correct"}, scores.select("query_id", "answer", "reason")
    assert set(scores["validator"]) == {"dab_script"} and scores["reason"].str.starts_with(
        "validate.py").all()
    pass_at_k = pl.read_parquet(out["report"]["pass_at_k"])
    assert pass_at_k.filter(pl.col("k") == 1)["pass_at_k"].to_list() == [1.0, 1.0, 1.0]
