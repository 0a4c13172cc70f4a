"""querylab command line: run (end-to-end benchmark), build (datasets), report (from artifacts)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from querylab import UsageError, run_id_or_new


def _prefect_defaults() -> None:
    """Offline-friendly Prefect defaults (an explicit environment always wins)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def _check_datasets(names: list[str] | None) -> None:
    from flows.datasets import dataset_flows

    known = dataset_flows()
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        raise UsageError(f"unknown dataset(s) {unknown}; have {sorted(known)}")


def cmd_run(args: argparse.Namespace) -> int:
    """``querylab run``: validate the options, run the benchmark flow, print the report."""
    from flows.benchmark import benchmark
    from querylab import cmd_agents
    from querylab.cmd_report import print_report, with_run_details
    from schemas.settings import Settings
    from tasks.progress import console_progress
    from tasks.runs import StageFailed, run_lease, valid_run_id
    from tasks.trials import parse_agent

    settings = Settings.from_env()
    root = args.artifacts or settings.artifacts
    run_id = valid_run_id(run_id_or_new(args.run_id))
    agents = args.agent or ["oracle"]
    for agent in agents:
        parse_agent(agent)
    _check_datasets(args.dataset)
    if args.trials < 1 or args.batch_size < 1:
        raise UsageError("--trials and --batch-size must be at least 1")
    lease = contextlib.ExitStack()
    lease.enter_context(run_lease(root, run_id))  # refuses at once (LeaseHeld) if it is running
    print(f"querylab run {run_id}: agents {agents}, {args.trials} trials per query, "
          f"artifacts in {root}")
    try:
        with lease, console_progress(args.progress):
            out = benchmark(
                run_id=run_id,
                datasets=args.dataset or None,
                agents=agents,
                n_trials=args.trials,
                batch_size=args.batch_size,
                artifacts_root=root,
                agent_options=cmd_agents.agent_options_from_args(args),
            )
    except StageFailed as exc:
        print(f"querylab run: {exc}\n(re-run the failed stage: querylab rerun --run-id {run_id})",
              file=sys.stderr)
        return 1
    status = print_report(with_run_details(out["report"], root, run_id))
    for name in ("trials", "tool_calls", "llm_calls", "agents"):
        if name in out["trials"]:
            print(f"{name + ':':<10} {out['trials'][name]}")
    for uri in out["manifests"]:
        print(f"dataset:   {uri}")
    return status


def cmd_build(args: argparse.Namespace) -> int:
    """``querylab build``: build and load datasets; prints each manifest URI."""
    from flows.datasets import dataset_flows, default_datasets

    _check_datasets(args.dataset)
    flows = dataset_flows()
    for name in args.dataset or default_datasets():
        print(flows[name](artifacts_root=args.artifacts, source_dir=args.source_dir))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``querylab`` console script; returns the exit status."""
    from querylab import (
        cmd_agents,
        cmd_datasets,
        cmd_equivalence,
        cmd_lifecycle,
        cmd_ops,
        cmd_report,
        cmd_text2sql,
    )

    _prefect_defaults()
    p = argparse.ArgumentParser(prog="querylab", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="build datasets, run agent trials, print pass@k")
    r.add_argument(
        "--agent", action="append",
        help="oracle (default), openai:<model> (see `querylab models`), replay:<answers.json>; "
        "repeat for several agents",
    )
    r.add_argument("--dataset", action="append", help="dataset name (default: all); repeat")
    r.add_argument("--trials", type=int, default=5, help="trials per query (default 5)")
    r.add_argument("--batch-size", type=int, default=25, help="trials per mapped task")
    r.add_argument("--run-id", help="reuse a run id to resume it (default: a new one)")
    r.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    r.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="progress bar (default: when stderr is a terminal)",
    )
    cmd_agents.add_agent_options(r)
    r.set_defaults(func=cmd_run)

    b = sub.add_parser("build", help="build and load datasets only")
    b.add_argument("dataset", nargs="*")
    b.add_argument("--source-dir", help="directory holding the dataset's source files")
    b.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    b.set_defaults(func=cmd_build)


    for module in (
        cmd_report, cmd_ops, cmd_agents, cmd_datasets, cmd_equivalence, cmd_text2sql,
        cmd_lifecycle,
    ):
        module.register(sub)

    args = p.parse_args(argv)
    from schemas.artifacts import ArtifactSchemaError
    from tasks.runs import RunError
    from tasks.spec import SpecError
    from tasks.storage import StorageError
    from tasks.trials import AgentConfigError

    try:
        return args.func(args)
    except (
        UsageError, AgentConfigError, SpecError, StorageError, ArtifactSchemaError, RunError
    ) as exc:
        print(f"querylab {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
