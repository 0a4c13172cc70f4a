"""Batch keys and failure gathering of the mapped stages (issue 16, stale batches).

A batch key digests the items, the agent's fingerprint and the full stage configuration, so
re-running a run id with a changed ``GenerationConfig`` / ``LifecycleConfig`` / equivalence pair
/ replay source runs the affected batches again, while an unchanged re-run reuses every batch.
Every mapped batch runs to its end even when others fail: the flow then raises
:class:`tasks.core.runs.StageFailed` naming each failed batch (never only the first).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from schemas.lifecycle import LifecycleConfig
from schemas.text2sql import GenerationConfig
from tasks.core.runs import StageFailed, batch_key, spec_fingerprint
from tests.helpers import SHARED_DATA

QUESTIONS = str(SHARED_DATA / "tpcds" / "business_questions.json")
SPIDER_DIR = SHARED_DATA / "spider" / "databases"
SPIDER_QUESTIONS = SHARED_DATA / "spider" / "dev.json"


def _mtimes(directory: Path, pattern: str) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in sorted(directory.glob(pattern))}


def test_batch_key_digests_every_material_and_replay_content(tmp_path):
    base = batch_key("openai:m", 3, ["m", None, [["1", "q"]], {"max_retries": 3}])
    assert base.startswith("openai_m-0003-") and len(base.rsplit("-", 1)[1]) == 10
    assert base == batch_key("openai:m", 3, ["m", None, [["1", "q"]], {"max_retries": 3}])
    assert base != batch_key("openai:m", 3, ["m", None, [["1", "q"]], {"max_retries": 1}])
    assert base != batch_key("openai:m", 3, ["m", None, [["1", "q2"]], {"max_retries": 3}])
    f = tmp_path / "a.jsonl"
    f.write_text("one\n")
    d = tmp_path / "dir"
    d.mkdir()
    (d / "1.sql").write_text("SELECT 1")
    fp_file, fp_dir = spec_fingerprint(f"replay:{f}"), spec_fingerprint(f"replay:{d}")
    f.write_text("two\n")
    (d / "1.sql").write_text("SELECT 2")
    assert spec_fingerprint(f"replay:{f}") != fp_file
    assert spec_fingerprint(f"replay:{d}") != fp_dir
    assert spec_fingerprint("oracle") is None and spec_fingerprint("openai:m") is None
    with pytest.raises(OSError):
        spec_fingerprint(f"replay:{tmp_path / 'gone.jsonl'}")


def test_generation_and_lifecycle_plans_digest_the_config():
    from tasks.text2sql.stage import plan_generation_batches

    keys = lambda cfg: [b["key"] for b in plan_generation_batches(["oracle"], ["1", "2"], 1,
                                                                  config=cfg)]
    assert keys(None) == keys(GenerationConfig()) == keys({"max_retries": 3})
    for changed in ({"max_retries": 1}, {"temperature": 0.7}, {"max_tokens": 64},
                    {"statement_timeout_ms": 5}):
        assert set(keys(changed)).isdisjoint(keys(None)), changed
    # the business questions are part of the items
    with_questions = plan_generation_batches(["oracle"], ["1"], 1, descriptions_path=QUESTIONS)
    assert with_questions[0]["key"] != keys(None)[0]


# -------------------------------------------------------------------------------- generation


@pytest.fixture
def replay_twice(tmp_path) -> Path:
    """Query 3: an invalid attempt, then a valid one (so ``max_retries`` decides the outcome)."""
    path = tmp_path / "twice.jsonl"
    path.write_text(
        json.dumps({"query_id": 3, "attempt": 0, "sql": "SELECT * FROM nowhere"}) + "\n"
        + json.dumps({"query_id": 3, "attempt": 1, "sql": "SELECT 1"}) + "\n"
    )
    return path


def test_generation_rerun_with_changed_config_regenerates(
    prefect_harness, settings, pg_server_url, replay_twice
):
    from flows.text2sql import text2sql_generation

    def run(config=None, generators=None):
        return text2sql_generation(
            "t2s-stale", generators or ["oracle", f"replay:{replay_twice}"], QUESTIONS,
            query_ids=["3"], config=config, batch_size=1, artifacts_root=settings.artifacts,
        )

    first = run()
    batches = Path(first["generations"]).parent / "batches"
    replay = pl.read_parquet(first["generations"]).filter(pl.col("model") == "replay:twice")
    assert replay.select("attempt", "valid").rows() == [(0, False), (1, True)]
    before = _mtimes(batches, "*.parquet")
    assert len(before) == 2
    run()  # unchanged: every batch is reused
    assert _mtimes(batches, "*.parquet") == before
    # no retry allowed now: the stale batch (valid after a retry) must not be reused
    again = run({"max_retries": 0})
    replay = pl.read_parquet(again["generations"]).filter(pl.col("model") == "replay:twice")
    assert replay.select("attempt", "valid").rows() == [(0, False)]
    assert _mtimes(batches, "*.parquet") | before == _mtimes(batches, "*.parquet")  # kept
    assert len(_mtimes(batches, "*.parquet")) == 4
    # a changed replay file is another generator's answers: that batch runs again
    replay_twice.write_text(json.dumps({"query_id": 3, "sql": "SELECT 2"}) + "\n")
    third = run({"max_retries": 0})
    replay = pl.read_parquet(third["generations"]).filter(pl.col("model") == "replay:twice")
    assert replay.select("attempt", "valid", "sql").rows() == [(0, True, "SELECT 2")]


def test_generation_gathers_every_failed_batch(prefect_harness, settings, pg_server_url,
                                               tmp_path):
    from flows.text2sql import text2sql_generation

    bad = []
    for name in ("broken_a", "broken_b"):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("not json\n")  # exists (passes planning), fails when the batch loads it
        bad.append(f"replay:{path}")
    with pytest.raises(StageFailed) as info:
        text2sql_generation("t2s-failing", ["oracle", *bad], QUESTIONS, query_ids=["3"],
                            batch_size=1, artifacts_root=settings.artifacts)
    exc = info.value
    assert (exc.stage, exc.total, len(exc.failed)) == ("generation", 3, 2)
    failed = " ".join(k for k, _ in exc.failed)
    assert "broken_a" in failed and "broken_b" in failed
    assert all("GeneratorConfigError" in err and ".jsonl:1" in err for _, err in exc.failed)
    # the batch that worked was written, so a re-run after the fix only does the failed ones
    written = list((Path(settings.artifacts) / "runs" / "t2s-failing" / "text2sql" /
                    "batches").glob("oracle-*.parquet"))
    assert len(written) == 1


# -------------------------------------------------------------------------------- lifecycle

LC_CONFIG = {
    "spider_db_ids": ["pets_1"],
    "include_chinook": False,
    "max_items": 2,
    "variants": ["original"],
    "batch_size": 10,
}


def _lifecycle(settings, run_id, models, config=None):
    from flows.lifecycle import lifecycle

    return lifecycle(run_id, models, str(SPIDER_DIR), str(SPIDER_QUESTIONS),
                     phases=["text2sql"], config={**LC_CONFIG, **(config or {})},
                     artifacts_root=settings.artifacts)


def _replay_file(path: Path, items: list[dict], sql: str | None = None) -> None:
    path.write_text("".join(
        json.dumps({"item_id": it["item_id"],
                    "response": f"```sql\n{sql or it['reference']['sql']}\n```"}) + "\n"
        for it in items))


def test_lifecycle_rerun_with_changed_config_or_replay_runs_again(
    prefect_harness, settings, tmp_path
):
    from tasks.lifecycle.pipeline import (
        generate_lifecycle_items,
        plan_lifecycle_batches,
        prepare_lifecycle_databases,
        read_items,
    )

    run_id = "lc-stale"
    cfg = LifecycleConfig.model_validate(LC_CONFIG).model_dump(mode="json")
    dbs = prepare_lifecycle_databases.fn(run_id, settings.artifacts, str(SPIDER_DIR),
                                         str(SPIDER_QUESTIONS), None, cfg)
    manifest = generate_lifecycle_items.fn(run_id, settings.artifacts, "text2sql", dbs, cfg)
    items = read_items(manifest["uri"])
    replay = tmp_path / "recorded.jsonl"
    _replay_file(replay, items)  # right answers
    models = ["oracle", f"replay:{replay}"]

    first = _lifecycle(settings, run_id, models)
    batches = Path(first["markdown"]).parent / "batches"
    results = lambda out: pl.read_parquet(out["results"]["text2sql"]["results"])
    assert results(first).filter(pl.col("model") == "replay:recorded")["ex"].to_list() == [1.0] * 2
    before = _mtimes(batches, "*.results.parquet")
    assert len(before) == 2
    _lifecycle(settings, run_id, models)  # unchanged: every batch reused
    assert _mtimes(batches, "*.results.parquet") == before

    # the replay file now holds wrong answers: its batch runs again, the oracle's is kept
    _replay_file(replay, items, sql="SELECT 0")
    second = _lifecycle(settings, run_id, models)
    assert results(second).filter(pl.col("model") == "replay:recorded")["ex"].to_list() == [0.0] * 2
    now = _mtimes(batches, "*.results.parquet")
    assert len(now) == 3 and {p: now[p] for p in before} == before

    # a changed stage config (debug rounds, sampling) is a new batch for every model
    for changed in ({"debug_rounds": 1}, {"temperature": 0.5}):
        old = {b["key"] for b in plan_lifecycle_batches(models, [manifest], 10, cfg)}
        new = {b["key"] for b in plan_lifecycle_batches(models, [manifest], 10,
                                                        {**cfg, **changed})}
        assert old.isdisjoint(new), changed
    third = _lifecycle(settings, run_id, models, {"debug_rounds": 1})
    assert len(_mtimes(batches, "*.results.parquet")) == 5
    assert results(third).height == results(second).height == 4  # only this config's batches


def test_lifecycle_gathers_every_failed_batch(prefect_harness, settings, tmp_path):
    bad = []
    for name in ("broken_a", "broken_b"):
        path = tmp_path / f"{name}.jsonl"
        path.write_text('{"response": "no item id"}\n')
        bad.append(f"replay:{path}")
    with pytest.raises(StageFailed) as info:
        _lifecycle(settings, "lc-failing", ["oracle", *bad])
    exc = info.value
    assert (exc.stage, exc.total, len(exc.failed)) == ("lifecycle", 3, 2)
    failed = " ".join(k for k, _ in exc.failed)
    assert "broken_a" in failed and "broken_b" in failed
    assert all("AgentConfigError" in err for _, err in exc.failed)
    batches = Path(settings.artifacts) / "runs" / "lc-failing" / "lifecycle" / "batches"
    assert len(list(batches.glob("oracle-*.results.parquet"))) == 1


# -------------------------------------------------------------------------------- equivalence


def _pairs(path: Path, db: Path, sql2: str) -> Path:
    rows = [
        {"id": "same", "sql1": "SELECT id FROM t", "sql2": sql2, "db": str(db),
         "dialect": "sqlite", "label": True},
        {"id": "other", "sql1": "SELECT id FROM t", "sql2": "SELECT id FROM t WHERE id > 1",
         "db": str(db), "dialect": "sqlite", "label": False},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def tiny_db(tmp_path) -> Path:
    import sqlite3

    path = tmp_path / "t.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY)")
    con.executemany("INSERT INTO t VALUES (?)", [(1,), (2,)])
    con.commit()
    con.close()
    return path


def test_equivalence_rerun_with_a_changed_pair_judges_it_again(
    prefect_harness, settings, tmp_path, tiny_db
):
    from flows.equivalence import equivalence

    def run(pairs_path):
        out = equivalence(run_id="eq-stale", pairs_path=str(pairs_path), methods=["exec_match"],
                          batch_size=1, artifacts_root=settings.artifacts)
        df = pl.read_parquet(out["equivalence"])
        return out, dict(df.select("pair_id", "verdict").rows())

    pairs = _pairs(tmp_path / "pairs.jsonl", tiny_db, "SELECT id FROM t WHERE id > 0")
    out, verdicts = run(pairs)
    assert verdicts == {"same": "equivalent", "other": "not_equivalent"}
    batches = Path(out["equivalence"]).parent / "batches"
    before = _mtimes(batches, "*.parquet")
    assert run(pairs)[1] == verdicts and _mtimes(batches, "*.parquet") == before
    # the same id now holds another query: judged again, the unchanged pair's batch is kept
    _pairs(pairs, tiny_db, "SELECT id FROM t WHERE id = 1")
    assert run(pairs)[1] == {"same": "not_equivalent", "other": "not_equivalent"}
    now = _mtimes(batches, "*.parquet")
    assert len(now) == 3 and {p: now[p] for p in before} == before


def test_equivalence_gathers_every_failed_batch(prefect_harness, settings, tmp_path, tiny_db,
                                                monkeypatch):
    from prefect import task

    import flows.equivalence as flow_module
    from tasks.equivalence.stage import run_equivalence_batch

    real = run_equivalence_batch.fn

    def flaky(run_id, artifacts_root, pairs_uri, batch, options=None):
        if (batch["method"], batch["pair_ids"]) != ("exec_match", ["same"]):
            raise RuntimeError(f"lost the database of {batch['pair_ids']}")
        return real(run_id, artifacts_root, pairs_uri, batch, options)

    monkeypatch.setattr(flow_module, "run_equivalence_batch",
                        task(name="flaky-equivalence-batch", persist_result=False)(flaky))
    pairs = _pairs(tmp_path / "pairs.jsonl", tiny_db, "SELECT id FROM t")
    with pytest.raises(StageFailed) as info:
        flow_module.equivalence(run_id="eq-failing", pairs_path=str(pairs),
                                methods=["exec_match", "finder"], batch_size=1,
                                artifacts_root=settings.artifacts)
    exc = info.value
    assert (exc.stage, exc.total, len(exc.failed)) == ("equivalence", 4, 3)
    assert all("lost the database" in err for _, err in exc.failed)
    batches = Path(settings.artifacts) / "runs" / "eq-failing" / "equivalence" / "batches"
    assert len(list(batches.glob("*.parquet"))) == 1  # the batch that worked is kept


# -------------------------------------------------------------------------------- trials


def test_trial_keys_digest_options_hints_and_items(stocks_manifest, settings):
    from tasks.core import storage
    from tasks.trials.stage import plan_batches

    uri = storage.join(settings.artifacts, "datasets", "stocks", stocks_manifest["version"],
                       "manifest.json")
    keys = lambda **kw: {b["key"] for b in plan_batches([uri], ["openai:m"], 2, 4, **kw)}
    base = keys()
    assert keys() == base
    assert keys(options={"max_iterations": 3}).isdisjoint(base)
    assert keys(options={"temperature": 0.5}).isdisjoint(base)
    assert keys(hints=["on"]).isdisjoint(base)
