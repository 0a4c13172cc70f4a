"""Lifecycle suite: items generated from real schemas and queries (Spider dev databases built
from the shared data, Chinook read in place). Every reasoning-graph node executes, every
debugging item fails before correction while its reference executes, UPDATE/DELETE items are
checked by database state, schema variants hold the same data, perturbations are reproducible
from the seed, maintenance anomalies are detectable."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.lifecycle import LifecycleConfig
from tasks.lifecycle.design import design_items, table_groups
from tasks.lifecycle.dml import dml_state, state_matches
from tasks.lifecycle.graphs import (
    PERTURBATION_KINDS,
    PerturbationError,
    build_reasoning_graph,
    check_graph,
    perturb_graph,
)
from tasks.lifecycle.items import (
    LifecycleSourceError,
    generate_phase_items,
    prepare_databases,
    sample_ids,
)
from tasks.lifecycle.maintenance import (
    MAINTENANCE_FILE,
    MaintenanceError,
    MetricsAPI,
    generate_scenario,
    load_catalogue,
)
from tasks.lifecycle.naming import split_words
from tasks.lifecycle.runner import db_path
from tasks.lifecycle.schema import execute_ddl, read_sqlite_schema, sqlite_ddl
from tasks.scoring.result_match import results_match
from tasks.text2sql.spider import run_sqlite
from tests.helpers import SHARED_DATA

SPIDER_DIR = SHARED_DATA / "spider" / "databases"
QUESTIONS = SHARED_DATA / "spider" / "dev.json"
CHINOOK = SHARED_DATA / "chinook" / "Chinook_Sqlite.sqlite"
DBS = ["concert_singer", "pets_1", "car_1"]


@pytest.fixture(scope="module")
def config() -> LifecycleConfig:
    return LifecycleConfig(spider_db_ids=DBS, max_items=20, seed=7, maintenance_scenarios=7)


@pytest.fixture(scope="module")
def databases(tmp_path_factory, config) -> dict:
    home = tmp_path_factory.mktemp("lifecycle-home")
    return prepare_databases(SPIDER_DIR, QUESTIONS, home, config, CHINOOK)


@pytest.fixture(scope="module")
def items(databases, config) -> dict:
    out = {}
    for phase in ("design", "implementation", "text2sql", "progressive", "dml", "debug"):
        out[phase] = generate_phase_items(phase, databases, config)
    return out


@pytest.mark.slow
def test_databases_manifest(databases):
    assert sorted(databases["spider"]) == sorted(DBS)
    assert databases["chinook"] == str(CHINOOK.resolve())
    assert sorted(databases["variants"]["pets_1"]) == ["camel_case", "prefixed", "snake_case"]
    names = {t.name for t in read_sqlite_schema(databases["variants"]["pets_1"]["prefixed"]).tables}
    assert names == {"t_student", "t_has_pet", "t_pets"}
    for v, path in databases["variants"]["car_1"].items():  # same rows under other names
        orig = {t.name: t for t in read_sqlite_schema(databases["spider"]["car_1"]).tables}
        var = read_sqlite_schema(path)
        assert [len(t.columns) for t in var.tables] == [len(t.columns) for t in orig.values()]
        for o, t in zip(orig.values(), var.tables):
            n_o = run_sqlite(databases["spider"]["car_1"], f'SELECT count(*) FROM "{o.name}"')
            assert run_sqlite(path, f'SELECT count(*) FROM "{t.name}"') == n_o, (v, t.name)


@pytest.mark.slow
def test_design_items_from_real_schemas(items, databases):
    design, manifest = items["design"]
    # k = 1..5 tables for 4 databases, but pets_1 has 3 tables and concert_singer 4
    assert manifest["n_items"] == len(design) == 4 * 5 - 3
    for it in design:
        ref = it["reference"]["schema"]
        k = it["context"]["k"]
        assert len(ref["tables"]) == k and f"exactly {k} table" in it["prompt"]
        text = it["context"]["requirements"].lower()
        for t in ref["tables"]:  # every entity and attribute is named in the requirements
            assert " ".join(split_words(t["name"])) in text
            for c in t["columns"]:
                assert " ".join(split_words(c["name"])) in text, (it["item_id"], c["name"])
        # the group's foreign keys stay inside the group
        names = {t["name"].lower() for t in ref["tables"]}
        assert all(
            fk["references"]["table"].lower() in names
            for t in ref["tables"]
            for fk in t["foreign_keys"]
        )
    sources = {it["source"] for it in design}
    assert sources <= {"spider", "chinook"}


def test_table_groups_follow_foreign_keys():
    import random

    schema = read_sqlite_schema(CHINOOK)
    groups = table_groups(schema, 3, 5, random.Random(1))
    assert len(groups) == 5 and all(len(g) == 3 for g in groups)
    assert len({frozenset(g) for g in groups}) == 5
    fk = {(t.name, f.ref_table) for t in schema.tables for f in t.foreign_keys}
    for g in groups:  # grown along foreign keys: every table touches another one of the group
        assert all(any((a, b) in fk or (b, a) in fk for b in g if b != a) for a in g)
    assert table_groups(schema, 12, 1, random.Random(1)) == []
    # same seed, same items
    a = design_items({"chinook": schema}, [2], 2, seed=3)
    b = design_items({"chinook": schema}, [2], 2, seed=3)
    assert a == b and a != design_items({"chinook": schema}, [2], 2, seed=4)


@pytest.mark.slow
def test_implementation_items_reference_ddl_executes(items):
    impl, _ = items["implementation"]
    assert any(it["item_id"].endswith("/all") for it in impl)
    for it in impl:
        created = execute_ddl(it["reference"]["ddl"])
        assert [t.name for t in created.tables] == [
            t["name"] for t in it["reference"]["schema"]["tables"]
        ]
        for t in it["reference"]["schema"]["tables"]:
            assert f"Table {t['name']}:" in it["prompt"]


@pytest.mark.slow
def test_text2sql_items_and_variants(items, databases):
    t2s, manifest = items["text2sql"]
    by_base: dict[str, dict] = {}
    for it in t2s:
        by_base.setdefault(it["base_id"], {})[it["variant"]] = it
    assert len(by_base) == 20 and manifest["n_base_items"] == 20
    questions = json.loads(QUESTIONS.read_text())
    for base, variants in by_base.items():
        assert set(variants) == {"original", "snake_case", "camel_case", "prefixed"}
        q = questions[int(base)]
        assert variants["original"]["reference"]["sql"] == q["query"]
        assert f"Question: {q['question']}" in variants["original"]["prompt"]
        gold = run_sqlite(db_path(databases, q["db_id"]), q["query"])
        for v, it in variants.items():
            path = db_path(databases, it["db_id"], v)
            assert sqlite_ddl(path) in it["prompt"]
            rows = run_sqlite(path, it["reference"]["sql"])
            assert results_match(gold, rows, ordered=it["reference"]["ordered"]), (base, v)


@pytest.mark.slow
def test_every_reasoning_graph_node_executes(items, databases):
    prog, manifest = items["progressive"]
    assert manifest["n_base_items"] >= 15
    questions = json.loads(QUESTIONS.read_text())
    for it in prog:
        path = db_path(databases, it["db_id"])
        gold = it["reference"]["nodes"]
        assert it["reference"]["final"] == list(gold)[-1]
        for sql in gold.values():
            run_sqlite(path, sql)  # raises if a node does not execute
        # the last node is the full query
        q = questions[int(it["base_id"])]
        assert results_match(
            run_sqlite(path, q["query"]),
            run_sqlite(path, gold[it["reference"]["final"]]),
            ordered=True,
        )
        shown = [n["id"] for n in it["context"]["nodes"]]
        assert shown[-1] == it["reference"]["final"]
        assert it["level"] == len(it["context"]["perturbations"])
        removed = {op["node"] for op in it["context"]["perturbations"] if op["kind"] == "remove"}
        assert not removed & set(shown)
        assert all(d in shown for n in it["context"]["nodes"] for d in n["depends_on"])


@pytest.mark.slow
def test_graph_with_a_node_that_does_not_execute_is_dropped_and_counted(
    databases, config, tmp_path
):
    q = tmp_path / "dev.json"
    q.write_text(
        json.dumps(
            [
                {
                    "db_id": "concert_singer",
                    "question": "Singers older than their country's average",
                    "query": "SELECT name FROM singer AS s WHERE age > (SELECT avg(age) FROM singer "
                    "WHERE country = s.country)",
                },
                {
                    "db_id": "concert_singer",
                    "question": "How many singers are there?",
                    "query": "SELECT count(*) FROM singer",
                },
            ]
        )
    )
    nodes = build_reasoning_graph(json.loads(q.read_text())[0]["query"])
    assert [n["kind"] for n in nodes] == ["filter", "aggregate", "filter", "final"]
    assert check_graph(nodes, databases["spider"]["concert_singer"]).startswith(
        "n1: no such column"
    )
    dbs = {**databases, "questions": str(q)}
    got, manifest = generate_phase_items("progressive", dbs, config)
    assert manifest["dropped"] == {
        "a node does not execute": 1,
        "single-node graph (no perturbation levels)": 1,
    }
    assert [it["item_id"] for it in got] == ["progressive/1/L0"]


def test_reasoning_graph_shape():
    nodes = build_reasoning_graph(
        "SELECT T2.name, count(*) FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = "
        "T2.stadium_id WHERE T1.year > 2013 GROUP BY T1.stadium_id ORDER BY count(*) DESC LIMIT 1"
    )
    assert [n["kind"] for n in nodes] == ["join", "filter", "aggregate", "final"]
    assert [n["depends_on"] for n in nodes] == [[], ["n1"], ["n2"], ["n3"]]
    assert (
        nodes[0]["description"]
        == "Join concert (T1), stadium (T2) on T1.stadium_id = T2.stadium_id"
    )
    assert nodes[2]["sql"].startswith("SELECT T2.name, COUNT(*) FROM")
    sub = build_reasoning_graph(
        "SELECT name FROM stadium WHERE stadium_id NOT IN (SELECT stadium_id FROM concert)"
    )
    assert sub[0]["sql"] == "SELECT stadium_id FROM concert"
    assert "[n1]" in sub[1]["description"] and sub[-1]["depends_on"] == ["n2"]


@pytest.mark.slow
def test_perturbation_levels_reproducible_from_seed(items, databases, config):
    prog, _ = items["progressive"]
    again, _ = generate_phase_items("progressive", databases, config)
    assert again == prog  # same seed: the same operations on the same nodes
    other, _ = generate_phase_items("progressive", databases, config.model_copy(update={"seed": 8}))
    ops = lambda xs: [x["context"]["perturbations"] for x in xs if x["level"] > 0]
    assert ops(other) != ops(prog)
    levels = {it["level"] for it in prog}
    assert levels == {0, 1, 2, 3, 4, 5}
    kinds = {op["kind"] for it in prog for op in it["context"]["perturbations"]}
    assert kinds == set(PERTURBATION_KINDS)
    path = databases["spider"]["concert_singer"]
    names = ["singer", "Age", "Name", "Country", "concert", "stadium", "Year", "Stadium_ID"]
    nodes = build_reasoning_graph(
        "SELECT T2.name FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = T2.stadium_id "
        "WHERE T1.year > 2013 GROUP BY T2.name HAVING count(*) > 1"
    )
    for level in range(1, 6):
        a = perturb_graph(nodes, level, 5, "g", names)
        assert a == perturb_graph(nodes, level, 5, "g", names) and len(a[1]) == level
        for op in a[1]:
            if op["kind"] in ("syntax", "schema"):
                with pytest.raises(sqlite3.Error):
                    run_sqlite(path, op["sql"])
    with pytest.raises(PerturbationError):
        perturb_graph(nodes[-1:], 1, 0, "g", names)


@pytest.mark.slow
def test_every_debug_item_fails_before_and_its_reference_executes(items, databases):
    debug, manifest = items["debug"]
    assert len(debug) == 20 and manifest["dropped"] == {}
    assert len({it["reference"]["kind"] for it in debug}) == 5
    for it in debug:
        path = db_path(databases, it["db_id"])
        ref = it["reference"]
        with pytest.raises(sqlite3.Error) as err:
            run_sqlite(path, ref["flawed_sql"])
        assert str(err.value) == ref["error"] and ref["error"] in it["prompt"]
        assert ref["flawed_sql"] in it["prompt"]
        run_sqlite(path, ref["sql"])  # the reference correction executes


@pytest.mark.slow
def test_dml_items_are_checked_by_state(items, databases):
    dml, _ = items["dml"]
    assert {it["reference"]["template"] for it in dml} >= {"update_by_key", "delete_by_value"}
    assert any(it["db_id"] == "chinook" for it in dml)
    for it in dml:
        path = db_path(databases, it["db_id"])
        before_bytes = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        before = dml_state(path, None)
        expected = it["reference"]["expected_state"]
        assert not state_matches(expected, before)  # the statement changes the database
        assert state_matches(expected, dml_state(path, it["reference"]["sql"]))
        # a query returning the changed rows changes nothing: it does not pass
        assert not state_matches(
            expected, dml_state(path, f'SELECT * FROM "{it["reference"]["table"]}"')
        )
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == before_bytes
        assert it["context"]["request"] in it["prompt"]


def test_maintenance_scenarios_inject_detectable_anomalies():
    cat = load_catalogue()
    for i in range(len(cat["root_causes"]) * 2):
        sc = generate_scenario(cat, i, seed=11)
        assert sc == generate_scenario(cat, i, seed=11)
        api = MetricsAPI(sc, cat)
        effects = cat["root_causes"][sc["root_cause"]]["effects"]
        for metric in cat["metrics"]:
            res = json.loads(
                api.call(
                    "check_metric_abnormal",
                    {"metric": metric, "start": sc["start"], "end": sc["end"]},
                )[0]
            )
            assert res["abnormal"] == (metric in effects), (sc["root_cause"], metric, res)
            assert metric not in sc["alert"]  # the alert names symptoms, not metrics
    assert (
        generate_scenario(cat, 0, seed=11)["series"] != generate_scenario(cat, 0, seed=12)["series"]
    )
    sc = generate_scenario(cat, 0, seed=1)
    api = MetricsAPI(sc, cat)
    out, ok = api.call(
        "check_metric_abnormal", {"metric": "disk_iops", "start": sc["start"], "end": sc["end"]}
    )
    assert not ok and "unknown metric" in json.loads(out)["error"]
    out, ok = api.call("get_metric_values", {"metric": "qps", "start": "noon", "end": sc["end"]})
    assert not ok and "ISO 8601" in out
    assert not api.call("drop_database", {})[1]
    points = json.loads(
        api.call("get_metric_values", {"metric": "qps", "start": sc["start"], "end": sc["end"]})[0]
    )
    assert points["points"][0][0] == sc["start"] and points["points"][-1][0] == sc["end"]


def test_bad_sources_and_config(tmp_path, config):
    with pytest.raises(LifecycleSourceError, match="dev.json"):
        prepare_databases(SPIDER_DIR, tmp_path / "none.json", tmp_path, config, CHINOOK)
    with pytest.raises(LifecycleSourceError, match="Chinook"):
        prepare_databases(SPIDER_DIR, QUESTIONS, tmp_path, config, tmp_path / "no.sqlite")
    with pytest.raises(ValidationError, match="original"):
        LifecycleConfig(variants=["snake_case"])
    with pytest.raises(ValidationError, match="0 to 5"):
        LifecycleConfig(graph_levels=[6])
    with pytest.raises(ValidationError, match="1 to 5"):
        LifecycleConfig(design_table_counts=[0])
    with pytest.raises(ValueError, match="unknown phase"):
        generate_phase_items("tuning", {}, config)
    bad = tmp_path / "m.yaml"
    bad.write_text(MAINTENANCE_FILE.read_text().replace("experts: [memory]", "experts: [dba]"))
    with pytest.raises(MaintenanceError, match="unknown experts"):
        load_catalogue(bad)


def test_sample_ids_is_stable():
    ids = [str(i) for i in range(100)]
    a = sample_ids(ids, 10, 0, "q")
    assert len(a) == 10 and a == sorted(a, key=int)
    # an item's rank does not depend on the others: a subset keeps the chosen ids it holds
    assert set(sample_ids([i for i in ids if int(i) % 2 == 0], 10, 0, "q")) >= {
        i for i in a if int(i) % 2 == 0
    }
    assert sample_ids(ids, None, 0, "q") == ids
