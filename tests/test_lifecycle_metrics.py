"""Lifecycle suite: semantic name matching, schema reading/parsing/sandbox, and every metric with
hand-computed values (including partial matches)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from tasks.lifecycle.maintenance import call_key, parse_experts
from tasks.lifecycle.metrics import (
    assigner_scores,
    coefficient_of_variation,
    design_scores,
    graph_execution_accuracy,
    implementation_scores,
    state_difference,
    table_digests,
    tool_call_scores,
)
from tasks.lifecycle.naming import (
    NamingError,
    load_synonyms,
    match_names,
    name_key,
    names_match,
    singularise,
    split_words,
    table_key,
)
from tasks.lifecycle.schema import (
    DDLError,
    Schema,
    SchemaParseError,
    execute_ddl,
    parse_design,
    render_ddl,
    type_class,
)

# concert_singer's stadium and concert tables, as the Spider DDL defines them
REFERENCE = Schema.from_dict(
    {
        "tables": [
            {
                "name": "stadium",
                "columns": [
                    {"name": n, "type": t}
                    for n, t in [
                        ("Stadium_ID", "INT"),
                        ("Location", "TEXT"),
                        ("Name", "TEXT"),
                        ("Capacity", "INT"),
                        ("Highest", "INT"),
                        ("Lowest", "INT"),
                        ("Average", "INT"),
                    ]
                ],
                "primary_key": ["Stadium_ID"],
            },
            {
                "name": "concert",
                "columns": [
                    {"name": n, "type": t}
                    for n, t in [
                        ("concert_ID", "INT"),
                        ("concert_Name", "TEXT"),
                        ("Theme", "TEXT"),
                        ("Stadium_ID", "INT"),
                        ("Year", "TEXT"),
                    ]
                ],
                "primary_key": ["concert_ID"],
                "foreign_keys": [
                    {
                        "columns": ["Stadium_ID"],
                        "references": {"table": "stadium", "columns": ["Stadium_ID"]},
                    }
                ],
            },
        ]
    }
)
# a design with two attributes missing (Highest, Lowest), Capacity typed TEXT and no foreign
# key; names differ from the reference only by case, plural and the table-prefix rule
PARTIAL_DDL = """
CREATE TABLE stadiums (id INTEGER PRIMARY KEY, location TEXT, name VARCHAR(80),
                       capacity TEXT, average INTEGER);
CREATE TABLE Concerts (ConcertId INTEGER PRIMARY KEY, concert_name TEXT, theme TEXT,
                       stadium_id INTEGER, year TEXT);
"""


# -------------------------------------------------------------------------------- naming


def test_words_singular_and_keys():
    assert split_words("Song_release_year") == ["song", "release", "year"]
    assert split_words("TVChannel") == ["tv", "channel"]
    assert split_words("Home Town") == ["home", "town"]
    assert [
        singularise(w)
        for w in (
            "countries",
            "movies",
            "addresses",
            "statuses",
            "courses",
            "people",
            "has",
            "ids",
            "series",
            "boxes",
        )
    ] == ["country", "movie", "address", "status", "course", "person", "has", "id", "series", "box"]
    assert name_key("Song_release_year") == name_key("songReleaseYears") == "songreleaseyear"
    assert name_key("HomeTown") == name_key("home_town")
    # synonyms (one word and several words) and the table prefix rule
    assert name_key("staff_id") == name_key("EmployeeIdentifier") == "employeeid"
    assert name_key("given_name") == name_key("FirstName")
    assert table_key("tbl_Singers") == table_key("singer") == "singer"
    assert name_key("t_singer") != name_key("singer")  # the prefix rule is for tables only
    assert names_match("Singer_ID", "id", "singer", "singers")
    assert names_match("Name", "singer_name", "singer", "singer")
    assert not names_match("Stadium_ID", "id", "concert", "concert")


def test_match_names_is_one_to_one_and_exact_first():
    ref = ["Singer_ID", "Name", "Country", "Age"]
    pred = ["name", "id", "singer_id", "nation"]
    # exact keys first: Singer_ID -> singer_id (not "id"); Name -> name; Country -> nation
    assert match_names(ref, pred, reference_table="singer", predicted_table="singer") == {
        0: 2,
        1: 0,
        2: 3,
    }
    assert match_names(["Employees", "Dept"], ["department", "staff"], kind="table") == {0: 1, 1: 0}
    with pytest.raises(ValueError, match="kind"):
        match_names([], [], kind="index")


def test_synonym_file_errors(tmp_path):
    bad = tmp_path / "syn.yaml"
    bad.write_text("groups:\n  - [car, auto]\n  - [auto, vehicle]\n")
    with pytest.raises(NamingError, match="two synonym groups"):
        load_synonyms(bad)
    with pytest.raises(NamingError, match="not found"):
        load_synonyms(tmp_path / "none.yaml")
    assert load_synonyms()[("qty",)] == ("quantity",)


# -------------------------------------------------------------------------------- schemas


def test_type_classes():
    assert [
        type_class(t)
        for t in (
            "NVARCHAR(120)",
            "NUMERIC(10,2)",
            "DATETIME",
            "date",
            "INTEGER",
            "TINYINT(1)",
            "BOOLEAN",
            "",
            "REAL",
            "TEXT(1)",
            "blob",
            "TIMESTAMP",
            "TIME",
        )
    ] == [
        "text",
        "number",
        "datetime",
        "date",
        "integer",
        "integer",
        "boolean",
        "text",
        "number",
        "text",
        "blob",
        "datetime",
        "time",
    ]


def test_parse_design_json_ddl_and_lenient_forms():
    as_json = parse_design("Here:\n```json\n" + json.dumps(REFERENCE.to_dict()) + "\n```")
    assert as_json.to_dict() == REFERENCE.to_dict()
    lenient = parse_design(
        '{"tables": [{"name": "a", "columns": [{"name": "id", "type": "int", "primary_key": true},'
        ' {"name": "b_id", "type": "int", "references": "b(id)"}]}, '
        '{"name": "b", "columns": ["id"], "primary_key": "id"}]}'
    )
    assert lenient.tables[0].primary_key == ("id",)
    assert lenient.tables[0].foreign_keys[0].ref_table == "b"
    assert lenient.tables[0].foreign_keys[0].ref_columns == ("id",)
    assert lenient.tables[1].primary_key == ("id",)
    ddl = parse_design(f"```sql\n{PARTIAL_DDL}\n```")
    assert [t.name for t in ddl.tables] == ["stadiums", "Concerts"]
    with pytest.raises(SchemaParseError):
        parse_design("I would create two tables.")
    with pytest.raises(SchemaParseError):
        parse_design("")


def test_execute_ddl_reads_back_what_sqlite_created(tmp_path):
    created = execute_ddl(render_ddl(REFERENCE))
    assert created.to_dict() == REFERENCE.to_dict()
    with pytest.raises(DDLError, match="syntax error"):
        execute_ddl("CREATE TABLE t (a INT,)")
    with pytest.raises(DDLError, match="no table"):
        execute_ddl("SELECT 1")
    target = tmp_path / "escape.db"
    with pytest.raises(DDLError, match="not authorized"):
        execute_ddl(f"ATTACH DATABASE '{target}' AS x; CREATE TABLE x.t (a INT);")
    with pytest.raises(DDLError, match="not authorized"):
        execute_ddl(f"CREATE TABLE t (a INT); VACUUM INTO '{target}';")
    assert not target.exists()


def test_model_queries_run_read_only_without_attach(tmp_path):
    from tasks.lifecycle.schema import run_readonly

    db = tmp_path / "d.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (a INT)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.commit()
    conn.close()
    assert run_readonly(db, "SELECT a FROM t") == [(1,)]
    target = tmp_path / "created.db"
    with pytest.raises(sqlite3.Error, match="not authorized|too many attached"):
        run_readonly(db, f"ATTACH DATABASE '{target}' AS x")
    with pytest.raises(sqlite3.Error, match="not authorized"):
        run_readonly(db, "DELETE FROM t")
    assert not target.exists() and run_readonly(db, "SELECT count(*) FROM t") == [(1,)]


# -------------------------------------------------------------------------------- P1 / P2


def test_design_scores_partial_match_hand_computed():
    s = design_scores(REFERENCE, parse_design(PARTIAL_DDL))
    # 12 reference attributes: 5 of stadium's 7 and all 5 of concert's are there
    assert s["matched_attributes"] == 10 and s["acc_entity"] == pytest.approx(10 / 12)
    # Capacity INT designed as TEXT: 9 attributes with the right type class
    assert s["acc_data"] == pytest.approx(9 / 12)
    # keys: PK stadium, PK concert, FK concert.Stadium_ID -> stadium; the FK is missing
    assert (s["n_keys"], s["matched_keys"]) == (3, 2) and s["acc_key"] == pytest.approx(2 / 3)
    assert s["matched_tables"] == {"stadium": "stadiums", "concert": "Concerts"}
    assert design_scores(REFERENCE, REFERENCE)["acc_key"] == 1.0


def test_design_scores_wrong_fk_target_and_unmatched_table():
    pred = parse_design(
        "CREATE TABLE stadium (stadium_id INT PRIMARY KEY, name TEXT);"
        "CREATE TABLE show (concert_id INT PRIMARY KEY);"  # 'show' is not 'concert'
    )
    s = design_scores(REFERENCE, pred)
    assert s["acc_entity"] == pytest.approx(2 / 12) and s["acc_key"] == pytest.approx(1 / 3)
    # a foreign key to the wrong column does not count
    pred = parse_design(
        "CREATE TABLE stadium (stadium_id INT PRIMARY KEY, name TEXT);"
        "CREATE TABLE concert (concert_id INT PRIMARY KEY, stadium_id INT REFERENCES stadium(name));"
    )
    assert design_scores(REFERENCE, pred)["matched_keys"] == 2
    no_keys = Schema.from_dict({"tables": [{"name": "t", "columns": ["a"]}]})
    assert design_scores(no_keys, no_keys)["acc_key"] is None


def test_implementation_scores_partial_hand_computed():
    created = execute_ddl(
        "CREATE TABLE venue (Stadium_ID INT, Location TEXT, Name TEXT, Capacity INT, Highest INT,"
        " Lowest INT, Average INT);"
        "CREATE TABLE concert (concert_ID INTEGER, concert_Name TEXT, Theme TEXT, "
        "Stadium_ID REAL, Year TEXT);"
    )
    s = implementation_scores(REFERENCE, created)
    # 'venue' is no semantic match of 'stadium' (T-Level 1/2); concert: 4 of 5 fields (Stadium_ID
    # declared REAL), stadium's 7 fields count for nothing: F-Level 4/12
    assert s["t_level"] == 0.5 and s["f_level"] == pytest.approx(4 / 12)
    assert implementation_scores(REFERENCE, None) == {
        "t_level": 0.0,
        "f_level": 0.0,
        "n_tables": 2,
        "matched_tables": 0,
        "n_fields": 12,
        "matched_fields": 0,
    }


# -------------------------------------------------------------------------------- P3 .. P5


def test_graph_execution_accuracy():
    # graph 1: 2 of 3 nodes; graph 2: 1 of 1; graph 3: 0 of 2 -> (2/3 + 1 + 0) / 3
    assert graph_execution_accuracy([[True, True, False], [True], [False, False]]) == pytest.approx(
        (2 / 3 + 1 + 0) / 3
    )
    assert graph_execution_accuracy([[], [True]]) == 1.0
    assert graph_execution_accuracy([]) is None


def test_state_digests_compare_contents_not_order():
    a = sqlite3.connect(":memory:")
    b = sqlite3.connect(":memory:")
    for conn, rows in ((a, [(1, "x"), (2, "y")]), (b, [(2, "y"), (1.0, "x")])):
        conn.execute("CREATE TABLE t (id INT, v TEXT)")
        conn.execute("CREATE TABLE u (id INT)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", rows)
    assert state_difference(table_digests(a), table_digests(b)) == []
    b.execute("UPDATE t SET v = 'z' WHERE id = 2")
    b.execute("CREATE TABLE extra (a INT)")
    assert state_difference(table_digests(a), table_digests(b)) == ["extra", "t"]


def test_assigner_and_tool_call_scores_partial():
    assert assigner_scores(["cpu", "query"], ["query", "CPU"]) == {"accuracy": 1.0, "jaccard": 1.0}
    s = assigner_scores(["cpu", "query"], ["cpu", "query", "io"])
    assert s["accuracy"] == 0.0 and s["jaccard"] == pytest.approx(2 / 3)
    assert assigner_scores(["io"], []) == {"accuracy": 0.0, "jaccard": 0.0}
    w = ("2025-03-01T09:10", "2025-03-01T09:27")
    a = call_key("check_metric_abnormal", {"metric": "cpu_usage", "start": w[0], "end": w[1]})
    b = call_key("check_metric_abnormal", {"metric": "load_average", "start": w[0], "end": w[1]})
    # the same call written differently (case, seconds, Z, JSON text) is the same call
    a2 = call_key(
        "check_metric_abnormal",
        json.dumps({"metric": "CPU_usage", "start": "2025-03-01 09:10:00Z", "end": w[1]}),
    )
    assert a == a2
    wrong_window = call_key(
        "check_metric_abnormal",
        {"metric": "load_average", "start": "2025-03-01T09:00", "end": w[1]},
    )
    assert call_key("list_metrics", {}) is None and call_key("get_metric_values", {}) is None
    # expected {a, b}; made {a, wrong window} -> Jaccard 1/3, precision 1/2, recall 1/2
    assert tool_call_scores({a, b}, {a2, wrong_window}) == {
        "correctness": pytest.approx(1 / 3),
        "precision": 0.5,
        "recall": 0.5,
    }
    assert tool_call_scores({a, b}, {a, b}) == {"correctness": 1.0, "precision": 1.0, "recall": 1.0}
    assert tool_call_scores({a}, set()) == {"correctness": 0.0, "precision": 0.0, "recall": 0.0}
    names = ["cpu", "memory", "io", "workload", "query", "write", "index", "configuration"]
    assert parse_experts('```json\n{"experts": ["Query", "cpu", "dba"]}\n```', names) == [
        "cpu",
        "query",
    ]
    assert parse_experts("The io and write experts.", names) == ["io", "write"]


def test_coefficient_of_variation():
    # EX 0.8, 0.6, 0.7, 0.5: mean 0.65, population std sqrt(0.0125)
    assert coefficient_of_variation([0.8, 0.6, 0.7, 0.5]) == pytest.approx(0.0125**0.5 / 0.65)
    assert coefficient_of_variation([0.5, 0.5]) == 0.0
    assert coefficient_of_variation([0.5]) is None and coefficient_of_variation([0.0, 0.0]) is None
