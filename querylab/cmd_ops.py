"""Operations commands: ``querylab rerun`` (re-run stages of a run from its run id alone) and
``querylab status`` (a run's configuration and the state of each stage).

``querylab rerun --run-id X --stage trials`` runs the same stage flow as the Prefect deployment
``stage-trials/trials`` with ``run_id=X``: finished items (trial batches, checkpointed trials)
are skipped, so only what failed or never ran is executed. Without ``--stage`` it re-runs every
stage of the run that has not completed, in DAG order.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

from schemas.runs import STAGES


def register(subparsers) -> None:
    """Add ``rerun`` and ``status`` to the ``querylab`` sub-command parsers."""
    r = subparsers.add_parser(
        "rerun", help="re-run stages of a run from its run record (finished work is skipped)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("--run-id", required=True, help="the run to re-run")
    r.add_argument(
        "--stage", action="append", choices=STAGES,
        help="stage to re-run; repeat for several (run in DAG order). Default: every stage "
        "of the run that has not completed",
    )
    r.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    r.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="show a progress bar (default: when stderr is a terminal)",
    )
    r.set_defaults(func=cmd_rerun)

    s = subparsers.add_parser("status", help="a run's configuration and the state of its stages")
    s.add_argument("--run-id", required=True)
    s.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    s.add_argument("--json", action="store_true", help="print the records as JSON")
    s.set_defaults(func=cmd_status)


def _root(args: argparse.Namespace) -> str:
    from schemas.settings import Settings

    return args.artifacts or Settings.from_env().artifacts


def _plan(root: str, run_id: str, wanted: list[str] | None) -> list[str]:
    """The stages to run, in DAG order; RunError when one cannot run."""
    from tasks import runs

    record = runs.load_run(root, run_id)
    configured = runs.configured_stages(record)
    if wanted:
        stages = [s for s in STAGES if s in set(wanted)]
        missing = [s for s in stages if s not in configured]
        if missing:
            raise runs.RunError(
                f"run {run_id!r} has no configuration for stage(s) {missing} (configured: "
                f"{', '.join(configured) or 'none'})"
            )
    else:
        stages = runs.pending_stages(root, run_id)
    if "trials" in stages and "datasets" not in stages:
        runs.run_manifests(root, run_id)  # fails early, naming the stage to run first
    return stages


def _print_outputs(stage: str, out) -> None:
    if stage == "datasets":
        for uri in out:
            print(f"dataset:   {uri}")
    elif isinstance(out, dict):
        for name, value in out.items():
            if isinstance(value, str) and ("/" in value or value.endswith((".parquet", ".json"))):
                print(f"{name + ':':<11}{value}")


def cmd_rerun(args: argparse.Namespace) -> int:
    """``querylab rerun``: run the chosen (default: unfinished) stages of a run. Exit status 0
    when every stage completed, 1 when one failed (later stages are not run) or the report
    names an oracle failure, 2 for a bad run id or a run without the needed record."""
    from flows.stages import run_stage
    from querylab.cmd_report import print_report, with_run_details
    from tasks import runs
    from tasks.progress import console_progress

    root = _root(args)
    try:
        runs.valid_run_id(args.run_id)
        stages = _plan(root, args.run_id, args.stage)
    except runs.RunError as exc:
        print(f"querylab rerun: {exc}", file=sys.stderr)
        return 2
    if not stages:
        print(f"run {args.run_id}: every stage has completed; name one with --stage to re-run it")
        return 0
    try:
        lease = contextlib.ExitStack()
        lease.enter_context(runs.run_lease(root, args.run_id))  # refuses at once if it is running
    except runs.RunError as exc:
        print(f"querylab rerun: {exc}", file=sys.stderr)
        return 2
    print(f"querylab rerun {args.run_id}: stages {', '.join(stages)}; artifacts in {root}")
    status = 0
    with lease, console_progress(args.progress):
        for stage in stages:
            try:
                out = run_stage(stage, args.run_id, root)
            except runs.RunError as exc:
                print(f"querylab rerun: {exc}", file=sys.stderr)
                return 2
            except Exception as exc:  # noqa: BLE001 - reported in one line, exit status 1
                print(f"querylab rerun: stage {stage} of run {args.run_id} failed: {exc}",
                      file=sys.stderr)
                return 1
            print(f"{stage}: completed")
            if stage == "report":
                status = max(status, print_report(with_run_details(out, root, args.run_id)))
            else:
                _print_outputs(stage, out)
    return status


def cmd_status(args: argparse.Namespace) -> int:
    """``querylab status``: print the run record and each stage's latest attempt (exit 2 when
    the run has no record)."""
    from tasks import runs

    root = _root(args)
    try:
        record = runs.load_run(root, args.run_id)
        statuses = runs.stage_statuses(root, args.run_id)
    except runs.RunError as exc:
        print(f"querylab status: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({
            "run": record.model_dump(mode="json"),
            "stages": {s: st.model_dump(mode="json") for s, st in statuses.items()},
        }, indent=2, sort_keys=True))
        return 0
    print(f"run {record.run_id}: created {record.created_at}, updated {record.updated_at}, "
          f"artifacts in {root}")
    if record.benchmark:
        b = record.benchmark
        print(f"benchmark: datasets {', '.join(b.datasets)}; agents {', '.join(b.agents)}; "
              f"{b.n_trials} trials per query in batches of {b.batch_size}")
    for stage, params in record.stages.items():
        print(f"{stage}: {json.dumps(params, sort_keys=True)}")
    print(f"\n{'stage':<12} {'status':<10} {'attempt':>7}  {'started':<20} {'finished':<20} error")
    for stage in runs.configured_stages(record) + [s for s in statuses
                                                   if s not in runs.configured_stages(record)]:
        st = statuses.get(stage)
        if st is None:
            print(f"{stage:<12} {'-':<10} {'':>7}  {'':<20} {'':<20}")
            continue
        error = (st.error or "").splitlines()[0][:100] if st.error else ""
        print(f"{stage:<12} {st.status:<10} {st.attempt:>7}  {st.started_at:<20} "
              f"{st.finished_at or '':<20} {error}")
    pending = runs.pending_stages(root, args.run_id)
    if pending:
        print(f"\nnot completed: {', '.join(pending)} "
              f"(`querylab rerun --run-id {args.run_id}` runs them)")
    return 0
