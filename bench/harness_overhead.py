"""Harness overhead of agent trials: ms per trial with a zero-latency model.

    .venv/bin/python bench/harness_overhead.py [--trials 1000] [--baseline-trials 100]

What runs: the scripted OpenAI-compatible server (tests/fakes/openai_server.py) in its own
process answers instantly with a fixed 5-step trajectory — ``list_db``, ``query_db`` on SQLite,
``query_db`` on DuckDB, ``execute_python`` over both results, ``return_answer`` — so each trial
is 5 model calls over real HTTP (real ``openai`` client) and 5 tool calls on the built
``stocks`` dataset. The trials go through the production batch path
(:func:`tasks.trials.stage.run_batch`, 100 trials per batch, response cache on and written,
per-trial checkpoints, Parquet artifacts), one batch after another, each batch running its
trials concurrently (up to the default ``max_concurrency``). Since the model costs
nothing, all wall time per trial is harness overhead: HTTP round trips, tool execution
(list/query in-process, ``execute_python`` in a forked sandbox child), bookkeeping.

Baseline ("DAB's container-per-call shape"): the same trials through the same path, but every
tool call runs in a fresh Python subprocess that imports only querylab's database layer and
tools, opens the database files and runs the tool (``execute_python`` runs in that fresh
process, importing nothing it does not ask for). It is measured on
``--baseline-trials`` trials (it is slow) and reported per trial.

Targets: harness ≤ 60 ms per trial and ≥ 10× faster than the baseline. The last line prints
both figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench._trajectory import bench_env, build_stocks, start_server, stop_server, write_models

_TMP = bench_env("querylab-bench-")

CHILD = r"""
import contextlib, glob, io, json, os, sys
from tasks.db.databases import DuckDBDatabase, SQLiteDatabase
from tasks.agents.tools import ToolBox

req = json.loads(sys.stdin.read())

class FreshProcessToolBox(ToolBox):
    def _store(self, call_id, value):  # on the host: the next tool call is another process
        name = super()._store(call_id, value)
        os.makedirs(os.path.join(str(self.workdir), "vars"), exist_ok=True)
        with open(os.path.join(str(self.workdir), "vars", name + ".json"), "w") as fh:
            json.dump(value, fh, default=str)
        return name

    def _tool_execute_python(self, out, code):
        g = {}
        for f in glob.glob(os.path.join(str(self.workdir), "vars", "var_*.json")):
            with open(f) as fh:
                g[os.path.basename(f)[:-5]] = json.load(fh)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(code, g)
        self._store(out.call_id, buf.getvalue())
        self._ok(out, buf.getvalue(), {"stdout": buf.getvalue()})

kinds = {"sqlite": SQLiteDatabase, "duckdb": DuckDBDatabase}
dbs = {name: kinds[engine](name, path) for name, (engine, path) in req["databases"].items()}
box = FreshProcessToolBox(dbs, req["workdir"], descriptions=req["descriptions"])
o = box.call(req["name"], req["arguments"], req["call_id"])
print(json.dumps({k: getattr(o, k) for k in ("call_id", "tool", "arguments", "success", "content",
                  "error", "result_size", "answer")}, default=str))
"""


def make_subprocess_toolbox(databases: dict[str, tuple[str, str]]):
    """A ToolBox whose every call runs in a fresh Python subprocess (the baseline) that imports
    only the database layer and the tools and opens ``databases`` (name → (engine, file))."""
    from tasks.agents.tools import ToolBox, ToolOutcome

    class SubprocessToolBox(ToolBox):
        def call(self, name, arguments, call_id):
            raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
            start = time.perf_counter()
            req = {"databases": databases, "workdir": str(self.workdir), "name": name,
                   "arguments": raw, "call_id": call_id, "descriptions": self.descriptions}
            proc = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(req),
                                  capture_output=True, text=True, cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
            fields = json.loads(proc.stdout.strip().splitlines()[-1])
            out = ToolOutcome(**fields)
            out.duration_s = time.perf_counter() - start
            return out

    return SubprocessToolBox


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=1000)
    p.add_argument("--baseline-trials", type=int, default=100)
    args = p.parse_args()

    import polars as pl

    from schemas.settings import Settings
    from tasks.db.engines import build_dir
    from tasks.trials.stage import combine_trials, plan_batches, run_batch

    settings = Settings.from_env()
    uri, manifest = build_stocks(settings)
    n_queries = len(manifest["queries"])
    files = {db: (d["engine"], str(build_dir(manifest, settings) / f"{db}.{d['engine']}"))
             for db, d in manifest["databases"].items()}

    server, base_url = start_server()
    try:
        write_models(_TMP, base_url)

        def run(root: str, run_id: str, n: int, factory=None) -> tuple[float, pl.DataFrame]:
            per_query = -(-n // n_queries)
            batches = plan_batches([uri], ["openai:bench"], per_query, batch_size=100)
            kw = {} if factory is None else {"toolbox_factory": factory}
            t0 = time.perf_counter()
            for b in batches:
                run_batch(run_id, root, b, **kw)
            elapsed = time.perf_counter() - t0
            out = combine_trials.fn(run_id, root, [b["key"] for b in batches])
            trials = pl.read_parquet(out["trials"])
            calls = pl.read_parquet(out["tool_calls"])
            llm = pl.read_parquet(out["llm_calls"])
            assert set(trials["terminate_reason"]) == {"return_answer"}, trials["error"].unique()
            assert calls["success"].all() and calls.height == 5 * trials.height
            assert llm.height == 5 * trials.height and not llm["cache_hit"].any()
            stats = {
                "trials": trials.height,
                "ms_per_trial": 1000 * elapsed / trials.height,
                "model_http_ms": 1000 * llm["latency_s"].sum() / trials.height,
                "tools_ms": 1000 * calls["duration_s"].sum() / trials.height,
                "python_ms": 1000 * calls.filter(pl.col("tool") == "execute_python")[
                    "duration_s"].mean(),
            }
            stats["other_ms"] = stats["ms_per_trial"] - stats["model_http_ms"] - stats["tools_ms"]
            return stats

        harness = run(str(_TMP / "a-harness"), "bench", args.trials)
        baseline = run(str(_TMP / "a-baseline"), "bench-baseline", args.baseline_trials,
                       make_subprocess_toolbox(files))
    finally:
        stop_server(server)
        from tasks.sandbox.session import _close_all

        _close_all()
        shutil.rmtree(_TMP, ignore_errors=True)

    for name, s in (("harness", harness), ("baseline", baseline)):
        # a batch runs its trials concurrently: per-trial model and tool times overlap, so they
        # add up to more than the wall time per trial (then there is no bookkeeping remainder)
        rest = (f"bookkeeping {s['other_ms']:.1f}" if s["other_ms"] >= 0 else
                "summed over overlapping concurrent trials")
        print(f"{name:9s} {s['trials']:5d} trials: {s['ms_per_trial']:8.1f} ms/trial wall; per "
              f"trial model HTTP {s['model_http_ms']:.1f} + tools {s['tools_ms']:.1f} "
              f"(execute_python {s['python_ms']:.1f} per call), {rest}")
    speedup = baseline["ms_per_trial"] / harness["ms_per_trial"]
    print(
        f"harness overhead {harness['ms_per_trial']:.1f} ms/trial (target <= 60) over "
        f"{harness['trials']} trials x 5 tool calls; fresh-subprocess-per-tool-call baseline "
        f"{baseline['ms_per_trial']:.1f} ms/trial; {speedup:.1f}x faster (target >= 10)"
    )


if __name__ == "__main__":
    main()
