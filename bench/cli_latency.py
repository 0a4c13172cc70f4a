"""Benchmark: wall time of the commands that only read artifacts, and of a run whose endpoint
is unreachable.

Targets (issue 13): ``report``, ``status``, ``view``, ``runs``, ``models``, ``datasets list``
and ``--help`` return in ≤ 3 s and start no Prefect server (nor import Prefect); ``querylab
run --agent openai:my-local-model --dataset stocks`` against ``http://127.0.0.1:9/v1`` exits
non-zero in ≤ 10 s before building anything. Each command runs as a fresh ``python -m
querylab.cli`` process (interpreter start-up included) on a small real run (the oracle on
``stocks``, built and scored with plain function calls in a temporary artifact root), best of
``--repeat`` runs.

Usage: ``.venv/bin/python bench/cli_latency.py [--repeat 3]``. The last line is the figure:
the slowest read-only command's seconds (and the unreachable run's).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _prepare(root: str, home: str) -> str:
    """A scored and reported oracle run of ``stocks`` under ``root``; returns its run id."""
    os.environ["QUERYLAB_HOME"] = home
    from schemas.settings import Settings
    from tasks.core import runs
    from tasks.core import storage
    from tasks.core.layout import RunLayout
    from tasks.datasets.build import build_dataset_artifacts
    from tasks.db.engines import ensure_loaded
    from tasks.report.stage import report_run
    from tasks.scoring.stage import score_run
    from tasks.datasets.spec import spec_path
    from tasks.trials.stage import combine_trials, plan_batches, run_batch

    uri = build_dataset_artifacts.fn(str(spec_path("stocks")), root)
    manifest = storage.read_json(uri)
    settings = Settings(artifacts=root, home=Path(home))
    for db in manifest["databases"]:
        ensure_loaded(manifest, db, settings)
    run_id = "bench-cli"
    runs.record_benchmark(root, run_id, {"datasets": ["stocks"], "agents": ["oracle"],
                                         "n_trials": 2})
    runs.record_manifests(root, run_id, [uri])
    batches = plan_batches([uri], ["oracle"], 2)
    for b in batches:
        run_batch(run_id, root, b)
    combine_trials.fn(run_id, root, [b["key"] for b in batches])
    storage.write_json(RunLayout(root, run_id).trials("manifests.json"), [uri])
    score_run(run_id, root)
    report_run(run_id, root)
    return run_id


def _time(argv: list[str], env: dict, repeat: int, expect: int = 0) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "querylab.cli", *argv], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        elapsed = time.perf_counter() - start
        if proc.returncode != expect:
            raise SystemExit(f"{argv}: exit {proc.returncode}: {proc.stderr[-2000:]}")
        best = min(best, elapsed)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="querylab-bench-cli-") as tmp:
        root, home = str(Path(tmp) / "artifacts"), str(Path(tmp) / "home")
        run_id = _prepare(root, home)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("QUERYLAB_", "PREFECT_API"))}
        env.update(QUERYLAB_ARTIFACTS=root, QUERYLAB_HOME=home, PYTHONPATH=str(REPO),
                   PREFECT_HOME=str(Path(tmp) / "prefect"))
        commands = {
            "--help": ["--help"],
            "report": ["report", "--run-id", run_id],
            "status": ["status", "--run-id", run_id],
            "view": ["view", "--run-id", run_id],
            "runs": ["runs"],
            "models": ["models"],
            "datasets list": ["datasets", "list"],
        }
        times = {name: _time(argv, env, args.repeat) for name, argv in commands.items()}
        for name, t in times.items():
            print(f"{name:<14} {t:6.2f} s")
        down = {**env, "QUERYLAB_OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
                "QUERYLAB_ARTIFACTS": str(Path(tmp) / "unreachable")}
        unreachable = _time(["run", "--agent", "openai:my-local-model", "--dataset", "stocks",
                             "--trials", "1"], down, args.repeat, expect=2)
        built = (Path(tmp) / "unreachable").exists()
        print(f"{'unreachable run':<14} {unreachable:6.2f} s (exit 2, anything built: {built})")
        print(f"load average: {os.getloadavg()}")
    slowest = max(times, key=times.get)
    print(f"cli: slowest read-only command {times[slowest]:.2f} s ({slowest}; target <= 3 s); "
          f"unreachable-endpoint run {unreachable:.2f} s (target <= 10 s)")


if __name__ == "__main__":
    main()
