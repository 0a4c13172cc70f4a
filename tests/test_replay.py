"""The replay agent: DAB leaderboard answer files scored through the same validators, batch task
and tables as live agents."""

from __future__ import annotations

import json

import polars as pl
import pytest

from tasks.core import storage
from tasks.scoring.stage import score_frame
from tasks.agents.replay import ReplayError, answers_for, load_answers, resolve_query
from tasks.trials.stage import check_agents, combine_trials, plan_batches, run_trial_batch


@pytest.fixture
def manifest_uri(stocks_manifest, settings) -> str:
    return storage.join(
        settings.artifacts, "datasets", "stocks", stocks_manifest["version"], "manifest.json"
    )


def _write(tmp_path, entries, name="answers.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(entries))
    return str(path)


def test_replay_scores_a_leaderboard_file(tmp_path, manifest_uri, stocks_manifest):
    ids = [q["id"] for q in stocks_manifest["queries"]]
    nasdaq = ids.index("nasdaq_top_volume_2012") + 1
    entries = [
        # DAB's shape: upper-case dataset, 1-based query number and run as strings
        {"dataset": "STOCKS", "query": str(nasdaq), "run": "0",
         "answer": "Facebook had the highest average daily volume."},
        {"dataset": "STOCKS", "query": str(nasdaq), "run": "1", "answer": "Apple"},
        # a query id and an int run work too; extra keys are ignored
        {"dataset": "stocks", "query": "nasdaq_top_volume_2012", "run": 2, "answer": "FB (Facebook)",
         "agent": "x"},
        {"dataset": "OTHER_DATASET", "query": "1", "run": "0", "answer": "ignored"},
    ]
    agent = f"replay:{_write(tmp_path, entries)}"
    desc = check_agents([agent], [manifest_uri])
    assert desc[0]["entries"] == 4 and desc[0]["ignored_datasets"] == ["other_dataset"]
    root = str(tmp_path / "artifacts")
    batches = plan_batches([manifest_uri], [agent], 3, batch_size=100)
    for b in batches:
        run_trial_batch.fn("replay-run", root, b)
    out = combine_trials.fn("replay-run", root, [b["key"] for b in batches])
    trials = score_frame(pl.read_parquet(out["trials"]), [manifest_uri])
    assert trials.height == len(ids) * 3
    nq = trials.filter(pl.col("query_id") == "nasdaq_top_volume_2012").sort("trial")
    assert nq["is_correct"].to_list() == [True, False, True]
    assert nq["terminate_reason"].to_list() == ["replay"] * 3
    others = trials.filter(pl.col("query_id") != "nasdaq_top_volume_2012")
    assert set(others["terminate_reason"]) == {"no_answer"} and not others["is_correct"].any()
    assert trials["cost_usd"].sum() == 0 and trials["n_llm_calls"].sum() == 0
    assert pl.read_parquet(out["llm_calls"]).height == 0
    # the file, not n_trials, sets the trials: runs 0..2 → 3 per query, whatever n_trials says
    items = [i for b in plan_batches([manifest_uri], [agent], 5, 100) for i in b["items"]]
    assert len(items) == len(ids) * 3 and max(t for _, t in items) == 2
    # a dataset the file does not answer is not planned for the replay agent
    other = _write(tmp_path, [entries[-1]], name="other.json")
    assert plan_batches([manifest_uri], [f"replay:{other}"], 5, 100) == []
    # the same file plans the same batches; an edited file plans new ones
    assert [b["key"] for b in plan_batches([manifest_uri], [agent], 3, 100)] == [b["key"] for b in batches]
    _write(tmp_path, entries[:1])
    assert plan_batches([manifest_uri], [agent], 3, 100)[0]["key"] != batches[0]["key"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json at all", "not valid JSON"),
        ('{"dataset": "stocks"}', "expected a JSON list"),
        ('[{"dataset": "stocks", "query": "1", "answer": "x"}]', "missing keys ['run']"),
        ('[{"dataset": "stocks", "query": "1", "run": "-1", "answer": "x"}]', "non-negative integer"),
        (('[{"dataset": "stocks", "query": "1", "run": 0, "answer": "x"},'
          ' {"dataset": "STOCKS", "query": "1", "run": "0", "answer": "y"}]'), "duplicate answer"),
        ('[1, 2]', "entry 0: expected an object"),
    ],
)
def test_bad_answer_files_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ReplayError) as err:
        load_answers(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_unknown_queries_fail_before_any_trial(tmp_path, manifest_uri, stocks_manifest):
    path = _write(tmp_path, [{"dataset": "stocks", "query": "99", "run": 0, "answer": "x"},
                             {"dataset": "stocks", "query": "no_such_query", "run": 0, "answer": "x"}])
    with pytest.raises(ReplayError, match=r"has no queries \['99', 'no_such_query'\]"):
        check_agents([f"replay:{path}"], [manifest_uri])
    with pytest.raises(ReplayError, match="not found"):
        check_agents([f"replay:{tmp_path / 'missing.json'}"], [manifest_uri])
    assert resolve_query(stocks_manifest, "query1") == stocks_manifest["queries"][0]["id"]
    # the same trial answered by id and by position is ambiguous
    first = stocks_manifest["queries"][0]["id"]
    both = load_answers(_write(tmp_path, [{"dataset": "stocks", "query": first, "run": 0, "answer": "a"},
                                          {"dataset": "stocks", "query": "1", "run": 0, "answer": "b"}]))
    with pytest.raises(ReplayError, match="twice"):
        answers_for(both, stocks_manifest)


def test_json_lines_and_non_string_answers(tmp_path, stocks_manifest):
    path = tmp_path / "answers.jsonl"
    path.write_text('{"dataset": "stocks", "query": "1", "run": 0, "answer": 42.5}\n'
                    '{"dataset": "stocks", "query": "2", "run": 0, "answer": null}\n')
    got = answers_for(load_answers(path), stocks_manifest)
    ids = [q["id"] for q in stocks_manifest["queries"]]
    assert got == {(ids[0], 0): "42.5", (ids[1], 0): None}
