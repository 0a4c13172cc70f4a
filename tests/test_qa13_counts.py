"""The QA findings on issue 13 about what a run reports and how it exits (M2 cost, M3 exit
codes, M5 pass@k counts, the minor list), each replayed through the real CLI / ReAct loop over
real HTTP against the scripted OpenAI-compatible server. The reports are
/work/team/qa/issue13-reports.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

from tasks.core import storage
from tests.fakes.openai_server import (
    ScriptedOpenAIServer,
    error,
    is_preflight,
    message,
    tool_calls,
)


def _down(body, index):
    """Preflight passes, every trial request fails (HTTP 500)."""
    if is_preflight(body):
        return message("OK")
    return error(500, "scripted outage")


# -- M3 / Minor 7: exit codes follow the errored share of each agent ---------------------------


def test_errored_share_is_per_agent_and_every_command_exits_by_it(prefect_harness, tmp_path,
                                                                  model, capsys):
    """An agent whose every trial errored fails the run even when an oracle's trials bring the
    run's overall share down to the allowed one; ``rerun`` of the finished run and ``rerun
    --stage report`` exit 1 too, and ``runs`` lists the run as errored, not completed."""
    from querylab.cli import main

    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(_down) as srv:
        agent = model(srv)
        argv = ["run", "--dataset", "stocks", "--agent", "oracle", "--agent", agent,
                "--trials", "1", "--limit", "2", "--run-id", "half-down", "--artifacts", root,
                "--max-retries", "0", "--max-error-share", "0.5"]
        assert main(argv) == 1  # 2 of 4 trials overall (0.5), but 2 of 2 of the agent's
        err = capsys.readouterr().err
        assert f"{agent}: 2 of 2 (100.0%)" in err and "--retry-errors" in err
        assert main(["rerun", "--run-id", "half-down", "--artifacts", root]) == 1
        captured = capsys.readouterr()
        assert "every stage has completed" in captured.out
        assert "2 of 4 trials errored" in captured.err
        assert main(["rerun", "--run-id", "half-down", "--stage", "report",
                     "--artifacts", root]) == 1
        assert "2 of 4 trials errored" in capsys.readouterr().err
        # allowing every trial to error is a choice the user makes explicitly
        assert main(["rerun", "--run-id", "half-down", "--stage", "report",
                     "--artifacts", root, "--max-error-share", "1"]) == 0
        capsys.readouterr()
        assert main(["runs", "--artifacts", root, "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert [r["status"] for r in listed if r["run_id"] == "half-down"] == ["errored"]
        assert main(["runs", "--artifacts", root]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("half-down"))
        assert "errored" in line and "completed" not in line


# -- M2: every paid call stays in the totals -----------------------------------------------------

#: USD of one scripted response (DEFAULT_USAGE: 10 prompt, 5 completion tokens) at the
#: scripted model's prices (input $1, output $4 per million tokens).
UNIT = (10 * 1.0 + 5 * 4.0) / 1e6


def _three_turns(state: dict):
    """list_db, then query_db (HTTP 500 while ``state["down"]``), then return_answer;
    counts the successful (paid) trial responses in ``state["paid"]``."""

    def responder(body, index):
        if is_preflight(body):
            return message("OK")
        n = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if n == 1 and state["down"]:
            return error(500, "scripted outage")
        state["paid"] += 1
        if n == 0:
            return tool_calls(("list_db", {}))
        if n == 1:
            return tool_calls(("query_db", {"db": "listings",
                                            "query": "SELECT count(*) AS n FROM listings"}))
        return tool_calls(("return_answer", {"answer": "Facebook"}))

    return responder


def test_retried_trials_keep_the_calls_they_paid_and_preflight_is_counted(
        prefect_harness, tmp_path, model, capsys):
    """A trial errored on its second call is retried after recovery: its first call is
    answered from the response cache ($0, no request) but the cost paid for it the first time
    stays in the totals; the preflight requests are recorded and in the report's total, which
    equals what the endpoint was asked for."""
    from querylab.cli import main

    state = {"down": True, "paid": 0}
    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(_three_turns(state)) as srv:
        agent = model(srv)
        assert main(["run", "--dataset", "stocks", "--agent", agent, "--trials", "1",
                     "--limit", "1", "--run-id", "paid", "--artifacts", root,
                     "--max-retries", "0"]) == 1
        state["down"] = False
        assert main(["rerun", "--run-id", "paid", "--retry-errors", "--artifacts", root]) == 0
        out = capsys.readouterr().out
        preflights = srv.preflight_count
        trial_requests = srv.trial_request_count
    assert preflights == 2 and trial_requests == 4  # 2 + (1 cached, 2 new)
    assert state["paid"] == 3
    calls = pl.read_parquet(storage.join(root, "runs", "paid", "trials", "llm_calls.parquet"))
    sent = calls.filter(~pl.col("cache_hit"))
    assert int(sent["attempts"].sum()) == trial_requests  # every request has its row
    assert calls["cost_usd"].sum() == pytest.approx(3 * UNIT)
    assert sorted(calls["trial_attempt"].to_list()) == [0, 0, 1, 1, 1]
    cost = pl.read_parquet(storage.join(root, "runs", "paid", "report", "cost.parquet"))
    all_row = cost.filter(pl.col("agent") == agent, pl.col("dataset") == "ALL")
    assert all_row["cost_usd"][0] == pytest.approx(3 * UNIT)  # was 2 units: the first lost
    checks = json.loads(storage.read_bytes(storage.join(root, "runs", "paid",
                                                        "preflight.json")))
    assert [c["requests"] for c in checks] == [1, 1]
    assert sum(c["cost_usd"] for c in checks) == pytest.approx(2 * UNIT)
    md = (tmp_path / "art" / "runs" / "paid" / "report" / "report.md").read_text()
    assert f"Paid in all: ${5 * UNIT:.6f}" in md and "2 preflight request(s)" in md
    assert "report" in out


def test_a_harness_failure_after_a_paid_response_keeps_the_call(tmp_path, monkeypatch, model,
                                                                stocks_uri):
    """The response cache cannot be written (a full disk) after the second response arrived:
    the trial is errored (querylab's side), and keeps both paid calls and its transcript."""
    from tasks.core.llm import ResponseCache
    from tests.helpers import run_batch

    real_put = ResponseCache.put
    puts = {"n": 0}

    def put(self, key, entry):
        puts["n"] += 1
        if puts["n"] == 2:
            raise OSError(28, "No space left on device")
        return real_put(self, key, entry)

    monkeypatch.setattr(ResponseCache, "put", put)
    state = {"down": False, "paid": 0}
    with ScriptedOpenAIServer(_three_turns(state)) as srv:
        out = run_batch(str(tmp_path / "art"), "full", stocks_uri, model(srv),
                        [["nasdaq_top_volume_2012", 0]], score=False)
        requests = srv.trial_request_count
    trial = out["trials"][0]
    assert trial["terminate_reason"] == "error" and "No space left" in trial["error"]
    assert requests == 2 and out["llm_calls"].height == 2
    assert trial["n_llm_calls"] == 2
    assert out["llm_calls"]["cost_usd"].sum() == pytest.approx(2 * UNIT)
    assert trial["cost_usd"] == pytest.approx(2 * UNIT)
    assert out["messages"].filter(pl.col("role") == "assistant").height >= 1


def test_a_trial_interrupted_mid_way_keeps_its_paid_calls_on_resume(tmp_path, monkeypatch,
                                                                    model, stocks_uri):
    """The process is interrupted (as by a kill) after the first model call of a trial; on
    resume the call is a $0 cache hit, but the cost paid before the interruption is kept."""
    from tasks.agents.tools import ToolBox
    from tests.helpers import run_batch

    real_call = ToolBox.call
    state = {"down": False, "paid": 0, "interrupt": True}

    def call(self, name, args, cid):
        if state["interrupt"]:
            raise KeyboardInterrupt  # not an Exception: the batch stops, nothing recorded
        return real_call(self, name, args, cid)

    monkeypatch.setattr(ToolBox, "call", call)
    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(_three_turns(state)) as srv:
        with pytest.raises(KeyboardInterrupt):
            run_batch(root, "killed", stocks_uri, model(srv), [["nasdaq_top_volume_2012", 0]],
                      score=False)
        state["interrupt"] = False
        out = run_batch(root, "killed", stocks_uri, model(srv), [["nasdaq_top_volume_2012", 0]],
                        score=False)
        requests = srv.trial_request_count
    assert requests == 3 and state["paid"] == 3  # 1 before the kill, 2 after (1 cached)
    calls = out["llm_calls"]
    assert calls.filter(~pl.col("cache_hit")).height == 3
    assert calls["cost_usd"].sum() == pytest.approx(3 * UNIT)
    assert out["trials"][0]["cost_usd"] == pytest.approx(3 * UNIT)
    assert out["trials"][0]["terminate_reason"] == "return_answer"


# -- M5: pass@k says how many queries each mean is over -----------------------------------------


@pytest.mark.slow
def test_pass_at_k_counts_the_queries_left_out(tmp_path, model, stocks_uri, capsys):
    """Two trials per query: one query loses one trial to a 500 (too few for pass@2), one
    loses both (no scored trial), one has both. pass@2 is over one query and the table says
    so; the all-errored query is counted, not dropped from ALL."""
    from querylab.cmd_report import print_report, with_run_details
    from tests.helpers import run_batch

    fail = {"apple_2005_volatility": {1}, "best_it_return_2010": {0, 1}}  # trial indices
    ids = ["apple_2005_volatility", "best_it_return_2010", "nasdaq_top_volume_2012"]
    questions = {q["question"]: q["id"] for q in
                 json.loads(storage.read_bytes(stocks_uri))["queries"] if q["id"] in ids}
    seen: dict[str, int] = {}  # query id → conversations started

    def responder(body, index):
        if is_preflight(body):
            return message("OK")
        prompt = body["messages"][1]["content"]  # the question inside the user prompt
        qid = next(v for k, v in questions.items() if k in prompt)
        if len(body["messages"]) == 2:
            seen[qid] = seen.get(qid, -1) + 1
        if seen[qid] in fail.get(qid, ()):
            return error(500, "scripted outage")
        return tool_calls(("return_answer", {"answer": "Facebook"}))

    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(responder) as srv:
        run_batch(root, "few", stocks_uri, model(srv), [[q, t] for q in ids for t in (0, 1)],
                  options={"max_retries": 0})
    scores = pl.read_parquet(storage.join(root, "runs", "few", "score", "scores.parquet"))
    assert (scores["verdict"] == "errored").sum() == 3
    summary = pl.read_parquet(storage.join(root, "runs", "few", "report",
                                           "pass_at_k_summary.parquet"))
    overall = {r["k"]: r for r in summary.filter(pl.col("dataset") == "ALL (queries)")
               .iter_rows(named=True)}
    assert (overall[1]["queries"], overall[1]["queries_short"],
            overall[1]["queries_errored"]) == (2, 0, 1)
    assert (overall[2]["queries"], overall[2]["queries_short"],
            overall[2]["queries_errored"]) == (1, 1, 1)
    assert overall[1]["n_errored"] == 3
    md = (tmp_path / "art" / "runs" / "few" / "report" / "report.md").read_text()
    assert "### Queries behind each pass@k" in md
    assert "| queries | all errored | pass@1 over | pass@2 over |" in md
    from tasks.report.stage import report_run

    rep = report_run("few", root)
    print_report(with_run_details(rep, root, "few"))
    printed = capsys.readouterr().out
    assert "queries behind each pass@k" in printed and "pass@2 over" in printed



# -- Minor 1, 2: endpoint and model text cannot drive the terminal or the report ---------------

ANSI = "\x1b[2K\x1b[1A\r\x1b]0;owned\x07\x9b2Jgone\x08\x08"
HOSTILE_ANSWER = "<img src=x onerror=alert(1)> <script>alert(2)</script> [x](javascript:alert(3))"


@pytest.mark.slow
def test_endpoint_escapes_are_stripped_and_model_markup_is_escaped(tmp_path, model, stocks_uri,
                                                                   capsys):
    """A 500 whose message is ANSI/control codes (they could erase the "Errored trials" lines)
    reaches the terminal as plain text; a wrong answer made of HTML and a javascript: link is
    text in report.md, not markup."""
    from querylab.cmd_report import print_report, with_run_details
    from tasks.core.llm import ResolvedModel  # noqa: F401 - the preflight below uses the table model
    from tasks.core.llm import preflight, resolve_model
    from tests.helpers import run_batch

    def responder(body, index):
        if is_preflight(body):
            return error(401, f"bad key {ANSI}")
        prompt = body["messages"][1]["content"]
        if "2012" in prompt and "NASDAQ" in prompt:
            return error(500, f"upstream {ANSI} failed")
        return tool_calls(("return_answer", {"answer": HOSTILE_ANSWER}))

    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(responder) as srv:
        agent = model(srv)
        out = run_batch(root, "esc", stocks_uri, agent,
                        [["nasdaq_top_volume_2012", 0], ["apple_2005_volatility", 0]],
                        options={"max_retries": 0})
        check = preflight(resolve_model(agent.removeprefix("openai:")))
    trial = out["trials"]
    errored = [t for t in trial.values() if t["terminate_reason"] == "api_error"]
    assert errored and "\x1b" not in errored[0]["error"] and "upstream" in errored[0]["error"]
    assert not check.ok and "\x1b" not in check.problem and "\x07" not in check.problem
    from tasks.report.stage import report_run

    print_report(with_run_details(report_run("esc", root), root, "esc"))
    printed = capsys.readouterr().out
    assert "Errored trials" in printed and "upstream" in printed
    assert not any(c in printed for c in "\x1b\x07\x08\x9b\r")
    md = (tmp_path / "art" / "runs" / "esc" / "report" / "report.md").read_text()
    assert "onerror" in md  # the answer is shown ...
    assert "<img" not in md and "<script" not in md  # as text: no HTML, no link
    assert not re.search(r"(?<!\\)\]\(javascript:", md)
    assert "&lt;img src=x onerror=alert(1)&gt;" in md and "\\[x\\](javascript:alert(3))" in md


# -- Minor 4: judge responses are cached apart from agent responses -----------------------------


@pytest.mark.slow
def test_judge_responses_are_cached_in_their_own_namespace(tmp_path, capsys, monkeypatch):
    """`querylab report --judge-model`: the judge's prompts show the ground truth, so its
    responses go to cache/judge, never to cache/llm where agent responses are looked up."""
    from pathlib import Path

    from querylab.cli import main
    from tests.helpers import write_run

    root = str(tmp_path / "art")
    write_run(root, run_id="judged")
    verdict = message('{"failure_mode": "FM2", "rationale": "plan"}')
    with ScriptedOpenAIServer(lambda body, index: verdict) as srv:
        monkeypatch.setenv("QUERYLAB_OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("QUERYLAB_OPENAI_API_KEY", "test-key")
        assert main(["report", "--run-id", "judged", "--artifacts", root, "--judge-model",
                     "openai:judge", "--judge-limit", "2"]) == 0
        assert srv.request_count == 2
    capsys.readouterr()
    assert len(list(Path(root, "cache", "judge").rglob("*.json"))) == 2
    assert not list(Path(root, "cache", "llm").rglob("*.json"))


# -- Minor 5: a run answered wholly from an earlier run's cache says so --------------------------


@pytest.mark.slow
def test_a_new_run_answered_from_the_cache_is_warned_about(tmp_path, model, stocks_uri, capsys):
    """The same agent, endpoint and trial indices under a new run id make no request at all:
    the report and the terminal warn that the samples repeat the earlier run's; a retry inside
    one run (first paid, then a cache hit) is not warned about."""
    from querylab.cmd_report import print_report, with_run_details
    from tasks.report.stage import report_run
    from tests.helpers import run_batch

    root = str(tmp_path / "art")
    items = [["nasdaq_top_volume_2012", 0]]
    with ScriptedOpenAIServer(lambda body, index: tool_calls(
            ("return_answer", {"answer": "Facebook"}))) as srv:
        agent = model(srv)
        run_batch(root, "first", stocks_uri, agent, items)
        first = report_run("first", root)
        run_batch(root, "second", stocks_uri, agent, items)
        requests = srv.trial_request_count
    assert requests == 1  # the second run sent nothing
    assert not any(n.startswith("Warning:") for n in first["notes"])
    second = report_run("second", root)
    warned = [n for n in second["notes"] if n.startswith("Warning:")]
    assert len(warned) == 1 and f"{agent} made no request" in warned[0]
    md = (tmp_path / "art" / "runs" / "second" / "report" / "report.md").read_text()
    assert "made no request to its endpoint" in md
    capsys.readouterr()
    print_report(with_run_details(second, root, "second"))
    assert "warning: " + agent + " made no request" in capsys.readouterr().err


# -- Medium 4 and the CLI: a typo is one line; a closed pipe is quiet ----------------------------


@pytest.mark.parametrize("argv, expected", [
    (["run", "--agnet", "oracle"], "querylab run: unrecognized arguments: --agnet oracle; "
                                   "did you mean --agent?"),
    (["run", "--hints", "of"], "did you mean 'off'?"),
    (["stauts", "--run-id", "x"], "did you mean 'status'?"),
    (["rerun"], "querylab rerun: the following arguments are required: --run-id"),
])
def test_option_typos_are_one_line_with_a_suggestion(argv, expected, capsys):
    from querylab.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and expected in err
    assert len(err.strip().splitlines()) == 1 and "usage:" not in err


@pytest.mark.slow
def test_runs_into_a_closed_pipe_is_quiet(tmp_path):
    """`querylab runs | head`: the reader is gone before querylab writes; no traceback."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from querylab.cli import main; sys.exit(main())",
         "runs", "--artifacts", str(tmp_path / "none")],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # as `head` does once it has what it wants
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
    assert proc.returncode in (0, 141)


def test_datasets_build_typo_is_one_line_before_prefect(capsys):
    import sys

    from querylab.cli import main

    before = "prefect" in sys.modules
    assert main(["datasets", "build", "stoks"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("querylab datasets build: unknown dataset(s) ['stoks'] (did you mean "
                          "'stocks'?)") and len(err.strip().splitlines()) == 1
    assert before or "flows.datasets" not in sys.modules


# -- Low (viewer): sizes and requests as they were -----------------------------------------------


@pytest.mark.slow
def test_viewer_says_how_many_requests_and_whether_a_result_was_cut(tmp_path, model, stocks_uri):
    """In headless Chromium: an errored trial whose one model call took 3 HTTP attempts says
    so; a tool result shown whole is not called "shown of a" smaller result."""
    from querylab.cli import main
    from tests.helpers import browser_dom
    from tests.helpers import run_batch

    def responder(body, index):
        prompt = body["messages"][1]["content"]
        if "2012" in prompt and "NASDAQ" in prompt:
            return error(500, "scripted outage")
        n = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if n == 0:
            return tool_calls(("list_db", {}))
        return tool_calls(("return_answer", {"answer": "Apple"}))

    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(responder) as srv:
        agent = model(srv)
        run_batch(root, "view", stocks_uri, agent,
                  [["nasdaq_top_volume_2012", 0], ["apple_2005_volatility", 0]],
                  options={"max_retries": 2, "retry_base_delay_s": 0.01})
    assert main(["view", "--run-id", "view", "--artifacts", root]) == 0
    viewer = Path(root, "runs", "view", "report", "viewer.html")
    errored = f"{agent}|stocks|nasdaq_top_volume_2012|0"
    pane = browser_dom(viewer, tmp_path, f"trial={errored}")
    pane = pane[pane.index('id="detail"'):pane.index("<script")]  # the rendered page only
    assert "1 model call (3 HTTP requests" in pane
    ok = browser_dom(viewer, tmp_path, f"trial={agent}|stocks|apple_2005_volatility|0")
    ok = ok[ok.index('id="detail"'):ok.index("<script")]
    assert "the whole result" in ok and "-character result" not in ok


# -- text2sql: model SQL is validated as the read-only role, and only ever planned ---------------


def test_text2sql_validation_runs_as_the_read_only_role(pg_server_url, monkeypatch, tmp_path):
    """The model's SQL goes to EXPLAIN as the TPC-DS database's `<db>_ro` role: `ANALYZE
    SELECT CAST(pg_read_file(...) AS int)` (EXPLAIN ANALYZE would run it as the superuser and
    the cast error would show the file) is refused before PostgreSQL sees it, a plain call of
    pg_read_file is denied, and a real query still validates."""
    from schemas.settings import Settings
    from tasks.text2sql.generators import generate_with_validation
    from tasks.text2sql.validation import PostgresValidator, tpcds_validator_dsn
    from tests.helpers import TPCDS_VALID_REPLY, register_model, text2sql_generator

    leak = "ANALYZE SELECT CAST(pg_read_file('/etc/os-release') AS int)"
    script = [message(f"```sql\n{leak}\n```"),
              message("```sql\nSELECT CAST(pg_read_file('/etc/os-release') AS int)\n```"),
              message(TPCDS_VALID_REPLY)]
    with PostgresValidator(tpcds_validator_dsn(Settings.from_env())) as validator:
        user, superuser = validator._conn.execute(
            "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert user.endswith("_ro") and superuser is False
        with ScriptedOpenAIServer(script) as srv:
            register_model(srv.base_url, tmp_path, monkeypatch.setenv, name="scripted",
                           prices="{input: 2.0, output: 10.0}",
                           key_env="QUERYLAB_OPENAI_API_KEY", api_key_required=False)
            gen = text2sql_generator(srv)
            rows = generate_with_validation(gen, "3", "the prompt", validator.validate, 3)
            retries = [r["messages"][-1]["content"] for r in srv.requests[1:]]
            gen.close()
    assert [r["valid"] for r in rows] == [False, False, True]
    assert rows[0]["error"].startswith("not a query: it starts with 'ANALYZE'")
    assert "permission denied for function pg_read_file" in rows[1]["error"]
    assert not any("PRETTY_NAME" in (r["error"] or "") for r in rows)
    assert not any("PRETTY_NAME" in text for text in retries)  # nothing of the file reached it
