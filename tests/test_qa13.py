"""The QA findings on issue 13 (honest scores), each replayed as its attack through the real
ReAct loop over real HTTP (the scripted OpenAI-compatible server) and asserted blocked or
honest: failures the model causes are the agent's (scored), infrastructure failures are
errored (no verdict), tool-call ids are echoed to the API only in a form any OpenAI-compatible
endpoint accepts, the answer key stays out of reach, shotgun answers fail, paid calls are
all counted. The reports are /work/team/qa/issue13-reports.md (C = critical, M = major)."""

from __future__ import annotations

import json
import re
import signal
import os

import polars as pl
import pytest

from tasks.core import storage
from tasks.scoring.stage import score_run
from tasks.trials.stage import combine_trials
from tests.fakes.openai_server import (
    ScriptedOpenAIServer,
    delay,
    error,
    message,
    raw_tool_calls,
    tool_calls,
)
from tests.helpers import run_batch

STOCKS_Q = "nasdaq_top_volume_2012"  # ground truth: Facebook
MOVIES_Q = "spielberg_box_office"
_OPENAI_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")


def _turns(body: dict) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def _question(body: dict) -> str:
    return body["messages"][1]["content"]


def _fn(name: str, args) -> dict:
    return {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}


# -- C4: the model cannot make its own failures "errored" ----------------------------------------


def _openai_like(responder):
    """A responder that, like OpenAI, refuses (HTTP 400) any request whose history holds a
    tool-call id longer than 40 characters or outside ``[A-Za-z0-9_-]``."""

    def respond(body, index):
        for i, m in enumerate(body["messages"]):
            ids = [tc["id"] for tc in m.get("tool_calls") or []]
            ids += [m["tool_call_id"]] if m.get("tool_call_id") is not None else []
            for cid in ids:
                if not (isinstance(cid, str) and _OPENAI_ID.fullmatch(cid)):
                    return error(400, f"Invalid 'messages[{i}].tool_calls[0].id': string too "
                                      f"long. Expected a string with maximum length 40, but "
                                      f"got a string with length {len(str(cid))} instead.")
        return responder(body, index)

    return respond


@pytest.mark.slow
def test_odd_tool_call_ids_are_replaced_before_they_are_echoed(tmp_path, stocks_uri, model):
    """C4: ids of 64 and 300 characters, with spaces and non-ASCII, duplicated within a turn:
    an OpenAI-like endpoint 400s on any of them in the history, so before the fix the trial
    was errored (and left out of pass@1). querylab echoes stable short ids instead, keeps the
    original in the transcript, and the trial is scored; a re-run is answered from the cache
    (the replacement ids are the same)."""
    odd = ["x" * 64, "c" * 300, "id with spaces ü", "x" * 64]

    def responder(body, index):
        n = _turns(body)
        if n == 0:
            return raw_tool_calls([
                {"id": odd[0], "type": "function", "function": _fn("list_db", {})},
                {"id": odd[1], "type": "function",
                 "function": _fn("list_db", {"db": "listings"})},
                {"id": odd[2], "type": "function", "function": _fn("query_db", {
                    "db": "listings", "query": "SELECT company FROM listings WHERE listing "
                                               "LIKE 'NASDAQ:%'"})},
                {"id": odd[3], "type": "function", "function": _fn("list_db", {})},
            ])
        if n == 1:
            return raw_tool_calls([{"id": "call_ok-1", "type": "function",
                                    "function": _fn("list_db", {})}])
        return tool_calls(("return_answer", {"answer": "Facebook"}))

    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(_openai_like(responder)) as srv:
        agent = model(srv)
        out = run_batch(root, "ids", stocks_uri, agent, [[STOCKS_Q, 0]])
        assert srv.errors == []
        sent = [tc["id"] for r in srv.requests for m in r["messages"]
                for tc in m.get("tool_calls") or []]
        n_requests = srv.request_count
        again = run_batch(root, "ids-again", stocks_uri, agent, [[STOCKS_Q, 0]])
        assert srv.request_count == n_requests  # same ids, same requests: all cache hits
    t = out["trials"][0]
    assert t["terminate_reason"] == "return_answer" and out["scores"][0]["verdict"] == "correct"
    assert again["scores"][0]["verdict"] == "correct"
    assert sent and all(_OPENAI_ID.fullmatch(c) for c in sent)
    msgs = out["messages"].sort("index")
    first = json.loads(msgs.filter(pl.col("role") == "assistant")["tool_calls"][0])
    ids = [c["id"] for c in first]
    assert len(set(ids)) == 4 and all(_OPENAI_ID.fullmatch(c) for c in ids)
    assert [c.get("original_id", "")[:20] for c in first] == [o[:20] for o in odd]
    assert first[1]["original_id"].endswith("[300 characters]")
    second = json.loads(msgs.filter(pl.col("role") == "assistant")["tool_calls"][1])
    assert second == [{"id": "call_ok-1", "name": "list_db", "arguments": "{}"}]  # kept as is
    tool_ids = msgs.filter(pl.col("role") == "tool")["tool_call_id"].to_list()
    assert tool_ids[:4] == ids and tool_ids[4] == "call_ok-1"


@pytest.mark.slow
def test_model_caused_crashes_are_the_agents_not_errored(tmp_path, stocks_uri, model):
    """C4 (crash part) and M4: a 300-character id, arguments nested 100,000 deep and lone
    surrogates in the reply text or in return_answer's argument used to crash the harness (or
    the score step) and make the trial errored. Now each is a tool error or a clean answer,
    the trial is scored, and score, audit and report all run."""

    def responder(body, index):
        n = _turns(body)
        if n == 0:  # trials of a batch run one after the other: count their first calls
            state["k"] = state.get("k", -1) + 1
        k = state["k"]
        if k == 0:  # a 300-character id, then the answer
            if n == 0:
                return raw_tool_calls([{"id": "c" * 300, "type": "function",
                                        "function": _fn("list_db", {})}])
            return tool_calls(("return_answer", {"answer": "Apple"}))
        if k == 1:  # arguments nested 100,000 deep
            if n == 0:
                return tool_calls(("query_db", "[" * 100_000 + "]" * 100_000))
            return tool_calls(("return_answer", {"answer": "Facebook"}))
        if k == 2:  # a lone surrogate in the reply text
            return message("Facebook \ud800")
        return tool_calls(("return_answer", '{"answer": "Facebook \\ud800"}'))

    state: dict = {}
    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(responder) as srv:
        out = run_batch(root, "crash", stocks_uri, model(srv), [[STOCKS_Q, t] for t in range(4)])
    reasons = {t: r["terminate_reason"] for t, r in out["trials"].items()}
    assert reasons == {0: "return_answer", 1: "return_answer", 2: "no_tool_call",
                       3: "return_answer"}
    verdicts = {t: r["verdict"] for t, r in out["scores"].items()}
    assert verdicts == {0: "incorrect", 1: "correct", 2: "correct", 3: "correct"}
    assert out["summary"]["errored"] == 0
    assert out["trials"][3]["answer"] == "Facebook \ufffd"


# -- M1: infrastructure failures are errored, not incorrect --------------------------------------


@pytest.mark.slow
def test_wall_time_used_up_waiting_for_the_model_is_errored(tmp_path, stocks_uri, model):
    """M1: an endpoint that hangs past the trial's wall time, and a 429 whose Retry-After is
    longer than the wall time left, used to end the trial ``max_wall_time`` (scored incorrect,
    FM5). The wait was for the API, so the trial is errored (``api_error``) with a reason
    saying so; the agent's own use of the wall time stays ``max_wall_time``."""

    def responder(body, index):
        if _turns(body) == 0:
            state["k"] = state.get("k", -1) + 1
        k = state["k"]
        if k == 0:
            return delay(4, message("late"))
        if k == 1:
            return error(429, retry_after=30)
        if _turns(body) == 0:  # the agent spends its own wall time in a cell
            return tool_calls(("execute_python", {"code": "import time; time.sleep(5)"}))
        return tool_calls(("return_answer", {"answer": "Facebook"}))

    state: dict = {}
    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(responder) as srv:
        out = run_batch(root, "wall", stocks_uri, model(srv), [[STOCKS_Q, t] for t in range(3)],
                        options={"max_wall_time_s": 1.5, "max_retries": 5})
    t = out["trials"]
    assert [t[i]["terminate_reason"] for i in range(3)] == ["api_error", "api_error",
                                                             "max_wall_time"]
    assert [out["scores"][i]["verdict"] for i in range(3)] == ["errored", "errored", "incorrect"]
    assert "wall time ran out" in t[0]["error"] and "timed out" in t[0]["error"]
    assert "Retry-After 30" in t[1]["error"] and "--retry-errors" in t[1]["error"]
    assert t[1]["latency_s"] < 3  # it did not sleep 30 s for nothing


def test_database_server_failure_mid_trial_is_errored(tmp_path, movies_uri, model,
                                                      pg_server_url, movies_manifest):
    """M1: the PostgreSQL server dropping the agent's connection mid-trial (terminated by an
    administrator, then refusing connections) used to be shown to the model as a query error
    ("server closed the connection unexpectedly") and the trial scored incorrect (FM3). It is
    an infrastructure failure: the trial is errored and says why. A connection dropped while
    idle is replaced once, transparently (the server is back): that trial is scored."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from tasks.db.engines import _physical_name

    dbname = _physical_name(movies_manifest, "boxoffice")
    admin = make_conninfo(**{**conninfo_to_dict(pg_server_url), "dbname": "postgres"})

    def kill_agents(block: bool) -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            if block:
                conn.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                         "datname = %s AND pid <> pg_backend_pid()", (dbname,))

    query = ("query_db", {"db": "boxoffice", "query": "SELECT count(*) AS n FROM revenue"})

    def responder(body, index):
        n = _turns(body)
        if n == 0:
            state["k"] = state.get("k", -1) + 1
            return tool_calls(query)
        if n == 1:  # the first query answered; now the server goes away
            kill_agents(block=state["k"] == 0)
            return tool_calls(query)
        return tool_calls(("return_answer", {"answer": "I could not query the database."}))

    state: dict = {}
    root = str(tmp_path / "art")
    try:
        with ScriptedOpenAIServer(responder) as srv:
            agent = model(srv)
            out = run_batch(root, "pg-down", movies_uri, agent, [[MOVIES_Q, 0]], score=False)
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
            back = run_batch(root, "pg-back", movies_uri, agent, [[MOVIES_Q, 1]], key="c",
                             score=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
    t = out["trials"][0]
    assert t["terminate_reason"] == "error", t
    assert t["error"].startswith("database unavailable (query_db)"), t["error"]
    assert "not currently accepting connections" in t["error"]
    # the model never saw the failure as a query result to be scored on
    shown = out["messages"].filter(pl.col("role") == "tool")["content"].to_list()
    assert "database unavailable" in shown[-1] and len(shown) == 2
    assert back["trials"][1]["terminate_reason"] == "return_answer"  # reconnected once


@pytest.mark.slow
def test_sandbox_failure_is_errored_but_a_full_work_directory_is_the_agents(
        tmp_path, stocks_uri, model, monkeypatch):
    """M1: the sandbox itself failing (its session process killed under the trial) used to
    come back to the model as "execute_python could not run" and the trial was scored. It is
    infrastructure: errored. A cell that fills its own work directory stays a tool error."""
    from tasks.agents.tools import ToolBox

    sessions = []
    real = ToolBox.python_session

    def spy(self):
        s = real(self)
        sessions.append(s)
        return s

    monkeypatch.setattr(ToolBox, "python_session", spy)
    fill = ("with open('big', 'wb') as f:\n    f.write(b'x' * (40 << 20))\n"
            "with open('big2', 'wb') as f:\n    f.write(b'x' * (40 << 20))")

    def responder(body, index):
        n = _turns(body)
        if n == 0:
            state["k"] = state.get("k", -1) + 1
            return tool_calls(("execute_python", {"code": "print(1)" if state["k"] == 0
                                                  else fill}))
        if n == 1 and state["k"] == 0:  # the sandbox session dies under the trial
            os.kill(sessions[-1].pid, signal.SIGKILL)
            return tool_calls(("execute_python", {"code": "print(2)"}))
        return tool_calls(("return_answer", {"answer": "Facebook"}))

    state: dict = {}
    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(responder) as srv:
        out = run_batch(root, "sbx", stocks_uri, model(srv), [[STOCKS_Q, 0], [STOCKS_Q, 1]],
                        options={"python_disk_mb": 64})
    t = out["trials"]
    assert t[0]["terminate_reason"] == "error" and "sandbox unavailable" in t[0]["error"], t[0]
    assert out["scores"][0]["verdict"] == "errored"
    assert t[1]["terminate_reason"] == "return_answer" and out["scores"][1]["verdict"] == "correct"
    full = out["messages"].filter(pl.col("role") == "tool", pl.col("trial_key").str.ends_with("|1"))
    assert "No space left" in full["content"][0] or "work directory" in full["content"][0]


@pytest.mark.slow
def test_a_cell_in_the_way_of_a_stored_variable_is_the_agents_not_an_errored_trial(
        tmp_path, stocks_uri, model):
    """QA adversary: a cell planted a directory at ``vars/var_q1.json`` and the next
    ``query_db`` (call id ``q1``) failed to store its rows: a harness error, so the trial was
    errored and left out of the score — a failing trial opted out. Now it is the agent's: the
    rows come back with ``variable_not_saved`` and the trial goes on to be scored."""
    from tests.fakes.openai_server import raw_tool_calls

    def responder(body, index):
        n = _turns(body)
        if n == 0:
            return tool_calls(("execute_python", {
                "code": "import os\nos.makedirs('vars/var_q1.json/x')\nprint('planted')"}))
        if n == 1:
            return raw_tool_calls([{"id": "q1", "type": "function", "function": {
                "name": "query_db", "arguments": json.dumps(
                    {"db": "listings", "query": "SELECT count(*) AS n FROM listings"})}}])
        return tool_calls(("return_answer", {"answer": "IBM"}))

    with ScriptedOpenAIServer(responder) as srv:
        out = run_batch(str(tmp_path / "art"), "inway", stocks_uri, model(srv), [[STOCKS_Q, 0]])
    t = out["trials"][0]
    assert t["terminate_reason"] == "return_answer", t
    assert out["scores"][0]["verdict"] == "incorrect"  # scored, not errored
    tool = out["messages"].filter(pl.col("role") == "tool")["content"].to_list()
    shown = json.loads(tool[1])
    assert shown["row_count"] == 1 and shown["variable"] is None, shown
    assert "Is a directory" in shown["variable_not_saved"] or "directory" in \
        shown["variable_not_saved"], shown


@pytest.mark.slow
def test_a_cell_cannot_errored_its_trial_through_the_work_directory_or_the_audit_pipe(
        tmp_path, stocks_uri, model):
    """QA adversary re-check: ``chmod('.', 0)`` made every later cell fail to start (a sandbox
    failure: errored, unscored), and a lone surrogate written to the cell's audit pipe failed
    the whole batch's Parquet write. Both trials now run to their answer and are scored."""
    audit = ("import os, stat\n"
             "for f in os.listdir('/proc/self/fd'):\n"
             "    f = int(f)\n"
             "    try:\n"
             "        if f > 2 and stat.S_ISFIFO(os.fstat(f).st_mode):\n"
             "            os.write(f, b'{\"e\": \"open\", \"p\": \"/x\\\\ud800\"}\\n')\n"
             "    except OSError:\n"
             "        pass\n"
             "print('wrote')")
    first = {0: "import os\nos.chmod('.', 0)\nprint('locked')", 1: audit}

    def responder(body, index):
        n = _turns(body)
        if n == 0:  # the batch runs its trials one after another: trial 0, then trial 1
            code = first[0] if state.setdefault("k", 0) == 0 else first[1]
            state["k"] += 1
            return tool_calls(("execute_python", {"code": code}))
        if n == 1:
            return tool_calls(("execute_python", {"code": "print(6 * 7)"}))
        return tool_calls(("return_answer", {"answer": "IBM"}))

    state: dict = {}
    with ScriptedOpenAIServer(responder) as srv:
        out = run_batch(str(tmp_path / "art"), "lock", stocks_uri, model(srv),
                        [[STOCKS_Q, 0], [STOCKS_Q, 1]])
    for t in out["trials"].values():
        assert t["terminate_reason"] == "return_answer", t
    assert [out["scores"][i]["verdict"] for i in (0, 1)] == ["incorrect", "incorrect"]
    tools = out["messages"].filter(pl.col("role") == "tool")
    assert sum("42" in c for c in tools["content"].to_list()) == 2, tools["content"].to_list()


# -- C1, C2, C3: the answer key is out of reach, and attempts are seen at run time -------------


def _flags(root: str, run_id: str) -> dict[int, set[str]]:
    audit = pl.read_parquet(storage.join(root, "runs", run_id, "score", "audit.parquet"))
    out: dict[int, set[str]] = {}
    for row in audit.iter_rows(named=True):
        out.setdefault(int(row["trial_key"].rsplit("|", 1)[1]), set()).add(row["check"])
    return out


def test_postgres_read_of_the_answer_key_is_refused_and_flagged(tmp_path, movies_uri, model):
    """C1 (VERIFY) and C3: the QA's stealth query — ``U&"pg\\005fread\\005ffile"`` of
    ``'scor' || 'ing.json'`` with the ground truth cut out by a regular expression — used to
    return the ground truth (agents were superusers) with zero audit findings. It is refused
    (by the parser, which now reads U& names as the engine does, and by the engine: a
    SELECT-only role), ``rolsuper`` is false, and the audit flags the file function and the
    answer-key name however they are spelled."""
    scoring_dir = movies_uri[: -len("manifest.json")]
    steal = ("SELECT substring(U&\"pg\\005fread\\005ffile\"('" + scoring_dir + "scor' || "
             "'ing.json') from 'spielberg_box_office\": \\{\\s*\"ground_tr' || 'uth\": "
             "([0-9.]+)') AS total")
    who = ("SELECT current_user AS u, (SELECT rolsuper FROM pg_roles WHERE rolname = "
           "current_user) AS su")

    def responder(body, index):
        n = _turns(body)
        if n == 0:
            return tool_calls(("query_db", {"db": "boxoffice", "query": steal}))
        if n == 1:
            return tool_calls(("query_db", {"db": "boxoffice", "query": who}))
        return tool_calls(("return_answer", {"answer": "unknown"}))

    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(responder) as srv:
        out = run_batch(root, "pg-steal", movies_uri, model(srv), [[MOVIES_Q, 0]])
    tools = out["messages"].filter(pl.col("role") == "tool")["content"].to_list()
    assert "not allowed" in tools[0] or "permission denied" in tools[0], tools[0]
    assert json.loads(tools[1])["preview"][0]["su"] is False
    assert out["scores"][0]["verdict"] == "incorrect"
    assert {"path_outside_workdir", "answer_key_access"} <= _flags(root, "pg-steal")[0]
    # the engine alone refuses it too (the parser check is the second layer)
    from schemas.settings import Settings
    from tasks.db.engines import open_database

    db = open_database(storage.read_json(movies_uri), "boxoffice", Settings.from_env())
    from tasks.db.databases import QueryError

    with pytest.raises(QueryError, match="permission denied"):
        db._execute(steal, 10)


@pytest.mark.slow
def test_a_cell_cannot_read_or_forge_the_scoring_file_and_is_seen_doing_it(
        tmp_path, stocks_uri, model, settings):
    """C2 (VERIFY) and C3: the QA's cells walked the artifact root (a path built from
    ``os.sep`` pieces), read ``scoring.json`` (named ``'scor' + 'ing.json'``) and rewrote it with
    a forged ground truth, and planted a file under the artifact root — with zero audit
    findings. The sealed sandbox shows none of it (the scoring file is unchanged, nothing is
    planted); the run-time audit hook reports the walk and the read attempts, so the trial is
    flagged ``runtime_path_access`` and ``answer_key_access`` though its code names no path."""
    import hashlib

    scoring = stocks_uri[: -len("manifest.json")] + "scoring.json"
    before = hashlib.sha256(open(scoring, "rb").read()).hexdigest()
    parts = [p for p in settings.artifacts.split("/") if p]
    forge = ("import os, json\nroot = os.sep + os.path.join(" + ", ".join(map(repr, parts)) + ")\n"
             "found = 0\nfor d, _, fs in os.walk(root):\n    for f in fs:\n"
             "        if f.startswith('scor') and f.endswith('.json'):\n"
             "            p = os.path.join(d, f); s = json.load(open(p))\n"
             "            s['queries']['nyse_drawdown_2008']['ground' + '_truth'] = 12.3\n"
             "            json.dump(s, open(p, 'w')); found += 1\n"
             "try:\n    open(os.path.join(root, 'PWNED_BY_CELL'), 'w').write('x')\n"
             "except OSError as e:\n    print('blocked:', type(e).__name__)\n"
             "try:\n    open(os.sep.join(['', 'srv', 'scor' + 'ing.json']))\n"
             "except OSError:\n    pass\nprint('found', found)")

    def responder(body, index):
        if _turns(body) == 0:
            return tool_calls(("execute_python", {"code": forge}))
        return tool_calls(("return_answer", {"answer": "12.3"}))

    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(responder) as srv:
        out = run_batch(root, "forge", stocks_uri, model(srv), [["nyse_drawdown_2008", 0]])
    shown = json.loads(out["messages"].filter(pl.col("role") == "tool")["content"][0])
    assert "found 0" in shown["stdout"] and "blocked" in shown["stdout"]
    assert hashlib.sha256(open(scoring, "rb").read()).hexdigest() == before
    assert not os.path.exists(os.path.join(settings.artifacts, "PWNED_BY_CELL"))
    assert out["scores"][0]["verdict"] == "incorrect"
    flags = _flags(root, "forge")[0]
    assert {"runtime_path_access", "answer_key_access"} <= flags, flags
    events = json.loads(out["messages"].filter(pl.col("role") == "tool")["runtime_events"][0])
    walked = [e for e in events if e["e"] == "os.scandir"]
    assert walked and walked[0]["p"] == settings.artifacts.rstrip("/") and not walked[0]["x"]
    assert any(e["e"] == "open" and e["p"].endswith("/srv/scoring.json") for e in events)
    audit = pl.read_parquet(storage.join(root, "runs", "forge", "score", "audit.parquet"))
    assert audit.filter(pl.col("check") == "runtime_path_access")["evidence"][0].startswith(
        "at run time: os.scandir")


@pytest.mark.slow
def test_network_and_process_attempts_are_seen_at_run_time(tmp_path, stocks_uri, model):
    """C3: a cell that hides its network and process use behind ``__import__`` and
    ``getattr`` (no ``import socket`` for the text rules to see) is flagged from what it did."""
    code = ("s = __import__('so' + 'cket')\ntry:\n    s.create_connection(('10.1.2.3', 80), 0.2)\n"
            "except OSError:\n    pass\nsp = __import__('sub' + 'process')\n"
            "getattr(sp, 'run')(['true'])\nprint('done')")

    def responder(body, index):
        if _turns(body) == 0:
            return tool_calls(("execute_python", {"code": code}))
        return tool_calls(("return_answer", {"answer": "Facebook"}))

    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(responder) as srv:
        run_batch(root, "net", stocks_uri, model(srv), [[STOCKS_Q, 0]])
    flags = _flags(root, "net")[0]
    assert {"runtime_network", "runtime_process"} <= flags, flags
    assert "network_attempt" not in flags  # the text rules alone would have missed it


# -- C5: shotgun answers -------------------------------------------------------------------------


@pytest.mark.slow
def test_shotgun_answers_are_wrong_and_flagged(tmp_path, stocks_uri, model):
    """C5: "Candidates: 0.0 0.5 … 100.0" used to be correct for a number query (one of them
    was within the tolerance) and "Apple, Facebook, Google, IBM, Microsoft" for a which-company
    query (the right one is among them). Both are wrong now, with a reason, and flagged; a
    plain answer that mentions the question's own year still passes."""
    shotgun = "Candidates: " + " ".join(f"{x / 2:.1f}" for x in range(201))
    answers = {"apple_2005_volatility": [shotgun, "Apple's 2005 volatility was 38.76%."],
               STOCKS_Q: ["Apple, Facebook, Google, IBM, Microsoft", "Facebook"]}

    def responder(body, index):
        if _turns(body) == 0:
            state["k"] = state.get("k", -1) + 1
        qid, t = state["plan"][state["k"]]
        return tool_calls(("return_answer", {"answer": answers[qid][t]}))

    state: dict = {"plan": [(q, t) for q in answers for t in (0, 1)]}
    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(responder) as srv:
        agent = model(srv)
        for i, qid in enumerate(answers):
            run_batch(root, "shotgun", stocks_uri, agent, [[qid, 0], [qid, 1]], key=f"b{i}",
                      score=False)
    combine_trials.fn("shotgun", root, ["b0", "b1"])
    summary = score_run("shotgun", root)
    scores = {(r["query_id"], r["trial"]): r
              for r in pl.read_parquet(summary["scores"]).iter_rows(named=True)}
    vol, nasdaq = scores[("apple_2005_volatility", 0)], scores[(STOCKS_Q, 0)]
    assert vol["verdict"] == "incorrect" and "200 candidate numbers" in vol["reason"]  # 1 is in the question
    assert nasdaq["verdict"] == "incorrect" and "4 other option(s)" in nasdaq["reason"]
    assert scores[("apple_2005_volatility", 1)]["verdict"] == "correct"
    assert scores[(STOCKS_Q, 1)]["verdict"] == "correct"
    audit = pl.read_parquet(summary["audit"]).filter(pl.col("check") == "shotgun_answer")
    assert sorted(k.split("|")[2] for k in audit["trial_key"]) == sorted(
        ["apple_2005_volatility", STOCKS_Q])


def test_thousands_separators_need_groups_of_three():
    """C5: "1,24" was read as 124 (correct for a truth of 124); separators now need groups
    of three, so it reads as 1 and 24."""
    from tasks.scoring.validate import check_answer, numbers_in

    v = {"kind": "number", "decimals": 0}
    assert numbers_in("1,24") == [1, 24] and numbers_in("9,090,303,780") == [9090303780]
    assert numbers_in("1,2345 and 12,345.5") == [1, 2345, 12345.5]
    assert not check_answer("1,24", 124.0, v).ok and check_answer("124", 124.0, v).ok
    assert check_answer("1,240 films", 1240.0, v).ok
    # per query: max_candidates; the question's own numbers are not candidates
    lots = "In 2005: 1, 2, 3, 38.8"
    assert check_answer(lots, 38.76, {"kind": "number", "decimals": 1},
                        "In 2005, round to 1 decimal").ok
    assert not check_answer(lots, 38.76, {"kind": "number", "decimals": 1}).ok
    assert not check_answer(lots, 38.76, {"kind": "number", "decimals": 1, "max_candidates": 2},
                            "In 2005, round to 1 decimal").ok


# -- tamper-evident scoring; rescore after a spec fix (newcomer High 2, Medium 3) ----------------


@pytest.fixture
def own_stocks(tmp_path, settings):
    """stocks built into an artifact root of the test's own (its scoring may be changed)."""
    from tasks.datasets.build import build_dataset_artifacts
    from tasks.db.engines import ensure_loaded
    from tasks.datasets.spec import spec_path

    root = str(tmp_path / "own")
    uri = build_dataset_artifacts.fn(str(spec_path("stocks")), root)
    manifest = storage.read_json(uri)
    for db in manifest["databases"]:
        ensure_loaded(manifest, db, settings)
    return root, uri


def _spec_copy(tmp_path, edit) -> str:
    """A copy of data/stocks.yaml (with its CSV) changed by ``edit(text) -> text``."""
    import shutil

    from tasks.datasets.spec import DATA_DIR

    d = tmp_path / f"spec{len(list(tmp_path.glob('spec*')))}"
    d.mkdir()
    shutil.copy(DATA_DIR / "stocks_companies.csv", d)
    (d / "stocks.yaml").write_text(edit((DATA_DIR / "stocks.yaml").read_text()))
    return d / "stocks.yaml"


@pytest.mark.slow
def test_scoring_is_tamper_evident_and_rescore_follows_the_spec(tmp_path, own_stocks, model,
                                                                monkeypatch, capsys):
    """C2 follow-up and newcomer High 2 / Medium 3. The manifest records the scoring file's
    digest at build time: a hand-edited (or forged) scoring.json is refused at score time
    instead of silently changing this run and every later one. A spec fix is the way: with
    the data version unchanged `querylab rescore` re-derives the ground truth from the
    canonical tables, says what it used and what changed, and records the new digest; an
    earlier run keeps showing the scoring it was decided on. A changed data version is a
    one-line refusal that writes nothing (the run is not marked failed)."""
    import tasks.datasets.spec
    from querylab.cli import main
    from tasks.core import runs
    from tasks.scoring.scoring_file import load_scoring, pinned_scoring_uri, scoring_uri
    from tasks.report.viewer import viewer_data
    from tests.helpers import fixed_ground_truth

    root, uri = own_stocks
    runs.record_benchmark(root, "spec-fix", {"datasets": ["stocks"], "agents": ["oracle"]})
    state: dict = {}

    def responder(body, index):
        if _turns(body) == 0:
            state.setdefault("k", []).append(1)
        return tool_calls(("return_answer", {"answer": "Facebook" if len(state["k"]) % 2
                                              else "Apple"}))

    with ScriptedOpenAIServer(responder) as srv:
        agent = model(srv)
        run_batch(root, "spec-fix", uri, agent, [[STOCKS_Q, 0], [STOCKS_Q, 1]])
        run_batch(root, "older", uri, agent, [[STOCKS_Q, 0]], key="o")
    capsys.readouterr()
    digest = storage.read_json(uri)["scoring_digest"]

    # hand-editing the scoring file: refused, one line, nothing recorded as failed
    original = storage.read_bytes(scoring_uri(uri))
    forged = storage.read_json(scoring_uri(uri))
    forged["queries"][STOCKS_Q]["ground_truth"] = ["Apple"]
    storage.write_json(scoring_uri(uri), forged)
    assert main(["rescore", "--run-id", "spec-fix", "--artifacts", root]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "edited by hand or tampered with" in err[0], err
    assert runs.stage_status(root, "spec-fix", "score") is None  # nothing recorded
    with pytest.raises(Exception, match="tampered"):
        score_run("spec-fix", root)
    storage.write_bytes(scoring_uri(uri), original)

    # a spec fix with the same data version: re-derived, reported, recorded
    fixed = _spec_copy(tmp_path, lambda t: fixed_ground_truth(t, STOCKS_Q, "SELECT 'Apple'"))
    real = tasks.datasets.spec.spec_path
    monkeypatch.setattr(tasks.datasets.spec, "spec_path", lambda n: fixed if n == "stocks" else real(n))
    assert main(["rescore", "--run-id", "spec-fix", "--artifacts", root]) == 0
    out = capsys.readouterr().out
    assert "2 verdict(s) changed" in out
    assert f"re-derived from {fixed}: {digest} -> " in out and "1 query(ies) changed" in out
    assert f'{STOCKS_Q}: ground_truth ["Facebook"] -> ["Apple"]' in out
    new = storage.read_json(uri)["scoring_digest"]
    assert new != digest and runs.score_summary(root, "spec-fix")["scoring"] == {"stocks": new}
    assert load_scoring(uri)["queries"][STOCKS_Q]["ground_truth"] == ["Apple"]
    assert storage.exists(pinned_scoring_uri(uri, digest))  # the old scoring is kept
    # the older run was scored with the old digest: its viewer still shows that ground truth
    assert runs.score_summary(root, "older")["scoring"] == {"stocks": digest}
    shown = viewer_data("older", root)["trials"][0]
    assert shown["ground_truth"] == "Facebook" and shown["verdict"] == "correct"

    # a changed data version (a question edited): refused before anything is written
    moved = _spec_copy(tmp_path, lambda t: t.replace("which had the highest average daily",
                                                     "which had the largest average daily"))
    monkeypatch.setattr(tasks.datasets.spec, "spec_path", lambda n: moved if n == "stocks" else real(n))
    before = runs.stage_status(root, "spec-fix", "score")
    assert main(["rescore", "--run-id", "spec-fix", "--artifacts", root]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ran on data version" in err[0] and "now gives" in err[0], err
    after = runs.stage_status(root, "spec-fix", "score")
    assert (after.status, after.attempt) == (before.status, before.attempt) == ("completed", 1)
    assert runs.list_runs(root)[0]["status"] != "failed"
    # --scoring recorded: the scoring files as they are (no spec involved)
    assert main(["rescore", "--run-id", "spec-fix", "--artifacts", root, "--scoring",
                 "recorded"]) == 0
    assert "its recorded scoring file: unchanged" in capsys.readouterr().out
