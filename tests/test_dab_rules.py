"""DAB as published (issue 15, points 1-3): imported datasets run under DAB's names, prompt,
limits and scoring rules; a scoring-only import rescores leaderboard answer files and prints
DAB's leaderboard pass@1 computed as DAB's stats_scripts compute it. Over the hand-made DAB
checkouts of ``tests/fakes/dab.py``, through the real CLI, flows and (for LLM agents) the
scripted OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import polars as pl
import pytest

from tasks.core import runs
from tasks.core import storage
from tasks.agents.react import SYSTEM_PROMPT, user_prompt
from tasks.datasets.dab_import import import_dab_dataset
from tasks.scoring.dab_rules import (
    DAB_AGENT_DEFAULTS,
    EMPTY_ANSWER_REASON,
    NO_TOOL_CALL_REASON,
    dataset_condition,
    leaderboard_pass_at_1,
    pass_at_k,
)
from tasks.agents.replay import ReplayError, answers_for, load_answers
from tasks.scoring.scoring_file import load_scoring
from tasks.scoring.stage import score_rows
from tasks.trials.stage import AgentConfigError, agent_options, check_agents, plan_batches
from tests.fakes.dab import make_dab_suite, scoring_only_copy, write_answer_file
from tests.fakes.hostile import register_model
from tests.fakes.openai_server import ScriptedOpenAIServer, is_preflight, message, tool_calls

#: A leaderboard answer file over the suite and what DAB's scripts make of it.
ANSWERS = {
    ("tinyshop", 1): ["The total is 151.25.", "About 150"],         # 1/2
    ("tinyshop", 2): ["Lovelace, Hopper", "Hopper and Lovelace"],   # 2/2
    ("tinyshop", 3): ["4.5", ""],                                    # 1/2: "" is invalid
    ("PATENTS", 1): ["3 publications", "three: 3"],                 # 2/2
    ("PATENTS", 2): ["Soil working", None],                         # 1/1: run 1 missing
    ("PATENTS", 4): ["2019", "2020"],                               # 1/2
    ("agnews", 1): ["The Rundown", "Cavaliers"],                    # 1/2
    ("agnews", 2): ["2", "two 2"],                                  # 2/2
}
# tinyshop (0.5 + 1 + 0.5) / 3, PATENTS (1 + 1 + 0.5) / 3, agnews (0.5 + 1) / 2; mean of those
EXPECTED = {"tinyshop": 2 / 3, "PATENTS": 2.5 / 3, "agnews": 0.75}
EXPECTED_ALL = (2 / 3 + 2.5 / 3 + 0.75) / 3            # 0.7500
EXPECTED_MISSING_AS_FAILURES = (2 / 3 + 2 / 3 + 0.75) / 3  # 0.6944 (PATENTS q2: 1/2)


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    return make_dab_suite(tmp_path_factory.mktemp("suite"))


@pytest.fixture(scope="module")
def imported(suite, settings) -> dict[str, str]:
    """The suite imported into the session's artifact root: name → manifest URI."""
    return {name: import_dab_dataset.fn(str(suite / f"query_{name}"), settings.artifacts)
            for name in ("tinyshop", "PATENTS", "agnews")}


def _main(*argv: str) -> int:
    from querylab.cli import main

    return main(list(argv))


# -- the leaderboard figure -----------------------------------------------------------------------


def test_pass_at_k_is_dabs():
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 5) == 1.0 and pass_at_k(10, 2, 5) == pytest.approx(1 - 56 / 252)


def test_leaderboard_figure_averages_queries_then_datasets():
    def row(dataset, query, reason, verdict):
        return {"agent": "a", "dataset": dataset, "query_id": query, "terminate_reason": reason,
                "verdict": verdict, "is_correct": None if verdict == "errored" else
                verdict == "correct"}

    rows = (
        [row("d1", "query1", "replay", v) for v in ("correct", "incorrect")]      # 0.5
        + [row("d1", "query2", "replay", "correct")]                              # 1.0
        + [row("d1", "query3", "no_answer", "incorrect")] * 2                     # no runs
        + [row("d2", "query1", "replay", "correct")] * 3                          # 1.0 ...
        + [row("d2", "query1", "api_error", "errored")]                           # a run: 3/4
        + [row("d2", "query2", "return_answer", "errored")]                       # validator
        + [row("d2", "query2", "return_answer", "incorrect")]                     # 0/1
    )
    fig = leaderboard_pass_at_1(pl.DataFrame(rows))["a"]
    assert [(d["dataset"], d["queries"], d["pass_at_1"]) for d in fig["datasets"]] == [
        ("d1", 2, 0.75), ("d2", 2, 0.375)]
    assert fig["pass_at_1"] == pytest.approx((0.75 + 0.375) / 2)
    assert fig["missing_runs"] == 2 and fig["validator_errors"] == 1
    # with the missing trials counted as failed runs, d1 has 3 queries: (0.5 + 1 + 0) / 3
    assert fig["pass_at_1_missing_as_failures"] == pytest.approx((0.5 + 0.375) / 2)


# -- scoring rules --------------------------------------------------------------------------------


@pytest.mark.slow
def test_dab_scoring_rules(imported):
    scoring = load_scoring(imported["tinyshop"])
    base = {"run_id": "r", "agent": "a", "dataset": "tinyshop", "query_id": "query1",
            "error": None, "dataset_version": scoring["version"]}
    trials = [
        {**base, "trial_key": "k0", "trial": 0, "terminate_reason": "no_tool_call",
         "answer": "It is 151.25"},
        {**base, "trial_key": "k1", "trial": 1, "terminate_reason": "return_answer",
         "answer": ""},
        {**base, "trial_key": "k2", "trial": 2, "terminate_reason": "return_answer",
         "answer": "151.25"},
    ]
    rows = score_rows(trials, {"tinyshop": scoring})
    assert [r["verdict"] for r in rows] == ["incorrect", "incorrect", "correct"]
    assert rows[0]["reason"] == NO_TOOL_CALL_REASON and rows[1]["reason"] == EMPTY_ANSWER_REASON
    # --score-no-tool-call scores the text; the empty answer stays invalid
    rows = score_rows(trials, {"tinyshop": scoring}, score_no_tool_call=True)
    assert [r["verdict"] for r in rows] == ["correct", "incorrect", "correct"]


@pytest.mark.slow
def test_dab_limits_are_the_defaults_of_imported_datasets(imported, stocks_manifest, settings):
    stocks = storage.join(settings.artifacts, "datasets", "stocks", stocks_manifest["version"],
                          "manifest.json")
    plans = {b["manifest_uri"]: b["options"]
             for b in plan_batches([imported["tinyshop"], stocks], ["openai:m"], 1, 100)}
    dab = plans[imported["tinyshop"]]
    assert dab["python_timeout_s"] == 600 and dab["preview_chars"] == 10_000
    assert dab["request_timeout_s"] == 600 and "max_iterations" not in dab  # 100: the default
    assert plans[stocks] == {}  # querylab's own defaults
    # an option given explicitly wins over DAB's
    plans = {b["manifest_uri"]: b["options"] for b in plan_batches(
        [imported["tinyshop"], stocks], ["openai:m"], 1, 100,
        options={"python_timeout_s": 60, "max_iterations": 5})}
    effective = agent_options(plans[imported["tinyshop"]])
    assert effective.python_timeout_s == 60 and effective.max_iterations == 5
    assert effective.preview_chars == 10_000  # the others stay DAB's
    assert plans[stocks] == {"max_iterations": 5}  # 60 s is querylab's default
    manifest = storage.read_json(imported["tinyshop"])
    cond = dataset_condition(manifest, {}, ["off"], False)
    assert cond["format"] == "dab" and cond["agent_options"]["preview_chars"] == 10_000
    assert "no_tool_call endings invalid (DAB)" in cond["scoring"]
    assert set(DAB_AGENT_DEFAULTS) <= set(cond["agent_options"]) | {"max_iterations"}


@pytest.mark.slow
def test_prompt_is_question_and_description_as_dab_builds_it(imported, suite):
    m = storage.read_json(imported["agnews"])
    description = (suite / "query_agnews" / "db_description.txt").read_text()
    hints = (suite / "query_agnews" / "db_description_withhint.txt").read_text()
    question = m["queries"][0]["question"]
    # run_agent.py + prompt_builder.init_messages, byte for byte
    dab_off = f"QUERY:\n{question.strip()}\n\nDATABASE DESCRIPTION:\n{description.strip()}"
    dab_on = (f"QUERY:\n{question.strip()}\n\nDATABASE DESCRIPTION:\n"
              + (description.strip() + "\n\n" + hints.strip()).strip())
    assert user_prompt(m, question, hints=False) == dab_off
    assert user_prompt(m, question, hints=True) == dab_on


@pytest.mark.slow
def test_agents_that_cannot_run_a_dab_dataset_are_refused(imported, suite, tmp_path):
    pub = scoring_only_copy(suite, tmp_path / "pub")
    uri = import_dab_dataset.fn(str(pub / "query_agnews"), str(tmp_path / "art"),
                                scoring_only=True)
    with pytest.raises(AgentConfigError, match="--scoring-only .* not openai:m"):
        check_agents(["openai:m"], [uri])
    assert check_agents(["oracle"], [uri])  # the oracle needs no database
    # --hints on where DAB has no hint file: refused, as DAB's --use_hints refuses
    nohint = tmp_path / "query_nohint"
    shutil.copytree(suite / "query_tinyshop", nohint)
    (nohint / "db_description_withhint.txt").unlink()
    uri = import_dab_dataset.fn(str(nohint), str(tmp_path / "art"))
    with pytest.raises(AgentConfigError, match="no db_description_withhint.txt"):
        check_agents(["openai:m"], [uri], hints=["off", "on"])


# -- scoring-only rescoring of an answer file -------------------------------------------------------


def test_scoring_only_rescore_prints_the_dab_figure_last(suite, tmp_path, prefect_harness,
                                                          capsys):
    pub = scoring_only_copy(suite, tmp_path / "pub")
    assert not list(pub.rglob("*.db")) and not list(pub.rglob("db_config.yaml"))
    answers = write_answer_file(tmp_path / "answers.json", ANSWERS)
    root = str(tmp_path / "art")
    status = _main("import-dab", str(pub), "--scoring-only", "--agent", f"replay:{answers}",
                   "--run-id", "rescore-1", "--artifacts", root)
    out = capsys.readouterr().out
    assert status == 0, out
    lines = out.strip().splitlines()
    assert lines[-1] == f"DAB pass@1: {EXPECTED_ALL:.4f}" == "DAB pass@1: 0.7500"
    table = {line.split()[0]: line.split() for line in lines
             if line.split() and line.split()[0] in EXPECTED}
    for name, value in EXPECTED.items():
        assert float(table[name][-1]) == pytest.approx(value, abs=5e-5), table[name]
    assert f"counted as failures: {EXPECTED_MISSING_AS_FAILURES:.4f}" in out
    scores = pl.read_parquet(storage.join(root, "runs", "rescore-1", "score", "scores.parquet"))
    assert set(scores["dataset"]) == {"tinyshop", "PATENTS", "agnews"}  # DAB's names
    assert scores.filter(pl.col("terminate_reason") == "no_answer").height == 1
    empty = scores.filter(pl.col("answer") == "")
    assert empty["reason"].to_list() == [EMPTY_ANSWER_REASON]
    # the same figure from the stored scores alone
    fig = leaderboard_pass_at_1(scores)
    assert fig[f"replay:{answers}"]["pass_at_1"] == pytest.approx(EXPECTED_ALL)
    record = runs.find_run(root, "rescore-1")
    assert record.conditions["PATENTS"]["format"] == "dab"
    # re-running with `querylab run` finds the imported datasets by the file's names
    status = _main("run", "--agent", f"replay:{answers}", "--run-id", "rescore-2",
                   "--artifacts", root)
    out = capsys.readouterr().out
    assert status == 0 and out.strip().splitlines()[-1] == "DAB pass@1: 0.7500"


def test_answer_files_that_match_nothing_are_errors(suite, tmp_path, prefect_harness, capsys):
    pub = scoring_only_copy(suite, tmp_path / "pub")
    root = str(tmp_path / "art")
    typo = write_answer_file(tmp_path / "typo.json", {**ANSWERS, ("agnew", 1): ["x"]})
    status = _main("import-dab", str(pub), "--scoring-only", "--agent", f"replay:{typo}",
                   "--artifacts", root)
    err = capsys.readouterr().err
    assert status == 2 and "'agnew' (1 entries)" in err and "agnews" in err
    gap = write_answer_file(tmp_path / "gap.json", {("PATENTS", 3): ["x"]})  # no query3
    assert _main("import-dab", str(pub), "--scoring-only", "--agent", f"replay:{gap}",
                 "--artifacts", root, "--run-id", "gap-1") == 2
    assert "has no queries ['3']" in capsys.readouterr().err
    # `querylab run` with no --dataset: the file's datasets must be querylab's or imported
    other = write_answer_file(tmp_path / "other.json", {("yelp", 1): ["x"], ("agnews", 1): ["y"]})
    assert _main("run", "--agent", f"replay:{other}", "--artifacts", root) == 2
    assert "'yelp' (1 entries)" in capsys.readouterr().err
    # named datasets the file does not answer at all: nothing to score
    manifest = storage.read_json(import_dab_dataset.fn(str(pub / "query_agnews"), root,
                                                       scoring_only=True))
    with pytest.raises(ReplayError, match="no entry is for a dataset of this run"):
        check_agents([f"replay:{gap}"], [storage.join(root, "datasets", "agnews",
                                                      manifest["version"], "manifest.json")])
    got = answers_for(load_answers(write_answer_file(
        tmp_path / "n.json", {("PATENTS", 4): ["2019"]})), {"name": "PATENTS", "format": "dab",
                                                           "queries": [{"id": "query1"},
                                                                       {"id": "query4"}]})
    assert got == {("query4", 0): "2019"}  # DAB's query 4 is folder query4, not position 4


def test_a_run_that_scores_nothing_fails():
    from querylab.cli import check_scored

    assert check_scored({"trials": 0}, "run") == 1 and check_scored({"trials": 3}, "run") == 0


# -- runs on DAB datasets ------------------------------------------------------------------------


@pytest.mark.slow
def test_run_a_dab_fixture_with_the_oracle(imported, prefect_harness, settings, capsys):
    status = _main("run", "--dataset", "patents", "--dataset", "agnews", "--agent", "oracle",
                   "--trials", "1", "--run-id", "dab-oracle")
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.strip().splitlines()[-1] == "DAB pass@1: 1.0000"
    record = runs.find_run(settings.artifacts, "dab-oracle")
    assert record.benchmark.datasets == ["PATENTS", "agnews"]  # resolved to DAB's spelling
    report = next(line.split()[-1] for line in out.splitlines() if line.startswith("report:"))
    assert "DAB condition of `PATENTS`, `agnews`: hints off; limits as DAB" in \
        Path(report).read_text()
    assert _main("run", "--dataset", "PATENT", "--agent", "oracle") == 2
    assert "imported DAB datasets" in capsys.readouterr().err
    assert _main("run", "--dataset", "agnews", "--query", "agnews/query9") == 2


@pytest.fixture
def total_as_text_model(tmp_path, monkeypatch):
    """A scripted server: query1 (the total) answered by text without a tool call (a
    ``no_tool_call`` ending), every other question by return_answer("4.5"); yields (agent, server)."""
    lock = threading.Lock()

    def respond(body: dict, index: int):
        with lock:
            user = body["messages"][1]["content"] if len(body["messages"]) > 1 else ""
            if "total amount" in user:
                return message("The total is 151.25.")
            return tool_calls(("return_answer", {"answer": "4.5"}))

    with ScriptedOpenAIServer(respond) as srv:
        yield register_model(srv, tmp_path, monkeypatch.setenv), srv


@pytest.mark.slow
def test_hints_on_and_off_prompts_in_the_transcripts(imported, suite, prefect_harness, settings,
                                                     total_as_text_model):
    from flows.benchmark import benchmark

    agent, srv = total_as_text_model
    out = benchmark(run_id="dab-hints", datasets=["tinyshop"], agents=[agent], n_trials=1,
                    batch_size=10, artifacts_root=settings.artifacts, hints=["off", "on"],
                    agent_options={"cache": "off"})
    hints = (suite / "query_tinyshop" / "db_description_withhint.txt").read_text().strip()
    messages = pl.read_parquet(out["trials"]["messages"])
    first_user = (messages.filter(pl.col("role") == "user").sort("index")
                  .group_by("trial_key", maintain_order=True).first())
    by_condition: dict[str, dict[str, str]] = {"off": {}, "on": {}}
    for key, content in first_user.select("trial_key", "content").iter_rows():
        condition = "on" if key.startswith(agent + "+hints|") else "off"
        by_condition[condition][key.split("|")[2]] = content
    assert set(by_condition["off"]) == set(by_condition["on"]) == {"query1", "query2", "query3"}
    for qid, off in by_condition["off"].items():
        on = by_condition["on"][qid]
        assert off.startswith("QUERY:\n") and "\n\nDATABASE DESCRIPTION:\n" in off
        assert on == off + "\n\n" + hints and hints not in off  # visible in the transcripts
    systems = messages.filter(pl.col("role") == "system")["content"].unique().to_list()
    assert systems == [SYSTEM_PROMPT]
    # DAB's scoring: the text reply (no tool call) is invalid, whatever it says
    scores = pl.read_parquet(out["score"]["scores"])
    q1 = scores.filter(pl.col("query_id") == "query1")
    assert set(q1["terminate_reason"]) == {"no_tool_call"}
    assert set(q1["reason"]) == {NO_TOOL_CALL_REASON} and not q1["is_correct"].any()
    assert scores.filter(pl.col("query_id") == "query3")["is_correct"].all()
    # the condition is in the run record and the report
    record = runs.find_run(settings.artifacts, "dab-hints")
    cond = record.conditions["tinyshop"]
    assert cond["hints"] == ["off", "on"] and cond["agent_options"]["python_timeout_s"] == 600
    report_md = storage.read_bytes(out["report"]["markdown"]).decode()
    assert "DAB condition of `tinyshop`: hints off/on" in report_md
    assert "no_tool_call endings invalid (DAB)" in report_md
    # the batches ran with DAB's limits
    assert all(b["options"].get("preview_chars") == 10_000 for b in plan_batches(
        [out["manifests"][0]], [agent], 1, 10, options={"cache": "off"}, hints=["off", "on"]))
    requests = [b for b in srv.requests if not is_preflight(b)]
    assert len(requests) == 6 and all(json.dumps(b).count("QUERY:") == 1 for b in requests)
