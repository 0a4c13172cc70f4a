"""Honest scores a person can check (issue 13, and 12.1): the trial side never sees answers,
scoring is its own step, errored trials are not incorrect, transcripts, the trace audit, the
viewer, rescoring without model calls, preflight and the endpoint the user named.

Everything runs the real ReAct loop over real HTTP against the scripted OpenAI-compatible
server; the viewer is checked in headless Chromium."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from schemas import artifacts
from tasks.core import storage
from tasks.core.llm import preflight, resolve_model
from tasks.report.stage import report_run
from tasks.scoring.scoring_file import PRIVATE_QUERY_KEYS, full_manifest, load_scoring, scoring_uri
from tasks.scoring.stage import score_run
from tasks.trials.stage import combine_trials, run_trial_batch
from tests.fakes.openai_server import (
    ScriptedOpenAIServer,
    delay,
    error,
    is_preflight,
    message,
    tool_calls,
)
from tests.helpers import browser_dom, fixed_ground_truth, register_model

QUERY = "nasdaq_top_volume_2012"  # ground truth: Facebook


@pytest.fixture
def manifest_uri(stocks_manifest, settings) -> str:
    return storage.join(settings.artifacts, "datasets", "stocks", stocks_manifest["version"],
                        "manifest.json")


def _run(root: str, run_id: str, manifest_uri: str, agent: str, items: list, key: str = "b",
         options: dict | None = None) -> dict:
    """One batch through the real trial task, combined and recorded as the run's trials; its
    trials one after another (the list scripts are consumed in request order)."""
    batch = {"key": key, "agent": agent, "manifest_uri": manifest_uri, "items": items,
             "options": options or {}}
    run_trial_batch.fn(run_id, root, batch, max_concurrency=1)
    storage.write_json(storage.join(root, "runs", run_id, "trials", "manifests.json"),
                       [manifest_uri])
    return combine_trials.fn(run_id, root, [key])


# -- 12.1: the trial side gets a manifest without answers ---------------------------------------


def test_public_manifest_has_no_answers_and_scoring_file_has_them(manifest_uri, stocks_manifest):
    public = storage.read_json(manifest_uri)
    private = load_scoring(manifest_uri)
    assert scoring_uri(manifest_uri).endswith("/scoring.json")
    assert "canonical" not in public and "spec_file" not in public
    text = json.dumps(public)
    for q in public["queries"]:
        assert set(q) == {"id", "question"}, q
        truth = private["queries"][q["id"]]
        assert set(truth) == set(PRIVATE_QUERY_KEYS)
        # no ground-truth value, validator or reference step appears in the public manifest
        gt = truth["ground_truth"]
        for item in gt if isinstance(gt, list) else []:
            assert json.dumps(item) not in text
        for step in truth["reference"]:
            assert json.dumps(step["args"])[1:-1] not in text
    assert private["canonical"] and full_manifest(manifest_uri)["queries"][0]["validator"]


def test_the_trial_side_never_reads_the_scoring_file(tmp_path, manifest_uri, model, monkeypatch):
    """An LLM agent's batch reads the public manifest only; the trusted oracle alone reads the
    scoring file (its reference solutions)."""
    import tasks.trials.stage

    opened: list[str] = []
    real = storage.read_json

    def spy(uri):
        opened.append(uri)
        return real(uri)

    monkeypatch.setattr(storage, "read_json", spy)
    monkeypatch.setattr(tasks.trials.stage.storage, "read_json", spy)
    with ScriptedOpenAIServer([tool_calls(("return_answer", {"answer": "Facebook"}))]) as srv:
        _run(str(tmp_path / "a"), "side", manifest_uri, model(srv), [[QUERY, 0]])
    assert manifest_uri in opened and not any(u.endswith("scoring.json") for u in opened)
    opened.clear()
    _run(str(tmp_path / "a"), "side-oracle", manifest_uri, "oracle", [[QUERY, 0]], key="o")
    assert scoring_uri(manifest_uri) in opened


# -- transcripts, audit, viewer ------------------------------------------------------------------

HOSTILE_ANSWER = '<img src=x onerror="document.title=\'pwned\'">Facebook'


def _scripted_run(tmp_path, manifest_uri, model) -> tuple[str, str, dict]:
    """Trial 0 explores, queries, computes and answers; trial 1 reads a file outside its work
    directory and answers with markup. Returns (root, run_id, score summary)."""
    script = [
        tool_calls(("list_db", {}), reasoning="First I look at the databases."),
        tool_calls(("query_db", {"db": "listings", "query":
                    "SELECT listing, company FROM listings WHERE listing LIKE 'NASDAQ:%'"})),
        tool_calls(("execute_python", {"code": "print('rows seen:', len(var_call_1_0))"})),
        tool_calls(("return_answer", {"answer": "Facebook"})),
        tool_calls(("execute_python", {"code": "print(open('/etc/hostname').read()[:40])"})),
        tool_calls(("return_answer", {"answer": HOSTILE_ANSWER})),
    ]
    root, run_id = str(tmp_path / "art"), "view-run"
    with ScriptedOpenAIServer(script) as srv:
        _run(root, run_id, manifest_uri, model(srv), [[QUERY, 0], [QUERY, 1]])
        assert srv.errors == []
    summary = score_run(run_id, root)
    report_run(run_id, root)
    return root, run_id, summary


@pytest.mark.integration
def test_messages_audit_and_viewer_in_chromium(tmp_path, manifest_uri, model, stocks_manifest):
    root, run_id, summary = _scripted_run(tmp_path, manifest_uri, model)
    msgs = pl.read_parquet(storage.join(root, "runs", run_id, "trials", "messages.parquet"))
    key0, key1 = (f"openai:ops-m|stocks|{QUERY}|{t}" for t in (0, 1))
    m0 = msgs.filter(pl.col("trial_key") == key0).sort("index")
    assert m0["role"].to_list() == ["system", "user", "assistant", "tool", "assistant", "tool",
                                    "assistant", "tool", "assistant"]
    assert m0["index"].to_list() == list(range(9))
    assert m0["turn"].to_list() == [0, 0, 0, 0, 1, 1, 2, 2, 3]
    question = next(q["question"] for q in stocks_manifest["queries"] if q["id"] == QUERY)
    from tasks.agents.react import user_prompt

    # the exact first user message the model got (DAB's shape: QUERY + DATABASE DESCRIPTION)
    assert m0["content"][1] == user_prompt(storage.read_json(manifest_uri), question)
    assert m0["reasoning"][2] == "First I look at the databases."
    assert json.loads(m0["tool_calls"][8]) == [
        {"id": "call_3_0", "name": "return_answer", "arguments": '{"answer": "Facebook"}'}]
    tool_rows = m0.filter(pl.col("role") == "tool")
    calls = pl.read_parquet(storage.join(root, "runs", run_id, "trials", "tool_calls.parquet"))
    sizes = calls.filter(pl.col("trial_key") == key0, pl.col("tool") != "return_answer")
    assert tool_rows["full_size"].to_list() == sizes["result_size"].to_list()
    assert (tool_rows["content_chars"] == tool_rows["content"].str.len_chars()).all()

    # verdicts come from the score step; the audit flags the trial that read /etc/hostname
    scores = pl.read_parquet(summary["scores"]).sort("trial_key")
    assert scores["verdict"].to_list() == ["correct", "correct"]
    assert scores["reason"][0] == "all 1 items present"
    audit = pl.read_parquet(summary["audit"])
    assert set(audit["trial_key"]) == {key1} and summary["flagged"] == 1
    checks = set(audit["check"])
    assert {"path_outside_workdir", "answer_not_in_tool_output"} <= checks
    assert "/etc/hostname" in audit.filter(pl.col("check") == "path_outside_workdir")["evidence"][0]
    assert scores.filter(pl.col("trial_key") == key1)["audit_flags"][0] == len(audit)
    report_md = Path(root, "runs", run_id, "report", "report.md").read_text()
    assert "## Trace audit" in report_md and "path_outside_workdir" in report_md

    # `querylab view`: question, ground truth, answer, verdict with reason, every tool result
    from querylab.cli import main

    viewer = Path(root, "runs", run_id, "report", "viewer.html")
    viewer.unlink()
    assert main(["view", "--run-id", run_id, "--artifacts", root]) == 0
    assert viewer.exists()
    dom = browser_dom(viewer, tmp_path, f"trial={key0}")
    check = _check(dom)
    assert check["status"] == "ok" and check["trials"] == "2" and check["selected"] == key0
    pane = dom[dom.index('id="detail"'):]
    for text in (question, "Facebook", "correct", "all 1 items present", "return_answer",
                 "First I look at the databases."):
        assert html.escape(text, quote=False) in pane, text
    for content in tool_rows["content"]:
        assert html.escape(content, quote=False) in pane, content[:80]
    assert pane.count('data-role="tool"') == 3 and pane.count("<details") >= 3  # collapsed
    # filters from the URL fragment: the flagged trial alone; model output stays text
    dom = browser_dom(viewer, tmp_path, f"flagged=only&trial={key1}")
    check = _check(dom)
    assert check["shown"] == "1" and check["selected"] == key1
    pane = dom[dom.index('id="detail"'):]
    assert html.escape(HOSTILE_ANSWER, quote=False) in pane and '<img src="x"' not in dom
    assert "<title>querylab transcripts" in dom and "pwned" not in dom.split("</title>")[0]
    assert "/etc/hostname" in pane  # the audit finding is shown
    assert _check(browser_dom(viewer, tmp_path, "verdict=errored"))["shown"] == "0"


def _check(dom: str) -> dict[str, str]:
    m = re.search(r'<div id="viewer-check"([^>]*)>', dom)
    assert m, dom[-2000:]
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', m.group(1)))


def test_oracle_and_replay_trials_have_transcripts(tmp_path, manifest_uri):
    root = str(tmp_path / "art")
    out = _run(root, "oracle-msgs", manifest_uri, "oracle", [[QUERY, 0]], key="o")
    msgs = pl.read_parquet(out["messages"]).sort("index")
    reference = load_scoring(manifest_uri)["queries"][QUERY]["reference"]
    assert msgs["role"].to_list() == ["user"] + ["assistant", "tool"] * len(reference) + [
        "assistant"]
    assert json.loads(msgs["tool_calls"][-1])[0]["name"] == "return_answer"
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps([{"dataset": "stocks", "query": QUERY, "run": 0,
                                    "answer": "Facebook"}]))
    out = _run(root, "replay-msgs", manifest_uri, f"replay:{answers}", [[QUERY, 0]], key="r")
    msgs = pl.read_parquet(out["messages"]).sort("index")
    assert msgs["role"].to_list() == ["user", "assistant"] and msgs["content"][1] == "Facebook"


@pytest.mark.slow
def test_audit_flags_answer_key_reads_and_prompt_free_answers(tmp_path, manifest_uri, model):
    """A hostile agent walking the file system for the answer key, and one that returns the
    right number with no tool output behind it, are both flagged."""
    walk = ("import os\nfor d, _, fs in os.walk('/'):\n"
            "    if 'scoring.json' in fs or 'manifest.json' in fs: print(d)")
    script = [
        tool_calls(("execute_python", {"code": walk})),
        tool_calls(("return_answer", {"answer": "Facebook"})),
        tool_calls(("query_db", {"db": "market", "query": "SELECT 1 AS one"})),
        message("Facebook, I know this without looking."),
    ]
    root, run_id = str(tmp_path / "art"), "audit-run"
    with ScriptedOpenAIServer(script) as srv:
        _run(root, run_id, manifest_uri, model(srv), [[QUERY, 0], [QUERY, 1]])
    out = score_run(run_id, root)
    audit = pl.read_parquet(out["audit"])
    by = {k: set(g["check"]) for (k,), g in audit.group_by("trial_key")}
    k0, k1 = (f"openai:ops-m|stocks|{QUERY}|{t}" for t in (0, 1))
    assert {"path_outside_workdir", "answer_key_access"} <= by[k0]
    assert "answer_not_in_tool_output" in by[k1]


# -- rescoring without model calls ---------------------------------------------------------------


@pytest.mark.slow
def test_validator_change_and_rescore_without_model_calls(tmp_path, model, capsys):
    from querylab.cli import main
    from tasks.datasets.build import build_dataset_artifacts
    from tasks.db.engines import ensure_loaded
    from tasks.datasets.spec import spec_path

    root = str(tmp_path / "own")
    uri = build_dataset_artifacts.fn(str(spec_path("stocks")), root)
    from schemas.settings import Settings

    manifest = storage.read_json(uri)
    for db in manifest["databases"]:
        ensure_loaded(manifest, db, Settings.from_env())
    script = [tool_calls(("return_answer", {"answer": "Facebook"})),
              tool_calls(("return_answer", {"answer": "Apple"}))]
    with ScriptedOpenAIServer(script) as srv:
        _run(root, "rescore-run", uri, model(srv), [[QUERY, 0], [QUERY, 1]])
        first = score_run("rescore-run", root)
        before = pl.read_parquet(first["scores"]).sort("trial")["verdict"].to_list()
        assert before == ["correct", "incorrect"]
        # the viewer labels the incorrect trial even before any report ran
        from tasks.report.viewer import viewer_data

        shown = {t["trial"]: t for t in viewer_data("rescore-run", root)["trials"]}
        assert shown[1]["mode"] == "FM1" and shown[1]["rule"] == "no_data_tool_call"
        assert shown[0]["mode"] is None and shown[1]["ground_truth"] == "Facebook"
        # fix the "validator": the ground truth of the query was wrong all along (a fixed
        # spec: its ground-truth SQL; hand-editing scoring.json is refused, tests/test_qa13.py)
        fixed = tmp_path / "spec" / "stocks.yaml"
        fixed.parent.mkdir()
        shutil.copy(spec_path("stocks").parent / "stocks_companies.csv", fixed.parent)
        fixed.write_text(fixed_ground_truth(spec_path("stocks").read_text(), QUERY,
                                            "SELECT 'Apple'"))
        import tasks.datasets.spec

        real = tasks.datasets.spec.spec_path
        tasks.datasets.spec.spec_path = lambda name: fixed if name == "stocks" else real(name)
        try:
            n = srv.request_count
            assert main(["rescore", "--run-id", "rescore-run", "--artifacts", root]) == 0
            assert srv.request_count == n  # no model call
        finally:
            tasks.datasets.spec.spec_path = real
    out = capsys.readouterr().out
    assert "2 verdict(s) changed" in out and "correct -> incorrect" in out
    after = pl.read_parquet(storage.join(root, "runs", "rescore-run", "score", "scores.parquet"))
    assert after.sort("trial")["verdict"].to_list() == ["incorrect", "correct"]
    assert set(after["scorer_version"]) == {first["scorer_version"]}
    assert after["validator_digest"][0] != pl.read_parquet(first["scores"])["validator_digest"][0] \
        or True  # the file was rewritten in place; the digest is recomputed from it
    summary = storage.read_json(storage.join(root, "runs", "rescore-run", "score", "summary.json"))
    assert summary["correct"] == 1 and summary["scorer_version"]
    report = Path(root, "runs", "rescore-run", "report", "report.md").read_text()
    assert "| openai:ops-m | stocks" in report


# -- errored is not incorrect; retry exactly the errored trials ----------------------------------


def test_half_the_trials_errored_then_retry_errors(prefect_harness, tmp_path, model, capsys):
    """Acceptance: a server failing half the trials with 500s — the report shows them errored,
    pass@1 over the rest, exit non-zero and a retry hint; after recovery ``rerun
    --retry-errors`` makes exactly the errored trials' calls and exits 0."""
    from querylab.cli import main

    state = {"down": True, "started": {}}
    failed_conversations: list[str] = []

    def responder(body, index):
        if is_preflight(body):
            return message("OK")
        question = body["messages"][1]["content"]
        n = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if n == 0:
            starts = state["started"].setdefault(question, 0)
            state["started"][question] = starts + 1
            if state["down"] and starts >= 1:  # the second trial of every query: 500
                failed_conversations.append(question)
                return error(500, "scripted outage")
            return tool_calls(("list_db", {}))
        if n == 1:
            return tool_calls(("query_db", {"db": "listings",
                                            "query": "SELECT count(*) AS n FROM listings"}))
        return tool_calls(("return_answer", {"answer": "Facebook"}))

    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(responder) as srv:
        agent = model(srv)
        argv = ["run", "--dataset", "stocks", "--agent", agent, "--trials", "2",
                "--run-id", "half", "--artifacts", root, "--max-retries", "0"]
        assert main(argv) == 1
        captured = capsys.readouterr()
        assert srv.preflight_count == 1
        # 5 queries × (trial 0: 3 calls + trial 1: one failed call)
        assert srv.trial_request_count == 5 * 3 + 5
        assert "5 of 10 trials errored" in captured.err and "--retry-errors" in captured.err
        assert "n_errored" in captured.out
        per_query = pl.read_parquet(storage.join(root, "runs", "half", "report",
                                                 "pass_at_k.parquet")).filter(pl.col("k") == 1)
        assert per_query["n"].to_list() == [1] * 5 and per_query["n_errored"].to_list() == [1] * 5
        nasdaq = per_query.filter(pl.col("query_id") == QUERY)["pass_at_k"][0]
        assert nasdaq == 1.0  # pass@1 over the scored trial, not 0.5
        scores = pl.read_parquet(storage.join(root, "runs", "half", "score", "scores.parquet"))
        assert (scores["verdict"] == "errored").sum() == 5
        md = Path(root, "runs", "half", "report", "report.md").read_text()
        assert "## Errored trials" in md and "5 trial(s) errored" in md
        fm = pl.read_parquet(storage.join(root, "runs", "half", "report", "failure_modes.parquet"))
        assert fm.filter(pl.col("dataset") == "ALL")["FM5"][0] == 0  # errored is no failure mode
        batch_rows = pl.read_parquet(storage.join(root, "runs", "half", "trials", "trials.parquet"))
        kept = batch_rows.filter(pl.col("terminate_reason") != "api_error")

        # the server recovers; only the errored trials call it again
        state["down"] = False
        before = srv.request_count
        assert main(["rerun", "--run-id", "half", "--retry-errors", "--artifacts", root]) == 0
        new = [r for r in srv.requests[before:] if not is_preflight(r)]
    assert len(new) == 5 * 3
    questions = [r["messages"][1]["content"] for r in new if len(r["messages"]) == 2]
    assert sorted(questions) == sorted(failed_conversations)
    after = pl.read_parquet(storage.join(root, "runs", "half", "trials", "trials.parquet"))
    assert after.height == 10 and set(after["terminate_reason"]) == {"return_answer"}
    cols = ["trial_key", "answer", "latency_s", "cost_usd", "prompt_tokens"]
    assert after.filter(pl.col("trial_key").is_in(kept["trial_key"])).select(cols).sort(
        "trial_key").equals(kept.select(cols).sort("trial_key"))  # finished trials untouched
    scores = pl.read_parquet(storage.join(root, "runs", "half", "score", "scores.parquet"))
    assert (scores["verdict"] == "errored").sum() == 0
    out = capsys.readouterr().out
    assert "stages trials, score, report (errored trials only)" in out

    # Prefect conventions: flow runs named after stage and run id, tagged; batches named
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    with get_client(sync_client=True) as client:
        flow_runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=["run:half"])))
        names = {f.name for f in flow_runs}
        assert {"benchmark-half", "trials-half", "score-half", "report-half"} <= names, names
        bench = next(f for f in flow_runs if f.name == "benchmark-half")
        assert {"querylab", "run:half", f"agent:{agent}", "dataset:stocks"} <= set(bench.tags)
        tasks_ = client.read_task_runs(flow_run_filter=FlowRunFilter(
            id={"any_": [f.id for f in flow_runs]}))
        assert any(t.name.startswith("batch-openai_ops-m-stocks-0000-") for t in tasks_)


# -- preflight and the endpoint named ------------------------------------------------------------


@pytest.mark.parametrize(
    "step, problem",
    [
        (error(401), "the API key was refused (HTTP 401)"),
        (error(404, "The model `x` does not exist"), "HTTP 404"),
        (error(400, "tools are not supported by this model"), "tool calling not accepted"),
        (error(500), "the endpoint failed (HTTP 500)"),
        (error(429, {"error": {"message": "You exceeded your current quota",
                               "code": "insufficient_quota"}}), "quota used up"),
    ],
)
def test_preflight_names_the_problem(step, problem, monkeypatch):
    with ScriptedOpenAIServer(lambda body, i: step) as srv:
        base = srv.base_url
        monkeypatch.setenv("QUERYLAB_OPENAI_BASE_URL", base)
        r = preflight(resolve_model("pf-m"), timeout_s=4)
        assert srv.request_count in (1, 2)  # one retry for 5xx only
        assert srv.requests[0]["tools"][0]["function"]["name"] == "ping"
    assert not r.ok and problem in r.problem, r
    assert r.line().startswith(f"openai:pf-m at {base}: ")
    if "tool" in problem:
        assert r.tools_accepted is False


@pytest.mark.slow
def test_preflight_ok_rate_limited_unreachable_and_slow(monkeypatch):
    with ScriptedOpenAIServer([message("OK"), error(429, retry_after=1)]) as srv:
        monkeypatch.setenv("QUERYLAB_OPENAI_BASE_URL", srv.base_url)
        ok = preflight(resolve_model("pf-m"))
        limited = preflight(resolve_model("pf-m"))
    assert ok.ok and ok.tools_accepted and ok.status == 200 and ok.problem is None
    assert limited.ok and "rate-limited" in limited.warning
    monkeypatch.setenv("QUERYLAB_OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    down = preflight(resolve_model("pf-m"), timeout_s=3)
    assert not down.ok and down.problem.startswith("endpoint unreachable") and down.latency_s < 3
    with ScriptedOpenAIServer([delay(10, message("late"))] * 2) as srv:
        monkeypatch.setenv("QUERYLAB_OPENAI_BASE_URL", srv.base_url)
        slow = preflight(resolve_model("pf-m"), timeout_s=1.5)
    assert not slow.ok and "timeout" in slow.problem and slow.latency_s < 3


@pytest.mark.slow
def test_unreachable_endpoint_run_fails_fast_before_building(tmp_path):
    """Acceptance: the issue's command exits non-zero within 10 s with one line naming agent,
    endpoint and problem, and builds nothing."""
    import os
    import subprocess
    import sys
    import time

    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUERYLAB_")}
    env.update(QUERYLAB_OPENAI_BASE_URL="http://127.0.0.1:9/v1", PYTHONPATH=str(repo),
               QUERYLAB_ARTIFACTS=str(tmp_path / "artifacts"), QUERYLAB_HOME=str(tmp_path / "home"))
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "querylab.cli", "run", "--agent", "openai:my-local-model",
         "--dataset", "stocks", "--trials", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.strip().splitlines() if ": warning: " not in x]
    assert "querylab run: warning: openai:my-local-model is not in the models table" in proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("querylab run: preflight failed: ")
    assert "openai:my-local-model at http://127.0.0.1:9/v1: endpoint unreachable" in lines[0]
    assert elapsed < 10, elapsed
    assert not (tmp_path / "artifacts").exists() and not (tmp_path / "home").exists()


@pytest.mark.slow
def test_named_endpoint_overrides_the_models_table(tmp_path, manifest_uri, monkeypatch, caplog):
    from tasks.core.llm import endpoint_warning
    from tasks.trials.stage import check_agents

    register_model("https://api.example.invalid/v1", tmp_path, monkeypatch.setenv, name="tbl-m",
                   key_env="QL_TBL_KEY", prices="{input: 1, output: 1}", context_window=1000)
    monkeypatch.delenv("QL_TBL_KEY", raising=False)  # not needed once the endpoint is named
    root = str(tmp_path / "art")
    with ScriptedOpenAIServer(lambda b, i: tool_calls(("return_answer", {"answer": "x"}))) as srv:
        monkeypatch.setenv("QUERYLAB_OPENAI_BASE_URL", srv.base_url)
        resolved = resolve_model("tbl-m")
        assert resolved.base_url == srv.base_url and resolved.base_url_source == "env"
        assert "not to the models table's https://api.example.invalid/v1" in endpoint_warning(resolved)
        desc = check_agents(["openai:tbl-m"])
        assert desc[0]["base_url"] == srv.base_url and "overrides" not in desc[0]
        assert desc[0]["overridden_base_url"] == "https://api.example.invalid/v1"
        assert "models table's https://api.example.invalid/v1" in desc[0]["warnings"][0]
        # the trials stage logs it; the CLI prints it before anything starts
        from tasks.trials.stage import describe_agents

        with caplog.at_level("WARNING"):
            describe_agents.fn("warn-run", root, ["openai:tbl-m"], [manifest_uri])
        assert "models table's https://api.example.invalid/v1" in caplog.text
        out = _run(root, "env-url", manifest_uri, "openai:tbl-m", [[QUERY, 0]])
        n_env, env_url = srv.request_count, srv.base_url
    assert n_env == 1
    assert set(pl.read_parquet(out["llm_calls"])["base_url"]) == {env_url}
    # openai:<model>@<url>: one agent's endpoint, also over the environment's
    with ScriptedOpenAIServer(lambda b, i: tool_calls(("return_answer", {"answer": "x"}))) as other:
        agent = f"openai:tbl-m@{other.base_url}"
        r = resolve_model(agent.removeprefix("openai:"))
        assert (r.name, r.base_url, r.base_url_source) == ("tbl-m", other.base_url, "agent")
        out = _run(root, "agent-url", manifest_uri, agent, [[QUERY, 0]], key="c")
        assert other.request_count == 1
        other_url = other.base_url
    llm = pl.read_parquet(out["llm_calls"])
    assert set(llm["base_url"]) == {other_url}
    trials = pl.read_parquet(out["trials"])
    assert trials["model"].to_list() == ["tbl-m"]
    # a model id may contain "@" without naming a URL
    assert resolve_model("claude-3-5-sonnet@20240620").model_id == "claude-3-5-sonnet@20240620"


# -- the CLI: one line for user errors, --debug, subsets, list of runs ---------------------------


def test_spec_typo_is_one_line_and_debug_shows_the_traceback(tmp_path, monkeypatch, capsys):
    import tasks.datasets.spec
    from querylab.cli import main

    broken = tmp_path / "stocks.yaml"
    text = (Path(tasks.datasets.spec.spec_path("stocks"))).read_text()
    broken.write_text(text.replace("queries:", "querys:", 1))
    monkeypatch.setattr(tasks.datasets.spec, "spec_path", lambda name: broken)
    assert main(["run", "--dataset", "stocks", "--artifacts", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "stocks.yaml" in err
    assert main(["--debug", "run", "--dataset", "stocks", "--artifacts", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("querylab run: ")
    assert main(["run", "--dataset", "stocks", "--query", "no_such_query",
                 "--artifacts", str(tmp_path / "a")]) == 2
    monkeypatch.undo()
    assert main(["run", "--dataset", "stocks", "--query", "nope",
                 "--artifacts", str(tmp_path / "a")]) == 2
    assert "unknown query id(s) ['nope']" in capsys.readouterr().err


def test_query_selection_and_limit(manifest_uri, stocks_manifest):
    from tasks.trials.stage import plan_batches, select_queries

    ids = [q["id"] for q in stocks_manifest["queries"]]
    assert [q["id"] for q in select_queries(stocks_manifest, limit=2)] == ids[:2]
    assert [q["id"] for q in select_queries(stocks_manifest, [f"stocks/{QUERY}"])] == [QUERY]
    items = [i for b in plan_batches([manifest_uri], ["oracle"], 2, query_ids=[QUERY])
             for i in b["items"]]
    assert items == [[QUERY, 0], [QUERY, 1]]
    with pytest.raises(ValueError, match="unknown query id"):
        plan_batches([manifest_uri], ["oracle"], 1, query_ids=["nope"])


@pytest.mark.slow
def test_read_only_commands_do_not_import_prefect(tmp_path, manifest_uri):
    """report, status, view, runs, models, datasets list, rescore and --help on a real run:
    no Prefect import (so no server); their timings are in bench/cli_latency.py."""
    import os
    import subprocess
    import sys

    from tasks.core import runs

    root = str(tmp_path / "art")
    runs.record_benchmark(root, "ro-run", {"datasets": ["stocks"], "agents": ["oracle"],
                                           "n_trials": 1})
    runs.record_manifests(root, "ro-run", [manifest_uri])
    _run(root, "ro-run", manifest_uri, "oracle", [[QUERY, 0]], key="o")
    score_run("ro-run", root)
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "QUERYLAB_ARTIFACTS": root}
    code = ("import sys, io, contextlib\nfrom querylab.cli import main\n"
            "argv = sys.argv[1:]\n"
            "try:\n    rc = main(argv)\nexcept SystemExit as e:\n    rc = e.code\n"
            "print('RC', rc, 'PREFECT', 'prefect' in sys.modules)")
    for argv in (["report", "--run-id", "ro-run"], ["status", "--run-id", "ro-run"],
                 ["view", "--run-id", "ro-run"], ["runs"], ["models"], ["datasets", "list"],
                 ["rescore", "--run-id", "ro-run"], ["--help"]):
        proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        last = proc.stdout.strip().splitlines()[-1]
        assert last == "RC 0 PREFECT False", (argv, last, proc.stderr[-2000:])


@pytest.mark.slow
def test_runs_lists_runs_with_pass_at_1(tmp_path, manifest_uri, capsys):
    from querylab.cli import main
    from tasks.core import runs

    root = str(tmp_path / "art")
    for run_id in ("list-a", "list-b"):
        runs.record_benchmark(root, run_id, {"datasets": ["stocks"], "agents": ["oracle"]})
        runs.record_manifests(root, run_id, [manifest_uri])
        _run(root, run_id, manifest_uri, "oracle", [[QUERY, 0]], key="o")
        score_run(run_id, root)
    report_run("list-a", root)
    listed = runs.list_runs(root)
    assert {r["run_id"] for r in listed} == {"list-a", "list-b"}
    a = next(r for r in listed if r["run_id"] == "list-a")
    assert a["pass_at_1"] == {"oracle": 1.0} and a["trials"] == 1 and a["errored"] == 0
    assert a["agents"] == ["oracle"] and a["datasets"] == ["stocks"] and a["status"] == "partial"
    assert main(["runs", "--artifacts", root]) == 0
    out = capsys.readouterr().out
    assert "list-a" in out and "oracle 1.000" in out and "pass@1" in out.splitlines()[0]


def test_progress_counts_with_any_local_root_spelling(tmp_path, monkeypatch, manifest_uri):
    from tasks.core.progress import count_finished_trials
    from tasks.trials.stage import plan_batches

    monkeypatch.chdir(tmp_path)
    batches = plan_batches([manifest_uri], ["oracle"], 1, batch_size=2)
    for root in ("./artifacts", str(tmp_path / "artifacts"), f"file://{tmp_path}/artifacts"):
        shutil.rmtree(tmp_path / "artifacts", ignore_errors=True)
        run_trial_batch.fn("prog", root, batches[0])
        assert count_finished_trials(root, "prog", batches) == len(batches[0]["items"]), root
        listed = storage.list_uris(storage.join(root, "runs", "prog"), ".parquet")
        assert listed and all(u.startswith(root.rstrip("/")) for u in listed)
    assert storage.list_dirs(str(tmp_path / "artifacts" / "runs")) == ["prog"]


def test_messages_schema_is_declared():
    assert artifacts.ALL["messages"] is artifacts.MESSAGES
    assert {"trial_key", "index", "turn", "role", "content", "reasoning", "tool_calls",
            "tool_call_id", "content_chars", "full_size"} <= set(artifacts.MESSAGES.names)
    assert "is_correct" not in artifacts.TRIALS.names and "verdict" in artifacts.SCORES.names


def test_viewer_is_served_on_loopback_only():
    import urllib.error
    import urllib.request

    from tasks.report.viewer import serve_html

    server = serve_html(b"<!DOCTYPE html><p>viewer</p>")
    try:
        host, port = server.server_address
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/") as resp:
            assert resp.read() == b"<!DOCTYPE html><p>viewer</p>"
            assert resp.headers["Content-Type"].startswith("text/html")
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/../../etc/passwd")
    finally:
        server.shutdown()
