"""Cost of the sealed ``execute_python`` sandbox: ms per cell and per trial session.

    .venv/bin/python bench/sandbox_cells.py [--cells 300] [--sessions 100]

What runs (one process; the three kinds of cell interleaved, so they see the same load):

- **plain fork**: the pre-isolation design's core: this process imports pandas and pyarrow,
  then per cell ``fork()``\\ s a child that redirects stdout to a file, sets rlimits and runs
  ``exec(code)``; the parent waits. No namespaces, cgroups, uid change or file-system view.
- **sealed cell**: :meth:`tasks.sandbox.session.Session.run` of the same code in one open sealed
  session (new PID namespace, cgroup join and limits, own mount namespace and ``/proc``,
  capabilities and uid dropped, seccomp, a fresh output tmpfs, the harness round trip).
- **legacy cell**: the same in a legacy session (host directory, no file-system view).
- **session set-up**: ``open_session()`` + ``close()`` without warm spares (fork from the
  zygote into a new PID namespace; new network, IPC, UTS namespaces; a private copy of the
  template view with the trial's tmpfs work directory, output directory and ``/proc``; the
  trial's cgroups, which the session joins) — paid once per trial that runs Python.
- **session hand-over**: the same with the warm pool (the default): opening takes a ready
  session (recycled when the previous trial closed its own: processes killed, fresh tmpfs
  and IPC namespace) and closing gives it back; the loop sleeps 0.2 s untimed, as a trial
  does other work between sessions.

The cell is ``print(sum(range(1000)))``. The last line gives the isolation cost per cell
(median of the paired differences sealed − plain fork, one pair per iteration) and per trial
(session open + close).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CODE = "print(sum(range(1000)))"


def plain_fork_cell(out: str) -> float:
    """One cell the pre-isolation way (this process has pandas and pyarrow imported)."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 1)
            resource.setrlimit(resource.RLIMIT_CPU, (60, 61))
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            exec(CODE, {"__name__": "__main__"})
            sys.stdout.flush()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    with open(out) as fh:
        assert fh.read() == "499500\n"
    return time.perf_counter() - t0


def session_cell(session) -> float:
    t0 = time.perf_counter()
    res = session.run(CODE)
    assert res.ok and res.stdout == "499500\n", res.error
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cells", type=int, default=300)
    p.add_argument("--sessions", type=int, default=100)
    args = p.parse_args()

    import pandas  # noqa: F401  (preloaded for the plain fork, as in the zygote)
    import pyarrow  # noqa: F401

    from tasks.sandbox.session import Sandbox

    sb = Sandbox()
    cold = Sandbox(spares=0)
    legacy = Sandbox(isolate=False)
    plain, sealed, leg, setups, handovers = [], [], [], [], []
    try:
        for z in (sb, cold, legacy):  # start the zygotes (pandas import) outside the timings
            z.open_session().close()
        iso = sb.require_isolation()
        # interleaved, so the three kinds of cell see the same (shared, noisy) machine
        with tempfile.TemporaryDirectory() as tmp, sb.open_session() as s, \
                legacy.open_session() as ls:
            out = os.path.join(tmp, "cell.out")
            for _ in range(10):
                plain_fork_cell(out), session_cell(s), session_cell(ls)
            for _ in range(args.cells):
                plain.append(plain_fork_cell(out))
                sealed.append(session_cell(s))
                leg.append(session_cell(ls))
        for _ in range(args.sessions):
            t0 = time.perf_counter()
            cold.open_session().close()
            setups.append(time.perf_counter() - t0)
            time.sleep(0.2)  # a trial does other work between sessions
            t0 = time.perf_counter()
            sb.open_session().close()
            handovers.append(time.perf_counter() - t0)
    finally:
        for z in (sb, cold, legacy):
            z.close()

    def ms(xs):
        return 1000 * statistics.median(xs)

    print(f"isolation on this machine: {', '.join(k for k, v in iso.mechanisms.items() if v)}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, xs in (("plain fork", plain), ("legacy cell", leg), ("sealed cell", sealed),
                     ("session set-up", setups), ("session hand-over", handovers)):
        p90 = 1000 * sorted(xs)[int(len(xs) * 0.9)]
        print(f"{name:20s} {len(xs):5d} runs: median {ms(xs):6.2f} ms, mean "
              f"{1000 * statistics.mean(xs):6.2f} ms, p90 {p90:6.2f} ms")
    paired = [a - b for a, b in zip(sealed, plain, strict=True)]
    print(f"sandbox: sealed cell {ms(sealed):.2f} ms vs plain fork {ms(plain):.2f} ms -> "
          f"isolation costs {ms(paired):.2f} ms per cell (median of paired differences) + "
          f"per trial "
          f"{ms(handovers):.2f} ms (session hand-over; set-up without a spare "
          f"{ms(setups):.2f} ms)")


if __name__ == "__main__":
    main()
