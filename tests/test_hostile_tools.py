"""Hostile model output through the real ReAct loop over real HTTP.

A scripted OpenAI-compatible server (tests/fakes/openai_server.py) plays a hostile model: each
trial of a batch opens with one payload of the corpus in tests/fakes/hostile.py — tool calls
of every shape (ids of any length and type, 100,000-deep or megabyte arguments, lone
surrogates, invalid UTF-8 bodies, unknown tools, non-string arguments, malformed messages)
and queries that attack each engine (writes in disguise, file access, Unicode-escaped
PostgreSQL functions, the marker collection, zeroblob/repeat results, time bombs). Every
payload must be blocked by its precise check, and the batch must finish with every trial
recorded. bench/security.py runs the whole corpus (with execute_python and DAB inputs).
"""

from __future__ import annotations

import json
import shutil
import threading
import time

import polars as pl
import pytest

from tasks.core import storage
from tasks.trials.stage import batch_uri
from tests.fakes import hostile
from tests.fakes.openai_server import ScriptedOpenAIServer, delay, tool_calls

STOCKS_QUERY = "nasdaq_top_volume_2012"
MOVIES_QUERY = "spielberg_box_office"


@pytest.fixture
def short_limits(monkeypatch):
    monkeypatch.setenv("QUERYLAB_STATEMENT_TIMEOUT_MS", "3000")


def _run(payloads, manifest_uri, query_id, tmp_path, key, monkeypatch):
    with ScriptedOpenAIServer(hostile.responder(payloads)) as srv:
        agent = hostile.register_model(srv, tmp_path, monkeypatch.setenv)
        root = str(tmp_path / "artifacts")
        verdicts = hostile.run_payloads(payloads, srv, agent, manifest_uri, query_id, root, key)
    trials = pl.read_parquet(batch_uri(root, "hostile", key, "trials"))
    assert trials.height == len(payloads)  # every trial recorded: nothing escaped the batch
    return verdicts, root


def _through(verdicts):
    return [(v.payload.name, v.why) for v in verdicts if not v.blocked]


@pytest.mark.slow
def test_tool_call_shapes_are_tool_errors_and_the_batch_finishes(tmp_path, stocks_uri, monkeypatch):
    verdicts, _ = _run(hostile.tool_call_shapes(), stocks_uri, STOCKS_QUERY, tmp_path, "shapes",
                       monkeypatch)
    assert _through(verdicts) == [], "\n".join(f"{n}: {w}" for n, w in _through(verdicts))


@pytest.mark.slow
def test_rerun_of_a_hostile_batch_replays_the_cache_and_finishes(tmp_path, stocks_uri, monkeypatch):
    """The cached hostile responses replay on a re-run (no model call) and the batch still
    finishes with the same outcomes (before, the replay crashed again)."""
    never_completions = {"body that is not UTF-8", "body that is not JSON", "no choices"}  # not cached
    payloads = [p for p in hostile.tool_call_shapes() if p.name not in never_completions]
    with ScriptedOpenAIServer(hostile.responder(payloads)) as srv:
        agent = hostile.register_model(srv, tmp_path, monkeypatch.setenv)
        root = str(tmp_path / "artifacts")
        first = hostile.run_payloads(payloads, srv, agent, stocks_uri, STOCKS_QUERY, root, "again")
        assert all(v.blocked for v in first)
        rows = lambda what, cols: pl.read_parquet(  # noqa: E731
            batch_uri(root, "hostile", "again", what)).sort(cols[0]).select(cols).to_dicts()
        before = (rows("trials", ["trial", "terminate_reason", "answer", "error"]),
                  rows("tool_calls", ["trial_key", "call_index", "success", "error"]))
        n = srv.request_count
        shutil.rmtree(storage.join(root, "runs", "hostile", "trials"))  # the response cache stays
        hostile.run_payloads(payloads, srv, agent, stocks_uri, STOCKS_QUERY, root, "again")
        assert srv.request_count == n  # all from the response cache
        after = (rows("trials", ["trial", "terminate_reason", "answer", "error"]),
                 rows("tool_calls", ["trial_key", "call_index", "success", "error"]))
    assert after == before


@pytest.mark.slow
def test_sqlite_and_duckdb_attacks_are_blocked(tmp_path, stocks_uri, monkeypatch, short_limits):
    payloads = hostile.sqlite_payloads() + hostile.duckdb_payloads()
    verdicts, _ = _run(payloads, stocks_uri, STOCKS_QUERY, tmp_path, "sql", monkeypatch)
    assert _through(verdicts) == [], "\n".join(f"{n}: {w}" for n, w in _through(verdicts))


def test_postgres_and_mongo_attacks_are_blocked(tmp_path, movies_uri, monkeypatch, short_limits):
    payloads = hostile.postgres_payloads() + hostile.mongo_payloads()
    verdicts, _ = _run(payloads, movies_uri, MOVIES_QUERY, tmp_path, "pgmongo", monkeypatch)
    assert _through(verdicts) == [], "\n".join(f"{n}: {w}" for n, w in _through(verdicts))


def test_mongo_lookup_bomb_ends_at_the_limit_while_another_trial_answers(
        tmp_path, movies_uri, monkeypatch, movies_manifest, short_limits):
    """Two batches at once: one trial sends a $lookup self-join over the 2,760 films (minutes of
    mongomock work), the other a plain query one second later. The bomb is a tool error at the
    3 s limit; the plain query answers at once meanwhile."""
    plain = {"collection": "films", "find": {"year": 1994}, "projection": {"title": 1, "_id": 0},
             "limit": 3}
    questions = {q["id"]: q["question"] for q in movies_manifest["queries"]}
    steps = {questions["spielberg_box_office"]: hostile.q("catalog", hostile.LOOKUP_BOMB),
             questions["fresh_90s_comedies"]: delay(1.0, tool_calls(
                 ("query_db", {"db": "catalog", "query": json.dumps(plain)})))}

    def respond(body, index):
        if len(body["messages"]) == 2:  # the first user message holds the question
            return next(step for q, step in steps.items() if q in body["messages"][1]["content"])
        return tool_calls(("return_answer", {"answer": "done"}))

    root = str(tmp_path / "artifacts")
    with ScriptedOpenAIServer(respond) as srv:
        agent = hostile.register_model(srv, tmp_path, monkeypatch.setenv)
        out: dict = {}

        def go(key, qid):
            from tasks.trials.stage import run_batch

            run_batch("hostile", root, {"key": key, "agent": agent, "manifest_uri": movies_uri,
                                        "items": [[qid, 0]], "options": {"max_iterations": 3}})
            out[key] = pl.read_parquet(batch_uri(root, "hostile", key, "tool_calls")).to_dicts()[0]

        threads = [threading.Thread(target=go, args=("bomb", "spielberg_box_office")),
                   threading.Thread(target=go, args=("plain", "fresh_90s_comedies"))]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        elapsed = time.monotonic() - start
    assert not out["bomb"]["success"] and "timed out after 3000 ms" in out["bomb"]["error"]
    assert 2.5 < out["bomb"]["duration_s"] < 8
    assert out["plain"]["success"] and out["plain"]["duration_s"] < 1.5, out["plain"]
    assert elapsed < 30
