"""``querylab`` command line: ``run`` (end-to-end benchmark), ``build``, ``report``."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time


def _prefect_defaults() -> None:
    """Offline-friendly Prefect defaults (an explicit environment always wins)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def new_run_id() -> str:
    """``YYYYmmdd-HHMMSS-xxxx`` (UTC time + 4 random hex digits)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def _print_report(rep: dict, agents: list[str]) -> int:
    print("\npass@k (mean over queries per dataset; ALL rows: over all queries / over datasets)")
    print(rep["table"])
    status = 0
    if rep["failed"]:
        print("\nQueries with failed trials:")
        for f in rep["failed"]:
            print(f"  {f['agent']} {f['dataset']}/{f['query_id']}: {f['c']}/{f['n']} correct")
        if any(f["agent"] == "oracle" for f in rep["failed"]):
            print("ORACLE FAILED: the queries above are dataset bugs (the reference solution "
                  "does not reproduce the ground truth).")
            status = 1
    print(f"\nreport:    {rep['markdown']}\npass@k:    {rep['pass_at_k']}")
    return status


def cmd_run(args: argparse.Namespace) -> int:
    from flows.benchmark import benchmark
    from schemas.settings import Settings

    settings = Settings.from_env()
    root = args.artifacts or settings.artifacts
    run_id = args.run_id or new_run_id()
    agents = args.agent or ["oracle"]
    print(f"querylab run {run_id}: agents {agents}, {args.trials} trials per query, "
          f"artifacts in {root}")
    out = benchmark(
        run_id=run_id,
        datasets=args.dataset or None,
        agents=agents,
        n_trials=args.trials,
        batch_size=args.batch_size,
        artifacts_root=root,
    )
    status = _print_report(out["report"], agents)
    print(f"trials:    {out['trials']['trials']}\ntool calls: {out['trials']['tool_calls']}")
    for uri in out["manifests"]:
        print(f"dataset:   {uri}")
    return status


def cmd_build(args: argparse.Namespace) -> int:
    from flows.datasets import dataset_flows

    flows = dataset_flows()
    for name in args.dataset or list(flows):
        if name not in flows:
            print(f"unknown dataset {name!r}; have {sorted(flows)}", file=sys.stderr)
            return 2
        print(flows[name](artifacts_root=args.artifacts, source_dir=args.source_dir))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from flows.report import report

    rep = report(args.run_id, artifacts_root=args.artifacts)
    return _print_report(rep, [])


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``querylab`` console script; returns the exit status."""
    _prefect_defaults()
    p = argparse.ArgumentParser(prog="querylab", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="build datasets, run agent trials, print pass@k")
    r.add_argument("--agent", action="append", help="oracle (default) or openai:<model>; repeat")
    r.add_argument("--dataset", action="append", help="dataset name (default: all); repeat")
    r.add_argument("--trials", type=int, default=5, help="trials per query (default 5)")
    r.add_argument("--batch-size", type=int, default=25, help="trials per mapped task")
    r.add_argument("--run-id", help="reuse a run id to resume it (default: a new one)")
    r.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    r.set_defaults(func=cmd_run)

    b = sub.add_parser("build", help="build and load datasets only")
    b.add_argument("dataset", nargs="*")
    b.add_argument("--source-dir", help="directory holding the dataset's source files")
    b.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    b.set_defaults(func=cmd_build)

    rp = sub.add_parser("report", help="recompute a run's report from its artifacts")
    rp.add_argument("--run-id", required=True)
    rp.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    rp.set_defaults(func=cmd_report)

    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
