"""The counterexample finder: classic non-equivalent pairs give verified, 1-minimal
counterexamples; equivalent rewrites give none; generated instances honour the schema's keys."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from schemas.equivalence import FinderBudget, MatchOptions, QueryPair
from tasks.counterexample import (
    InstanceGenerator,
    _Analysis,
    build_domains,
    cascade,
    ddmin,
    find_counterexample,
)
from tasks.instances import (
    RelSchema,
    Sandbox,
    SchemaError,
    parse_query,
    render_instance,
    verify_counterexample,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "equivalence"
CLASSIC = [json.loads(x) for x in (DATA / "classic_not_equivalent.jsonl").read_text().splitlines() if x.strip()]
REWRITES = [json.loads(x) for x in (DATA / "equivalent_rewrites.jsonl").read_text().splitlines() if x.strip()]
# generous time so that the instance budget, not the machine's speed, ends the search
BUDGET = FinderBudget(max_instances=300, time_limit_s=120)


def _schema(pair: dict) -> RelSchema:
    p = QueryPair.model_validate(pair)
    from tasks.equivalence import pair_schema

    return pair_schema(p)


def _without_row(schema, instance, table, index):
    inst = {t: [tuple(r) for r in rows] for t, rows in instance.items()}
    del inst[table][index]
    tables = schema.closure(list(inst))
    return cascade(schema, tables, inst)


@pytest.mark.parametrize("pair", CLASSIC, ids=[p["id"] for p in CLASSIC])
def test_classic_pairs_get_a_verified_minimal_counterexample(pair):
    schema = _schema(pair)
    res = find_counterexample(pair["sql1"], pair["sql2"], schema, dialect=pair["dialect"],
                              budget=BUDGET)
    assert res.verdict == "not_equivalent", res.summary()
    assert res.verified is True and res.verify_error is None
    assert 1 <= res.rows <= 2, res.instance
    assert res.instances_tried <= BUDGET.max_instances
    assert res.result1 != res.result2
    # the emitted script is CREATE TABLE (with keys) + INSERT, and verifies on its own
    script = res.counterexample
    assert "CREATE TABLE" in script and "INSERT INTO" in script
    assert verify_counterexample(pair["sql1"], pair["sql2"], script, dialect=pair["dialect"],
                                 schema=schema).separates
    # 1-minimal: without any single row (and the rows that referenced it) the queries agree
    for table, rows in res.instance.items():
        for i in range(len(rows)):
            smaller = _without_row(schema, res.instance, table, i)
            text = render_instance(schema, smaller, pair["dialect"])
            check = verify_counterexample(pair["sql1"], pair["sql2"], text,
                                          dialect=pair["dialect"], schema=schema)
            assert check.error is None and not check.separates, (table, i, text)


def test_classic_counterexamples_are_the_textbook_ones():
    by_id = {p["id"]: p for p in CLASSIC}

    def find(pid):
        p = by_id[pid]
        return find_counterexample(p["sql1"], p["sql2"], _schema(p), dialect=p["dialect"],
                                   budget=BUDGET)

    count_bug = find("count_bug")  # a department with head count 0 and no employees
    assert count_bug.instance == {"dept": [[count_bug.instance["dept"][0][0], "a", 0]]}
    ties = find("order_limit_vs_max_ties")  # two employees tied at the maximum salary
    salaries = [r[2] for r in ties.instance["employee"]]
    assert len(salaries) == 2 and salaries[0] == salaries[1]
    assert ties.result1.startswith("1 row") and ties.result2.startswith("2 rows")
    not_in = find("not_in_with_nulls")  # a NULL in the subquery makes NOT IN unknown
    assert [None] in not_in.instance["blocked"]
    left = find("left_join_where_on_right")  # an author without books
    assert set(left.instance) == {"author"} and left.rows == 1
    having = find("having_vs_where_on_aggregate")  # rows at most 100 whose sum passes 100
    amounts = [r[2] for r in having.instance["sale"]]
    assert len(amounts) == 2 and sum(amounts) > 100 and min(amounts) <= 100
    sqlite_pair = find("boundary_gte_vs_gt_sqlite")
    assert sqlite_pair.engine == "sqlite" and sqlite_pair.instance["singer"][0][2] == 30


@pytest.mark.parametrize("pair", REWRITES, ids=[p["id"] for p in REWRITES])
def test_equivalent_rewrites_get_no_counterexample(pair):
    res = find_counterexample(pair["sql1"], pair["sql2"], _schema(pair), dialect=pair["dialect"],
                              budget=BUDGET)
    assert res.verdict == "no_counterexample_within_budget", res.summary()
    assert res.counterexample is None and res.verified is None
    assert res.instances_tried == BUDGET.max_instances
    assert "not a proof" in res.summary()


def test_arbitrary_choice_among_ties_is_not_a_counterexample():
    schema = RelSchema.from_ddl("CREATE TABLE emp (id INT PRIMARY KEY, name TEXT, salary INT)")
    res = find_counterexample(
        "SELECT name FROM emp ORDER BY salary DESC LIMIT 1",
        "SELECT e.name AS top FROM emp AS e ORDER BY e.salary DESC NULLS LAST LIMIT 1",
        schema, budget=BUDGET)
    # DuckDB sorts NULLs last by default, so the two agree whenever the choice is forced
    assert res.verdict == "no_counterexample_within_budget", res.summary()


def test_budget_is_respected_and_reported():
    pair = REWRITES[0]
    res = find_counterexample(pair["sql1"], pair["sql2"], _schema(pair),
                              budget=FinderBudget(max_instances=7, time_limit_s=60))
    assert res.verdict == "no_counterexample_within_budget" and res.instances_tried == 7
    res = find_counterexample(pair["sql1"], pair["sql2"], _schema(pair),
                              budget=FinderBudget(max_instances=10**6, time_limit_s=0.3))
    assert res.verdict == "no_counterexample_within_budget"
    assert 0 < res.instances_tried < 10**6 and res.search_s < 5


def test_search_is_deterministic_for_a_seed():
    pair = CLASSIC[0]
    runs = [find_counterexample(pair["sql1"], pair["sql2"], _schema(pair), budget=BUDGET)
            for _ in range(2)]
    assert runs[0].counterexample == runs[1].counterexample
    assert runs[0].found_at == runs[1].found_at


def test_set_semantics_option_hides_duplicate_differences():
    pair = next(p for p in CLASSIC if p["id"] == "distinct_on_non_key")
    res = find_counterexample(pair["sql1"], pair["sql2"], _schema(pair), budget=BUDGET,
                              match=MatchOptions(bag=False))
    assert res.verdict == "no_counterexample_within_budget"


def test_errors_are_reported_not_raised():
    schema = RelSchema.from_ddl("CREATE TABLE t (a INT)")
    res = find_counterexample("SELECT a FROM nowhere", "SELECT a FROM t", schema)
    assert res.verdict == "error" and "nowhere" in res.error
    res = find_counterexample("SELEC a FROM t", "SELECT a FROM t", schema)
    assert res.verdict == "error" and "parse" in res.error
    res = find_counterexample("SELECT b FROM t", "SELECT a FROM t", schema)
    assert res.verdict == "error" and "sql1 fails on the empty database" in res.error


def test_auto_engine_falls_back_to_sqlite_for_sqlite_only_queries():
    schema = RelSchema.from_ddl("CREATE TABLE t (id INT PRIMARY KEY, g TEXT, v INT)")
    # a bare column next to an aggregate: SQLite accepts it, DuckDB's binder does not
    res = find_counterexample("SELECT g, v, max(v) FROM t GROUP BY g",
                              "SELECT g, v, min(v) FROM t GROUP BY g", schema, budget=BUDGET)
    assert res.engine == "sqlite" and any("engine fallback: ran on sqlite" in n for n in res.readings)
    assert res.verdict == "not_equivalent" and res.verified


def test_generated_instances_honour_keys():
    ddl = """
    CREATE TABLE region (code TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE);
    CREATE TABLE shop (id INT PRIMARY KEY, region TEXT NOT NULL REFERENCES region(code),
                       manager INT, email TEXT UNIQUE);
    CREATE TABLE stock (shop_id INT NOT NULL, item TEXT NOT NULL, qty INT,
                        PRIMARY KEY (shop_id, item), FOREIGN KEY (shop_id) REFERENCES shop(id));
    """
    schema = RelSchema.from_ddl(ddl)
    sql = "SELECT s.id, SUM(k.qty) FROM shop s JOIN stock k ON k.shop_id = s.id WHERE k.qty > 5 GROUP BY s.id"
    analysis = _Analysis(schema, [parse_query(sql, "duckdb")])
    assert analysis.tables == ["region", "shop", "stock"]
    domains = build_domains(schema, analysis)
    qty = domains[("stock", schema.tables["stock"].index("qty"))]
    assert {4, 5, 6} <= set(qty) and {0, 1, 2} <= set(qty)  # constant neighbours + base pool
    gen = InstanceGenerator(schema, analysis.tables, domains, FinderBudget(max_instances=400))
    seen = {"null": False, "dup": False, "empty": False, "two_rows": False}
    with Sandbox(schema, analysis.tables, "duckdb", constraints=True) as box:
        for _ in range(400):
            inst = gen.next()
            box.load(inst)  # raises on any PK / UNIQUE / NOT NULL / FK violation
            stock = inst["stock"]
            seen["empty"] |= not any(inst.values())
            seen["null"] |= any(r[2] is None for r in stock)
            seen["two_rows"] |= len(stock) >= 2
            seen["dup"] |= any(a[2] == b[2] and a != b for i, a in enumerate(stock)
                               for b in stock[i + 1:])
    assert all(seen.values()), seen


def test_ddmin_is_one_minimal():
    items = list(range(20))
    assert ddmin(items, lambda s: 3 in s and 17 in s) == [3, 17]
    out = ddmin(items, lambda s: sum(s) >= 30)
    assert sum(out) >= 30 and all(sum(out) - x < 30 for x in out)
    assert ddmin(items, lambda s: True) == []


def test_cascade_drops_rows_that_lose_their_parent():
    schema = RelSchema.from_ddl(
        "CREATE TABLE p (id INT PRIMARY KEY); CREATE TABLE c (id INT PRIMARY KEY, pid INT REFERENCES p(id))")
    out = cascade(schema, ["p", "c"], {"p": [(1,)], "c": [(1, 1), (2, 2), (3, None)]})
    assert out == {"p": [(1,)], "c": [(1, 1), (3, None)]}


def test_schema_forms_agree_and_keys_are_read():
    ddl = RelSchema.from_ddl("""
        CREATE TABLE dept (id INTEGER, name TEXT NOT NULL, CONSTRAINT pk PRIMARY KEY (id));
        CREATE TABLE emp (id INTEGER PRIMARY KEY, dept_id INTEGER NOT NULL, email TEXT,
                          UNIQUE (email), FOREIGN KEY (dept_id) REFERENCES dept (id));
    """)
    mapping = RelSchema.from_mapping({
        "dept": {"columns": {"id": "INTEGER", "name": "TEXT"}, "primary_key": ["id"],
                 "not_null": ["name"]},
        "emp": {"columns": {"id": "INTEGER PRIMARY KEY", "dept_id": "INTEGER NOT NULL",
                            "email": "TEXT"}, "unique": [["email"]],
                "foreign_keys": [{"columns": ["dept_id"], "references": "dept"}]},
    })
    for s in (ddl, mapping):
        emp = s.table("EMP")
        assert emp.primary_key == ("id",) and emp.unique == [("email",)]
        assert [(f.columns, f.ref_table, f.ref_columns) for f in emp.foreign_keys] == [
            (("dept_id",), "dept", ("id",))]
        assert emp.column("dept_id").not_null and s.table("dept").column("name").not_null
        assert s.table("dept").primary_key == ("id",)
    assert ddl.ddl("duckdb") == mapping.ddl("duckdb")
    # the rendered DDL runs as is
    con = duckdb.connect()
    for stmt in ddl.ddl("duckdb").split(";"):
        if stmt.strip():
            con.execute(stmt)


def test_schema_errors_are_clear():
    with pytest.raises(SchemaError, match="no CREATE TABLE"):
        RelSchema.from_ddl("SELECT 1")
    with pytest.raises(SchemaError, match="unknown keys"):
        RelSchema.from_mapping({"t": {"columns": ["a"], "primary": ["a"]}})
    s = RelSchema.from_ddl("CREATE TABLE t (a INT REFERENCES missing(id))")
    assert s.notes and "missing" in s.notes[0] and s.table("t").foreign_keys == []
    with pytest.raises(KeyError, match="no table 'u'"):
        s.table("u")


def test_spider_schema_and_queries(tmp_path):
    from tests.conftest import SHARED_DATA

    ddl_file = SHARED_DATA / "spider" / "databases" / "concert_singer" / "schema.sql"
    if not ddl_file.exists():
        pytest.skip("shared Spider data not present")
    schema = RelSchema.from_ddl(ddl_file.read_text(), "sqlite")  # MySQL DDL, read anyway
    sic = schema.table("singer_in_concert")
    assert sic.primary_key == ("concert_ID", "Singer_ID")
    assert {f.ref_table for f in sic.foreign_keys} == {"singer", "concert"}
    # Spider's SQLite habit: a double-quoted string; the finder reads it as a constant
    res = find_counterexample(
        'SELECT count(*) FROM singer WHERE country = "France"',
        "SELECT count(*) FROM singer WHERE country = 'france'",
        schema, dialect="sqlite", budget=BUDGET)
    assert res.verdict == "not_equivalent" and res.engine == "sqlite"
    assert res.instance["singer"][0][2] in ("France", "france")
