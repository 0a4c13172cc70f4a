"""Artifact storage on a local path and on S3 (moto's server mode over real HTTP, boto3)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from schemas import report as report_schemas
from tasks.core import storage
from tests.fakes.s3 import moto_s3


@pytest.fixture(scope="module")
def s3_root():
    with moto_s3("querylab-test"):
        yield "s3://querylab-test/prefix"


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    return str(tmp_path / "art") if request.param == "local" else request.getfixturevalue("s3_root")


@pytest.mark.slow
def test_roundtrip_bytes_json_parquet(root):
    uri = storage.join(root, "runs", "r1", "x.bin")
    assert not storage.exists(uri)
    storage.write_bytes(uri, b"hello")
    assert storage.exists(uri) and storage.read_bytes(uri) == b"hello"
    storage.write_json(storage.join(root, "runs", "r1", "m.json"), {"b": 1, "a": [1, 2]})
    assert storage.read_json(storage.join(root, "runs", "r1", "m.json")) == {"a": [1, 2], "b": 1}
    rows = [{"agent": "a", "dataset": "d", "query_id": "q", "k": 1, "n": 2, "n_errored": 0, "c": 1,
             "pass_at_k": 0.5, "pass_hat_k": 0.0}]
    t_uri = storage.write_parquet(
        storage.join(root, "runs", "r1", "p.parquet"),
        pa.Table.from_pylist(rows, schema=report_schemas.PASS_AT_K),
        report_schemas.PASS_AT_K,
    )
    back = storage.read_parquet(t_uri, report_schemas.PASS_AT_K)
    assert back.to_pylist() == rows
    assert storage.list_uris(storage.join(root, "runs"), ".parquet") == [t_uri]
    assert len(storage.list_uris(storage.join(root, "runs"))) == 3


def test_missing_artifact_names_uri(root):
    uri = storage.join(root, "nope.parquet")
    with pytest.raises(storage.StorageError, match="nope.parquet"):
        storage.read_bytes(uri)


def test_large_s3_object_uses_multipart(s3_root, monkeypatch):
    monkeypatch.setattr(storage, "MULTIPART_THRESHOLD", 5 * 1024 * 1024)  # S3's minimum part
    data = bytes(range(256)) * (48 * 1024)  # 12 MiB → 3 parts
    uri = storage.write_bytes(storage.join(s3_root, "big.bin"), data)
    bucket, key = storage._split(uri)
    head = storage._s3().head_object(Bucket=bucket, Key=key)
    assert head["ETag"].strip('"').endswith("-3")  # multipart ETag: <md5>-<parts>
    assert storage.read_bytes(uri) == data


def test_local_files_get_the_usual_permissions(tmp_path):
    import os
    import stat

    mask = os.umask(0)
    os.umask(mask)
    uri = storage.write_bytes(str(tmp_path / "a" / "x.bin"), b"1")
    assert stat.S_IMODE(os.stat(uri).st_mode) == 0o666 & ~mask


def test_scan_parquet_is_read_parquet_lazily(root):
    """A lazy scan of the file / S3 object itself (the report's tables stream it) reads what
    read_parquet reads, with the same schema check."""
    import polars as pl

    from schemas.artifacts import ArtifactSchemaError, added_later

    old = pa.schema([pa.field("k", pa.string(), nullable=False), pa.field("n", pa.int32())],
                    metadata={"schema_version": "1"})
    new = pa.schema([*old, added_later(pa.field("late", pa.string()))],
                    metadata={"schema_version": "1"})
    rows = [{"k": f"t{i}", "n": i if i % 3 else None} for i in range(50)]
    uri = storage.write_parquet(storage.join(root, "scan", "t.parquet"),
                                pa.Table.from_pylist(rows, schema=old), old)
    lf = storage.scan_parquet(uri, new)
    assert isinstance(lf, pl.LazyFrame)
    eager = pl.from_arrow(storage.read_parquet(uri, new))
    lazy = lf.collect(engine="streaming")
    assert lazy.equals(eager) and lazy.schema == eager.schema
    assert lazy["late"].null_count() == 50  # written before the column existed: nulls
    assert lf.filter(pl.col("n") > 40).select("k").collect()["k"].to_list() == [
        "t41", "t43", "t44", "t46", "t47", "t49"]
    with pytest.raises(ArtifactSchemaError, match="missing columns"):
        storage.scan_parquet(uri, pa.schema([*old, pa.field("other", pa.int64())],
                                            metadata={"schema_version": "1"}))
    with pytest.raises(ArtifactSchemaError, match="schema_version 1 but querylab reads 2"):
        storage.scan_parquet(uri, old.with_metadata({"schema_version": "2"}))
    with pytest.raises(storage.StorageError, match="gone.parquet"):
        storage.scan_parquet(storage.join(root, "scan", "gone.parquet"), old)


def test_a_name_near_the_file_name_limit_is_still_written(tmp_path):
    """A local write's temporary name adds ~37 bytes to the target's: a target of 220-241
    bytes (a DAB import's file names) falls back to a short random temporary name instead
    of failing with "File name too long" (found by an adversarial review)."""
    from tasks.core import storage

    for n in (225, 241, 255):
        uri = str(tmp_path / ("é" * 10 + "a" * (n - 20)))
        storage.write_bytes(uri, b"x" * n)
        assert storage.read_bytes(uri) == b"x" * n
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
