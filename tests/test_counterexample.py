"""The counterexample finder: classic non-equivalent pairs give verified, 1-minimal
counterexamples; equivalent rewrites give none; generated instances honour the schema's keys."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from schemas.equivalence import FinderBudget, MatchOptions, QueryPair
from tasks.equivalence.counterexample import find_counterexample
from tasks.equivalence.instance_generator import InstanceGenerator, cascade
from tasks.equivalence.instance_db import InstanceDB
from tasks.equivalence.instances import (
    RelSchema,
    SchemaError,
    parse_query,
)
from tasks.equivalence.shrinking import ddmin
from tasks.equivalence.value_domains import _Analysis, build_domains
from tasks.equivalence.verification import render_instance, verify_counterexample

DATA = Path(__file__).resolve().parents[1] / "data" / "equivalence"
CLASSIC = [json.loads(x) for x in (DATA / "classic_not_equivalent.jsonl").read_text().splitlines() if x.strip()]
REWRITES = [json.loads(x) for x in (DATA / "equivalent_rewrites.jsonl").read_text().splitlines() if x.strip()]
# generous time so that the instance budget, not the machine's speed, ends the search
BUDGET = FinderBudget(max_instances=300, time_limit_s=120)


def _schema(pair: dict) -> RelSchema:
    p = QueryPair.model_validate(pair)
    from tasks.equivalence.pairs import pair_schema

    return pair_schema(p)


def _without_row(schema, instance, table, index):
    inst = {t: [tuple(r) for r in rows] for t, rows in instance.items()}
    del inst[table][index]
    tables = schema.closure(list(inst))
    return cascade(schema, tables, inst)


@pytest.mark.slow
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


@pytest.mark.slow
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
    not_in = find("not_in_with_nulls")  # a NULL on either side makes NOT IN unknown
    assert [None] in not_in.instance.get("blocked", []) or any(
        r[1] is None for r in not_in.instance["orders"]), not_in.instance
    left = find("left_join_where_on_right")  # an author without books
    assert set(left.instance) == {"author"} and left.rows == 1
    having = find("having_vs_where_on_aggregate")  # rows at most 100 whose sum passes 100
    amounts = [r[2] for r in having.instance["sale"]]
    assert len(amounts) == 2 and sum(amounts) > 100 and min(amounts) <= 100
    sqlite_pair = find("boundary_gte_vs_gt_sqlite")
    assert sqlite_pair.engine == "sqlite" and sqlite_pair.instance["singer"][0][2] == 30


@pytest.mark.slow
@pytest.mark.parametrize("pair", REWRITES, ids=[p["id"] for p in REWRITES])
def test_equivalent_rewrites_get_no_counterexample(pair):
    res = find_counterexample(pair["sql1"], pair["sql2"], _schema(pair), dialect=pair["dialect"],
                              budget=BUDGET)
    assert res.verdict == "no_counterexample_within_budget", res.summary()
    assert res.counterexample is None and res.verified is None
    assert res.instances_tried == BUDGET.max_instances
    assert "not a proof" in res.summary()


@pytest.mark.slow
def test_arbitrary_choice_among_ties_is_not_a_counterexample():
    schema = RelSchema.from_ddl("CREATE TABLE emp (id INT PRIMARY KEY, name TEXT, salary INT)")
    res = find_counterexample(
        "SELECT name FROM emp ORDER BY salary DESC LIMIT 1",
        "SELECT e.name AS top FROM emp AS e ORDER BY e.salary DESC NULLS LAST LIMIT 1",
        schema, budget=BUDGET)
    # DuckDB sorts NULLs last by default, so the two agree whenever the choice is forced
    assert res.verdict == "no_counterexample_within_budget", res.summary()


@pytest.mark.slow
def test_budget_is_respected_and_reported():
    pair = REWRITES[0]
    res = find_counterexample(pair["sql1"], pair["sql2"], _schema(pair),
                              budget=FinderBudget(max_instances=7, time_limit_s=60))
    assert res.verdict == "no_counterexample_within_budget" and res.instances_tried == 7
    res = find_counterexample(pair["sql1"], pair["sql2"], _schema(pair),
                              budget=FinderBudget(max_instances=10**6, time_limit_s=0.3))
    assert res.verdict == "no_counterexample_within_budget"
    assert 0 < res.instances_tried < 10**6 and res.search_s < 5


@pytest.mark.slow
def test_search_is_deterministic_for_a_seed():
    pair = CLASSIC[0]
    runs = [find_counterexample(pair["sql1"], pair["sql2"], _schema(pair), budget=BUDGET)
            for _ in range(2)]
    assert runs[0].counterexample == runs[1].counterexample
    assert runs[0].found_at == runs[1].found_at


@pytest.mark.slow
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
    res = find_counterexample("SELECT g, v FROM t GROUP BY g",
                              "SELECT g, v FROM t GROUP BY g, v", schema, budget=BUDGET)
    assert res.engine == "sqlite" and any("engine fallback: ran on sqlite" in n for n in res.readings)
    assert res.verdict == "not_equivalent" and res.verified  # a group with two values of v
    # which row's v a bare column shows is SQLite's choice: never a counterexample by itself
    res = find_counterexample("SELECT g, v, max(v) FROM t GROUP BY g",
                              "SELECT g, v, min(v) FROM t GROUP BY g", schema, budget=FAST)
    assert res.engine == "sqlite" and res.verdict == "nondeterministic", res.summary()


@pytest.mark.slow
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
    with InstanceDB(schema, analysis.tables, "duckdb", constraints=True) as box:
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
    from tests.helpers import SHARED_DATA

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


# -- issue 18: DDL of any dialect, one-sided errors, rewrite-engine SQL, deeper instances ------

BACKTICK = ("CREATE TABLE `emp` (`empno` int primary key not null, `deptno` int not null); "
            "CREATE TABLE ANON (c INT);")
FAST = FinderBudget(max_instances=300, time_limit_s=120)
CORPUS = [json.loads(x) for x in (DATA / "finder_corpus.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_backtick_ddl_is_read_as_mysql_with_the_reading_stated():
    schema = RelSchema.from_ddl(BACKTICK, None, "duckdb")
    assert sorted(schema.tables) == ["anon", "emp"] and schema.table("emp").column("deptno").not_null
    assert any("read as mysql, not duckdb" in n and "backtick" in n for n in schema.notes)
    res = find_counterexample("SELECT empno FROM emp", "SELECT empno FROM emp WHERE deptno=deptno",
                              schema, dialect="duckdb", budget=FAST)
    assert res.verdict == "no_counterexample_within_budget", res.summary()
    assert any("read as mysql" in r for r in res.readings)
    nullable = RelSchema.from_ddl(BACKTICK.replace("`deptno` int not null", "`deptno` int"), None, "duckdb")
    res = find_counterexample("SELECT empno FROM emp", "SELECT empno FROM emp WHERE deptno=deptno",
                              nullable, dialect="duckdb", budget=FAST)
    assert res.verdict == "not_equivalent" and res.instance == {"emp": [[res.instance["emp"][0][0], None]]}


@pytest.mark.parametrize("ddl, message", [
    ("CREATE TABLE t (a INT); FROBNICATE t;", r"statement 2 .*FROBNICATE t"),
    ("CREATE TABLE t (a INT); CREATE TABLE u (a INT b c d);", r"statement 2 .*CREATE TABLE u"),
    ("CREATE TABLE t (a INT); ALTER TABLE t DROP COLUMN a;", r"ALTER TABLE t: only ADD"),
    ("CREATE TABLE t (a INT); CREATE TABLE u AS SELECT * FROM t;", r"without a column list"),
    ("CREATE UNIQUE INDEX ux ON nowhere (a); CREATE TABLE t (a INT);", r"unknown table nowhere"),
])
def test_a_statement_that_does_not_parse_is_an_error_naming_it(ddl, message):
    with pytest.raises(SchemaError, match=message):
        RelSchema.from_ddl(ddl, "duckdb")


def test_mysql_ddl_details_are_read_not_dropped():
    ddl = """
    SET NAMES utf8mb4;
    DROP TABLE IF EXISTS `dept`;
    CREATE TABLE `dept` (
      `id` int(11) NOT NULL AUTO_INCREMENT,
      `name` varchar(50) NOT NULL COMMENT 'the name',
      `kind` enum('a','b') DEFAULT NULL,
      `budget` int CHECK (budget >= 0),
      PRIMARY KEY (`id`), UNIQUE KEY `uk_name` (`name`), KEY `ix_kind` (`kind`),
      INDEX ix_budget (`budget`)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
    LOCK TABLES `dept` WRITE;
    INSERT INTO `dept` VALUES (1,'x','a',3);
    UNLOCK TABLES;
    CREATE TABLE emp (id INT, dept_id INT, email TEXT);
    ALTER TABLE emp ADD PRIMARY KEY (id);
    ALTER TABLE emp ADD CONSTRAINT fk FOREIGN KEY (dept_id) REFERENCES dept(id);
    CREATE UNIQUE INDEX ux ON emp (email);
    """
    # SQLite's parser would read "INDEX ix_budget (...)" as a column named INDEX: not accepted
    schema = RelSchema.from_ddl(ddl, None, "sqlite")
    dept, emp = schema.table("dept"), schema.table("emp")
    assert [c.name for c in dept.columns] == ["id", "name", "kind", "budget"]
    assert dept.primary_key == ("id",) and dept.unique == [("name",)]
    assert [c.sql() for c in dept.checks] == ["budget >= 0"]
    assert emp.primary_key == ("id",) and emp.unique == [("email",)]
    assert [(f.columns, f.ref_table) for f in emp.foreign_keys] == [(("dept_id",), "dept")]
    assert any("2 statement(s) kept as commands and ignored (LOCK, UNLOCK)" in n for n in schema.notes)
    # CHECK and ENUM are enforced by the sandbox; the generator keeps to the ENUM's values
    with InstanceDB(schema, ["emp"], "duckdb", constraints=True) as box:
        for bad in ({"dept": [(1, "x", "c", 1)]}, {"dept": [(1, "x", "a", -1)]}):
            with pytest.raises(duckdb.Error):
                box.load(bad)
        box.load({"dept": [(1, "x", "b", 0)]})
    res = find_counterexample("SELECT kind FROM dept WHERE budget > 5", "SELECT kind FROM dept WHERE budget >= 5",
                              schema, dialect="mysql", budget=FAST)
    assert res.verdict == "not_equivalent" and res.instance["dept"][0][3] == 5


@pytest.mark.slow
def test_one_sided_runtime_error_is_error_on_instance_never_a_counterexample():
    schema = RelSchema.from_ddl("CREATE TABLE DEPT (DEPTNO INT PRIMARY KEY, DNAME INT)")
    sql1, sql2 = "SELECT DEPTNO FROM DEPT WHERE DNAME = 'SECURITY'", "SELECT DEPTNO FROM DEPT WHERE 1 = 0"
    res = find_counterexample(sql1, sql2, schema, dialect="mysql", budget=FAST)
    assert res.verdict == "error_on_instance", res.summary()
    assert res.counterexample is None and res.verified is None and res.instance is None
    assert res.error.startswith("sql1 fails (sql2 runs): Conversion Error")
    assert res.one_sided_errors > 0 and "an error is not a result" in res.summary()
    assert res.type_errors == [("sql1: type-incorrect comparison DNAME = 'SECURITY' "
                                "(DEPT.DNAME is INT, 'SECURITY' is no int)")]
    # the failing database is shrunk and shown; executed, it is no counterexample either
    assert res.error_script.count("INSERT INTO DEPT") == 1
    check = verify_counterexample(sql1, sql2, res.error_script, dialect="mysql", schema=schema)
    assert not check.separates and check.error_on_instance.startswith("sql1 fails")


def test_search_goes_on_past_one_sided_errors_to_a_real_counterexample():
    case = next(c for c in CORPUS if c["pair"]["id"] == "err_then_real_difference")
    p = case["pair"]
    res = find_counterexample(p["sql1"], p["sql2"], _schema(p), dialect=p["dialect"], budget=FAST)
    assert res.verdict == "not_equivalent" and res.verified
    # the counterexample is one on which both queries run
    assert not res.result1.startswith("ERROR") and not res.result2.startswith("ERROR")


EMP = CORPUS[2]["pair"]["schema"]  # MySQL DDL of DEPT / EMP


@pytest.mark.parametrize("dialect, sql1, sql2, verdict, reading", [
    ("calcite", "SELECT $f0 FROM (SELECT SAL + 1 AS $f0 FROM EMP) AS t", "SELECT SAL + 1 FROM EMP",
     "no_counterexample_within_budget", "read as identifiers: $f0"),
    ("duckdb", "SELECT $f0 FROM (SELECT SAL + 1 AS $f0 FROM EMP) AS t", "SELECT SAL FROM EMP",
     "not_equivalent", "read as identifiers: $f0"),
    ("calcite", "SELECT EXPR$0 FROM (SELECT COUNT(*) AS EXPR$0 FROM EMP) AS t", "SELECT COUNT(ENAME) FROM EMP",
     "not_equivalent", "read as identifiers: EXPR$0"),
    ("calcite", "SELECT e.EMPNO FROM EMP AS e JOIN (VALUES (10), (10)) AS t (EXPR$0) ON e.DEPTNO = t.EXPR$0",
     "SELECT EMPNO FROM EMP WHERE DEPTNO = 10", "not_equivalent", "EXPR$0"),
    ("calcite", "SELECT COUNT(*) AS EXPR$0 FROM EMP GROUP BY 1", "SELECT COUNT(*) FROM EMP",
     "not_equivalent", "GROUP BY 1 read as the constant 1"),
    ("mysql", "SELECT DEPTNO, COUNT(*) FROM EMP GROUP BY 1", "SELECT DEPTNO, COUNT(*) FROM EMP GROUP BY DEPTNO",
     "no_counterexample_within_budget", None),
    ("mysql", "SELECT EMPNO FROM EMP WHERE UNIX_TIMESTAMP(HIREDATE) >= 946684800",
     "SELECT EMPNO FROM EMP WHERE HIREDATE > '2000-01-01 00:00:00'", "not_equivalent", "UNIX_TIMESTAMP"),
    ("mysql", "SELECT ENAME || JOB FROM EMP", "SELECT CONCAT(ENAME, JOB) FROM EMP",
     "no_counterexample_within_budget", "`||` read as string concatenation"),
    ("mysql", "SELECT ENAME || JOB FROM EMP", "SELECT CONCAT(JOB, ENAME) FROM EMP",
     "not_equivalent", "`||` read as string concatenation"),
    ("mysql", "SELECT EMPNO FROM EMP WHERE SAL > 10 || DEPTNO = 1",
     "SELECT EMPNO FROM EMP WHERE SAL > 10 OR DEPTNO = 1", "no_counterexample_within_budget",
     "`||` read as OR (MySQL's default)"),
])
@pytest.mark.slow
def test_rewrite_engine_sql_is_read_and_every_reading_is_stated(dialect, sql1, sql2, verdict, reading):
    schema = RelSchema.from_ddl(EMP, None, dialect)
    res = find_counterexample(sql1, sql2, schema, dialect=dialect, budget=FAST)
    assert res.verdict == verdict, res.summary()
    assert res.engine == "duckdb" and not any("engine fallback" in r for r in res.readings)
    if reading:
        assert any(reading in r for r in res.readings), res.readings
    else:
        assert not any(r.startswith("sql") for r in res.readings), res.readings


@pytest.mark.slow
def test_predicates_set_the_instance_size_and_ddmin_still_shrinks():
    schema = RelSchema.from_ddl(EMP, None, "mysql")
    sql1 = "SELECT DEPTNO FROM EMP GROUP BY DEPTNO HAVING COUNT(*) > 10"
    sql2 = "SELECT DEPTNO FROM EMP GROUP BY DEPTNO HAVING COUNT(*) > 11"
    res = find_counterexample(sql1, sql2, schema, dialect="mysql", budget=FAST)
    assert res.verdict == "not_equivalent" and res.verified
    assert res.found_by.startswith("guided: COUNT(*) > 10 → 11 rows in EMP")
    assert res.rows_before_shrink >= 12 and "COUNT(*) > 10 → 11 rows" in res.size_hints
    emp = res.instance["EMP"] if "EMP" in res.instance else res.instance["emp"]
    assert len(emp) == 11 and len({r[-1] for r in emp}) == 1  # one department of 11
    assert res.rows == 12  # and its DEPT row: nothing else is left after ddmin
    # the same pair with a row budget below the threshold: noted, not separated
    small = FinderBudget(max_instances=300, time_limit_s=120, row_budget=8)
    res = find_counterexample(sql1, sql2, schema, dialect="mysql", budget=small)
    assert res.verdict == "no_counterexample_within_budget"
    assert any("exceed the row budget 8" in n for n in res.notes)


@pytest.mark.parametrize("pid", ["having_count_distinct", "correlated_count_threshold",
                                 "row_number_top5_vs_limit6", "ties_offset", "count_alias_outside_boundary"])
@pytest.mark.slow
def test_corpus_thresholds_are_separated_by_guided_instances(pid):
    case = next(c for c in CORPUS if c["pair"]["id"] == pid)
    p = case["pair"]
    res = find_counterexample(p["sql1"], p["sql2"], _schema(p), dialect=p["dialect"], budget=FAST)
    assert res.verdict == "not_equivalent" and res.verified, res.summary()
    assert res.found_by.startswith("guided:") and res.rows_before_shrink >= FAST.max_rows


@pytest.mark.slow
def test_an_arbitrary_choice_among_three_ties_is_not_a_counterexample():
    schema = RelSchema.from_ddl("CREATE TABLE emp (id INT PRIMARY KEY, name TEXT, sal INT)")
    sql1 = "SELECT name FROM emp ORDER BY sal LIMIT 1"
    sql2 = "SELECT name FROM emp ORDER BY sal, id LIMIT 1"
    res = find_counterexample(sql1, sql2, schema, budget=FAST)
    assert res.verdict == "nondeterministic", res.summary()
    assert any("LIMIT/OFFSET over tied rows" in c for c in res.choices)
    # three rows tied: sql1 may return any of them, so no database of ties separates the two
    script = ("INSERT INTO emp VALUES (2, 'a', 1), (0, 'b', 1), (1, 'a', 1);")
    check = verify_counterexample(sql1, sql2, script, schema=schema)
    assert not check.separates and check.choice


def test_the_corpus_covers_every_defect_class():
    from collections import Counter

    assert len(CORPUS) >= 30
    classes = Counter(c["class"] for c in CORPUS)
    assert set(classes) == {"backtick_ddl", "one_sided_error", "calcite_identifiers", "having_count",
                            "null_semantics", "bag_vs_set", "order_limit_ties"}
    assert all(n >= 4 for n in classes.values())
    expects = Counter(c["expect"] for c in CORPUS)
    assert expects["not_equivalent"] >= 15 and expects["no_counterexample"] >= 10
    assert expects["error_on_instance"] >= 2
    for c in CORPUS:
        QueryPair.model_validate(c["pair"])


def test_sql_reading_helpers():
    from tasks.equivalence.sql_ddl import split_statements
    from tasks.equivalence.sql_dialects import engine_sql, read_query

    script = "CREATE TABLE `a;b` (c TEXT DEFAULT ';'); -- x; y\nINSERT INTO t VALUES ('1;2');"
    assert split_statements(script, "mysql") == ["CREATE TABLE `a;b` (c TEXT DEFAULT ';')",
                                                 "INSERT INTO t VALUES ('1;2')"]
    q = read_query("SELECT * FROM (VALUES (1, 2)) AS t(EXPR$0, EXPR$1)", "calcite")
    assert engine_sql(q, "calcite", "duckdb") == 'SELECT * FROM (VALUES (1, 2)) AS t("EXPR$0", "EXPR$1")'
    lite = engine_sql(q, "calcite", "sqlite")
    assert 'column1 AS "EXPR$0"' in lite
    import sqlite3

    assert sqlite3.connect(":memory:").execute(lite).fetchall() == [(1, 2)]
    # a plain query in the engine's own dialect is passed through untouched
    text = "select a  from t where b = 1"
    assert engine_sql(read_query(text, "duckdb"), "duckdb", "duckdb") == text
    # parameters stay parameters
    assert "?" in engine_sql(read_query("SELECT a FROM t WHERE b = ?", "duckdb"), "duckdb", "sqlite")
