"""Hostile model output through the real ReAct loop over real HTTP.

A scripted OpenAI-compatible server (tests/fakes/openai_server.py) plays a hostile model: each
conversation of a batch opens with one payload — tool calls of every shape (ids of any length
and type, 100,000-deep or megabyte-sized arguments, lone surrogates, invalid UTF-8 bodies,
unknown tools, non-string arguments, malformed messages) and queries that attack the engines
(Unicode-escaped PostgreSQL function names, superuser checks, zeroblob/repeat results, a
mongomock ``$lookup`` bomb, the marker collection). Every payload must be blocked — a precise
tool error or a recorded terminate reason, never an exception — and the batch must finish with
every trial recorded. The same payload corpus, larger, runs in ``bench/security.py``.
"""

from __future__ import annotations

import json
import shutil
import threading
import time

import polars as pl
import pytest

from tasks import storage
from tasks.trials import batch_uri, run_batch
from tests.fakes.openai_server import (
    ScriptedOpenAIServer,
    delay,
    message,
    raw,
    raw_tool_calls,
    tool_calls,
)
from tests.test_agent_trials import manifest_uri, priced_model  # noqa: F401 - fixtures

STOCKS_QUERY = "nasdaq_top_volume_2012"


def _fn(name, args, cid="call_x"):
    """One tool call object as the API sends it (``args``: JSON text or any JSON value)."""
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def _conversations(payloads, pick=None):
    """A responder: the k-th conversation (a request with only the system and user messages)
    opens with ``payloads[k]`` (or ``payloads[pick(body)]``); every later turn returns an
    answer, so each trial ends after its payload."""
    state = {"next": 0}

    def responder(body, index):
        if len(body["messages"]) == 2:
            if pick is not None:
                return payloads[pick(body)]
            k = state["next"]
            state["next"] += 1
            return payloads[k] if k < len(payloads) else message("no payload left")
        return tool_calls(("return_answer", {"answer": "done"}))

    return responder


def _by_conversation(requests):
    groups: list[list[dict]] = []
    for body in requests:
        if len(body["messages"]) == 2:
            groups.append([])
        groups[-1].append(body)
    return groups


def _run(tmp_path, manifest_uri, agent, query_id, n, key, root=None):
    root = root or str(tmp_path / "artifacts")
    batch = {"key": key, "agent": agent, "manifest_uri": manifest_uri,
             "items": [[query_id, t] for t in range(n)], "options": {"max_iterations": 3}}
    run_batch("hostile", root, batch)
    trials = pl.read_parquet(batch_uri(root, "hostile", key, "trials")).sort("trial")
    calls = pl.read_parquet(batch_uri(root, "hostile", key, "tool_calls"))
    return trials, calls, root


def _first_call(calls, trial_key):
    rows = calls.filter(pl.col("trial_key") == trial_key).sort("call_index").to_dicts()
    return rows[0] if rows else None


# ---- tool-call shapes ---------------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000
SHAPES = [
    # (name, payload step, check(trial row, first tool-call row, next request or None))
    ("id of 300 characters",
     raw_tool_calls([_fn("query_db", json.dumps({"db": "listings", "query": "SELECT 1 AS one"}),
                         "c" * 300)]),
     lambda t, c, nxt: c["success"] and len(c["call_id"]) <= 256
     and json.loads(nxt["messages"][-1]["content"])["variable"].startswith("var_" + "c" * 32 + "_")
     and nxt["messages"][-1]["tool_call_id"] == "c" * 300),
    ("id with path characters",
     raw_tool_calls([_fn("query_db", json.dumps({"db": "listings", "query": "SELECT 1 AS one"}),
                         "../../../../etc/passwd\x00")]),
     lambda t, c, nxt: c["success"]
     and "/" not in json.loads(nxt["messages"][-1]["content"])["variable"]),
    ("id that is a number, name that is an object",
     raw_tool_calls([{"id": 12345, "type": "function",
                      "function": {"name": {"evil": True}, "arguments": "{}"}}]),
     lambda t, c, nxt: not c["success"] and "unknown tool" in c["error"]),
    ("arguments nested 100,000 deep",
     raw_tool_calls([_fn("query_db", DEEP)]),
     lambda t, c, nxt: not c["success"] and "nested deeper than" in c["error"]),
    ("arguments of 2 MB",
     raw_tool_calls([_fn("query_db", json.dumps({"db": "listings", "query": "SELECT '" + "x" * 2_000_000 + "'"}))]),
     lambda t, c, nxt: not c["success"] and "too large" in c["error"] and len(c["arguments"]) < 200_000),
    ("arguments that are a JSON object, not text",
     raw_tool_calls([_fn("query_db", {"db": "listings", "query": "SELECT 2 AS two"})]),
     lambda t, c, nxt: c["success"] and json.loads(nxt["messages"][-1]["content"])["preview"] == [{"two": 2}]),
    ("arguments that are a number",
     raw_tool_calls([_fn("query_db", 42)]),
     lambda t, c, nxt: not c["success"] and "must be a JSON object" in c["error"]),
    ("lone surrogates in arguments and id",
     raw_tool_calls([_fn("return_answer", '{"answer": "x\\ud800y"}', "id\ud800")]),
     lambda t, c, nxt: c["success"] and t["answer"] == "x\ufffdy" and t["terminate_reason"] == "return_answer"),
    ("unknown tool with a huge name",
     raw_tool_calls([_fn("drop_everything" * 10_000, "{}")]),
     lambda t, c, nxt: not c["success"] and "unknown tool" in c["error"] and len(c["tool"]) <= 200),
    ("argument names that are not identifiers",
     raw_tool_calls([_fn("query_db", json.dumps({"db": "listings", "query": "SELECT 1", "": 1, "a b": 2}))]),
     lambda t, c, nxt: not c["success"] and "unexpected argument names" in c["error"]),
    ("tool_calls holding a string",
     raw_tool_calls(["not a tool call"]),
     lambda t, c, nxt: not c["success"] and "unknown tool" in c["error"]),
    ("message that is null",
     raw(json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                     "choices": [{"index": 0, "message": None, "finish_reason": "stop"}]}).encode()),
     lambda t, c, nxt: c is None and t["terminate_reason"] == "api_error" and "no message" in t["error"]),
    ("body that is not UTF-8",
     raw(b'{"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "\xff\xfe"}}]}'),
     lambda t, c, nxt: c is None and t["terminate_reason"] == "api_error" and "decoded" in t["error"]),
    ("query that is not a string",
     raw_tool_calls([_fn("query_db", json.dumps({"db": ["listings"], "query": {"sql": 1}}))]),
     lambda t, c, nxt: not c["success"] and "db must be a string" in c["error"]),
]


def test_tool_call_shapes_are_tool_errors_and_the_batch_finishes(tmp_path, manifest_uri, priced_model):
    with ScriptedOpenAIServer(_conversations([s for _, s, _ in SHAPES])) as srv:
        agent = priced_model(srv)
        trials, calls, root = _run(tmp_path, manifest_uri, agent, STOCKS_QUERY, len(SHAPES), "shapes")
        groups = _by_conversation(srv.requests)
    assert trials.height == len(SHAPES)  # every trial recorded: nothing escaped the batch
    failures = []
    for (name, _, check), t, group in zip(SHAPES, trials.to_dicts(), groups):
        first = _first_call(calls, t["trial_key"])
        nxt = group[1] if len(group) > 1 else None
        if nxt is not None:
            json.dumps(nxt["messages"])  # what went back to the model is JSON
        try:
            ok = check(t, first, nxt)
        except Exception as exc:  # noqa: BLE001 - reported with the payload's name
            ok = f"{type(exc).__name__}: {exc}"
        if ok is not True:
            failures.append((name, ok, t["terminate_reason"], t["error"], first and first["error"]))
    assert failures == []
    # every string in the artifacts is valid UTF-8 (Parquet wrote them) and the batch is whole
    assert storage.exists(batch_uri(root, "hostile", "shapes", "llm_calls"))


def test_rerun_of_a_hostile_batch_replays_the_cache_and_finishes(tmp_path, manifest_uri, priced_model):
    """The cached hostile responses are replayed on a re-run (no model call) and the batch
    still finishes (before, the replay crashed again)."""
    picks = [s for _, s, _ in SHAPES[:5]]
    with ScriptedOpenAIServer(_conversations(picks)) as srv:
        agent = priced_model(srv)
        first, _, root = _run(tmp_path, manifest_uri, agent, STOCKS_QUERY, len(picks), "again")
        n = srv.request_count
        shutil.rmtree(storage.join(root, "runs", "hostile", "trials"))  # the cache stays
        second, _, _ = _run(tmp_path, manifest_uri, agent, STOCKS_QUERY, len(picks), "again", root)
        assert srv.request_count == n  # all from the response cache
    assert first.select("terminate_reason", "answer").to_dicts() == \
        second.select("terminate_reason", "answer").to_dicts()


# ---- engine attacks -------------------------------------------------------------------------------

SQLITE_FIVE = "(SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5)"


def test_huge_results_are_cut_through_the_loop(tmp_path, manifest_uri, priced_model):
    payloads = [
        tool_calls(("query_db", {"db": "listings", "query": f"SELECT zeroblob(40000000) AS z FROM {SQLITE_FIVE}"})),
        tool_calls(("query_db", {"db": "market", "query": "SELECT repeat('x', 100000000) AS x FROM range(5)"})),
        tool_calls(("query_db", {"db": "market", "query": "SELECT repeat('x', 100000000) AS x FROM range(100000)"})),
    ]
    with ScriptedOpenAIServer(_conversations(payloads)) as srv:
        agent = priced_model(srv)
        trials, calls, _ = _run(tmp_path, manifest_uri, agent, STOCKS_QUERY, len(payloads), "huge")
        groups = _by_conversation(srv.requests)
    rows = [_first_call(calls, k) for k in trials["trial_key"]]
    for row, group in zip(rows[:2], groups[:2]):
        shown = json.loads(group[1]["messages"][-1]["content"])
        assert row["success"] and shown["row_count"] == 5 and "values_cut" in shown
        assert row["result_size"] < 16 << 20
    # 100,000 rows of 100 MB each: the engine runs out of its worker's memory, not querylab's
    assert not rows[2]["success"] and "memory" in rows[2]["error"].lower()


@pytest.fixture
def movies_uri(movies_manifest, settings) -> str:
    return storage.join(settings.artifacts, "datasets", "movies", movies_manifest["version"],
                        "manifest.json")


PG_ATTACKS = [
    ('SELECT U&"pg\\005fread\\005ffile"(\'/etc/hostname\')', "permission denied for function pg_read_file"),
    ("SELECT U&\"pg\\005fls\\005fdir\"('/')", "permission denied for function pg_ls_dir"),
    ('SELECT U&"pg\\005fterminate\\005fbackend"(pg_backend_pid())',
     "permission denied for function pg_terminate_backend"),
    ("SELECT U&\"set\\005fconfig\"('statement_timeout', '0', false)", "permission denied for function set_config"),
    ("SELECT count(*) FROM pg_stat_activity", "permission denied for view pg_stat_activity"),
    ("SELECT * FROM querylab_meta.loaded", "permission denied for schema querylab_meta"),
]


def test_postgres_least_privilege_through_the_loop(tmp_path, movies_uri, priced_model):
    payloads = [tool_calls(("query_db", {"db": "boxoffice", "query": q})) for q, _ in PG_ATTACKS]
    payloads.append(tool_calls(("query_db", {"db": "boxoffice", "query":
                                             "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = current_user"})))
    with ScriptedOpenAIServer(_conversations(payloads)) as srv:
        agent = priced_model(srv)
        trials, calls, _ = _run(tmp_path, movies_uri, agent, "spielberg_box_office", len(payloads), "pg")
        groups = _by_conversation(srv.requests)
    rows = [_first_call(calls, k) for k in trials["trial_key"]]
    for (q, expected), row in zip(PG_ATTACKS, rows):
        assert not row["success"] and expected in row["error"], (q, row["error"])
    last = json.loads(groups[-1][1]["messages"][-1]["content"])
    assert rows[-1]["success"] and last["preview"] == [
        {"rolsuper": False, "rolcreaterole": False, "rolcreatedb": False}]


def test_mongo_lookup_bomb_ends_at_the_limit_while_another_trial_answers(
        tmp_path, movies_uri, priced_model, monkeypatch, movies_manifest):
    """Two batches at once: one trial sends a $lookup self-join over the 2,760 films (minutes of
    mongomock work), the other a plain query one second later. The bomb is a tool error at the
    3 s limit; the plain query answers at once meanwhile."""
    monkeypatch.setenv("QUERYLAB_STATEMENT_TIMEOUT_MS", "3000")
    bomb = {"collection": "films", "aggregate": [
        {"$lookup": {"from": "films", "localField": "language", "foreignField": "language", "as": "a"}},
        {"$unwind": "$a"},
        {"$lookup": {"from": "films", "localField": "language", "foreignField": "language", "as": "b"}},
        {"$unwind": "$b"}, {"$count": "n"}]}
    plain = {"collection": "films", "find": {"year": 1994}, "projection": {"title": 1, "_id": 0}, "limit": 3}
    questions = {q["id"]: q["question"] for q in movies_manifest["queries"]}
    steps = {
        "bomb": tool_calls(("query_db", {"db": "catalog", "query": json.dumps(bomb)})),
        "plain": delay(1.0, tool_calls(("query_db", {"db": "catalog", "query": json.dumps(plain)}))),
        "marker": tool_calls(("query_db", {"db": "catalog", "query": '{"collection": "_querylab_loaded"}'})),
        "marker_lookup": tool_calls(("query_db", {"db": "catalog", "query": json.dumps(
            {"collection": "films", "aggregate": [{"$lookup": {"from": "_querylab_loaded", "pipeline": [], "as": "m"}}]})})),
    }
    order = {questions["spielberg_box_office"]: "bomb", questions["fresh_90s_comedies"]: "plain"}
    marker_q = questions["horror_2000s_tomatometer"]
    marker_seen = {"n": 0}

    def pick(body):
        q = body["messages"][1]["content"]
        if q == marker_q:
            marker_seen["n"] += 1
            return "marker" if marker_seen["n"] == 1 else "marker_lookup"
        return order[q]

    with ScriptedOpenAIServer(_conversations(steps, pick)) as srv:
        agent = priced_model(srv)
        out: dict = {}

        def go(key, qid, n=1):
            out[key] = _run(tmp_path, movies_uri, agent, qid, n, key, str(tmp_path / "artifacts"))

        threads = [threading.Thread(target=go, args=("bomb", "spielberg_box_office")),
                   threading.Thread(target=go, args=("plain", "fresh_90s_comedies"))]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        elapsed = time.monotonic() - start
        go("marker", "horror_2000s_tomatometer", 2)
    bomb_row = _first_call(out["bomb"][1], out["bomb"][0]["trial_key"][0])
    plain_row = _first_call(out["plain"][1], out["plain"][0]["trial_key"][0])
    assert not bomb_row["success"] and "timed out after 3000 ms" in bomb_row["error"]
    assert 2.5 < bomb_row["duration_s"] < 8
    assert plain_row["success"] and plain_row["duration_s"] < 1.5, plain_row
    assert elapsed < 30
    for key in out["marker"][0]["trial_key"]:
        row = _first_call(out["marker"][1], key)
        assert not row["success"] and "Unknown collection '_querylab_loaded'" in row["error"]
