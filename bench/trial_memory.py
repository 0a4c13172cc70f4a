"""Memory of concurrent agent trials: peak PSS / RSS with 64 trials in flight at once.

    .venv/bin/python bench/trial_memory.py [--concurrency 64] [--latency 1.0]

What runs: ``--concurrency`` trials (rounded up to whole queries of the ``stocks`` dataset) at
``--max-concurrency`` ``--concurrency`` through the production trials flow, against the
scripted OpenAI-compatible server answering every call after ``--latency`` seconds with the
5-step trajectory of ``bench/_trajectory.py`` (so every trial is in flight at once, each with
its sandbox session: ``execute_python`` runs in the sealed sandbox). Same machinery as
``bench/latency_bound.py`` (:func:`bench.latency_bound.measure`).

Sandboxes come from one zygote per process and its bounded warm pool of sessions
(:mod:`tasks.sandbox.session`), not one interpreter per thread. Measured: the peak proportional set
size (PSS, shared pages split between the processes sharing them) of querylab's whole process
tree (harness, query workers, zygote, sessions; the scripted server excluded), sampled every
0.2 s, and the harness process's own peak RSS. The last line is the figure (target: ≤ 1.5 GB
at 64 concurrent trials):

    trial memory: peak PSS <M> MB over <P> processes with <N> requests in flight at once ...
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.latency_bound import measure  # noqa: E402  (sets up the bench environment)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--latency", type=float, default=1.0, help="seconds per model call")
    args = p.parse_args()
    results, peak_requests, n_calls = measure([("memory", args.concurrency)], args.concurrency,
                                              args.latency)
    r = results["memory"]
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load}")
    print(f"{r['trials']} trials ({n_calls} model calls x {args.latency:g} s) at max-concurrency "
          f"{args.concurrency}: {r['wall']:.1f} s; tool ms by tool {r['by_tool']}")
    print(f"trial memory: peak PSS {r['pss_mb']:.0f} MB over {r['procs']} processes with "
          f"{peak_requests} requests in flight at once (max-concurrency {args.concurrency}); "
          f"harness RSS {rss_mb:.0f} MB (target: PSS <= 1536 MB)")


if __name__ == "__main__":
    main()
