"""Tests of tasks/db/databases.py: the read-only query interface over SQLite, DuckDB, PostgreSQL
(embedded server, or QUERYLAB_POSTGRES_URL) and MongoDB (mongomock)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import threading
import uuid

import pyarrow as pa
import pytest

from tasks.db.databases import (
    ColumnInfo,
    DuckDBDatabase,
    MongoDatabase,
    PostgresDatabase,
    QueryError,
    QueryResult,
    SQLiteDatabase,
    check_read_only_mongo,
    check_read_only_sql,
    load_duckdb,
    load_mongo,
    load_postgres,
    load_sqlite,
    mongo_client,
    parse_mongo_query,
    postgres_database_dsn,
)

N = 25
# PostgreSQL runs on a real server: its cases are integration tests. The conftest marks a test
# by the fixtures it names, which it cannot see through ``request.getfixturevalue``, so the
# postgres parameters carry the marker themselves.
ENGINES = ["sqlite", "duckdb", pytest.param("postgres", marks=pytest.mark.integration), "mongodb"]


def _table(with_list: bool = True) -> pa.Table:
    ids = list(range(1, N + 1))
    cols = {
        "id": pa.array(ids, pa.int64()),
        "x": pa.array([i * 1.5 if i % 7 else None for i in ids], pa.float64()),
        "s": pa.array([f"name{i}" for i in ids], pa.string()),
        "d": pa.array([dt.date(2020, 1, 1) + dt.timedelta(days=i) for i in ids], pa.date32()),
        "b": pa.array([i % 2 == 0 for i in ids], pa.bool_()),
    }
    if with_list:
        cols["tags"] = pa.array([[f"t{i % 3}", "x"] if i % 5 else [] for i in ids], pa.list_(pa.string()))
    return pa.table(cols)


# ---- one database per engine, shared by the module -------------------------------------------


@pytest.fixture(scope="module")
def sqlite_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("sqlite") / "ds.sqlite"
    load_sqlite(path, {"t": _table(with_list=False)})
    return SQLiteDatabase("ds", path)


@pytest.fixture(scope="module")
def duckdb_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("duckdb") / "ds.duckdb"
    load_duckdb(path, {"t": _table()})
    return DuckDBDatabase("ds", path)


@pytest.fixture(scope="module")
def pg_dsn(pg_server_url):
    dsn = postgres_database_dsn(pg_server_url, f"ql_test_{uuid.uuid4().hex[:8]}", create=True)
    load_postgres(dsn, {"t": _table()})
    return dsn


@pytest.fixture(scope="module")
def postgres_db(pg_dsn):
    db = PostgresDatabase("ds", pg_dsn)
    yield db
    db.close()


@pytest.fixture(scope="module")
def mongodb_db():
    client = mongo_client(None)
    mdb = client[f"ql_test_{uuid.uuid4().hex[:8]}"]
    load_mongo(mdb, {"t": _table().to_pylist()})
    return MongoDatabase("ds", mdb)


@pytest.fixture(params=ENGINES)
def db(request):
    return request.getfixturevalue(f"{request.param}_db")


def _select_all(db):
    if db.engine == "mongodb":
        return {"collection": "t", "sort": [["id", 1]]}
    return "SELECT * FROM t ORDER BY id"


def _checksum(db) -> str:
    res = db.query(_select_all(db))
    return hashlib.sha256(json.dumps(res.rows, sort_keys=True).encode()).hexdigest()


@pytest.fixture(scope="module")
def baseline():
    """Checksum of each engine's table before any hostile statement ran (filled lazily)."""
    return {}


def _assert_unchanged(db, baseline):
    (info,) = [t for t in db.list_tables() if t.name == "t"]
    assert info.row_count == N
    assert _checksum(db) == baseline[db.engine]


# ---- reading ----------------------------------------------------------------------------------

EXPECTED_TYPES = {
    "sqlite": {"id": "INTEGER", "x": "REAL", "s": "TEXT", "d": "DATE", "b": "BOOLEAN"},
    "duckdb": {"id": "BIGINT", "x": "DOUBLE", "s": "VARCHAR", "d": "DATE", "b": "BOOLEAN",
               "tags": "VARCHAR[]"},
    "postgres": {"id": "bigint", "x": "double precision", "s": "text", "d": "date", "b": "boolean",
                 "tags": "text[]"},
    "mongodb": {"id": "int", "x": "float|NoneType", "s": "str", "d": "datetime", "b": "bool",
                "tags": "list"},
}


def test_list_tables(db, baseline):
    baseline.setdefault(db.engine, _checksum(db))
    tables = db.list_tables()
    assert [t.name for t in tables] == ["t"]
    (t,) = tables
    assert t.row_count == N
    assert {c.name: c.type for c in t.columns} == EXPECTED_TYPES[db.engine]
    assert all(isinstance(c, ColumnInfo) for c in t.columns)


def test_select_json_safe(db):
    if db.engine == "mongodb":
        res = db.query('{"collection": "t", "find": {"id": {"$lte": 5}}, "sort": [["id", 1]]}')
    else:
        res = db.query("SELECT * FROM t WHERE id <= 5 ORDER BY id")
    assert not res.truncated and len(res.rows) == 5
    assert res.columns[:5] == ["id", "x", "s", "d", "b"]
    json.dumps(res.rows, allow_nan=False)  # JSON-safe
    r2 = res.rows[1]
    assert r2["id"] == 2 and r2["x"] == 3.0 and r2["s"] == "name2"
    assert r2["d"].startswith("2020-01-03")  # ISO string (Mongo: a datetime at midnight)
    assert r2["b"] in (True, 1)  # SQLite has no boolean type: 0/1
    assert "_id" not in r2
    if db.engine != "sqlite":
        assert r2["tags"] == ["t2", "x"] and res.rows[4]["tags"] == []


def test_max_rows_truncation(db):
    res = db.query(_select_all(db), max_rows=10)
    assert len(res.rows) == 10 and res.truncated
    assert [r["id"] for r in res.rows] == list(range(1, 11))
    assert res.preview(3).splitlines()[-1] == "(10 rows, truncated)"
    full = db.query(_select_all(db), max_rows=N)
    assert len(full.rows) == N and not full.truncated


def test_unknown_table(db):
    q = {"collection": "nope"} if db.engine == "mongodb" else "SELECT * FROM nope"
    with pytest.raises(QueryError, match="nope"):
        db.query(q)


def test_engine_errors_are_query_errors(db):
    q = '{"collection": "t", "aggregate": [{"$bogus": 1}]}' if db.engine == "mongodb" else "SELECT FROM WHERE"
    with pytest.raises(QueryError):
        db.query(q)


# ---- hostile statements -------------------------------------------------------------------------

COMMON_HOSTILE = [
    ("INSERT INTO t (id) VALUES (999)", "INSERT"),
    ("UPDATE t SET x = 0", "UPDATE"),
    ("DELETE FROM t", "DELETE"),
    ("DROP TABLE t", "DROP"),
    ("CREATE TABLE u (a INTEGER)", "CREATE"),
    ("SELECT 1; DROP TABLE t", "2 statements"),
    ("WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x", "DELETE"),
    ("SELECT * INTO t2 FROM t", "INTO"),
]
HOSTILE = (
    [("sqlite", q, m) for q, m in COMMON_HOSTILE]
    + [("duckdb", q, m) for q, m in COMMON_HOSTILE]
    + [("postgres", q, m) for q, m in COMMON_HOSTILE]
    + [
        ("sqlite", "ATTACH 'x.db' AS y", "ATTACH"),
        ("duckdb", "ATTACH 'x.db' AS y", "ATTACH"),
        ("sqlite", "PRAGMA journal_mode=WAL", "PRAGMA"),
        ("sqlite", "PRAGMA user_version=3", "PRAGMA"),
        ("duckdb", "COPY t TO '{tmp}/x.csv'", "COPY"),
        ("postgres", "COPY t TO '{tmp}/x.csv'", "COPY"),
        ("postgres", "SELECT set_config('default_transaction_read_only', 'off', false)", "set_config"),
        ("duckdb", "INSTALL httpfs", "INSTALL"),
        ("mongodb", {"collection": "t", "aggregate": [{"$out": "t2"}]}, "$out"),
        ("mongodb", {"collection": "t", "aggregate": [{"$match": {}}, {"$merge": {"into": "t"}}]}, "$merge"),
        ("mongodb", '{"collection": "t", "find": {"$where": "this.id > 1"}}', "$where"),
        ("mongodb", {"collection": "t", "find": {"$expr": {"$function": {
            "body": "function() { return true }", "args": [], "lang": "js"}}}}, "$function"),
        ("mongodb", {"collection": "t", "aggregate": [{"$group": {"_id": None, "a": {"$accumulator": {}}}}]},
         "$accumulator"),
    ]
)


HOSTILE_CASES = [
    pytest.param(e, q, m, id=f"{e}-{str(q)[:40]}",
                 marks=[pytest.mark.integration] if e == "postgres" else [])
    for e, q, m in HOSTILE
]


@pytest.mark.parametrize(("engine", "statement", "message"), HOSTILE_CASES)
def test_hostile_refused(request, baseline, tmp_path, engine, statement, message):
    db = request.getfixturevalue(f"{engine}_db")
    baseline.setdefault(engine, _checksum(db))
    if isinstance(statement, str):
        statement = statement.replace("{tmp}", str(tmp_path))
    with pytest.raises(QueryError) as err:
        db.query(statement)
    text = str(err.value)
    assert message in text
    assert len(text) < 400 and ("Refused" in text or "read-only" in text)
    assert not (tmp_path / "x.csv").exists()
    _assert_unchanged(db, baseline)


def test_data_unchanged_after_all(db, baseline):
    baseline.setdefault(db.engine, _checksum(db))
    _assert_unchanged(db, baseline)


# ---- engine-side enforcement (parser check bypassed) ------------------------------------------------


def test_engine_side_sqlite(sqlite_db, baseline, tmp_path):
    baseline.setdefault("sqlite", _checksum(sqlite_db))
    for sql in ["INSERT INTO t (id) VALUES (999)", "DELETE FROM t", "PRAGMA user_version=3",
                f"ATTACH '{tmp_path}/new.db' AS y", f"VACUUM INTO '{tmp_path}/v.db'"]:
        with pytest.raises(QueryError):
            sqlite_db._execute(sql, 10)
    assert list(tmp_path.iterdir()) == []
    _assert_unchanged(sqlite_db, baseline)


def test_engine_side_duckdb(duckdb_db, baseline, tmp_path):
    baseline.setdefault("duckdb", _checksum(duckdb_db))
    with pytest.raises(QueryError, match="read-only"):
        duckdb_db._execute("INSERT INTO t (id) VALUES (999)", 10)
    with pytest.raises(QueryError, match="read-only"):
        duckdb_db._execute("DROP TABLE t", 10)
    with pytest.raises(QueryError):
        duckdb_db._execute(f"COPY t TO '{tmp_path}/x.csv'", 10)
    with pytest.raises(QueryError):
        duckdb_db._execute("SELECT * FROM read_csv('/etc/passwd')", 10)
    assert list(tmp_path.iterdir()) == []
    _assert_unchanged(duckdb_db, baseline)


def test_engine_side_postgres(postgres_db, baseline):
    baseline.setdefault("postgres", _checksum(postgres_db))
    for sql in ["INSERT INTO t (id) VALUES (999)", "DELETE FROM t", "DROP TABLE t",
                "CREATE TABLE u (a int)", "WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x"]:
        with pytest.raises(QueryError, match="read-only transaction"):
            postgres_db._execute(sql, 10)
    # turning read-only off for the session does not help: every transaction is BEGIN READ ONLY
    with pytest.raises(QueryError):
        postgres_db._execute("SET default_transaction_read_only = off; INSERT INTO t (id) VALUES (999)", 10)
    _assert_unchanged(postgres_db, baseline)


def test_postgres_tables_are_analysed_as_they_are_loaded(pg_server_url):
    """The planner has the loaded tables' statistics at once (both COPY paths), so a GROUP BY
    without ORDER BY returns its rows in the same order whether a query runs before or after
    autovacuum analyses the table (found comparing two runs' transcripts)."""
    import psycopg

    dsn = postgres_database_dsn(pg_server_url, f"ql_test_{uuid.uuid4().hex[:8]}", create=True)
    load_postgres(dsn, {"plain": _table(with_list=False), "listy": _table()})
    with psycopg.connect(dsn) as conn:
        rows = dict(conn.execute(
            "SELECT relname, reltuples FROM pg_class WHERE relname IN ('plain', 'listy')"
        ).fetchall())
    assert rows == {"plain": N, "listy": N}  # -1 (never analysed) without it


def test_postgres_timeout(pg_dsn):
    db = PostgresDatabase("ds", pg_dsn, statement_timeout_ms=200)
    try:
        with pytest.raises(QueryError, match="timed out after 200 ms"):
            db.query("SELECT pg_sleep(3)")
        assert db.query("SELECT count(*) AS n FROM t").rows == [{"n": N}]  # connection still usable
    finally:
        db.close()


def test_postgres_error_points_into_agent_sql(postgres_db):
    with pytest.raises(QueryError) as err:
        postgres_db.query("SELECT nosuchcol FROM t")
    assert "nosuchcol" in str(err.value) and "DECLARE" not in str(err.value)


def test_sqlite_and_duckdb_timeouts(tmp_path):
    path = tmp_path / "a.sqlite"
    load_sqlite(path, {"t": _table(with_list=False)})
    slow = ("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c) "
            "SELECT count(*) FROM c")
    with pytest.raises(QueryError, match="timed out"):
        SQLiteDatabase("a", path, timeout_ms=200).query(slow)
    dpath = tmp_path / "a.duckdb"
    load_duckdb(dpath, {"t": _table()})
    with pytest.raises(QueryError, match="timed out"):
        DuckDBDatabase("a", dpath, timeout_ms=200).query(
            "SELECT sum(hash(i)) FROM range(1000000000000) r(i)")


def test_threads_share_one_instance(duckdb_db, postgres_db, sqlite_db):
    errors: list[BaseException] = []

    def work(db):
        try:
            for _ in range(5):
                assert db.query("SELECT count(*) AS n FROM t").rows == [{"n": N}]
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(db,))
               for db in (duckdb_db, postgres_db, sqlite_db) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], [str(e) for e in errors]


# ---- the parser check alone -------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["postgres", "sqlite", "duckdb"])
@pytest.mark.parametrize("sql", [
    "SELECT 1",
    "select * from t where s like 'a%';",
    "WITH a AS (SELECT id FROM t) SELECT * FROM a",
    "SELECT id FROM t UNION ALL SELECT id FROM t",
    "SELECT id FROM t INTERSECT SELECT id FROM t",
    "SELECT id FROM t EXCEPT SELECT id FROM t",
    "(SELECT 1)",
])
def test_check_accepts_queries(sql, dialect):
    check_read_only_sql(sql, dialect)


def test_remembered_verdicts_are_the_parsers_own():
    """A text checked again gets the same verdict (a refusal raised again, same message), per
    dialect; texts past the cache's limit are parsed every time and judged the same way."""
    from tasks.db import guard

    for _ in range(3):
        with pytest.raises(QueryError, match="DELETE is not allowed") as first:
            check_read_only_sql("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", "postgres")
        check_read_only_sql("SELECT 1", "postgres")
    with pytest.raises(QueryError) as again:
        check_read_only_sql("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", "postgres")
    assert str(again.value) == str(first.value)
    with pytest.raises(QueryError, match="pragma|PRAGMA"):
        check_read_only_sql("PRAGMA writable_schema = 1", "sqlite")
    long_ok = "SELECT 1 AS a" + ", 1" * guard.VERDICT_CACHE_MAX_BYTES
    long_bad = long_ok + "; DROP TABLE t"
    assert len(long_ok) > guard.VERDICT_CACHE_MAX_BYTES
    check_read_only_sql(long_ok, "duckdb")
    with pytest.raises(QueryError, match="2 statements"):
        check_read_only_sql(long_bad, "duckdb")
    hits = guard._cached_verdict.cache_info().hits
    check_read_only_sql("SELECT 1", "postgres")
    assert guard._cached_verdict.cache_info().hits == hits + 1
    # 1,000 four-byte characters are 4,000 bytes: remembered; 1,100 (4,400 bytes) are not
    misses = guard._cached_verdict.cache_info().misses
    check_read_only_sql("SELECT '" + "\U0001F600" * 1000 + "'", "sqlite")
    check_read_only_sql("SELECT '" + "\U0001F600" * 1100 + "'", "sqlite")
    assert guard._cached_verdict.cache_info().misses == misses + 1
    with pytest.raises(QueryError, match="at most 100,000"):
        check_read_only_sql("SELECT 1" + " " * guard.MAX_SQL_CHARS, "duckdb")


@pytest.mark.parametrize("fn", ["pg_try_advisory_lock(1)", "pg_advisory_lock_shared(1)",
                                "pg_try_advisory_xact_lock_shared(1, 2)",
                                "pg_catalog.pg_try_advisory_lock(7)", "PG_ADVISORY_UNLOCK_ALL()"])
def test_advisory_locks_are_refused(fn):
    """A PostgreSQL advisory lock outlives the rolled-back query on a connection later trials
    reuse (and other connections see it): every advisory-lock function is refused."""
    with pytest.raises(QueryError, match="advisory"):
        check_read_only_sql(f"SELECT {fn}", "postgres")


def test_check_refusals():
    with pytest.raises(QueryError, match="parse"):
        check_read_only_sql("SELECT FROM WHERE", "postgres")
    with pytest.raises(QueryError, match="empty"):
        check_read_only_sql("  ", "sqlite")
    with pytest.raises(QueryError, match="statements"):
        check_read_only_sql("SELECT 1; SELECT 2", "duckdb")
    for sql in ["BEGIN", "SET x = 1", "DESCRIBE t", "EXPLAIN SELECT 1", "VACUUM", "LOAD httpfs"]:
        with pytest.raises(QueryError, match="Refused"):
            check_read_only_sql(sql, "duckdb")
    with pytest.raises(ValueError):
        check_read_only_sql("SELECT 1", "mysql")


# ---- Mongo specifics ------------------------------------------------------------------------------


def test_mongo_find_projection_sort_limit(mongodb_db):
    res = mongodb_db.query({"collection": "t", "find": {"b": True}, "projection": {"id": 1, "s": 1},
                            "sort": {"id": -1}, "limit": 3})
    assert res.columns == ["id", "s"] and [r["id"] for r in res.rows] == [24, 22, 20]
    assert not res.truncated


def test_mongo_aggregate_keeps_group_id(mongodb_db):
    res = mongodb_db.query({"collection": "t", "aggregate": [
        {"$group": {"_id": "$b", "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}]})
    assert res.rows == [{"_id": False, "n": 13}, {"_id": True, "n": 12}]
    res = mongodb_db.query({"collection": "t", "aggregate": [{"$match": {}}]}, max_rows=4)
    assert len(res.rows) == 4 and res.truncated and "_id" not in res.columns


def test_mongo_extended_json_dates(mongodb_db):
    res = mongodb_db.query('{"collection": "t", "find": {"d": {"$lt": {"$date": "2020-01-04T00:00:00Z"}}}}')
    assert [r["id"] for r in res.rows] == [1, 2]


@pytest.mark.parametrize("bad", [
    "not json", "[1, 2]", {"find": {}}, {"collection": "t", "update": {}},
    {"collection": "t", "aggregate": {"$match": {}}}, {"collection": "t", "sort": [["id", 2]]},
    {"collection": "t", "limit": -1},
])
def test_mongo_bad_shapes(bad):
    with pytest.raises(QueryError, match="Accepted shapes"):
        parse_mongo_query(bad)


def test_mongo_checks_recursive():
    check_read_only_mongo({"collection": "t", "aggregate": [{"$match": {"s": "$out"}}]})  # a value
    with pytest.raises(QueryError, match=r"\$where"):
        check_read_only_mongo({"collection": "t", "find": {"$or": [{"a": 1}, {"$where": "1"}]}})


def test_mongo_client_singleton():
    assert mongo_client(None) is mongo_client(None)


# ---- loaders, DSNs, results ----------------------------------------------------------------------


@pytest.mark.slow
def test_loaders_replace_files(tmp_path):
    spath, dpath = tmp_path / "r.sqlite", tmp_path / "r.duckdb"
    load_sqlite(spath, {"t": _table(with_list=False)})
    load_duckdb(dpath, {"t": _table()})
    sdb, ddb = SQLiteDatabase("r", spath), DuckDBDatabase("r", dpath)
    assert ddb.query("SELECT count(*) AS n FROM t").rows == [{"n": N}]
    small = {"t": _table().slice(0, 3), "u": pa.table({"a": [1]})}
    load_sqlite(spath, {k: v.drop_columns(["tags"]) if "tags" in v.column_names else v
                        for k, v in small.items()})
    load_duckdb(dpath, small)
    for db in (sdb, ddb):
        assert db.query("SELECT count(*) AS n FROM t").rows == [{"n": 3}]
        assert [t.name for t in db.list_tables()] == ["t", "u"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.duckdb", "r.sqlite"]


def test_postgres_dsn_forms(pg_server_url, pg_dsn):
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = conninfo_to_dict(pg_dsn)["dbname"]
    as_kv = make_conninfo(**conninfo_to_dict(pg_server_url))
    for server in (pg_server_url, as_kv):
        dsn = postgres_database_dsn(server, name, create=True)  # exists: no error
        assert conninfo_to_dict(dsn)["dbname"] == name
        assert PostgresDatabase("x", dsn).query("SELECT count(*) AS n FROM t").rows == [{"n": N}]


def test_preview_format():
    res = QueryResult(columns=["a", "b"], rows=[{"a": 1, "b": None}, {"a": 22, "b": "x" * 60}],
                      truncated=False)
    lines = res.preview().splitlines()
    assert lines[0].split(" | ")[0].strip() == "a" and "NULL" in lines[2]
    assert len(lines[3]) < 60 and lines[-1] == "(2 rows)"
    assert res.preview(1).splitlines()[-1] == "(2 rows)"


def test_postgres_bulk_copy_equals_the_row_by_row_copy(pg_server_url, monkeypatch):
    """The CSV COPY of an Arrow table (no Python per row) loads exactly what psycopg's typed
    row-by-row COPY does: empty strings stay '' and nulls NULL, quotes, commas, newlines,
    backslashes and tabs survive, NaN / inf / -0.0, float32, dates at both ends, timestamps
    with and without a zone, dictionary-encoded and all-null columns."""
    import math

    import psycopg

    import tasks.db.postgres as databases  # where load_postgres and its COPY helpers live

    t = pa.table({
        "i": pa.array([1, None, -3, 2**62], pa.int64()),
        "i16": pa.array([1, 2, None, -5], pa.int16()),
        "f": pa.array([0.1, float("nan"), float("inf"), None], pa.float64()),
        "f32": pa.array([0.1, 1e30, -0.0, None], pa.float32()),
        "s": pa.array(["", None, 'a "q", b\nc\\d', "é 中 \t x"], pa.string()),
        "b": pa.array([True, False, None, True]),
        "d": pa.array([dt.date(2020, 1, 1), None, dt.date(1, 1, 1), dt.date(9999, 12, 31)],
                      pa.date32()),
        "ts": pa.array([dt.datetime(2020, 1, 1, 12, 30, 1, 123456), None, dt.datetime(1970, 1, 1),
                        dt.datetime(2038, 1, 19, 3, 14, 8)], pa.timestamp("us")),
        "tz": pa.array([dt.datetime(2020, 1, 1, 12, tzinfo=dt.UTC), None, None, None],
                       pa.timestamp("us", tz="UTC")),
        "dict": pa.array(["x", "y", None, "x"]).dictionary_encode(),
        "n": pa.nulls(4),
    })
    dsn = postgres_database_dsn(pg_server_url, f"ql_test_{uuid.uuid4().hex[:8]}", create=True)

    def loaded(bulk: bool) -> list[tuple]:
        copied = []
        real = databases._copy_csv
        monkeypatch.setattr(databases, "_copy_csv", lambda c, tbl: (copied.append(1), real(c, tbl)))
        if not bulk:
            monkeypatch.setattr(databases, "_csv_copyable", lambda _t: False)
        load_postgres(dsn, {"t": t})
        monkeypatch.undo()
        assert bool(copied) == bulk  # the path under test did run
        with psycopg.connect(dsn) as conn:
            rows = conn.execute("SELECT * FROM t ORDER BY i NULLS FIRST, i16").fetchall()
        return [tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in r)
                for r in rows]

    bulk = loaded(True)
    assert bulk == loaded(False)
    assert [r[4] for r in bulk] == [None, 'a "q", b\nc\\d', "", "é 中 \t x"]
    # a table with a list column takes the typed path (arrays need psycopg's adaptation)
    assert not databases._csv_copyable(pa.list_(pa.string()))
