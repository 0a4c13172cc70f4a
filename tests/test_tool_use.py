"""Tool-use table from hand-built trajectories: exploration share, DB:Python ratio, parallel
calls, calls per trial and extraction methods, computed by hand."""

from __future__ import annotations

import json

import polars as pl
import pytest

from schemas.report import ALL
from tasks.report.features import TOOL_USE_FEATURES, call_features, with_call_features
from tasks.report.tool_use import tool_use_table


def call(key: str, i: int, tool: str, turn: int, ok: bool = True, **args) -> dict:
    return {
        "trial_key": key,
        "call_index": i,
        "turn": turn,
        "tool": tool,
        "arguments": json.dumps(args),
        "success": ok,
    }


def features_of(tool: str, **args) -> dict:
    df = call_features(pl.DataFrame([call("t", 0, tool, 0, **args)]))
    return df.row(0, named=True)


@pytest.mark.parametrize(
    "tool, args, explore",
    [
        ("list_db", {}, True),
        ("list_db", {"db": "market"}, True),
        ("query_db", {"db": "m", "query": "SELECT * FROM aapl LIMIT 5"}, True),
        ("query_db", {"db": "m", "query": "select *\nfrom aapl\nlimit 5"}, True),
        ("query_db", {"db": "m", "query": "SELECT * FROM information_schema.columns"}, True),
        ("query_db", {"db": "l", "query": "SELECT name FROM sqlite_master"}, True),
        ("query_db", {"db": "l", "query": "PRAGMA table_info(listings)"}, True),
        ("query_db", {"db": "l", "query": "SELECT * FROM pragma_table_info('x')"}, True),
        ("query_db", {"db": "m", "query": "DESCRIBE aapl"}, True),
        ("query_db", {"db": "m", "query": "SELECT * FROM duckdb_tables()"}, True),
        ("query_db", {"db": "c", "query": '{"collection": "films", "find": {}, "limit": 3}'}, True),
        ("query_db", {"db": "c", "query": '{"collection": "films", "limit": 3}'}, True),
        (
            "query_db",
            {
                "db": "c",
                "query": '{"collection": "films", "aggregate": [{"$sample": {"size": 3}}]}',
            },
            True,
        ),
        ("query_db", {"db": "m", "query": "SELECT * FROM aapl WHERE year(date) = 2005"}, False),
        ("query_db", {"db": "m", "query": "SELECT date FROM aapl LIMIT 5"}, False),
        (
            "query_db",
            {"db": "c", "query": '{"collection": "films", "find": {"year": 1999}}'},
            False,
        ),
        (
            "query_db",
            {"db": "c", "query": '{"collection": "films", "aggregate": [{"$match": {"y": 1}}]}'},
            False,
        ),
        ("execute_python", {"code": "print(1)"}, False),
        ("return_answer", {"answer": "x"}, False),
    ],
)
def test_exploration_rules(tool, args, explore):
    assert features_of(tool, **args)["explore"] is explore


@pytest.mark.parametrize(
    "tool, args, method",
    [
        (
            "query_db",
            {"db": "l", "query": "SELECT * FROM l WHERE profile LIKE '%Tech%'"},
            "sql_pattern",
        ),
        (
            "query_db",
            {"db": "l", "query": "SELECT * FROM l WHERE profile ilike '%tech%'"},
            "sql_pattern",
        ),
        (
            "query_db",
            {"db": "l", "query": "SELECT regexp_extract(awards, 'Won (\\d+)') FROM f"},
            "sql_pattern",
        ),
        ("query_db", {"db": "p", "query": "SELECT * FROM f WHERE awards ~ 'Won'"}, "sql_pattern"),
        (
            "query_db",
            {"db": "c", "query": '{"collection": "f", "find": {"s": {"$regex": "Horror"}}}'},
            "sql_pattern",
        ),
        ("execute_python", {"code": "import re\nm = re.search(r'Won (\\d+)', s)"}, "python_regex"),
        ("execute_python", {"code": "df['s'].str.contains('Horror')"}, "python_regex"),
        (
            "execute_python",
            {"code": "x = [r for r in rows if 'Horror' in r['synopsis']]"},
            "python_string",
        ),
        ("execute_python", {"code": "ok = s.startswith('Won')"}, "python_string"),
        ("execute_python", {"code": "from openai import OpenAI\nc = OpenAI()"}, "model_call"),
        (
            "execute_python",
            {"code": "client.chat.completions.create(model='m', messages=[])"},
            "model_call",
        ),
    ],
)
def test_extraction_methods(tool, args, method):
    row = features_of(tool, **args)
    methods = {m for m in ("sql_pattern", "python_regex", "python_string", "model_call") if row[m]}
    assert methods == {method}


def test_parsed_arguments_and_bad_json():
    rows = call_features(
        pl.DataFrame(
            [
                call("t", 0, "query_db", 0, db="m", query="SELECT 1"),
                {
                    **call("t", 1, "query_db", 0),
                    "arguments": '{"query": "SELECT 2", "db": "x\\"y"}',
                },
                {**call("t", 2, "query_db", 1), "arguments": "{broken"},
                {**call("t", 3, "execute_python", 1), "arguments": ""},
            ]
        )
    ).sort("call_index")
    assert rows["db"].to_list() == ["m", 'x"y', None, None]
    assert rows["query"].to_list() == ["SELECT 1", "SELECT 2", None, None]
    assert not rows["explore"].any()


def test_tool_use_table_by_hand():
    trials = pl.DataFrame(
        {
            "trial_key": ["t1", "t2", "t3", "t4"],
            "agent": ["a", "a", "a", "b"],
            "dataset": ["d", "d", "e", "d"],
        }
    )
    calls = pl.DataFrame(
        [
            # t1: turn 0 = list_db + SELECT * LIMIT in parallel; turn 1 python (regex); 2 answer
            call("t1", 0, "list_db", 0),
            call("t1", 1, "query_db", 0, db="m", query="SELECT * FROM aapl LIMIT 5"),
            call("t1", 2, "execute_python", 1, code="import re\nre.findall('x', s)"),
            call("t1", 3, "return_answer", 2, answer="1"),
            # t2: three parallel queries (one failed), then an answer
            call("t2", 0, "query_db", 0, db="m", query="SELECT a FROM x WHERE y LIKE '%z%'"),
            call("t2", 1, "query_db", 0, db="m", query="SELECT a FROM y"),
            call("t2", 2, "query_db", 0, ok=False, db="m", query="SELECT nope"),
            call("t2", 3, "return_answer", 1, answer="2"),
            # t3: no tool calls at all (still counts as a trial)
            # t4 (agent b): one python call
            call("t4", 0, "execute_python", 0, code="print(1)"),
            call("zz", 0, "list_db", 0),  # a call of a trial not in the run: ignored
        ]
    )
    table = tool_use_table(trials, calls)
    assert tool_use_table(trials, with_call_features(calls)).equals(table)  # stored features
    rows = {(r["agent"], r["dataset"]): r for r in table.iter_rows(named=True)}
    d = rows[("a", "d")]
    assert d["trials"] == 2 and d["tool_calls"] == 8 and d["calls_per_trial"] == 4.0
    assert d["failed_call_share"] == pytest.approx(1 / 8)
    assert d["exploration_share"] == pytest.approx(2 / 6)  # return_answer calls excluded
    assert (d["db_calls"], d["python_calls"], d["db_python_ratio"]) == (5, 1, 5.0)
    assert d["turns"] == 5 and d["parallel_turn_share"] == pytest.approx(2 / 5)
    assert d["max_calls_per_turn"] == 3
    assert d["extract_sql_pattern"] == 0.5 and d["extract_python_regex"] == 0.5
    assert d["extract_model_call"] == 0.0
    e = rows[("a", "e")]
    assert (e["trials"], e["tool_calls"], e["calls_per_trial"]) == (1, 0, 0.0)
    assert e["exploration_share"] is None and e["db_python_ratio"] is None
    assert e["parallel_turn_share"] is None and e["max_calls_per_turn"] is None
    total = rows[("a", ALL)]
    assert total["trials"] == 3 and total["calls_per_trial"] == pytest.approx(8 / 3)
    assert total["extract_sql_pattern"] == pytest.approx(1 / 3)
    b = rows[("b", "d")]
    assert b["db_python_ratio"] == 0.0 and b["parallel_turn_share"] == 0.0
    assert table["dataset"].to_list() == ["d", "e", ALL, "d", ALL]


def test_tool_use_table_without_calls():
    trials = pl.DataFrame({"trial_key": ["t1"], "agent": ["a"], "dataset": ["d"]})
    empty = pl.DataFrame(
        schema={
            "trial_key": pl.String,
            "call_index": pl.Int32,
            "turn": pl.Int32,
            "tool": pl.String,
            "arguments": pl.String,
            "success": pl.Boolean,
        }
    )
    row = tool_use_table(trials, empty).row(0, named=True)
    assert row["trials"] == 1 and row["tool_calls"] == 0 and row["exploration_share"] is None


def test_turn_lanes_equal_per_turn_grouping(monkeypatch):
    """Per-trial turn figures counted in byte lanes equal those of grouping by (trial, turn):
    for turns across several lanes, for a trial with more calls than a lane byte holds
    (counted again exactly) and, with the lanes switched off, for the two-key path itself."""
    from tasks.report import tool_use

    calls = []
    for n in range(40):  # turn t of trial n has (n + t) % 4 calls; turns 0..(n % 20) * 3
        for t in range(0, (n % 20) * 3 + 1, 3):
            calls += [call(f"t{n}", len(calls), "query_db", t, ok=bool(j % 2), db="d",
                           query="SELECT 1") for j in range((n + t) % 4)]
    calls += [call("big", i, "execute_python", int(i >= 280), code="print(1)")
              for i in range(300)]  # 280 calls in turn 0: more than a lane byte counts
    calls += [call("big", 300 + i, "list_db", 2, db="d") for i in range(3)]
    trials = pl.DataFrame({"trial_key": [f"t{n}" for n in range(40)] + ["big"],
                           "agent": "a", "dataset": [f"d{n % 3}" for n in range(41)]})

    def per_trial(frame):
        tid = tool_use.trial_id_expr(trials)
        feats = call_features(frame.with_columns(tid), TOOL_USE_FEATURES,
                              with_db=False)
        return tool_use.trial_tool_stats(feats.lazy()).collect().sort("tid")

    lanes = per_trial(pl.DataFrame(calls))
    big = lanes.filter(pl.col("tool_calls") == 303).row(0, named=True)
    assert (big["turns"], big["max_calls_per_turn"], big["parallel_turns"]) == (3, 280, 3)
    lanes_table = tool_use_table(trials, pl.DataFrame(calls))
    monkeypatch.setattr(tool_use, "LANE_TURNS", 0)  # every run takes the two-key path
    assert per_trial(pl.DataFrame(calls)).equals(lanes)
    assert tool_use_table(trials, pl.DataFrame(calls)).equals(lanes_table)
