"""Latency-bound trials: how close querylab gets to the model's latency limit.

    .venv/bin/python bench/latency_bound.py [--trials 200] [--latency 0.5] [--concurrency 64]
        [--max-trials M]

What runs: the scripted OpenAI-compatible server (tests/fakes/openai_server.py, in its own
process) answers every model call after ``--latency`` seconds with a fixed 5-step trajectory
(``list_db``, ``query_db`` on SQLite, ``query_db`` on DuckDB, ``execute_python`` over both results
in the sealed sandbox, ``return_answer``), so each trial is 5 model calls over real HTTP and 5
real tool calls on the built ``stocks`` dataset. The trials go through the production trials
flow (:func:`flows.trials.run_trials`: Prefect tasks mapped over batches of 25, per-trial
checkpoints, response cache written, Parquet artifacts, the batches combined), once with
``--max-concurrency`` (model calls in flight across the stage) and ``--max-trials`` (trials
admitted; default ``2 x`` the concurrency), and once with the defaults (``--max-concurrency
32``, 64 trials admitted). The Prefect server
(up to its first answer), the process's first Prefect flow run (the empty flow below: its lazy
set-up cost the first timed run ~0.3 s, which a trials stage inside ``querylab run`` never pays)
and the sandbox's zygote are started before the clock starts (once per process, not per run).

W is the trials flow's wall time; L = calls × latency / concurrency is the limit no scheduler
can beat (every call slot busy on a model call all the time). A model call holds a slot of
``--max-concurrency`` only while its request is in flight, so slots are filled call by call; the
wave floor printed, ``ceil(T / concurrency) × c × latency`` for T trials of c calls (10 s for
200 trials at 64), is what a schedule that held a slot per whole trial (querylab before the two
bounds were decoupled) could not beat: W below it shows the decoupling at work.
The ``--concurrency`` run is made twice with the same settings: once timed (W), once with the
proportional set size (PSS: shared pages split between the processes sharing them) of
querylab's process tree — the harness, its query workers and the sandbox zygote with every
trial's session — sampled every 2 s (the sampled run, second, starts with the sandbox pool
warm: W is the colder run). The sampler is kept out of the timed run: reading every process's
``smaps_rollup`` costs ~1 ms of CPU per process, ~130 ms a sample here, CPU the trials compete
for (back to back: W 11.2 s with it, 10.1 and 10.2 s without; W moves in whole seconds, see
below, so the sampler's own cost is under 1 s). The peak is a plateau of seconds (the sessions
stay open, recycled into the warm pool); it is printed with the harness process's own peak RSS
(target: ≤ 1.5 GB at 64 concurrent calls).
Prefect's cost per flow run is printed too, as the wall time of an empty flow mapping as many
tasks (~1.1 s here). It is not fixed: Prefect 3.9's flow-run heartbeat thread sleeps in 1 s
steps and is joined when the run ends, so a flow run's wall time is its body's rounded up to
the next whole second, plus ~0.1 s; inside W it costs between 0.1 and 1.1 s (the empty flow
is the worst case). It is part of W, not subtracted. Each run's line also gives the harness
process's CPU seconds over the timed run (``time.process_time``: every thread of this process,
user + system; the scripted server, query workers and sandbox are other processes): the
trials' threads share one GIL, so this is what the bookkeeping of the model and tool calls
adds up to.

The last line is the figure:
``latency-bound: W s for 1000 calls x 0.5 s at concurrency 64; limit L s; ratio W/L (target <=
1.3; peak PSS P MB of the sampled run, target <= 1536)``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench._trajectory import bench_env, build_stocks, start_server, stop_server, write_models

_TMP = bench_env("querylab-bench-latency-")


def _tree(pid: int) -> list[int]:
    """``pid`` and every descendant (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class MemorySampler:
    """Peak PSS of this process's tree (without ``exclude``) and peak count of its processes,
    sampled every ``every_s`` seconds in a thread."""

    def __init__(self, exclude: set[int], every_s: float = 2.0):
        self.exclude, self.every_s = exclude, every_s
        self.peak_kb, self.peak_procs = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = [p for p in _tree(os.getpid()) if p not in self.exclude]
            self.peak_kb = max(self.peak_kb, sum(_pss_kb(p) for p in pids))
            self.peak_procs = max(self.peak_procs, len(pids))
            self._stop.wait(self.every_s)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _empty_flow_s(n_batches: int) -> float:
    """Wall seconds of a Prefect flow run that maps ``n_batches`` tasks doing nothing (best of
    3): Prefect's cost per flow run at its worst. In Prefect 3.9 the flow run's heartbeat
    thread sleeps in 1 s steps and is joined at the end, so a flow run takes its body's time
    rounded up to a whole second (+ ~0.1 s): inside a longer W this costs 0.1-1.1 s."""
    from prefect import flow, task

    @task
    def nothing(i: int) -> int:
        return i

    @flow
    def empty() -> None:
        for f in nothing.map(range(n_batches)):
            f.result()

    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        empty()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(runs: list[tuple[str, int]], trials: int, latency: float,
            batch_size: int = 25, max_trials: int | None = None) -> tuple[dict, str, int]:
    """Run ``trials`` trials (rounded up to whole queries) through the production trials flow
    once per (name, max_concurrency) of ``runs`` (the ``concurrency`` one twice: timed, then
    with the memory sampler), against the scripted server answering each call after
    ``latency`` s. Returns (name → figures: concurrency, max_trials, wall s, trials, peak PSS
    MB and peak processes and the sampled run's wall s (None but for ``concurrency``), mean
    model call s and slot wait s, mean tool call ms, mean ms by tool; plus
    ``"prefect_flow_s"`` → :func:`_empty_flow_s`; the most requests the server answered at once;
    model calls per run). Every run is checked: each trial ended by ``return_answer``, every
    model call made, every tool call succeeded. Exits when the sandbox cannot be sealed."""
    import polars as pl
    from prefect.client.orchestration import get_client
    from prefect.testing.utilities import prefect_test_harness

    from flows.trials import run_trials
    from schemas.settings import Settings
    from tasks.sandbox.session import _close_all, shared_sandbox
    from tasks.core.concurrency import resolve_max_trials
    from tasks.core.task_runners import EnvTaskRunner

    uri, manifest = build_stocks(Settings.from_env())
    per_query = -(-trials // len(manifest["queries"]))
    n_calls = 5 * per_query * len(manifest["queries"])
    if not shared_sandbox().isolation().ok:
        sys.exit("this machine cannot seal execute_python (python -m tasks.sandbox.session says what "
                 "is missing)")
    server, base_url = start_server(latency)
    results = {}
    try:
        write_models(_TMP, base_url)
        with prefect_test_harness(server_startup_timeout=300):
            # the server's first answer (its lazy set-up: ~2 s on a loaded machine) is part of
            # starting it, not of the first run measured
            with get_client(sync_client=True) as client:
                client.api_version()
            # Prefect's cost per flow run, measured first: it is also the process's first flow
            # run, whose lazy set-up (~0.3 s here) a trials stage inside `querylab run` never
            # pays (the datasets flow ran before it)
            results["prefect_flow_s"] = _empty_flow_s(-(-n_calls // 5 // batch_size))
            cpu: dict[str, float] = {}  # the harness process's CPU seconds of a run, by tag
            for name, conc in runs:
                admitted = resolve_max_trials(conc, max_trials if name == "concurrency" else None)
                flow = run_trials.with_options(task_runner=EnvTaskRunner(admitted))

                def run(tag: str) -> tuple[dict, float]:
                    root = str(_TMP / f"a-{name}-{tag}")
                    t0, c0 = time.perf_counter(), time.process_time()
                    out = flow(f"lat-{name}-{tag}", [uri], ["openai:bench"], per_query,
                               batch_size, root, max_concurrency=conc, max_trials=admitted)
                    cpu[tag] = time.process_time() - c0
                    return out, time.perf_counter() - t0

                def check(out: dict) -> tuple:
                    trials_df = pl.read_parquet(out["trials"])
                    llm = pl.read_parquet(out["llm_calls"])
                    calls = pl.read_parquet(out["tool_calls"])
                    assert set(trials_df["terminate_reason"]) == {"return_answer"}, \
                        trials_df["error"].unique()
                    assert llm.height == n_calls and calls["success"].all()
                    return trials_df, llm, calls

                # the timed run has no memory sampler: reading every process's smaps_rollup
                # takes CPU the trials compete for; the peak PSS is taken on a second run with
                # the same settings
                out, wall = run("timed")
                trials_df, llm, calls = check(out)
                mem = None
                if name == "concurrency":
                    with MemorySampler({server.pid}) as mem:
                        sampled, sampled_wall = run("sampled")
                    check(sampled)
                results[name] = {
                    "concurrency": conc, "max_trials": admitted, "wall": wall,
                    "cpu_s": cpu["timed"],
                    "trials": trials_df.height,
                    "pss_mb": None if mem is None else mem.peak_kb / 1024,
                    "procs": None if mem is None else mem.peak_procs,
                    "sampled_wall": None if mem is None else sampled_wall,
                    "call_s": llm["latency_s"].mean(), "queue_s": llm["queue_s"].mean(),
                    "tool_ms": 1000 * calls["duration_s"].mean(),
                    "by_tool": dict(calls.group_by("tool").agg(
                        (1000 * pl.col("duration_s").mean()).round(1)).iter_rows()),
                }
    finally:
        peak_requests = stop_server(server)
        _close_all()
        shutil.rmtree(_TMP, ignore_errors=True)
    return results, peak_requests, n_calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--latency", type=float, default=0.5, help="seconds per model call")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=25)
    p.add_argument("--max-trials", type=int, default=None,
                   help="trials admitted at once (default 2 x --concurrency)")
    p.add_argument("--no-defaults", action="store_true", help="skip the default-settings run")
    args = p.parse_args()

    from tasks.core.concurrency import DEFAULT_MAX_CONCURRENCY

    runs = [("concurrency", args.concurrency)]
    if not args.no_defaults:
        runs.append(("defaults", DEFAULT_MAX_CONCURRENCY))
    results, peak_requests, n_calls = measure(runs, args.trials, args.latency, args.batch_size,
                                              args.max_trials)

    import resource
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load}; server saw at most "
          f"{peak_requests} requests at once")
    prefect_s = results.pop("prefect_flow_s")
    for name, r in results.items():
        c = r["concurrency"]
        limit = n_calls * args.latency / c
        floor = math.ceil(r["trials"] / c) * 5 * args.latency
        memory = ("" if r["pss_mb"] is None else
                  f"; peak PSS {r['pss_mb']:.0f} MB over {r['procs']} processes (a second run, "
                  f"sampled: {r['sampled_wall']:.2f} s)")
        print(f"{name:<12} max-concurrency {c:3d} max-trials {r['max_trials']:3d}: "
              f"{r['wall']:6.2f} s for {r['trials']} trials "
              f"({n_calls} calls, model call {r['call_s']:.3f} s + {r['queue_s']:.3f} s waiting "
              f"for a call slot, tool call {r['tool_ms']:.1f} ms mean); limit {limit:.2f} s, "
              f"whole-trial wave floor {floor:.2f} s; ratio {r['wall'] / limit:.2f}; "
              f"harness CPU {r['cpu_s']:.2f} s"
              f"{memory}; tool ms by tool {r['by_tool']}")
    print(f"Prefect's cost per flow run, at worst (an empty flow mapping as many tasks): "
          f"{prefect_s:.2f} s; its heartbeat thread rounds every W above up to a whole second "
          f"(+ ~0.1 s)")
    print(f"harness process peak RSS {rss_mb:.0f} MB")
    if "defaults" in results:
        d = results["defaults"]
        limit = n_calls * args.latency / d["concurrency"]
        print(f"latency-bound (defaults): {d['wall']:.1f} s for {n_calls} calls x "
              f"{args.latency:g} s at concurrency {d['concurrency']}; limit {limit:.1f} s; "
              f"ratio {d['wall'] / limit:.2f}")
    r = results["concurrency"]
    limit = n_calls * args.latency / args.concurrency
    print(f"latency-bound: {r['wall']:.1f} s for {n_calls} calls x {args.latency:g} s at "
          f"concurrency {args.concurrency}; limit {limit:.1f} s; ratio {r['wall'] / limit:.2f} "
          f"(target <= 1.3; peak PSS {r['pss_mb']:.0f} MB of the sampled run, target <= 1536)")


if __name__ == "__main__":
    main()
