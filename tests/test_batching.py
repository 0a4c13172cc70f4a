"""The batched-stage primitive (:mod:`tasks.core.batching`, issue 16 Build 2): planning keys,
run-if-missing with per-item checkpoints, writing a batch marker last, streaming combine."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.artifacts import ArtifactSchemaError
from schemas.text2sql import GENERATIONS
from tasks.core import batching, storage
from tasks.core.batching import BatchedStage, batch_key, label_slug, plan

SCHEMA = pa.schema(
    [pa.field("k", pa.string(), nullable=False), pa.field("n", pa.int64())],
    metadata={"schema_version": "1", "artifact": "test_rows"},
)
CALLS = pa.schema([pa.field("k", pa.string(), nullable=False)],
                  metadata={"schema_version": "1", "artifact": "test_calls"})


def test_label_slug_and_batch_key():
    assert label_slug("openai:gpt-4o mini") == "openai_gpt-4o_mini"
    assert label_slug(":x:") == "x" and label_slug(":::") == "x"
    assert label_slug(":x:", strip=False) == "_x_"
    assert label_slug("a" * 70) == "a" * 60 and label_slug("a" * 70, limit=None) == "a" * 70
    key = batch_key("openai:m", 2, ["m", [1, 2]])
    assert key.startswith("openai_m-0002-") and len(key.rsplit("-", 1)[1]) == 10
    assert batch_key("x", 2, ["m", [1, 2]], slug="own-slug").startswith("own-slug-0002-")
    assert batch_key("x", 2, ["m", [1, 2]], slug="s")[-10:] == key[-10:]  # same digest


def test_plan_chunks_items_and_digests_each_chunk():
    seen = []

    def material(chunk):
        seen.append(chunk)
        return ["agent", chunk]

    out = plan("agent", ["a", "b", "c"], 2, material)
    assert [c for _, c in out] == [["a", "b"], ["c"]] == seen
    assert [k for k, _ in out] == [batch_key("agent", 0, ["agent", ["a", "b"]]),
                                   batch_key("agent", 1, ["agent", ["c"]])]
    assert plan("agent", [], 2, material) == []
    with pytest.raises(ValueError, match="batch_size"):
        plan("agent", ["a"], 0, material)


def _stage() -> BatchedStage:
    return BatchedStage("demo", (("calls", CALLS), ("rows", SCHEMA)))


def test_uris_follow_the_run_layout(tmp_path):
    root = str(tmp_path)
    assert _stage().uri(root, "r1", "k") == str(tmp_path / "runs/r1/demo/batches/k.rows.parquet")
    assert _stage().uri(root, "r1", "k", "calls").endswith("batches/k.calls.parquet")
    one = BatchedStage("demo", (("", SCHEMA),))
    assert one.uri(root, "r1", "k") == str(tmp_path / "runs/r1/demo/batches/k.parquet")
    cp = _stage().checkpoints(root, "r1", "k")
    assert cp.uri(3) == str(tmp_path / "runs/r1/demo/batches/k.parts/00003.json")


def test_run_items_resumes_from_checkpoints_and_write_marks_the_batch_last(tmp_path):
    root, stage = str(tmp_path), _stage()
    ran: list[str] = []
    killed: list[str] = []

    def run_item(item: str) -> dict:
        ran.append(item)
        if item == "c" and not killed:
            killed.append(item)
            raise RuntimeError("killed")
        return {"rows": [{"k": item, "n": len(ran)}], "calls": [{"k": item}, {"k": item}]}

    with pytest.raises(RuntimeError, match="killed"):
        stage.run_items(root, "r", "b", ["a", "b", "c", "d"], run_item)
    assert not stage.finished(root, "r", "b")
    cp = stage.checkpoints(root, "r", "b")
    assert cp.read(0) == {"rows": [{"k": "a", "n": 1}], "calls": [{"k": "a"}, {"k": "a"}]}
    assert cp.read(2) is None
    ran.clear()
    rows = stage.run_items(root, "r", "b", ["a", "b", "c", "d"], run_item)
    assert ran == ["c", "d"]  # a and b came from their checkpoints
    assert [r["k"] for r in rows["rows"]] == ["a", "b", "c", "d"]
    assert [r["k"] for r in rows["calls"]] == ["a", "a", "b", "b", "c", "c", "d", "d"]

    written: list[str] = []

    def transform(name: str, table: pa.Table) -> pa.Table:
        written.append(name)
        return table

    uri = stage.write(root, "r", "b", rows, transform=transform)
    assert written == ["calls", "rows"] and uri == stage.uri(root, "r", "b")
    assert stage.finished(root, "r", "b")
    assert storage.read_parquet(uri, SCHEMA).column("k").to_pylist() == ["a", "b", "c", "d"]
    assert not Path(cp.prefix).exists()  # checkpoints removed once the batch is written


def test_combine_streams_sorted_rows_into_one_artifact(tmp_path, monkeypatch):
    monkeypatch.setattr(batching, "COMBINE_ROW_GROUP", 3)
    uris = []
    for i, rows in enumerate([[("b", 2), ("a", None)], [], [("a", 1), ("c", 0), ("a", 5)]]):
        table = pa.Table.from_pylist([{"k": k, "n": n} for k, n in rows], schema=SCHEMA)
        uris.append(storage.write_parquet(str(tmp_path / f"{i}.parquet"), table, SCHEMA))
    out = batching.combine(uris, SCHEMA, ["k", "n"], str(tmp_path / "all.parquet"))
    table = storage.read_parquet(out, SCHEMA)
    assert table.to_pylist() == [{"k": "a", "n": None}, {"k": "a", "n": 1}, {"k": "a", "n": 5},
                                 {"k": "b", "n": 2}, {"k": "c", "n": 0}]
    assert table.schema.metadata[b"artifact"] == b"test_rows"
    assert pq.ParquetFile(out).metadata.num_row_groups == 2  # 3 + 2 rows
    # nulls last is pyarrow's order; the sort is stable (equal keys keep the batches' order)
    last = batching.combine(uris, SCHEMA, ["k"], str(tmp_path / "last.parquet"), nulls_last=True)
    assert storage.read_parquet(last).column("n").to_pylist() == [None, 1, 5, 2, 0]
    again = batching.combine(uris, SCHEMA, ["k", "n"], str(tmp_path / "again.parquet"))
    assert Path(again).read_bytes() == Path(out).read_bytes()  # deterministic bytes
    empty = batching.combine([], SCHEMA, ["k"], str(tmp_path / "empty.parquet"))
    assert storage.read_parquet(empty, SCHEMA).num_rows == 0


def test_combine_names_a_missing_or_foreign_batch(tmp_path):
    with pytest.raises(storage.StorageError, match="gone"):
        batching.combine([str(tmp_path / "gone.parquet")], SCHEMA, ["k"],
                         str(tmp_path / "out.parquet"))
    other = storage.write_parquet(str(tmp_path / "other.parquet"),
                                  GENERATIONS.empty_table(), GENERATIONS)
    with pytest.raises(ArtifactSchemaError):
        batching.combine([other], SCHEMA, ["k"], str(tmp_path / "out.parquet"))


def test_a_killed_equivalence_batch_resumes_with_its_unjudged_pairs(tmp_path, monkeypatch):
    import json

    import tasks.equivalence.stage as eq

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"id": f"p{i}", "sql1": "SELECT 1", "sql2": "SELECT 1"})
                             + "\n" for i in range(3)))
    root = str(tmp_path / "artifacts")
    prepared = eq.prepare_pairs.fn(str(pairs), "r", root)
    batch = eq.plan_equivalence_batches(prepared["ids"], ["finder"], 3)[0]
    real, judged, killed = eq.evaluate, [], []

    def evaluate(pair, *args):
        judged.append(pair.id)
        if pair.id == "p1" and not killed:
            killed.append(pair.id)
            raise RuntimeError("killed")
        return real(pair, *args)

    monkeypatch.setattr(eq, "evaluate", evaluate)
    with pytest.raises(RuntimeError, match="killed"):
        eq.run_equivalence_batch.fn("r", root, prepared["pairs_uri"], batch)
    judged.clear()
    uri = eq.run_equivalence_batch.fn("r", root, prepared["pairs_uri"], batch)
    assert judged == ["p1", "p2"]  # p0 was checkpointed by the killed attempt
    assert storage.read_parquet(uri).column("pair_id").to_pylist() == ["p0", "p1", "p2"]
    assert not Path(eq.EQUIVALENCE_BATCHES.checkpoints(root, "r", batch["key"]).prefix).exists()
