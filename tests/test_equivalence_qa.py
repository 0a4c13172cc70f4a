"""Issue 18, QA round: every repro of the adversary's and the newcomer's reports.

False-counterexample repros assert that the finder never says ``not_equivalent``; schema repros
that every clause is read or refused by name; the rest that time is bounded, dialects run with
their own semantics (PostgreSQL on the real server), and the reports name what went wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

from schemas.equivalence import FinderBudget, MatchOptions, QueryPair
from tasks.equivalence.counterexample import find_counterexample
from tasks.equivalence.instances import RelSchema, SchemaError
from tasks.equivalence.verification import render_instance, verify_counterexample
from tasks.scoring.result_match import compare_results, results_match

ROOT = Path(__file__).resolve().parents[1]
T = "CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, b INTEGER, s TEXT, x DOUBLE, d DATE, ts TIMESTAMP)"
TM = ("CREATE TABLE `t` (`id` int NOT NULL, `a` int, `b` int, `s` varchar(20), PRIMARY KEY (`id`)) "
      "ENGINE=InnoDB;")
TP = ("CREATE TABLE t (id integer PRIMARY KEY, a integer, b integer, s text, x double precision, "
      "d date, ts timestamp)")
EMP = ("CREATE TABLE dept (id INTEGER PRIMARY KEY, name TEXT NOT NULL); CREATE TABLE emp (id INTEGER "
       "PRIMARY KEY, grp INTEGER, sal INTEGER, s TEXT, dept_id INTEGER REFERENCES dept(id))")
FAST = FinderBudget(max_instances=300, time_limit_s=60)
SMALL = FinderBudget(max_instances=150, time_limit_s=60)


def find(sql1, sql2, ddl=T, dialect="duckdb", budget=FAST, **kw):
    schema = RelSchema.from_ddl(ddl, None, dialect)
    return find_counterexample(sql1, sql2, schema, dialect=dialect, budget=budget, **kw)


# -- C1 / C2: ties and other arbitrary choices are never counterexamples -----------------------


@pytest.mark.parametrize("dialect", ["duckdb", "sqlite"])
@pytest.mark.parametrize("sql1,sql2", [
    ("SELECT a, b FROM t ORDER BY a", "SELECT a, b FROM t ORDER BY a, b"),
    ("SELECT a, b FROM t ORDER BY a", "SELECT a, b FROM t ORDER BY a, b DESC"),
    ("SELECT id FROM t ORDER BY a LIMIT 3", "SELECT id FROM t ORDER BY a, id DESC LIMIT 3"),
    ("SELECT b FROM t ORDER BY a LIMIT 2", "SELECT b FROM t ORDER BY a, b DESC LIMIT 2"),
])
@pytest.mark.slow
def test_ties_under_order_by_are_no_counterexample(dialect, sql1, sql2):
    res = find(sql1, sql2, dialect=dialect)
    assert res.verdict == "nondeterministic", res.summary()
    assert res.counterexample is None and res.choice_instances > 0
    assert any("tied" in c or "ties" in c for c in res.choices), res.choices


def test_the_reported_tie_databases_do_not_verify():
    schema = RelSchema.from_ddl(T)
    rows = "INSERT INTO t (id, a, b) VALUES (0, 1, 0), (1, 1, 2), (2, 1, 0);"
    check = verify_counterexample("SELECT a, b FROM t ORDER BY a", "SELECT a, b FROM t ORDER BY a, b",
                                  rows, schema=schema)
    assert not check.separates and check.choice
    rows = "INSERT INTO t (id, a) VALUES (3, 1), (0, 1), (1, 1), (2, 1);"
    check = verify_counterexample("SELECT id FROM t ORDER BY a LIMIT 3",
                                  "SELECT id FROM t ORDER BY a, id DESC LIMIT 3", rows, schema=schema)
    assert not check.separates
    # ... while a difference no tie explains still verifies
    rows = "INSERT INTO t (id, a) VALUES (0, 1), (1, 2);"
    assert verify_counterexample("SELECT a FROM t ORDER BY a", "SELECT a FROM t ORDER BY a DESC",
                                 rows, schema=schema).separates


@pytest.mark.parametrize("sql1,sql2,ddl,dialect", [
    ("SELECT STRING_AGG(CAST(id AS VARCHAR), ',') FROM t",
     "SELECT STRING_AGG(CAST(id AS VARCHAR), ',' ORDER BY id) FROM t", T, "duckdb"),
    ("SELECT id, ROW_NUMBER() OVER () FROM t", "SELECT id, ROW_NUMBER() OVER (ORDER BY id) FROM t", T, "duckdb"),
    ("SELECT LIST(id) FROM t", "SELECT LIST(id ORDER BY id DESC) FROM t", T, "duckdb"),
    ("SELECT a, COUNT(*) FROM t GROUP BY b", "SELECT MIN(a), COUNT(*) FROM t GROUP BY b", TM, "mysql"),
    ("SELECT id FROM t ORDER BY a LIMIT 2",
     "SELECT id FROM (SELECT id, ROW_NUMBER() OVER (ORDER BY a, b) rn FROM t) z WHERE rn <= 2", T, "duckdb"),
])
@pytest.mark.slow
def test_arbitrary_choices_are_no_counterexample(sql1, sql2, ddl, dialect):
    res = find(sql1, sql2, ddl, dialect)
    assert res.verdict != "not_equivalent", res.summary()
    assert res.verdict == "nondeterministic" and res.choices, res.summary()


@pytest.mark.slow
def test_deterministic_parts_still_separate():
    # the COUNT column differs whatever order STRING_AGG concatenates in
    res = find("SELECT COUNT(*) AS n, STRING_AGG(s, ',') AS l FROM t",
               "SELECT COUNT(*) + 1, STRING_AGG(s, ',') FROM t")
    assert res.verdict == "not_equivalent" and res.verified
    # a total window order is no choice
    res = find("SELECT id, ROW_NUMBER() OVER (ORDER BY id) FROM t",
               "SELECT id, ROW_NUMBER() OVER (ORDER BY id DESC) FROM t")
    assert res.verdict == "not_equivalent" and res.verified
    res = find("SELECT id FROM emp QUALIFY ROW_NUMBER() OVER (PARTITION BY grp ORDER BY id) <= 20",
               "SELECT id FROM emp QUALIFY ROW_NUMBER() OVER (PARTITION BY grp ORDER BY id) <= 21", EMP)
    assert res.verdict == "not_equivalent" and res.found_by.startswith("guided")


# -- C3 / C4: volatile functions, floats ------------------------------------------------------------


@pytest.mark.slow
def test_now_is_one_instant_for_both_queries():
    res = find("SELECT id, now() FROM t", "SELECT id, now() FROM t", budget=SMALL)
    assert res.verdict == "no_counterexample_within_budget", res.summary()
    assert any("frozen" in r for r in res.readings)
    res = find("SELECT id, current_timestamp FROM t WHERE a = a OR a IS NULL",
               "SELECT id, current_timestamp FROM t", budget=SMALL)
    assert res.verdict == "no_counterexample_within_budget", res.summary()
    res = find("SELECT id FROM t WHERE ts < now()", "SELECT id FROM t WHERE ts <= now()")
    assert res.verdict == "not_equivalent"  # a frozen now() still has a boundary


@pytest.mark.slow
def test_every_spelling_of_now_is_the_same_instant(tmp_path):
    """DuckDB's ``get_current_timestamp()`` / ``current_localtimestamp()`` are ``now()`` too,
    in the finder and in execution match."""
    for other in ("get_current_timestamp()", "current_localtimestamp()"):
        res = find("SELECT id, current_timestamp FROM t", f"SELECT id, {other} FROM t", budget=SMALL)
        assert res.verdict == "no_counterexample_within_budget", res.summary()
    db = tmp_path / "now.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY); INSERT INTO t VALUES (1), (2)")
    con.close()
    from tasks.equivalence.methods import execution_match

    row = execution_match(QueryPair(id="now", sql1="SELECT id, current_timestamp FROM t",
                                    sql2="SELECT id, get_current_timestamp() FROM t", dialect="duckdb", db=str(db)))
    assert row["verdict"] == "equivalent", row


@pytest.mark.slow
def test_random_is_never_a_counterexample():
    res = find("SELECT id, random() FROM t", "SELECT id, random() FROM t", budget=SMALL)
    assert res.verdict != "not_equivalent"


@pytest.mark.slow
def test_floats_one_ulp_apart_are_equal():
    assert results_match([(0.050001500000000004,)], [(0.0500015,)])
    assert not results_match([(1.0,)], [(1.0000001,)])
    assert not results_match([(10**15,)], [(10**15 + 1,)])  # integers are exact
    res = find("SELECT x * 0.1 FROM t WHERE x >= 0.000015", "SELECT x / 10 FROM t WHERE x >= 0.000015",
               "CREATE TABLE t (id INTEGER PRIMARY KEY, x DOUBLE)", budget=SMALL)
    assert res.verdict == "no_counterexample_within_budget", res.summary()


# -- C5: dialect semantics ----------------------------------------------------------------------------


def _scratch_databases(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                            (f"querylab_eq_{os.getpid()}_%",)).fetchall()
    return [r[0] for r in rows]


def test_postgres_pairs_run_on_postgresql(pg_server_url):
    res = find("SELECT a / 2 FROM t WHERE a >= 0", "SELECT CAST(FLOOR(a / 2.0) AS INT) FROM t WHERE a >= 0",
               TP, "postgres", budget=SMALL)
    assert res.engine == "postgres" and res.verdict == "no_counterexample_within_budget", res.summary()
    res = find("SELECT a / 2 FROM t", "SELECT a / 2.0 FROM t", TP, "postgres", budget=SMALL)
    assert res.engine == "postgres" and res.verdict == "not_equivalent" and res.verified
    res = find("SELECT a / b FROM t", "SELECT CASE WHEN b = 0 THEN NULL ELSE a / b END FROM t", TP,
               "postgres", budget=SMALL)
    assert res.verdict == "error_on_instance" and "division by zero" in res.error
    assert _scratch_databases(pg_server_url) == []  # every scratch database was dropped


def test_postgres_schema_clauses_on_the_server(pg_server_url):
    for ddl, sql1, sql2 in [
        ("CREATE TABLE t (id int PRIMARY KEY, a int, UNIQUE NULLS NOT DISTINCT (a))",
         "SELECT a FROM t", "SELECT DISTINCT a FROM t"),
        ("CREATE TYPE mood AS ENUM ('sad', 'ok'); CREATE TABLE t (id int PRIMARY KEY, m mood)",
         "SELECT id FROM t WHERE m IN ('sad', 'ok') OR m IS NULL", "SELECT id FROM t"),
        ("CREATE TABLE t (id int PRIMARY KEY, s VARCHAR(1))",
         "SELECT id FROM t WHERE length(s) <= 1 OR s IS NULL", "SELECT id FROM t"),
        ("CREATE TABLE t (id int PRIMARY KEY, a int NOT NULL, b int NOT NULL, c int GENERATED ALWAYS AS (a + b) STORED)",
         "SELECT id, c FROM t", "SELECT id, a + b FROM t"),
    ]:
        res = find(sql1, sql2, ddl, "postgres", budget=SMALL)
        assert res.engine == "postgres" and res.verdict == "no_counterexample_within_budget", (ddl, res.summary())
    assert _scratch_databases(pg_server_url) == []


@pytest.mark.parametrize("sql1,sql2", [
    ("SELECT id FROM t WHERE s = 'Bob'", "SELECT id FROM t WHERE LOWER(s) = 'bob'"),
    ("SELECT id FROM t WHERE s = 'ab'", "SELECT id FROM t WHERE s = 'ab '"),
    ("SELECT a / 3 FROM t", "SELECT ROUND(a / 3, 4) FROM t"),
])
@pytest.mark.slow
def test_mysql_approximation_is_stated_and_hides_no_known_difference(sql1, sql2):
    res = find(sql1, sql2, TM, "mysql", budget=SMALL)
    assert res.verdict != "not_equivalent", res.summary()
    assert any("MySQL semantics approximated by DuckDB" in r for r in res.readings)


def test_mysql_binary_collation_is_case_sensitive():
    res = find("SELECT id FROM t WHERE s = 'Bob'", "SELECT id FROM t WHERE LOWER(s) = 'bob'",
               "CREATE TABLE `t` (`id` int PRIMARY KEY, `s` varchar(20) COLLATE utf8mb4_bin)", "mysql")
    assert res.verdict == "not_equivalent"


@pytest.mark.slow
def test_mysql_pipes_between_numbers_is_or():
    ddl = "CREATE TABLE `u` (`id` int PRIMARY KEY, `a` int, `b` int)"
    res = find("SELECT a || b FROM u", "SELECT a OR b FROM u", ddl, "mysql", budget=SMALL)
    assert res.verdict == "no_counterexample_within_budget", res.summary()
    assert any("read as OR" in r for r in res.readings)


# -- C6: the schema reader loses nothing ----------------------------------------------------------------


def test_untyped_sqlite_columns_are_columns():
    schema = RelSchema.from_ddl("CREATE TABLE u (a, b INT); CREATE TABLE v (x PRIMARY KEY, y)", "sqlite")
    assert [c.name for c in schema.table("u").columns] == ["a", "b"]
    assert [c.name for c in schema.table("v").columns] == ["x", "y"] and schema.table("v").primary_key == ("x",)
    assert any("have no type" in n for n in schema.notes)
    res = find("SELECT * FROM t", "SELECT id, b FROM t", "CREATE TABLE t (id INTEGER PRIMARY KEY, a, b INT)",
               "sqlite")
    assert res.verdict == "not_equivalent"


@pytest.mark.parametrize("ddl,message", [
    ("CREATE TABLE u (b INT,, c)", "empty item in the column list of u"),
    ("CREATE TABLE r (a int, EXCLUDE USING gist (a WITH &&))", "EXCLUDE with an operator other than ="),
    ('CREATE TABLE "T" ("A" int, "a" int)', "given twice"),
    ("CREATE TABLE t (id int, a int); ALTER TABLE t RENAME TO u", "ALTER TABLE t"),
    ("CREATE TABLE t (id int, m mystery)", "which the schema does not define"),
    ("CREATE TABLE p (id int, a int NOT NULL); CREATE TABLE c (b int) INHERITS (p)", "INHERITS is not read"),
])
def test_schema_clauses_not_understood_are_errors_naming_them(ddl, message):
    with pytest.raises(SchemaError, match=message):
        RelSchema.from_ddl(ddl)


def test_a_dropped_table_is_not_in_the_schema():
    schema = RelSchema.from_ddl("DROP TABLE IF EXISTS t; CREATE TABLE t (id int PRIMARY KEY); "
                                "CREATE TABLE old (a int); DROP TABLE old", "postgres")
    assert list(schema.tables) == ["t"] and any("table old dropped" in n for n in schema.notes)


def test_key_syntax_of_every_dialect_is_read():
    pk = RelSchema.from_ddl("CREATE TABLE `t` (`id` int NOT NULL, `a` int, PRIMARY KEY USING BTREE (`id`))")
    assert pk.table("t").primary_key == ("id",) and any("USING BTREE" in n for n in pk.notes)
    ts = RelSchema.from_ddl("CREATE TABLE t (id int NOT NULL, x int, CONSTRAINT pk PRIMARY KEY CLUSTERED "
                            "(id ASC), UNIQUE NONCLUSTERED (x))", "tsql")
    assert ts.table("t").primary_key == ("id",) and ts.table("t").unique == [("x",)]
    for ddl in ("CREATE TABLE t (id int NOT NULL, x int, PRIMARY KEY NONCLUSTERED (id))",
                "CREATE TABLE t (id int NOT NULL PRIMARY KEY CLUSTERED, x int UNIQUE NONCLUSTERED)"):
        unnamed = RelSchema.from_ddl(ddl, "tsql").table("t")
        assert unnamed.primary_key == ("id",) and unnamed.unique in ([], [("x",)])
    lax = RelSchema.from_ddl("CREATE TABLE t (id int PRIMARY KEY, a int CHECK (a > (1)) NOT ENFORCED, "
                             "CONSTRAINT c CHECK (a > 0) NOT ENFORCED, CHECK (a < 9) ENFORCED)", "mysql")
    assert [c.sql() for c in lax.table("t").checks] == ["a < 9"] and any("NOT ENFORCED" in n for n in lax.notes)
    ex = RelSchema.from_ddl("CREATE TABLE r (id int PRIMARY KEY, a int, EXCLUDE USING btree (a WITH =))", "postgres")
    assert ex.table("r").unique == [("a",)]
    nn = RelSchema.from_ddl("CREATE TABLE t (a int, UNIQUE NULLS NOT DISTINCT (a))", "postgres")
    assert nn.table("t").nulls_not_distinct == [("a",)]
    like = RelSchema.from_ddl("CREATE TABLE a (id int PRIMARY KEY, v int NOT NULL CHECK (v > 0)); "
                              "CREATE TABLE b (LIKE a INCLUDING ALL, x int)", "postgres")
    b = like.table("b")
    assert [c.name for c in b.columns] == ["id", "v", "x"] and b.primary_key == ("id",) and b.checks
    mylike = RelSchema.from_ddl("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b LIKE a", "mysql")
    assert mylike.table("b").primary_key == ("id",)
    lite = RelSchema.from_ddl("CREATE TABLE t (id INTEGER, n INT UNIQUE ON CONFLICT IGNORE, "
                              "PRIMARY KEY (id DESC) ON CONFLICT REPLACE)", "sqlite")
    assert lite.table("t").primary_key == ("id",) and lite.table("t").unique == [("n",)]
    key = RelSchema.from_ddl("CREATE TABLE t (id INT PRIMARY KEY, a INT, KEY (a))")
    assert [c.name for c in key.table("t").columns] == ["id", "a"]
    dump = RelSchema.from_ddl(
        "CREATE TABLE public.emp (id integer NOT NULL, n text); ALTER TABLE public.emp OWNER TO postgres; "
        "ALTER TABLE ONLY public.emp ALTER COLUMN id SET DEFAULT nextval('s'::regclass); "
        "ALTER TABLE ONLY public.emp ADD CONSTRAINT emp_pkey PRIMARY KEY (id);", "postgres")
    assert dump.table("emp").primary_key == ("id",)


@pytest.mark.slow
def test_declared_types_bound_the_values():
    schema = RelSchema.from_ddl("CREATE TABLE `t` (`id` int PRIMARY KEY, `tags` set('x','y'), "
                                "`e` enum('a','b'), `s` varchar(1), `u` tinyint unsigned, `m` decimal(3,1))",
                                "mysql")
    cols = {c.name: c for c in schema.table("t").columns}
    assert cols["tags"].accepts("x,y") and not cols["tags"].accepts("a")
    assert cols["e"].accepts("b") and not cols["e"].accepts("c")
    assert cols["s"].accepts("a") and not cols["s"].accepts("1a")
    assert cols["u"].accepts(255) and not cols["u"].accepts(-1)
    assert cols["m"].accepts(12.5) and not cols["m"].accepts(2.25) and not cols["m"].accepts(100.0)
    for sql1 in ("SELECT id FROM t WHERE tags IN ('', 'x', 'y', 'x,y') OR tags IS NULL",
                 "SELECT id FROM t WHERE u >= 0 OR u IS NULL",
                 "SELECT id FROM t WHERE length(s) <= 1 OR s IS NULL"):
        res = find_counterexample(sql1, "SELECT id FROM t", schema, dialect="mysql", budget=SMALL)
        assert res.verdict == "no_counterexample_within_budget", (sql1, res.summary())


@pytest.mark.slow
def test_generated_columns_keep_their_expression():
    for ddl in (("CREATE TABLE `t` (`id` int NOT NULL, `a` int NOT NULL, `b` int NOT NULL, `c` int "
                "GENERATED ALWAYS AS (`a` + `b`) STORED, PRIMARY KEY (`id`))"),
                "CREATE TABLE t (id int PRIMARY KEY, a int NOT NULL, b int NOT NULL, c int AS (a + b))"):
        schema = RelSchema.from_ddl(ddl)
        assert schema.table("t").column("c").generated.sql() in ("a + b", "`a` + `b`", '"a" + "b"')
        res = find_counterexample("SELECT id, c FROM t", "SELECT id, a + b FROM t", schema, budget=SMALL)
        assert res.verdict == "no_counterexample_within_budget", res.summary()
        res = find_counterexample("SELECT id, c FROM t", "SELECT id, a - b FROM t", schema, budget=FAST)
        assert res.verdict == "not_equivalent" and "(id, a, b)" in res.counterexample


@pytest.mark.parametrize("dialect,ddl", [
    ("duckdb", "CREATE TABLE t (id int PRIMARY KEY, a int NOT NULL, b int NOT NULL, c int GENERATED ALWAYS AS (a + b))"),
    ("mysql", ("CREATE TABLE `t` (`id` int PRIMARY KEY, `a` int NOT NULL, `b` int NOT NULL, "
               "`c` int GENERATED ALWAYS AS (`a` + `b`))")),
])
@pytest.mark.slow
def test_generated_columns_without_virtual_or_stored_keep_their_expression(dialect, ddl):
    """``GENERATED ALWAYS AS (expr)`` with neither VIRTUAL nor STORED (DuckDB's usual form,
    MySQL's default VIRTUAL) is a generated column, not an identity clause to skip."""
    schema = RelSchema.from_ddl(ddl, dialect)
    assert schema.table("t").column("c").generated is not None
    res = find_counterexample("SELECT id, c FROM t", "SELECT id, a + b FROM t", schema, dialect=dialect,
                              budget=SMALL)
    assert res.verdict != "not_equivalent", res.summary()
    assert RelSchema.from_ddl("CREATE TABLE t (id int GENERATED ALWAYS AS IDENTITY, a int)",
                              "postgres").table("t").column("id").generated is None


@pytest.mark.parametrize("dialect", ["duckdb", "sqlite", "postgres"])
def test_unique_indexes_on_expressions_and_partial_ones_bind_the_instances(dialect, pg_server_url):
    """``CREATE UNIQUE INDEX ... (lower(s))`` and ``... (a) WHERE a > 0`` restrict the rows: an
    instance breaking them is no database of the schema, so no counterexample may use one."""
    expr = RelSchema.from_ddl("CREATE TABLE t (id int PRIMARY KEY, s text); "
                              "CREATE UNIQUE INDEX u ON t (lower(s))", dialect)
    assert [ux.name for ux in expr.table("t").unique_indexes] == ["u"]
    res = find_counterexample("SELECT lower(s) FROM t WHERE s IS NOT NULL",
                              "SELECT DISTINCT lower(s) FROM t WHERE s IS NOT NULL", expr, dialect=dialect,
                              budget=SMALL)
    assert res.verdict != "not_equivalent", res.summary()
    part = RelSchema.from_ddl("CREATE TABLE t (id int PRIMARY KEY, a int); "
                              "CREATE UNIQUE INDEX u ON t (a) WHERE a > 0", dialect)
    res = find_counterexample("SELECT a FROM t WHERE a > 0", "SELECT DISTINCT a FROM t WHERE a > 0", part,
                              dialect=dialect, budget=SMALL)
    assert res.verdict != "not_equivalent", res.summary()
    # outside the index's WHERE duplicates are allowed, and the script states the index
    res = find_counterexample("SELECT a FROM t", "SELECT DISTINCT a FROM t", part, dialect=dialect, budget=FAST)
    assert res.verdict == "not_equivalent" and res.verified
    assert "UNIQUE INDEX u ON t (a) WHERE a > 0" in res.counterexample
    with pytest.raises(SchemaError, match="no column z"):
        RelSchema.from_ddl("CREATE TABLE t (a int); CREATE UNIQUE INDEX u ON t (lower(z))", dialect)


@pytest.mark.slow
def test_a_check_the_engine_cannot_evaluate_certifies_no_counterexample():
    """A CHECK the engine cannot create (a function it lacks) is not enforced: a database the
    queries differ on may break it, so it is no counterexample — the verdict is an error naming
    the CHECK, never a verified not_equivalent."""
    schema = RelSchema.from_ddl("CREATE TABLE t (id INT PRIMARY KEY, a INT, CHECK (nosuchfn(a) > 0))", "duckdb")
    res = find_counterexample("SELECT id FROM t WHERE a > 0", "SELECT id FROM t", schema, dialect="duckdb",
                              budget=FAST)
    assert res.verdict == "error" and "CHECK constraints of table t" in res.error and not res.verified


# -- M1-M9 ----------------------------------------------------------------------------------------------


def test_wide_results_compare_without_walking_every_permutation():
    assert compare_results([(1,) * 12], [(1,) * 11 + (0,)]) is False
    assert compare_results([(1,) * 12, (2,) * 12], [(2,) * 12, (1,) * 12]) is True
    rows = [tuple(range(9))] * 3
    assert results_match(rows, [tuple(reversed(range(9)))] * 3)
    res = find("SELECT a,a,a,a,a,a,a,a,a,a FROM t", "SELECT a,a,a,a,a,a,a,a,a,b FROM t",
               budget=FinderBudget(time_limit_s=5))
    assert res.verdict == "not_equivalent"


@pytest.mark.slow
def test_a_query_timeout_is_a_timeout_not_an_error():
    res = find("SELECT COUNT(*) FROM t t1, t t2, t t3, t t4, t t5, t t6, t t7",
               "SELECT COUNT(*) * COUNT(*) * COUNT(*) * COUNT(*) * COUNT(*) * COUNT(*) * COUNT(*) FROM t",
               "CREATE TABLE t (id INTEGER PRIMARY KEY)",
               budget=FinderBudget(time_limit_s=3, query_timeout_s=0.2, max_rows=12, row_budget=40))
    assert res.verdict in ("no_counterexample_within_budget", "nondeterministic"), res.summary()
    assert res.verdict != "error_on_instance"
    assert res.seconds < 3 * 2 + 5  # the limit holds (not minutes)


def test_a_run_that_hits_its_time_limit_says_so():
    res = find("SELECT id FROM t WHERE a > 1", "SELECT id FROM t WHERE a > 1 AND a = a",
               budget=FinderBudget(max_instances=10**6, time_limit_s=0.5))
    assert res.hit_time_limit and "time limit reached" in res.summary()
    assert any("stopped at its time limit" in n for n in res.notes)


@pytest.mark.slow
def test_foreign_key_cycles_and_self_references():
    cycle = ("CREATE TABLE dept (deptno INT PRIMARY KEY, mgr INT REFERENCES emp(empno)); "
             "CREATE TABLE emp (empno INT PRIMARY KEY, deptno INT REFERENCES dept(deptno), sal INT);")
    res = find("SELECT empno FROM emp WHERE sal > 1", "SELECT empno FROM emp WHERE sal >= 1", cycle)
    assert res.verdict == "not_equivalent" and res.verified, res.summary()
    res = find("SELECT deptno FROM dept WHERE mgr IS NULL", "SELECT deptno FROM dept", cycle)
    assert res.verdict == "not_equivalent" and res.verified
    con = duckdb.connect()
    con.execute(res.counterexample)  # the script creates parents first and loads
    self_ref = "CREATE TABLE emp (empno INT PRIMARY KEY, mgr INT REFERENCES emp(empno), sal INT)"
    res = find("SELECT empno FROM emp WHERE mgr IS NULL", "SELECT empno FROM emp", self_ref)
    assert res.verdict == "not_equivalent"
    res = find("SELECT e.empno FROM emp e JOIN emp m ON e.mgr = m.empno",
               "SELECT empno FROM emp WHERE mgr IS NOT NULL", self_ref, budget=SMALL)
    assert res.verdict == "no_counterexample_within_budget", res.summary()
    res = find("SELECT empno FROM emp", "SELECT empno FROM emp WHERE 1 = 0",
               "CREATE TABLE emp (empno INT PRIMARY KEY, mgr INT NOT NULL REFERENCES emp(empno))")
    assert res.verdict == "not_equivalent"
    mgr = res.instance["emp"]
    assert all(r[1] in {x[0] for x in mgr} for r in mgr)  # every mgr exists (here: itself)


def test_foreign_key_cycles_verify_on_sqlite_and_postgres(pg_server_url):
    cycle = ("CREATE TABLE dept (deptno INT PRIMARY KEY, mgr INT REFERENCES emp(empno)); "
             "CREATE TABLE emp (empno INT PRIMARY KEY, deptno INT REFERENCES dept(deptno), sal INT);")
    for dialect in ("sqlite", "postgres"):
        res = find("SELECT deptno FROM dept WHERE mgr IS NOT NULL", "SELECT deptno FROM dept", cycle, dialect)
        assert res.verdict == "not_equivalent" and res.verified, (dialect, res.summary())


@pytest.mark.parametrize("sql1,sql2,ddl", [
    ("SELECT id FROM t WHERE ts > '2000-01-01'", "SELECT id FROM t WHERE ts >= '2000-01-02'", T),
    ("SELECT id FROM t WHERE ABS(a) = a", "SELECT id FROM t WHERE a IS NOT NULL", T),
    ("SELECT grp FROM emp GROUP BY grp HAVING COUNT(*) BETWEEN 20 AND 30",
     "SELECT grp FROM emp GROUP BY grp HAVING COUNT(*) BETWEEN 21 AND 30", EMP),
    ("SELECT grp FROM emp GROUP BY grp HAVING COUNT(*) IN (20, 40)",
     "SELECT grp FROM emp GROUP BY grp HAVING COUNT(*) IN (40)", EMP),
    ("SELECT id FROM t WHERE length(s) > 5", "SELECT id FROM t WHERE length(s) > 6", T),
    ("SELECT id FROM t WHERE trim(s) = 'a'", "SELECT id FROM t WHERE s = 'a'", T),
])
@pytest.mark.slow
def test_boundaries_that_were_missed(sql1, sql2, ddl):
    res = find(sql1, sql2, ddl)
    assert res.verdict == "not_equivalent" and res.verified, res.summary()


def test_schema_qualified_tables():
    ddl = "CREATE TABLE hr.emp (id INT PRIMARY KEY, sal INT)"
    res = find("SELECT id FROM hr.emp", "SELECT id FROM hr.emp WHERE sal > 0", ddl)
    assert res.verdict == "not_equivalent" and "CREATE TABLE hr.emp" in res.counterexample
    con = duckdb.connect()
    con.execute(res.counterexample)
    assert con.execute("SELECT count(*) FROM hr.emp").fetchone()[0] == res.rows
    res = find("SELECT id FROM sales.emp", "SELECT id FROM hr.emp", ddl)
    assert res.verdict == "error" and "it has hr.emp" in res.error


def test_deep_nesting_is_an_error_not_a_traceback():
    q = "SELECT id FROM t"
    for i in range(200):
        q = f"SELECT id FROM ({q}) AS s{i}"
    res = find(q, "SELECT id FROM t")
    assert res.verdict == "error" and "nested too deeply" in res.error


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "querylab.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ}, check=False)


@pytest.mark.slow
def test_cli_long_schema_bad_json_and_statements_are_one_line_errors():
    long_ddl = "CREATE TABLE t (id INTEGER PRIMARY KEY, " + ", ".join(f"c{i} INT" for i in range(60)) + ")"
    out = _cli("equivalence", "find", "--schema", long_ddl, "--sql1", "SELECT id FROM t",
               "--sql2", "SELECT id FROM t WHERE c1 > 0", "--max-instances", "50")
    assert out.returncode == 0 and "Traceback" not in out.stderr and "verdict: not_equivalent" in out.stdout
    out = _cli("equivalence", "find", "--schema", '{"t": {"columns": ', "--sql1", "SELECT 1", "--sql2", "SELECT 2")
    assert out.returncode == 2 and "--schema: not valid JSON" in out.stderr and "Traceback" not in out.stderr
    out = _cli("equivalence", "find", "--schema", T, "--sql1", "DELETE FROM t", "--sql2", "SELECT id FROM t")
    assert "is a DELETE statement, not a query" in out.stdout


@pytest.mark.slow
def test_find_does_not_import_prefect():
    code = ("import sys\nfrom querylab.cli import main\n"
            "for argv in (['equivalence', 'find', '--help'], ['equivalence', 'find', '--schema', "
            "'CREATE TABLE t (a INT)', '--sql1', 'SELECT a FROM t', '--sql2', 'SELECT a FROM t', "
            "'--max-instances', '5']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('PREFECT' if 'prefect' in sys.modules else 'NO PREFECT')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         check=False)
    assert out.stdout.strip().endswith("NO PREFECT"), out.stdout + out.stderr


def test_readings_name_the_dialect_and_the_engine(capsys):
    from querylab.cli import main

    main(["equivalence", "find", "--dialect", "calcite", "--schema",
          "CREATE TABLE `emp` (`empno` int primary key not null, `deptno` int not null)",
          "--sql1", "SELECT empno FROM emp", "--sql2", "SELECT empno FROM emp WHERE deptno=deptno",
          "--max-instances", "20"])
    out = capsys.readouterr().out
    assert "read as mysql, not calcite" in out
    assert "calcite semantics approximated by DuckDB" in out and " semantics approximated" not in out.replace(
        "calcite semantics", "")
    main(["equivalence", "find", "--dialect", "sqlite", "--schema", "CREATE TABLE t (a INT)",
          "--sql1", "SELECT a FROM t", "--sql2", "SELECT a FROM t", "--max-instances", "20"])
    assert "engine: sqlite" in capsys.readouterr().out


# -- newcomer: reports name what went wrong ---------------------------------------------------------


def _row(pair_id, method, verdict, label=None, error=None, notion="semantic", **kw):
    base = {"pair_id": pair_id, "method": method, "technique": None, "notion": notion, "model": None,
            "verdict": verdict, "label": label, "label_semantic": label, "label_relaxed": label,
            "correct": None, "hardness": None, "counterexample": None, "counterexample_rows": None,
            "verified": None, "verify_error": None, "explanation": None, "response": None,
            "details": None, "instances_tried": None, "prompt_tokens": 0, "completion_tokens": 0,
            "cost_usd": 0.0, "seconds": 1.0, "error": error, "run_id": "r"}
    base.update(kw)
    return base


def test_tables_name_errors_skips_and_count_exec_match_databases(tmp_path):
    from schemas import equivalence as eqs
    from tasks.core import storage
    from tasks.equivalence.methods import SKIPPED_NO_DB
    from tasks.equivalence.stage import stage_prefix
    from tasks.equivalence.tables import (
        counterexample_table,
        equivalence_tables,
        label_agreement_table,
    )

    rows = [
        _row("p1", "finder", "error", label=True, error="schema: table t: the clause X is not understood\nmore"),
        _row("p1", "exec_match", "skipped", label=True, error=SKIPPED_NO_DB),
        _row("p2", "finder", "not_equivalent", label=False, counterexample="INSERT ...", verified=True),
        _row("p2", "exec_match", "not_equivalent", label=False, verified=True),
        _row("p3", "finder", "nondeterministic", label=True),
    ]
    for r in rows:  # plain labels only: the relaxed label of p2 is unknown, of p1/p3 equivalent
        r["label_relaxed"] = True if r["label"] else None
    df = pl.DataFrame(rows, schema=pl.from_arrow(eqs.EQUIVALENCE.empty_table()).schema)
    ce = counterexample_table(df).filter(pl.col("method") == "exec_match").row(0, named=True)
    assert ce["with_counterexample"] == 1 and ce["verified"] == 1
    agree = label_agreement_table(df)
    assert set(agree["label_notion"]) == {"semantic"}  # no relaxed row made of plain labels
    root = str(tmp_path)
    storage.write_parquet(storage.join(stage_prefix(root, "r"), "equivalence.parquet"), df.to_arrow(),
                          eqs.EQUIVALENCE)
    text = equivalence_tables.fn("r", root)["text"]
    assert "`p1` × finder: schema: table t: the clause X is not understood more" in text
    assert "exec_match: 1 pair(s) — the pair has no database (db)" in text
    assert "0 false counterexample(s) on 2 pair(s) labelled equivalent" in text


def test_execution_match_shows_the_differing_rows(tmp_path):
    import sqlite3

    from tasks.equivalence.methods import execution_match

    db = tmp_path / "hr.sqlite"
    con = sqlite3.connect(db)
    con.executescript("CREATE TABLE emp (id INT, sal INT); INSERT INTO emp VALUES (1, 10), (2, 20);")
    con.commit()
    con.close()
    pair = QueryPair.model_validate({"id": "x", "sql1": "SELECT id FROM emp WHERE sal > 10",
                                     "sql2": "SELECT id FROM emp WHERE sal < 20", "db": str(db),
                                     "dialect": "sqlite"})
    out = execution_match(pair, MatchOptions())
    assert out["verdict"] == "not_equivalent"
    assert "only sql1 returns [(2,)]" in out["explanation"] and "only sql2 returns [(1,)]" in out["explanation"]
    details = out["details"]
    assert details["only_in_sql1"] == "[(2,)]"


def test_corpus_file_is_valid_and_covers_the_qa_classes():
    from collections import Counter

    lines = [json.loads(x) for x in (ROOT / "data" / "equivalence" / "finder_corpus_qa.jsonl").read_text().splitlines()
             if x.strip()]
    assert len(lines) >= 60
    classes = Counter(c["class"] for c in lines)
    assert {"ties_order_by", "arbitrary_choice", "volatile", "float_tolerance", "dialect_semantics",
            "schema_reader", "bounded_time", "fk_shapes", "misses"} <= set(classes)
    for c in lines:
        QueryPair.model_validate(c["pair"])
        FinderBudget(**c.get("budget", {}))
    assert Counter(c["expect"] for c in lines)["nondeterministic"] >= 8


def test_render_instance_emits_enum_types_for_postgres():
    schema = RelSchema.from_ddl("CREATE TYPE mood AS ENUM ('sad', 'ok'); CREATE TABLE t (id int PRIMARY KEY, m mood)",
                                "postgres")
    script = render_instance(schema, {"t": [(1, "ok")]}, "postgres")
    assert script.startswith("CREATE TYPE mood AS ENUM ('sad', 'ok');")


def test_execution_match_does_not_call_a_tie_a_counterexample(tmp_path):
    import sqlite3

    from tasks.equivalence.methods import execution_match

    db = tmp_path / "ties.sqlite"
    con = sqlite3.connect(db)
    con.executescript("CREATE TABLE t (id INT PRIMARY KEY, a INT, b INT); "
                      "INSERT INTO t VALUES (1, 1, 2), (2, 1, 0), (3, 1, 1);")
    con.commit()
    con.close()

    def match(sql1, sql2):
        pair = QueryPair.model_validate({"id": "x", "sql1": sql1, "sql2": sql2, "db": str(db),
                                         "dialect": "sqlite"})
        return execution_match(pair, MatchOptions())

    out = match("SELECT a, b FROM t ORDER BY a", "SELECT a, b FROM t ORDER BY a, b")
    assert out["verdict"] == "nondeterministic" and "tied" in out["explanation"]
    out = match("SELECT id FROM t ORDER BY a LIMIT 1", "SELECT id FROM t ORDER BY a, id DESC LIMIT 1")
    assert out["verdict"] == "nondeterministic"
    out = match("SELECT id FROM t ORDER BY b", "SELECT id FROM t ORDER BY b DESC")
    assert out["verdict"] == "not_equivalent" and out["verified"]


@pytest.mark.slow
def test_mysql_prefix_keys_bind_the_prefix():
    schema = RelSchema.from_ddl("CREATE TABLE `t` (`id` int PRIMARY KEY, `ename` varchar(20), "
                                "UNIQUE KEY uk (`ename`(3)))")
    assert schema.table("t").unique == [("ename",)] and schema.table("t").key_prefixes == {("ename",): {"ename": 3}}
    res = find_counterexample("SELECT SUBSTRING(ename, 1, 3) FROM t WHERE ename IS NOT NULL",
                              "SELECT DISTINCT SUBSTRING(ename, 1, 3) FROM t WHERE ename IS NOT NULL",
                              schema, dialect="mysql", budget=SMALL)
    assert res.verdict == "no_counterexample_within_budget", res.summary()


def test_a_column_determined_by_a_grouped_key_is_not_bare():
    ddl = ("CREATE TABLE hs (id INT PRIMARY KEY, name TEXT, grade INT); "
           "CREATE TABLE likes (student_id INT, liked_id INT)")
    res = find("SELECT T2.name FROM likes AS T1 JOIN hs AS T2 ON T1.student_id = T2.id GROUP BY T1.student_id",
               "SELECT T2.name FROM likes AS T1 JOIN hs AS T2 ON T1.student_id = T2.id GROUP BY T1.student_id "
               "HAVING COUNT(*) > 1", ddl, "sqlite")
    assert res.verdict == "not_equivalent", res.summary()  # T2.name is determined by T2.id = student_id
    res = find("SELECT T2.name FROM likes AS T1 JOIN hs AS T2 ON T1.student_id = T2.id GROUP BY T1.liked_id",
               "SELECT MIN(T2.name) FROM likes AS T1 JOIN hs AS T2 ON T1.student_id = T2.id GROUP BY T1.liked_id",
               ddl, "sqlite")
    assert res.verdict == "nondeterministic" and any("bare column" in c for c in res.choices)


def test_a_subquery_limit_is_a_choice_only_where_its_ties_reach_the_cut():
    ddl = ("CREATE TABLE stadium (stadium_id INT PRIMARY KEY, capacity INT); "
           "CREATE TABLE concert (id INT PRIMARY KEY, stadium_id INT)")
    top = "(SELECT stadium_id FROM stadium ORDER BY capacity DESC LIMIT 1)"
    res = find(f"SELECT COUNT(*) FROM concert WHERE stadium_id = {top}",
               f"SELECT COUNT(*) FROM concert WHERE stadium_id <> {top}", ddl, "sqlite")
    assert res.verdict == "not_equivalent" and res.verified  # one stadium: no tie to choose from
    res = find(f"SELECT COUNT(*) FROM concert WHERE stadium_id = {top}",
               "SELECT COUNT(*) FROM concert WHERE stadium_id = (SELECT stadium_id FROM stadium "
               "ORDER BY capacity DESC, stadium_id LIMIT 1)", ddl, "sqlite")
    assert res.verdict == "nondeterministic", res.summary()
