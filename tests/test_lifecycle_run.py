"""Lifecycle suite runs: the oracle scores 1.0 on every phase; an ``openai:`` model behind the
scripted OpenAI-compatible server (real HTTP on 127.0.0.1) with seeded mistakes scores the
hand-computed values; replay; the Prefect flow (oracle + scripted + replay), its artifacts and
re-run; the CLI module."""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import polars as pl
import pytest

from schemas.lifecycle import PHASE_METRICS, PHASES, LifecycleConfig
from schemas.settings import Settings
from tasks.lifecycle.agents import (
    AgentConfigError,
    OpenAIAgent,
    OracleAgent,
    ReplayAgent,
    make_agent,
)
from tasks.lifecycle.items import generate_phase_items, prepare_databases
from tasks.lifecycle.runner import SYSTEM_PROMPTS, RunContext, progressive_prompt, run_item
from tasks.lifecycle.schema import read_sqlite_schema
from tests.fakes.openai_server import ScriptedOpenAIServer, message, tool_calls
from tests.helpers import SHARED_DATA, register_model

SPIDER_DIR = SHARED_DATA / "spider" / "databases"
QUESTIONS = SHARED_DATA / "spider" / "dev.json"
CHINOOK = SHARED_DATA / "chinook" / "Chinook_Sqlite.sqlite"


def _sql(text: str) -> str:
    return f"```sql\n{text}\n```"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    cfg = LifecycleConfig(
        spider_db_ids=["concert_singer", "pets_1"],
        max_items=8,
        maintenance_scenarios=7,
        variants=["original", "snake_case"],
        graph_levels=[0, 2],
        design_table_counts=[2, 3],
        seed=3,
    )
    dbs = prepare_databases(SPIDER_DIR, QUESTIONS, tmp_path_factory.mktemp("home"), cfg, CHINOOK)
    items = {phase: generate_phase_items(phase, dbs, cfg)[0] for phase in PHASES}
    return cfg, dbs, items


@pytest.mark.slow
def test_oracle_scores_one_on_every_phase(setup):
    cfg, dbs, items = setup
    ctx = RunContext(dbs, cfg)
    for phase in PHASES:
        assert items[phase], phase
        for it in items[phase]:
            row, calls = run_item(OracleAgent(), it, ctx, "r")
            assert row["error"] is None, (it["item_id"], row["error"])
            scored = [row[m] for m in PHASE_METRICS[phase] if row[m] is not None]
            assert scored and all(v == 1.0 for v in scored), (it["item_id"], row)
            assert calls and all(c["cost_usd"] == 0 for c in calls)


# ------------------------------------------------------------- scripted model, hand computed


def _register_scripted(directory: Path, base_url: str, setenv, key: str | None = None) -> None:
    """A QUERYLAB_MODELS file (in ``directory``) pricing model ``scripted`` at ``base_url``
    (USD 1 / 2 per million input / output tokens): prices come from the models table only."""
    register_model(base_url, directory, setenv, name="scripted",
                   key_env="QUERYLAB_OPENAI_API_KEY", key=key, api_key_required=False,
                   prices="{input: 1.0, output: 2.0}")


def _agent(srv: ScriptedOpenAIServer, cache=None, **cfg) -> OpenAIAgent:
    settings = Settings(openai_base_url=srv.base_url, openai_api_key="sk-test")
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        _register_scripted(Path(tmp), srv.base_url, mp.setenv)
        config = LifecycleConfig(**{"api_retries": 0, **cfg})
        agent = OpenAIAgent("scripted", settings, config, cache)
    assert agent.resolved.priced
    return agent


def _run(script, items, ctx, **cfg):
    with ScriptedOpenAIServer(script) as srv:
        agent = _agent(srv, **cfg)
        out = [run_item(agent, it, ctx, "r") for it in items]
        return out, srv.requests


def _hand_item(phase: str, dbs: dict, prompt: str = "the task") -> dict:
    ref = read_sqlite_schema(dbs["spider"]["concert_singer"]).subset(["stadium", "concert"])
    return {
        "item_id": f"{phase}/hand/k2/0",
        "phase": phase,
        "base_id": "hand",
        "source": "spider",
        "db_id": "concert_singer",
        "variant": "original",
        "level": 0,
        "seed": 0,
        "prompt": prompt,
        "reference": {"schema": ref.to_dict(), "ddl": ""},
        "context": {"k": 2},
    }


@pytest.mark.slow
def test_scripted_design_and_implementation(setup):
    cfg, dbs, _ = setup
    ctx = RunContext(dbs, cfg)
    design_answer = _sql(
        "CREATE TABLE stadiums (id INTEGER PRIMARY KEY, location TEXT, name TEXT, capacity TEXT,"
        " average INTEGER);\nCREATE TABLE concerts (concert_id INTEGER PRIMARY KEY, concert_name"
        " TEXT, theme TEXT, stadium_id INTEGER, year TEXT);"
    )
    ddl_answer = _sql(
        "CREATE TABLE venue (Stadium_ID INT, Location TEXT, Name TEXT, Capacity INT, Highest INT,"
        " Lowest INT, Average INT);\nCREATE TABLE concert (concert_ID INTEGER, concert_Name TEXT,"
        " Theme TEXT, Stadium_ID REAL, Year TEXT);"
    )
    out, requests = _run(
        [message(design_answer), message(ddl_answer), message("CREATE TABLE (")],
        [
            _hand_item("design", dbs),
            _hand_item("implementation", dbs),
            _hand_item("implementation", dbs),
        ],
        ctx,
    )
    (design, _), (impl, _), (broken, _) = out
    # 12 attributes: Highest/Lowest missing, Capacity as TEXT, the foreign key missing
    assert design["acc_entity"] == pytest.approx(10 / 12)
    assert design["acc_data"] == pytest.approx(9 / 12)
    assert design["acc_key"] == pytest.approx(2 / 3)
    # 'venue' is not 'stadium'; concert.Stadium_ID declared REAL
    assert impl["t_level"] == 0.5 and impl["f_level"] == pytest.approx(4 / 12)
    assert impl["ddl_executes"] == 1.0
    assert broken["ddl_executes"] == 0.0 and broken["t_level"] == 0.0
    assert broken["error"].startswith("DDL failed")
    assert design["cost_usd"] == pytest.approx((10 * 1.0 + 5 * 2.0) / 1e6)
    assert requests[0]["messages"][0]["content"] == SYSTEM_PROMPTS["design"]
    assert requests[0]["model"] == "scripted" and requests[0]["temperature"] == 0.0


@pytest.mark.slow
def test_scripted_operation_phases(setup):
    cfg, dbs, items = setup
    ctx = RunContext(dbs, cfg)
    t2s = [it for it in items["text2sql"] if it["variant"] == "original"][:4]
    script = [
        message(_sql("SELECT 1 FROM singer WHERE 0")),  # executes, wrong result
        message(_sql("SELEC name FROM singer")),  # fails
        message(_sql(t2s[2]["reference"]["sql"])),
        message("Sure:\n" + _sql(t2s[3]["reference"]["sql"])),
    ]
    out, _ = _run(script, t2s, ctx)
    assert [r["ex"] for r, _ in out] == [0.0, 0.0, 1.0, 1.0]
    assert "syntax error" in out[1][0]["error"]

    graph = next(
        it for it in items["progressive"] if it["level"] == 0 and len(it["context"]["nodes"]) >= 2
    )
    nodes = graph["context"]["nodes"]
    script = [message(_sql(graph["reference"]["nodes"][nodes[0]["id"]]))] + [
        message(_sql("SELECT 42")) for _ in nodes[1:]
    ]
    ((row, calls),) = _run(script, [graph], ctx)[0]
    # node 1 right, every later node wrong: G-EX 1/n, final-node EX 0
    assert row["g_ex"] == pytest.approx(1 / len(nodes)) and row["final_ex"] == 0.0
    assert row["n_calls"] == row["rounds"] == len(nodes) == len(calls)
    assert [c["step"] for c in calls] == list(range(len(nodes)))

    dml = items["dml"][:2]
    table = dml[1]["reference"]["table"]
    out, _ = _run(
        [message(_sql(dml[0]["reference"]["sql"])), message(_sql(f'DELETE FROM "{table}"'))],
        dml,
        ctx,
    )
    assert [r["state_match"] for r, _ in out] == [1.0, 0.0]
    assert table.lower() in out[1][0]["error"]


@pytest.mark.slow
def test_scripted_debugging_single_and_multi_round(setup):
    cfg, dbs, items = setup
    ctx = RunContext(dbs, cfg)
    a, b = items["debug"][:2]
    script = [
        message(_sql(a["reference"]["flawed_sql"])),  # round 1: the same error again
        message(_sql(a["reference"]["sql"])),  # round 2: fixed
        message(_sql(b["reference"]["sql"])),  # fixed at once
    ]
    out, requests = _run(script, [a, b], ctx)
    (ra, _), (rb, _) = out
    assert (ra["ex_single"], ra["ex_multi"], ra["rounds"]) == (0.0, 1.0, 2)
    assert (rb["ex_single"], rb["ex_multi"], rb["rounds"]) == (1.0, 1.0, 1)
    # mean over the two items: single-round EX 0.5, multi-round EX 1.0
    assert (ra["ex_single"] + rb["ex_single"]) / 2 == 0.5 and (
        ra["ex_multi"] + rb["ex_multi"]
    ) / 2 == 1.0
    retry = requests[1]["messages"]
    assert [m["role"] for m in retry] == ["system", "user", "assistant", "user"]
    assert a["reference"]["error"] in retry[-1]["content"]
    # with one round only the first attempt counts
    out, _ = _run([message(_sql(a["reference"]["flawed_sql"]))], [a], ctx, debug_rounds=1)
    assert (out[0][0]["ex_single"], out[0][0]["ex_multi"], out[0][0]["rounds"]) == (0.0, 0.0, 1)


@pytest.mark.slow
def test_scripted_maintenance(setup):
    cfg, dbs, items = setup
    ctx = RunContext(dbs, cfg)
    a, b = items["assigner"][:2]
    extra = next(n for n in a["context"]["expert_names"] if n not in b["reference"]["experts"])
    out, _ = _run(
        [
            message(json.dumps({"experts": a["reference"]["experts"]})),
            message(
                "```json\n" + json.dumps({"experts": b["reference"]["experts"] + [extra]}) + "\n```"
            ),
        ],
        [a, b],
        ctx,
    )
    (ra, _), (rb, _) = out
    n = len(b["reference"]["experts"])
    assert (ra["assigner_accuracy"], ra["assigner_jaccard"]) == (1.0, 1.0)
    assert rb["assigner_accuracy"] == 0.0 and rb["assigner_jaccard"] == pytest.approx(n / (n + 1))

    expert = next(
        it
        for it in items["expert"]
        if [c["name"] for c in it["reference"]["calls"]] == ["check_metric_abnormal"] * 2
    )
    e1, e2 = expert["reference"]["calls"]
    wrong = {**e2["arguments"], "start": "2025-03-01T08:01"}
    script = [
        tool_calls(
            ("list_metrics", {}),
            ("check_metric_abnormal", e1["arguments"]),
            ("check_metric_abnormal", wrong),
        ),
        message("memory looks abnormal"),
    ]
    out, requests = _run(script, [expert], ctx)
    row, calls = out[0]
    # expected {e1, e2}; made {e1, e2 with a wrong window}; list_metrics is not scored
    assert row["tool_call_correctness"] == pytest.approx(1 / 3)
    assert (row["tool_precision"], row["tool_recall"]) == (0.5, 0.5)
    assert row["answer"] == "memory looks abnormal" and row["rounds"] == 2
    assert requests[0]["tools"][1]["function"]["name"] == "check_metric_abnormal"
    tool_msgs = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert len(tool_msgs) == 3 and json.loads(tool_msgs[1]["content"])["abnormal"] is True
    assert len(json.loads(calls[0]["tool_results"])) == 3


@pytest.mark.slow
def test_api_error_scores_zero_and_is_recorded(setup):
    from tests.fakes.openai_server import error

    cfg, dbs, items = setup
    ctx = RunContext(dbs, cfg)
    out, _ = _run([error(500)], [items["text2sql"][0]], ctx)
    row, calls = out[0]
    assert row["ex"] == 0.0 and row["error"].startswith("api_error: HTTP 500")
    assert row["cost_usd"] == 0 and calls[0]["error"] == row["error"]  # a failed call is free
    # infrastructure errors are retried by the shared model layer (Retry-After honoured)
    ok = message(_sql(items["text2sql"][0]["reference"]["sql"]))
    out, requests = _run([error(429, retry_after=0), ok], [items["text2sql"][0]], ctx,
                         api_retries=1)
    assert len(requests) == 2 and out[0][0]["error"] is None and out[0][0]["ex"] == 1.0
    # unpriced: a model in no models file gets a null (unknown) cost
    with ScriptedOpenAIServer([ok]) as srv:
        agent = OpenAIAgent("unlisted", Settings(openai_base_url=srv.base_url), cfg)
        row, _ = run_item(agent, items["text2sql"][0], ctx, "r")
    assert agent.resolved.priced is False and row["cost_usd"] is None and row["ex"] == 1.0


@pytest.mark.slow
def test_response_cache_serves_a_rerun_of_an_item_but_not_a_twin(setup, tmp_path):
    from tasks.core.llm import ResponseCache

    cfg, dbs, items = setup
    ctx = RunContext(dbs, cfg)
    item = items["text2sql"][0]
    twin = {**item, "item_id": item["item_id"] + "/twin"}  # same prompt, another sample
    ok = message(_sql(item["reference"]["sql"]), {"prompt_tokens": 10, "completion_tokens": 5})
    with ScriptedOpenAIServer([ok, ok, ok]) as srv:
        agent = _agent(srv, ResponseCache(str(tmp_path)))
        first, _ = run_item(agent, item, ctx, "r")
        again, _ = run_item(agent, item, ctx, "r")
        twin_row, _ = run_item(agent, twin, ctx, "r")
        agent.close()
        assert srv.request_count == 2
    assert first["ex"] == again["ex"] == twin_row["ex"] == 1.0
    assert first["cost_usd"] == pytest.approx((10 * 1.0 + 5 * 2.0) / 1e6)
    assert again["cost_usd"] == 0 and again["prompt_tokens"] == 10  # a cache hit is free
    assert twin_row["cost_usd"] == first["cost_usd"]


@pytest.mark.slow
def test_replay_agent(setup, tmp_path):
    cfg, dbs, items = setup
    ctx = RunContext(dbs, cfg)
    t = items["text2sql"][0]
    ex = items["expert"][0]
    path = tmp_path / "recorded.jsonl"
    lines = [
        {"item_id": t["item_id"], "response": _sql(t["reference"]["sql"])},
        {"item_id": ex["item_id"], "step": 0, "tool_calls": ex["reference"]["calls"]},
        {"item_id": ex["item_id"], "step": 1, "response": "done"},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    agent = ReplayAgent(path)
    assert agent.label == "replay:recorded"
    assert run_item(agent, t, ctx, "r")[0]["ex"] == 1.0
    assert run_item(agent, ex, ctx, "r")[0]["tool_call_correctness"] == 1.0
    row, calls = run_item(agent, items["text2sql"][1], ctx, "r")
    assert row["ex"] == 0.0 and "has no answer" in row["error"] and calls == []
    path.write_text('{"response": "x"}\n')
    with pytest.raises(AgentConfigError, match=r"recorded\.jsonl:1"):
        ReplayAgent(path)
    with pytest.raises(AgentConfigError, match="unknown agent"):
        make_agent("gpt-4")
    with pytest.raises(AgentConfigError, match="QUERYLAB_OPENAI_API_KEY"):
        make_agent("openai:x", Settings())


# ------------------------------------------------------------------------------------ flow

FLOW_CONFIG = {
    "spider_db_ids": ["concert_singer"],
    "max_items": 6,
    "maintenance_scenarios": 4,
    "variants": ["original", "snake_case"],
    "graph_levels": [0, 1],
    "design_table_counts": [2],
    "dml_per_db": 1,
    "batch_size": 50,
}
FLOW_PHASES = ["design", "text2sql", "progressive", "debug", "assigner", "expert"]


class _Responder:
    """Answers like the oracle, with seeded mistakes: every third Text2SQL item (sorted ids)
    gets a wrong query, the Assigner item of scenario s000 gets no expert."""

    def __init__(self, root: str, run_id: str):
        self.prefix = Path(root) / "runs" / run_id / "lifecycle" / "items"
        self.lookup: dict | None = None

    def _load(self):
        from tasks.lifecycle.pipeline import read_items

        self.lookup = {}
        self.wrong = set()
        for phase in FLOW_PHASES:
            its = read_items(str(self.prefix / f"{phase}.parquet"))
            for it in its:
                if phase == "progressive":
                    for i in range(len(it["context"]["nodes"])):
                        self.lookup[progressive_prompt(it, i)] = (it, i)
                elif phase == "expert":
                    self.lookup[(it["context"]["system"], it["prompt"])] = (it, 0)
                else:
                    self.lookup[it["prompt"]] = (it, 0)
            if phase == "text2sql":
                ids = sorted(it["item_id"] for it in its)
                self.wrong |= {i for n, i in enumerate(ids) if n % 3 == 0}
        self.wrong.add("assigner/s000")

    def __call__(self, body: dict, index: int):
        from tasks.lifecycle.runner import oracle_answer

        if self.lookup is None:
            self._load()
        msgs = body["messages"]
        if body.get("tools"):
            item, _ = self.lookup[(msgs[0]["content"], msgs[1]["content"])]
            step = sum(m["role"] == "assistant" for m in msgs)
            ans = oracle_answer(item, step)
            if isinstance(ans, list):
                return tool_calls(*[(c["name"], c["arguments"]) for c in ans])
            return message(ans or "done")
        item, node = self.lookup[msgs[1]["content"]]
        if item["item_id"] in self.wrong:
            return message('{"experts": []}' if item["phase"] == "assigner" else _sql("SELECT 0"))
        return message(oracle_answer(item, node))


@pytest.fixture(scope="module")
def flow_run(prefect_harness, settings, tmp_path_factory):
    from flows.lifecycle import lifecycle
    from tasks.lifecycle.pipeline import generate_lifecycle_items, prepare_lifecycle_databases

    run_id = "lc-flow"
    cfg = LifecycleConfig.model_validate(FLOW_CONFIG).model_dump(mode="json")
    # items first (the flow reuses them), so a replay file can name real item ids
    dbs = prepare_lifecycle_databases.fn(
        run_id, settings.artifacts, str(SPIDER_DIR), str(QUESTIONS), str(CHINOOK), cfg
    )
    t2s = generate_lifecycle_items.fn(run_id, settings.artifacts, "text2sql", dbs, cfg)
    from tasks.lifecycle.pipeline import read_items

    first = read_items(t2s["uri"])[:2]
    replay = tmp_path_factory.mktemp("replay") / "elsewhere.jsonl"
    replay.write_text(
        "\n".join(
            json.dumps({"item_id": it["item_id"], "response": _sql(it["reference"]["sql"])})
            for it in first
        )
        + "\n"
    )
    models = ["oracle", "openai:scripted", f"replay:{replay}"]
    with (
        ScriptedOpenAIServer(_Responder(settings.artifacts, run_id)) as srv,
        pytest.MonkeyPatch.context() as mp,
    ):
        _register_scripted(replay.parent, srv.base_url, mp.setenv, key="sk-test-SECRET")
        out = lifecycle(
            run_id,
            models,
            str(SPIDER_DIR),
            str(QUESTIONS),
            str(CHINOOK),
            phases=FLOW_PHASES,
            config=FLOW_CONFIG,
            artifacts_root=settings.artifacts,
        )
        out["n_requests"] = srv.request_count
        out["server_errors"] = srv.errors
    return {
        **out,
        "models": models,
        "run_id": run_id,
        "replayed": sorted(it["item_id"] for it in first),
    }


def _main(flow_run) -> dict:
    main = pl.read_parquet(flow_run["main"])
    return {
        (m, p, k): v for m, p, k, v in main.select("model", "phase", "metric", "value").iter_rows()
    }


def test_flow_oracle_and_seeded_mistakes(flow_run):
    assert flow_run["server_errors"] == []
    main = _main(flow_run)
    oracle = {k: v for k, v in main.items() if k[0] == "oracle"}
    assert oracle and all(v == 1.0 for v in oracle.values() if v is not None)
    items = {m["phase"]: m for m in flow_run["items"]}
    n = items["text2sql"]["n_items"]  # every third of the n sorted ids wrong (both variants)
    t2s = pl.read_parquet(flow_run["results"]["text2sql"]["results"]).filter(
        pl.col("model") == "openai:scripted"
    )
    assert t2s.height == n and t2s["ex"].mean() == pytest.approx(1 - math.ceil(n / 3) / n)
    original = t2s.filter(pl.col("variant") == "original")
    assert main[("openai:scripted", "text2sql", "ex")] == pytest.approx(original["ex"].mean())
    scenarios = items["assigner"]["n_items"]
    assert main[("openai:scripted", "assigner", "assigner_accuracy")] == pytest.approx(
        (scenarios - 1) / scenarios
    )
    for phase in ("design", "progressive", "debug", "expert"):
        assert main[("openai:scripted", phase, PHASE_METRICS[phase][0])] == 1.0
    # replay: the two recorded Text2SQL answers (one question, two schema variants), nothing else
    replay = pl.read_parquet(flow_run["results"]["text2sql"]["results"]).filter(
        pl.col("model") == "replay:elsewhere"
    )
    assert replay.filter(pl.col("ex") == 1.0)["item_id"].to_list() == flow_run["replayed"]
    assert replay.filter(pl.col("ex") == 0.0)["error"].str.contains("has no answer").all()
    assert main[("replay:elsewhere", "text2sql", "ex")] == pytest.approx(
        1 / items["text2sql"]["n_base_items"]
    )
    assert main[("replay:elsewhere", "assigner", "assigner_accuracy")] == 0.0


def test_flow_artifacts_tables_and_costs(flow_run):
    calls = pl.read_parquet(flow_run["results"]["text2sql"]["calls"])
    scripted = calls.filter(pl.col("model") == "openai:scripted")
    assert scripted["cost_usd"].sum() == pytest.approx(scripted.height * (10 * 1.0 + 5 * 2.0) / 1e6)
    assert flow_run["n_requests"] == sum(
        pl.read_parquet(v["calls"]).filter(pl.col("model") == "openai:scripted").height
        for v in flow_run["results"].values()
    )
    rob = pl.read_parquet(flow_run["robustness"])
    assert set(rob["level"]) == {0, 1} and set(rob["model"]) == {
        "oracle",
        "openai:scripted",
        "replay:elsewhere",
    }
    cv = pl.read_parquet(flow_run["variant_cv"]).filter(pl.col("model") == "oracle")
    assert set(cv["variant"]) == {"original", "snake_case"} and cv["cv"].to_list() == [0.0, 0.0]
    exg = pl.read_parquet(flow_run["ex_vs_gex"]).filter(pl.col("model") == "oracle")
    assert exg.select("ex", "final_ex", "g_ex").row(0) == (1.0, 1.0, 1.0)
    md = Path(flow_run["markdown"]).read_text()
    assert "## Robustness by perturbation level" in md and "| openai:scripted" in md
    root = Path(flow_run["markdown"]).parent
    for phase in FLOW_PHASES:
        assert (root / "items" / f"{phase}.parquet").exists() and (
            root / "results" / f"{phase}.parquet"
        ).exists()
    for f in root.rglob("*.parquet"):
        assert b"SECRET" not in f.read_bytes()


def test_flow_rerun_skips_finished_batches(flow_run, settings):
    from flows.lifecycle import lifecycle

    batches = sorted((Path(flow_run["markdown"]).parent / "batches").glob("*.results.parquet"))
    assert len(batches) == 3 * len(FLOW_PHASES)
    before = {b: b.stat().st_mtime_ns for b in batches}
    # no API settings now: a batch that ran again would fail
    out = lifecycle(
        flow_run["run_id"],
        flow_run["models"],
        str(SPIDER_DIR),
        str(QUESTIONS),
        str(CHINOOK),
        phases=FLOW_PHASES,
        config=FLOW_CONFIG,
        artifacts_root=settings.artifacts,
    )
    assert {b: b.stat().st_mtime_ns for b in batches} == before
    assert pl.read_parquet(out["main"]).equals(pl.read_parquet(flow_run["main"]))


def test_cli_module(prefect_harness, settings, capsys):
    from querylab.cmd_lifecycle import register

    parser = argparse.ArgumentParser(prog="querylab")
    register(parser.add_subparsers(dest="command", required=True))

    def run(*argv: str) -> int:
        args = parser.parse_args(list(argv))
        return args.func(args)

    small = [
        "--db",
        "pets_1",
        "--max-items",
        "2",
        "--scenarios",
        "2",
        "--level",
        "0",
        "--level",
        "1",
        "--variant",
        "original",
        "--table-count",
        "2",
        "--run-id",
        "lc-cli",
    ]
    assert run("lifecycle", "items", *small) == 0
    out = capsys.readouterr().out
    assert "progressive" in out and "/lc-cli/lifecycle/items/debug.parquet" in out
    assert run("lifecycle", "run", *small) == 0
    out = capsys.readouterr().out
    assert "| oracle" in out and "report:" in out and "ORACLE FAILED" not in out
    assert run("lifecycle", "report", "--run-id", "lc-cli") == 0
    assert "Main results" in capsys.readouterr().out
    assert run("lifecycle", "run", "--phase", "tuning", *small) == 2
    assert "unknown phases" in capsys.readouterr().err
    assert run("lifecycle", "run", "--model", "gpt-4", *small) == 2
    assert run("lifecycle", "run", "--level", "7", "--run-id", "x") == 2
    assert run("lifecycle", "report", "--run-id", "no-such-run") == 2
