"""Per-call features stored in tool_calls.parquet at write time (issue 17, streaming report):
the raw columns stay identical, hostile arguments never break the write, and the report gives
the same tables from stored columns as from the old artifacts' fallback (which it logs)."""

from __future__ import annotations

import json
import logging

import polars as pl
import pyarrow as pa

from schemas import artifacts
from tasks.core import storage
from tasks.report.failure_modes import classify_failures, requirements_from_manifests
from tasks.report.features import (
    STORED_FEATURES,
    has_stored_features,
    tool_calls_with_features,
)
from tasks.report.loaders import _trials_uri, scan_tool_calls
from tasks.report.tool_use import tool_use_table

RAW = [f.name for f in artifacts.TOOL_CALLS if f.name not in STORED_FEATURES]

MANIFEST = {
    "name": "d",
    "databases": {"pg": {}, "mg": {}},
    "queries": [{"id": "q", "requires": {"sources": ["pg.films", "mg.reviews"],
                                         "operations": ["join_reformatted_key",
                                                        "extract_from_text"]}}],
}

HOSTILE_ARGS = [
    "not json at all",
    "",
    "[1, 2, 3]",
    '{"db": 7, "query": {"collection": "reviews", "find": {}}}',
    '{"query": "SELECT * FROM films LIMIT 5", "db": "pg"}',  # db not the first key
    '{"db": "p\\u0067", "query": "SELECT 1 FROM \\"Films\\" f JOIN x.y ON 1"}',  # escapes
    json.dumps({"db": "pg", "query": "SELECT " + "x, " * 20000 + "1 FROM films"}),
    json.dumps({"db": "mg", "query": '{"collection": "reviews", "pipeline": [{"$lookup": '
                                     '{"from": "films"}}]}'}),
    json.dumps({"db": "pg", "query": "DROP TABLE films; -- ' \" \x00 ☃"}),
]


def _calls() -> pl.DataFrame:
    rows = []
    for t in range(4):
        key = f"a|d|q|{t}"
        tools = ["list_db", "query_db", "query_db", "execute_python", "return_answer"]
        args = [
            json.dumps({"db": "pg"}),
            json.dumps({"db": "pg", "query": "SELECT split_part(k, ':', 2) FROM films"}),
            HOSTILE_ARGS[t * 2 % len(HOSTILE_ARGS)],
            json.dumps({"code": "import re\nre.findall('x', s)"}),
            json.dumps({"answer": "1"}),
        ]
        for i, (tool, a) in enumerate(zip(tools, args)):
            rows.append({"run_id": "r", "trial_key": key, "call_index": i, "turn": i // 2,
                         "call_id": f"c{i}", "tool": tool, "arguments": a, "success": i != 2,
                         "error": None, "result_size": i, "duration_s": 0.1})
    for j, a in enumerate(HOSTILE_ARGS):
        rows.append({"run_id": "r", "trial_key": "a|d|q|9", "call_index": j, "turn": j,
                     "call_id": f"h{j}", "tool": "query_db", "arguments": a, "success": True,
                     "error": None, "result_size": 0, "duration_s": 0.0})
    return pl.DataFrame(rows)


def _trials() -> pl.DataFrame:
    keys = [f"a|d|q|{t}" for t in (0, 1, 2, 3, 9)]
    return pl.DataFrame({
        "run_id": "r", "trial_key": keys, "agent": "a", "dataset": "d", "query_id": "q",
        "trial": [0, 1, 2, 3, 9], "answer": "7", "is_correct": [True, False, False, False, False],
        "terminate_reason": "return_answer", "error": None,
    })


def test_written_features_keep_raw_columns_and_order():
    raw = pa.Table.from_pylist(_calls().to_dicts(), schema=artifacts.TOOL_CALLS)
    out = tool_calls_with_features(raw)
    assert out.schema.equals(artifacts.TOOL_CALLS, check_metadata=False)
    assert out.select(RAW).equals(raw.select(RAW))
    df = pl.from_arrow(out)
    assert df["explore"].null_count() == 0 and df["source_refs"].null_count() == 0
    by_args = dict(zip(df["arguments"], df.select(STORED_FEATURES).iter_rows(named=True)))
    bad = by_args["not json at all"]
    assert bad["db"] is None and bad["source_refs"] == [] and not any(
        bad[f] for f in ("explore", "sql_pattern", "key_reformat"))
    assert by_args[HOSTILE_ARGS[4]]["db"] == "pg"  # parsed, not only the fast regex
    assert by_args[HOSTILE_ARGS[4]]["source_refs"] == ["films"]
    assert by_args[HOSTILE_ARGS[7]]["source_refs"] == ["reviews", "films"]
    # computing again on written rows (a resumed batch) gives the same table
    assert tool_calls_with_features(out).equals(out)
    empty = tool_calls_with_features(artifacts.TOOL_CALLS.empty_table())
    assert empty.num_rows == 0 and empty.schema.names == artifacts.TOOL_CALLS.names


def test_report_tables_equal_from_stored_and_old_artifacts(tmp_path, caplog):
    root = str(tmp_path)
    calls = _calls()
    trials = _trials()
    reqs = requirements_from_manifests([MANIFEST])
    old_schema = pa.schema([f for f in artifacts.TOOL_CALLS if f.name in RAW],
                           metadata=artifacts.TOOL_CALLS.metadata)
    tables = {}
    for run, table in (
        ("old", pa.Table.from_pylist(calls.to_dicts(), schema=old_schema)),
        ("new", tool_calls_with_features(
            pa.Table.from_pylist(calls.to_dicts(), schema=artifacts.TOOL_CALLS))),
    ):
        schema = old_schema if run == "old" else artifacts.TOOL_CALLS
        storage.write_parquet(_trials_uri(root, run, "tool_calls"), table, schema)
        lf = scan_tool_calls(root, run)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tasks.report.features"):
            assert has_stored_features(lf) == (run == "new")
            tables[run] = (tool_use_table(trials, lf), classify_failures(trials, lf, reqs))
        fallback = [r for r in caplog.records if "without stored per-call features" in r.message]
        assert len(fallback) == (2 if run == "old" else 0)  # one line per table
    assert tables["old"][0].equals(tables["new"][0])
    assert tables["old"][1].equals(tables["new"][1])
    labels = {r["trial_key"]: r for r in tables["new"][1].iter_rows(named=True)}
    assert labels["a|d|q|1"]["missing_sources"] == ["mg.reviews"]
    assert tables["new"][0]["tool_calls"].to_list() == [29, 29]


def test_partly_stored_artifact_falls_back_for_every_row():
    calls = pl.from_arrow(tool_calls_with_features(
        pa.Table.from_pylist(_calls().to_dicts(), schema=artifacts.TOOL_CALLS)))
    mixed = calls.with_columns(
        pl.when(pl.col("call_index") == 0).then(None).otherwise(pl.col("explore"))
        .alias("explore"))
    assert has_stored_features(calls.lazy()) and not has_stored_features(mixed.lazy())
    assert tool_use_table(_trials(), mixed).equals(tool_use_table(_trials(), calls))


def test_batch_and_large_write_paths_agree(monkeypatch):
    """A trials batch (one lazy plan) and a large artifact (parallel eager parse) get the
    same stored columns."""
    from tasks.report import features

    raw = pa.Table.from_pylist(_calls().to_dicts(), schema=artifacts.TOOL_CALLS)
    small = tool_calls_with_features(raw)
    monkeypatch.setattr(features, "SMALL_WRITE", 0)
    assert tool_calls_with_features(raw).equals(small)
