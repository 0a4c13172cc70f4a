"""Benchmark: combining a stage's batch artifacts (:func:`tasks.core.batching.combine`: the sort
order computed over the key columns, the sorted rows streamed out row group by row group)
against what the suites did before it (read every batch, concatenate, sort the whole table,
build the output Parquet file in memory, write it).

Synthetic data: ``--batches`` (400) ``llm_calls`` batch artifacts of ``--rows`` (5,000) rows
each, written by a child process. Each way of combining then runs in its own child process, so
its peak RSS is its own (the interpreter and imports included). Both outputs must hold the same
rows in the same order.

Polars is imported in both (every stage process imports it anyway).

Usage: ``.venv/bin/python bench/combine_batches.py [--batches 400] [--rows 5000]``. The last line
is the figure: seconds and peak RSS of the batching combine, and of the old way.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["trial_key", "trial_attempt", "call_index"]


def _write(directory: str, batches: int, rows: int) -> None:
    import pyarrow as pa

    from schemas import artifacts
    from tasks.core import storage

    for b in range(batches):
        n = range(rows)
        table = pa.table({
            "run_id": ["bench"] * rows,
            "trial_key": [f"agent|ds|q{(b * 7919 + i // 4) % 50_000}|{i % 5}" for i in n],
            "call_index": [i % 4 for i in n], "model": ["m"] * rows, "base_url": [None] * rows,
            "prompt_tokens": [1000 + i for i in n], "cached_tokens": [0] * rows,
            "completion_tokens": [50] * rows, "cost_usd": [0.001] * rows,
            "latency_s": [0.5] * rows, "finish_reason": ["stop"] * rows,
            "n_tool_calls": [1] * rows, "attempts": [1] * rows, "cache_hit": [False] * rows,
            "error": [None] * rows, "priced": [True] * rows,
            "trial_attempt": [None if i % 9 == 0 else 0 for i in n], "queue_s": [0.0] * rows,
        })
        storage.write_parquet(f"{directory}/batch-{b:05d}.parquet",
                              table, artifacts.LLM_CALLS)


def _combine(directory: str, how: str) -> dict:
    import resource
    import time

    import polars  # noqa: F401 - imported in both ways: every stage process has it
    import pyarrow as pa

    from schemas import artifacts
    from tasks.core import batching, storage

    uris = sorted(str(p) for p in Path(directory).glob("batch-*.parquet"))
    out = f"{directory}/out-{how}.parquet"
    start = time.perf_counter()
    if how == "batching":
        batching.combine(uris, artifacts.LLM_CALLS, ORDER, out, nulls_last=True)
    else:
        table = pa.concat_tables([storage.read_parquet(u, artifacts.LLM_CALLS) for u in uris])
        table = table.sort_by([(c, "ascending") for c in ORDER])
        storage.write_parquet(out, table, artifacts.LLM_CALLS)
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "peak_mb": peak_mb}


def _child(*args: str) -> str:
    proc = subprocess.run([sys.executable, __file__, *args], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--child", nargs=2, metavar=("WHAT", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.child:
        what, directory = args.child
        if what == "write":
            _write(directory, args.batches, args.rows)
        else:
            print(json.dumps(_combine(directory, what)))
        return
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="querylab-bench-combine-") as directory:
        _child("--batches", str(args.batches), "--rows", str(args.rows), "--child", "write",
               directory)
        new = json.loads(_child("--child", "batching", directory))
        old = json.loads(_child("--child", "in_memory", directory))
        same = pq.read_table(f"{directory}/out-batching.parquet").equals(
            pq.read_table(f"{directory}/out-in_memory.parquet"))
        if not same:
            raise SystemExit("the two combines differ")
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"{args.batches} batches × {args.rows} rows (load {load}): "
          f"batching.combine {new['seconds']:.2f} s, peak RSS {new['peak_mb']:.0f} MB; "
          f"in-memory before {old['seconds']:.2f} s, peak RSS {old['peak_mb']:.0f} MB")


if __name__ == "__main__":
    main()
