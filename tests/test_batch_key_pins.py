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


# computed on main 6dd35d2, before the refactor
PINNED: dict[str, list[str]] = {
    "text2sql": ["oracle-0000-5ec5012c5e", "oracle-0001-00c4c42e1e"],
    "equivalence": ["finder-0000-32da117f4b", "finder-0001-b3e5daf098",
                    "exec_match-0000-303bd8b124", "exec_match-0001-29dfc2c804"],
    "trials": ["openai_m-stocks-0000-3d5b40043b", "openai_m-stocks-0001-5e93d08a01",
               "openai_m-stocks-0002-3e34a8f12e"],
}
