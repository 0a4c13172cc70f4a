"""querylab command line: run (end-to-end benchmark), build (datasets), report (from artifacts)."""

from __future__ import annotations

import argparse
import os
import sys
import time

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


def _agent_plans(args: argparse.Namespace, agents: list[str]) -> dict[str, dict]:
    """``--agent-datasets AGENT=D1,D2`` and ``--agent-trials AGENT=N`` as
    :class:`schemas.runs.AgentPlan` dicts by agent (UsageError for a bad value)."""
    plans: dict[str, dict] = {}
    for flag, field, values in (("--agent-datasets", "datasets", args.agent_datasets),
                                ("--agent-trials", "n_trials", args.agent_trials)):
        for text in values or []:
            agent, sep, value = text.rpartition("=")
            if not sep or not agent or not value:
                raise UsageError(f"{flag} {text!r}: use AGENT=VALUE")
            if agent not in agents:
                raise UsageError(f"{flag} {text!r}: {agent} is not one of the agents {agents}")
            if field == "datasets":
                names = [d.strip() for d in value.split(",") if d.strip()]
                _check_datasets(names)
                plans.setdefault(agent, {})[field] = names
            else:
                try:
                    n = int(value)
                except ValueError:
                    n = 0
                if n < 1:
                    raise UsageError(f"{flag} {text!r}: the trial count must be an integer >= 1")
                plans.setdefault(agent, {})[field] = n
    return plans


def _print_timings(root: str, run_id: str, trials: dict, total_s: float) -> None:
    """How long the run took: each stage (wall time, from its stage record), each agent's
    trials (summed trial time: batches run side by side) and a local model's server load."""
    from datetime import datetime

    import polars as pl

    from schemas import artifacts
    from tasks import storage
    from tasks.runs import stage_status

    stages = []
    for stage in ("datasets", "trials", "report"):
        st = stage_status(root, run_id, stage)
        if st is not None and st.started_at and st.finished_at:
            took = (datetime.fromisoformat(st.finished_at)
                    - datetime.fromisoformat(st.started_at)).total_seconds()
            stages.append(f"{stage} {took:.1f} s")
    print(f"time:      {total_s:.1f} s in all ({', '.join(stages)})")
    if trials.get("trials"):
        table = pl.from_arrow(storage.read_parquet(trials["trials"], artifacts.TRIALS))
        loads = {d["agent"]: d["local"]["load_s"] for d in storage.read_json(trials["agents"])
                 if d.get("local")} if trials.get("agents") else {}
        for r in table.group_by("agent", maintain_order=True).agg(
                pl.len().alias("n"), pl.col("latency_s").sum().alias("s")).iter_rows(named=True):
            load = f", server loaded in {loads[r['agent']]:.1f} s" if r["agent"] in loads else ""
            print(f"           {r['agent']}: {r['n']} trials, {r['s']:.1f} s summed{load}")


def cmd_run(args: argparse.Namespace) -> int:
    """``querylab run``: validate the options, run the benchmark flow, print the report."""
    from flows.benchmark import benchmark
    from querylab import cmd_agents
    from querylab.cmd_report import print_report, with_run_details
    from schemas.settings import Settings
    from tasks.progress import console_progress
    from tasks.llm import local_entry
    from tasks.runs import StageFailed, valid_run_id
    from tasks.trials import parse_agent

    settings = Settings.from_env()
    root = args.artifacts or settings.artifacts
    run_id = valid_run_id(run_id_or_new(args.run_id))
    agents = args.agent or ["oracle"]
    for agent in agents:
        kind, name = parse_agent(agent)
        if kind == "local":  # installed? (before anything is built; the server starts later)
            local_entry(name)
    _check_datasets(args.dataset)
    if args.trials < 1 or args.batch_size < 1:
        raise UsageError("--trials and --batch-size must be at least 1")
    plans = _agent_plans(args, agents)
    hints = list(dict.fromkeys(args.hints or ["off"]))
    print(f"querylab run {run_id}: agents {agents}, {args.trials} trials per query, "
          f"hints {'/'.join(hints)}, artifacts in {root}")
    started = time.monotonic()
    try:
        with console_progress(args.progress):
            out = benchmark(
                run_id=run_id,
                datasets=args.dataset or None,
                agents=agents,
                n_trials=args.trials,
                batch_size=args.batch_size,
                artifacts_root=root,
                agent_options=cmd_agents.agent_options_from_args(args),
                agent_plans=plans,
                hints=hints,
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
    _print_timings(root, run_id, out["trials"], time.monotonic() - started)
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
        help="oracle (default), openai:<model> or local:<model> (see `querylab models`), "
        "replay:<answers.json>; repeat for several agents",
    )
    r.add_argument("--agent-datasets", action="append", metavar="AGENT=D1,D2",
                   help="run AGENT on these datasets only (default: all of the run's); repeat")
    r.add_argument("--agent-trials", action="append", metavar="AGENT=N",
                   help="trials per query for AGENT (default: --trials); repeat")
    r.add_argument("--dataset", action="append", help="dataset name (default: all); repeat")
    r.add_argument("--trials", type=int, default=5, help="trials per query (default 5)")
    r.add_argument("--batch-size", type=int, default=25, help="trials per mapped task")
    r.add_argument("--run-id", help="reuse a run id to resume it (default: a new one)")
    r.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    r.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="progress bar (default: when stderr is a terminal)",
    )
    r.add_argument(
        "--hints", action="append", choices=["on", "off"],
        help="hint condition: off (default, as DAB) shows the question and the database "
        "description; on adds the dataset's hints (DAB's --use_hints); repeat "
        "(--hints off --hints on) to compare both in one run",
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
