"""Failure-mode classifier: one hand-written trajectory per mode, the rule edges, source-touch
and operation-evidence detection, and the per-agent table."""

from __future__ import annotations

import json

import polars as pl
import pytest

from schemas.report import ALL
from tasks.report.failure_modes import (
    RequirementsError,
    classify_failures,
    failure_mode_table,
    requirements_from_manifests,
    unchecked_operations,
)
from tasks.report.features import with_call_features

MANIFEST = {
    "name": "movies",
    "databases": {"catalog": {"engine": "mongodb"}, "boxoffice": {"engine": "postgres"}},
    "queries": [
        {
            "id": "oscars",
            "requires": {
                "sources": ["catalog.films", "boxoffice.revenue"],
                "operations": ["join_reformatted_key", "extract_from_text", "domain_knowledge"],
            },
        },
        {
            "id": "vol",
            "requires": {"sources": ["boxoffice.prices"], "operations": ["use_adjusted_close"]},
        },
    ],
}


def trial(
    key: str,
    correct: bool = False,
    reason: str = "return_answer",
    answer: str | None = "7",
    error: str | None = None,
) -> dict:
    agent, dataset, query, n = key.split("|")
    return {
        "run_id": "r",
        "trial_key": key,
        "agent": agent,
        "dataset": dataset,
        "query_id": query,
        "trial": int(n),
        "answer": answer,
        "is_correct": correct,
        "terminate_reason": reason,
        "error": error,
    }


def call(key: str, i: int, tool: str, turn: int | None = None, ok: bool = True, **args) -> dict:
    return {
        "trial_key": key,
        "call_index": i,
        "turn": i if turn is None else turn,
        "tool": tool,
        "arguments": json.dumps(args),
        "success": ok,
    }


def k(query: str, n: int, agent: str = "a") -> str:
    return f"{agent}|movies|{query}|{n}"


MONGO_FIND = '{"collection": "films", "find": {"awards": {"$regex": "Won \\\\d+ Oscar"}}}'
GOOD_PYTHON = "box = {int(r['omdb_key'].split(':')[1]): r['usd'] for r in var_call_2}\nprint(1)"


def classify(trials: list[dict], calls: list[dict], manifests=(MANIFEST,)) -> dict[str, dict]:
    reqs = requirements_from_manifests(list(manifests)) if manifests else None
    calls_df = (
        pl.DataFrame(calls)
        if calls
        else pl.DataFrame(
            schema={
                "trial_key": pl.String,
                "call_index": pl.Int64,
                "turn": pl.Int64,
                "tool": pl.String,
                "arguments": pl.String,
                "success": pl.Boolean,
            }
        )
    )
    labels = classify_failures(pl.DataFrame(trials), calls_df, reqs)
    # the stored per-call features (written by the trials stage) give the same labels
    stored = classify_failures(pl.DataFrame(trials), with_call_features(calls_df), reqs)
    assert stored.equals(labels)
    return {r["trial_key"]: r for r in labels.iter_rows(named=True)}


def test_one_trajectory_per_failure_mode():
    trials = [
        trial(k("oscars", 0), reason="max_iterations", answer=None),  # FM5
        trial(k("oscars", 1), reason="no_tool_call", answer="about 12"),  # FM1
        trial(k("oscars", 2)),  # FM3: never queried boxoffice.revenue
        trial(k("oscars", 3)),  # FM2: both sources, keys never reformatted
        trial(k("oscars", 4)),  # FM4: everything evident, answer still wrong
        trial(k("oscars", 5), correct=True),  # correct: no label
    ]
    calls = [
        call(k("oscars", 2), 0, "query_db", db="catalog", query=MONGO_FIND),
        call(k("oscars", 2), 1, "query_db", db="boxoffice", query="SELECT * FROM reviews LIMIT 5"),
        call(k("oscars", 2), 2, "return_answer", answer="7"),
        call(k("oscars", 3), 0, "query_db", db="catalog", query=MONGO_FIND),
        call(
            k("oscars", 3), 1, "query_db", db="boxoffice", query="SELECT omdb_key, usd FROM revenue"
        ),
        call(k("oscars", 3), 2, "execute_python", code="print(len(var_call_1))"),
        call(k("oscars", 4), 0, "query_db", db="catalog", query=MONGO_FIND),
        call(
            k("oscars", 4), 1, "query_db", db="boxoffice", query="SELECT omdb_key, usd FROM revenue"
        ),
        call(k("oscars", 4), 2, "execute_python", code=GOOD_PYTHON),
        call(k("oscars", 4), 3, "return_answer", answer="7"),
    ]
    got = classify(trials, calls)
    assert set(got) == {k("oscars", i) for i in range(5)}
    assert {key: r["failure_mode"] for key, r in got.items()} == {
        k("oscars", 0): "FM5",
        k("oscars", 1): "FM1",
        k("oscars", 2): "FM3",
        k("oscars", 3): "FM2",
        k("oscars", 4): "FM4",
    }
    assert got[k("oscars", 0)]["rule"] == "runtime_stop"
    assert got[k("oscars", 1)]["rule"] == "no_data_tool_call"
    assert got[k("oscars", 2)]["missing_sources"] == ["boxoffice.revenue"]
    assert got[k("oscars", 3)]["missing_operations"] == ["join_reformatted_key"]
    assert got[k("oscars", 3)]["missing_sources"] == []
    # domain_knowledge has no trajectory signature: never counted missing
    assert got[k("oscars", 4)]["missing_operations"] == []
    assert got[k("oscars", 4)]["rule"] == "operations_evident"


@pytest.mark.parametrize(
    "reason",
    [
        "api_error",
        "error",
        "timeout",
        "wall_time",
        "max_tool_calls",
        "token_budget",
        "context_length",
        "tool_call_limit_exceeded",
    ],
)
def test_runtime_terminate_reasons_are_fm5(reason):
    got = classify([trial(k("oscars", 0), reason=reason)], [])
    assert got[k("oscars", 0)]["failure_mode"] == "FM5"


def test_every_runtime_terminate_reason_of_the_harness_is_fm5():
    """The harness's own list of runtime failures (DAB FM5) is covered by the classifier."""
    from tasks.agents.react import RUNTIME_FAILURES, TERMINATE_REASONS

    trials = [trial(f"a|movies|oscars|{i}", reason=r) for i, r in enumerate(TERMINATE_REASONS)]
    got = classify(trials, [])
    for i, reason in enumerate(TERMINATE_REASONS):
        is_fm5 = got[f"a|movies|oscars|{i}"]["failure_mode"] == "FM5"
        assert is_fm5 == (reason in RUNTIME_FAILURES), reason


def test_fm5_from_error_without_answer_and_fm1_edges():
    trials = [
        trial(k("oscars", 0), answer=None, error="reference step 2 failed"),  # FM5 runtime_error
        trial(k("oscars", 1), answer="   "),  # FM1 no_answer (had tool calls)
        trial(k("oscars", 2)),  # FM1: only return_answer, no data tool call
        trial(k("oscars", 3), reason="replay"),  # FM1: a replayed answer has no trajectory
    ]
    calls = [
        call(k("oscars", 1), 0, "list_db"),
        call(k("oscars", 1), 1, "return_answer", answer="   "),
        call(k("oscars", 2), 0, "return_answer", answer="7"),
    ]
    got = classify(trials, calls)
    assert [got[k("oscars", i)]["rule"] for i in range(3)] == [
        "runtime_error",
        "no_answer",
        "no_data_tool_call",
    ]
    assert [got[k("oscars", i)]["failure_mode"] for i in range(3)] == ["FM5", "FM1", "FM1"]


def test_unknown_requirements_are_fm1_not_a_guess():
    trials = [trial(k("oscars", 0)), trial("a|stocks|q9|0")]
    calls = [
        call(k("oscars", 0), 0, "query_db", db="catalog", query=MONGO_FIND),
        call("a|stocks|q9|0", 0, "query_db", db="market", query="SELECT 1"),
    ]
    got = classify(trials, calls, manifests=None)
    assert {r["rule"] for r in got.values()} == {"requirements_unknown"}
    got = classify(trials, calls)  # movies known, stocks not
    assert got["a|stocks|q9|0"]["rule"] == "requirements_unknown"
    assert got[k("oscars", 0)]["failure_mode"] == "FM3"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM prices",
        'SELECT * FROM "prices" p WHERE p.adj_close > 1',
        "SELECT * FROM public.prices",
        'SELECT * FROM "public"."PRICES"',
        "SELECT a.x FROM other a, prices b WHERE a.k = b.k",
        "SELECT x FROM other o JOIN prices p ON o.k = p.k",
        "select x from (select * from prices) t",
    ],
)
def test_sql_source_touch_forms(sql):
    key = k("vol", 0)
    got = classify(
        [trial(key)], [call(key, 0, "query_db", db="boxoffice", query=sql + " -- adj_close")]
    )
    assert got[key]["missing_sources"] == [], sql


@pytest.mark.parametrize(
    "db, sql",
    [
        ("boxoffice", "SELECT 'prices' AS name FROM other"),  # a literal is not a source
        ("boxoffice", "SELECT prices FROM other"),  # a column is not a source
        ("catalog", "SELECT * FROM prices"),  # right table name, wrong database
        ("boxoffice", "SELECT * FROM prices_2020"),  # another table
    ],
)
def test_sql_not_a_touch(db, sql):
    key = k("vol", 0)
    got = classify([trial(key)], [call(key, 0, "query_db", db=db, query=sql)])
    assert got[key]["missing_sources"] == ["boxoffice.prices"], sql
    assert got[key]["failure_mode"] == "FM3"


def test_mongo_touch_by_collection_or_lookup_and_failed_attempts_count():
    key1, key2, key3 = k("oscars", 1), k("oscars", 2), k("oscars", 3)
    lookup = json.dumps(
        {
            "collection": "other",
            "aggregate": [
                {"$lookup": {"from": "films", "localField": "a", "foreignField": "b", "as": "f"}}
            ],
        }
    )
    calls = [
        # key1: films via $lookup; revenue via a query that failed
        call(key1, 0, "query_db", db="catalog", query=lookup),
        call(key1, 1, "query_db", ok=False, db="boxoffice", query="SELECT * FROM revenue WHERE"),
        # key2: query passed as a JSON object instead of a string
        {
            **call(key2, 0, "query_db"),
            "arguments": json.dumps(
                {"db": "catalog", "query": {"collection": "films", "find": {"year": 1999}}}
            ),
        },
        call(key2, 1, "query_db", db="boxoffice", query="SELECT * FROM revenue"),
        # key3: db is not the first key of the arguments
        {
            **call(key3, 0, "query_db"),
            "arguments": json.dumps({"query": '{"collection": "films"}', "db": "catalog"}),
        },
        call(key3, 1, "query_db", db="boxoffice", query="SELECT * FROM revenue"),
    ]
    got = classify([trial(key1), trial(key2), trial(key3)], calls)
    for key in (key1, key2, key3):
        assert got[key]["missing_sources"] == [], key


def test_source_touch_with_dots_in_database_or_collection_names():
    """A source is touched when ``db + "." + ref`` is its normalised name, wherever the dots
    fall (a manifest without ``databases`` may name any database)."""
    manifest = {
        "name": "movies",
        "queries": [{"id": "q", "requires": {"sources": ["mg.v2.films"], "operations": []}}],
    }
    keys = [k("q", n) for n in range(4)]
    calls = [
        call(keys[0], 0, "query_db", db="mg.v2", query='{"collection": "films"}'),
        call(keys[1], 0, "query_db", db="mg", query='{"collection": "v2.films"}'),
        call(keys[2], 0, "query_db", db="mg", query='{"collection": "films"}'),
        call(keys[3], 0, "query_db", db="mg.v2", query="SELECT * FROM Films"),
    ]
    got = classify([trial(x) for x in keys], calls, manifests=(manifest,))
    assert [got[x]["missing_sources"] for x in keys] == [[], [], ["mg.v2.films"], []]


def test_sliced_old_artifact_equals_one_pass(monkeypatch):
    """An artifact without stored features is parsed in slices; a trial whose calls straddle
    slices gets the same label as from the stored features' single streaming pass."""
    from tasks.report import failure_evidence

    keys = [k("oscars", n) for n in range(3)] + [k("vol", 3)]
    calls = []
    for n, key in enumerate(keys):
        calls += [
            call(key, 0, "query_db", db="catalog", query=MONGO_FIND),
            call(key, 1, "list_db", db="boxoffice"),
            call(key, 2, "query_db", db="boxoffice",
                 query="SELECT split_part(omdb_key, ':', 2) FROM revenue" if n else "SELECT 1"),
            call(key, 3, "query_db", db="boxoffice", query="SELECT adj_close FROM prices"),
        ][: 2 + n]
    calls_df = pl.DataFrame(calls)
    trials = pl.DataFrame([trial(x) for x in keys])
    reqs = requirements_from_manifests([MANIFEST])
    whole = classify_failures(trials, with_call_features(calls_df), reqs)
    monkeypatch.setattr(failure_evidence, "CALLS_PER_SLICE", 3)
    sliced = classify_failures(trials, calls_df.sample(fraction=1.0, shuffle=True, seed=3), reqs)
    assert sliced.equals(whole)
    assert whole["failure_mode"].to_list() == ["FM3", "FM4", "FM4", "FM4"]


def test_operation_evidence_rules():
    key_ok, key_one_db, key_adj, key_raw = k("oscars", 0), k("oscars", 1), k("vol", 2), k("vol", 3)
    calls = [
        # keys reformatted in SQL and text read with LIKE
        call(key_ok, 0, "query_db", db="catalog", query=MONGO_FIND),
        call(
            key_ok,
            1,
            "query_db",
            db="boxoffice",
            query="SELECT split_part(omdb_key, ':', 2) AS id, usd FROM revenue "
            "WHERE production LIKE '%Disney%'",
        ),
        # reformatting code but only one database queried → no cross-database join
        call(key_one_db, 0, "query_db", db="boxoffice", query="SELECT omdb_key FROM revenue"),
        call(key_one_db, 1, "query_db", db="boxoffice", query="SELECT * FROM films"),
        call(key_one_db, 2, "execute_python", code=GOOD_PYTHON),
        call(key_adj, 0, "query_db", db="boxoffice", query="SELECT date, adj_close FROM prices"),
        call(key_raw, 0, "query_db", db="boxoffice", query="SELECT date, close FROM prices"),
    ]
    got = classify([trial(x) for x in (key_ok, key_one_db, key_adj, key_raw)], calls)
    assert got[key_ok]["failure_mode"] == "FM4"
    assert got[key_one_db]["missing_sources"] == ["catalog.films"]
    assert "join_reformatted_key" in got[key_one_db]["missing_operations"]
    assert got[key_adj]["failure_mode"] == "FM4"
    assert got[key_raw]["failure_mode"] == "FM2"
    assert got[key_raw]["missing_operations"] == ["use_adjusted_close"]


def test_malformed_arguments_do_not_break_classification():
    key = k("vol", 0)
    calls = [
        {**call(key, 0, "query_db"), "arguments": "{not json"},
        call(key, 1, "query_db", db="boxoffice", query="SELECT adj_close FROM prices"),
    ]
    got = classify([trial(key)], calls)
    assert got[key]["failure_mode"] == "FM4"


def test_failure_mode_table_by_hand_and_denominators():
    trials = [
        trial(k("oscars", 0), reason="api_error", answer=None),
        trial(k("oscars", 1), reason="no_tool_call"),
        trial(k("oscars", 2), correct=True),
        trial(k("oscars", 0, agent="b"), correct=True),
    ]
    frame = pl.DataFrame(trials)
    labels = classify_failures(
        frame,
        pl.DataFrame([call(k("oscars", 2), 0, "list_db")]),
        requirements_from_manifests([MANIFEST]),
    )
    table = failure_mode_table(frame, labels)
    rows = {(r["agent"], r["dataset"]): r for r in table.iter_rows(named=True)}
    a = rows[("a", "movies")]
    assert (a["trials"], a["incorrect"], a["FM1"], a["FM5"], a["FM3"]) == (3, 2, 1, 1, 0)
    assert a["FM1_share"] == 0.5 and a["FM2_share"] == 0.0
    assert rows[("a", ALL)]["incorrect"] == 2
    b = rows[("b", "movies")]
    assert b["incorrect"] == 0 and b["FM1_share"] is None  # no incorrect trials: no shares
    with pytest.raises(ValueError, match="exactly one label"):
        failure_mode_table(frame, labels.head(1))


def test_requirements_validation():
    bad = {**MANIFEST, "queries": [{"id": "q", "requires": {"sources": ["films"]}}]}
    with pytest.raises(RequirementsError, match="movies/q.*<db>.<table>"):
        requirements_from_manifests([bad])
    bad = {**MANIFEST, "queries": [{"id": "q", "requires": {"sources": ["nope.films"]}}]}
    with pytest.raises(RequirementsError, match="database 'nope'"):
        requirements_from_manifests([bad])
    reqs = requirements_from_manifests([MANIFEST, {"name": "x", "queries": [{"id": "q"}]}])
    assert reqs.height == 2  # a query without requires is left out
    assert unchecked_operations(reqs) == ["domain_knowledge"]


def test_shipped_dataset_annotations_are_valid():
    """Every query of the shipped specs carries requires, with sources the spec places."""
    from tasks.datasets.spec import load_spec, spec_path

    for name in ("movies", "stocks"):
        spec = load_spec(spec_path(name))
        placed = {f"{p.database}.{p.name}" for p in spec.placements}
        for q in spec.queries:
            assert set(q.requires.sources) <= placed, (name, q.id)
