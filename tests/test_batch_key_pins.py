"""Pinned batch keys, one per suite: a refactor of the batched stages (issue 16, Build 2) must
keep every key byte-identical, or runs started before it would not resume (they would pay
again for batches already finished). A failing assertion here means keys changed: do not
update the value unless the change of key is intended and said in the commit."""

from __future__ import annotations

from tasks.core import storage


def test_generation_key_is_pinned():
    from tasks.text2sql.stage import plan_generation_batches

    keys = [b["key"] for b in plan_generation_batches(["oracle"], ["1", "2"], 1)]
    assert keys == PINNED["text2sql"]


def test_equivalence_key_is_pinned():
    from tasks.equivalence.stage import plan_equivalence_batches

    keys = [b["key"] for b in plan_equivalence_batches(["p0", "p1", "p2"], ["finder", "exec_match"], 2)]
    assert keys == PINNED["equivalence"]


def test_trial_key_is_pinned(stocks_manifest, settings):
    from tasks.trials.stage import plan_batches

    uri = storage.join(settings.artifacts, "datasets", "stocks", stocks_manifest["version"],
                       "manifest.json")
    keys = [b["key"] for b in plan_batches([uri], ["openai:m"], 2, 4)]
    assert keys == PINNED["trials"]


def test_trial_key_with_options_hints_and_replay_is_pinned(stocks_uri, tmp_path, monkeypatch):
    from tasks.trials.stage import plan_batches

    monkeypatch.chdir(tmp_path)  # the replay spec is relative: the key names the spec as given
    (tmp_path / "answers.json").write_text(
        '[{"dataset": "stocks", "query": "1", "run": 1, "answer": "x"}]')
    batches = plan_batches([stocks_uri], ["openai:m", "replay:answers.json"], 1, 3,
                           options={"max_iterations": 3}, hints=["off", "on"], limit=2)
    assert [b["key"] for b in batches] == PINNED["trials_options"]


def test_equivalence_key_with_pairs_is_pinned(tmp_path):
    from tasks.equivalence.stage import plan_equivalence_batches

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(
        f'{{"id": "p{i}", "sql1": "SELECT {i}", "sql2": "SELECT {i} + 0", "label": true}}\n'
        for i in range(2)))
    keys = [b["key"] for b in plan_equivalence_batches(["p0", "p1"], ["exec_match"], 1,
                                                       pairs_uri=str(pairs))]
    assert keys == PINNED["equivalence_pairs"]


# computed on main 6dd35d2, before the refactor
PINNED: dict[str, list[str]] = {
    "text2sql": ["oracle-0000-5ec5012c5e", "oracle-0001-00c4c42e1e"],
    "equivalence": ["finder-0000-32da117f4b", "finder-0001-b3e5daf098",
                    "exec_match-0000-303bd8b124", "exec_match-0001-29dfc2c804"],
    "trials": ["openai_m-stocks-0000-3d5b40043b", "openai_m-stocks-0001-5e93d08a01",
               "openai_m-stocks-0002-3e34a8f12e"],
    "trials_options": ["openai_m-stocks-0000-f5109acb08",
                       "openai_m_hints-stocks-0000-0fd014bd8a",
                       "replay_answers.json-stocks-0000-1a27960e62",
                       "replay_answers.json-stocks-0001-e9c4f20bae"],
    "equivalence_pairs": ["exec_match-0000-00ee206646", "exec_match-0001-4b1117f77f"],
    # computed on main c2daafa, before the refactor
    "lifecycle": ["oracle-text2sql-0000-cfd804d270", "oracle-text2sql-0001-1b65e39d66",
                  "openai_m-text2sql-0000-16911f3a82", "openai_m-text2sql-0001-d687b539b0",
                  "replay_recorded-text2sql-0000-e95e140170",
                  "replay_recorded-text2sql-0001-57c9a0d526"],
}


def _lifecycle_items(path) -> dict:
    """Two fixed text2sql items in an items artifact at ``path``; returns their manifest."""
    from tasks.lifecycle.pipeline import items_to_table

    items = [
        {"item_id": f"t2s-{i}", "phase": "text2sql", "base_id": f"b{i}", "source": "spider",
         "db_id": "pets_1", "variant": "original", "level": 0, "seed": 7,
         "prompt": f"question {i}", "reference": {"sql": f"SELECT {i}"},
         "context": {"tables": ["pets"]}}
        for i in range(2)
    ]
    uri = storage.write_parquet(str(path), items_to_table(items))
    return {"phase": "text2sql", "uri": uri}


def test_lifecycle_key_is_pinned(tmp_path, monkeypatch):
    from tasks.lifecycle.pipeline import plan_lifecycle_batches

    monkeypatch.chdir(tmp_path)  # the replay spec is relative: the key names the spec as given
    (tmp_path / "recorded.jsonl").write_text('{"item_id": "t2s-0", "response": "SELECT 0"}\n')
    manifest = _lifecycle_items(tmp_path / "items.parquet")
    models = ["oracle", "openai:m", "replay:recorded.jsonl"]
    keys = [b["key"] for b in plan_lifecycle_batches(models, [manifest], 1, {"debug_rounds": 1})]
    assert keys == PINNED["lifecycle"]
