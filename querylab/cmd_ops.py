"""Operations commands: ``querylab rerun`` (re-run stages of a run from its run id alone),
``querylab rescore`` (re-apply the validators to the stored answers), ``querylab status`` (a
run's configuration and the state of each stage) and ``querylab runs`` (every run).

``querylab rerun --run-id X --stage trials`` runs the same stage flow as the Prefect deployment
``stage-trials/trials`` with ``run_id=X``: finished items (trial batches, checkpointed trials)
are skipped, so only what failed or never ran is executed. Without ``--stage`` it re-runs every
stage of the run that has not completed, in DAG order. ``--retry-errors`` re-runs exactly the
trials that errored (``api_error`` / ``error``), keeping every finished trial and cached model
response, then scores and reports again; it exits 1 while errored trials remain above
``--max-error-share`` (default: the run's).

``status``, ``runs`` and ``rescore`` never start a Prefect server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

from schemas.runs import STAGES
from tasks.core.concurrency import resolve_max_trials
from tasks.core.layout import RunLayout


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
    r.add_argument(
        "--retry-errors", action="store_true",
        help="re-run only the errored trials (api_error / error), then score and report again",
    )
    r.add_argument("--max-error-share", type=float, default=None, metavar="X",
                   help="share of each agent's trials that may error for exit 0 (default: "
                   "the run's, 0)")
    r.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    r.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="show a progress bar (default: when stderr is a terminal)",
    )
    r.set_defaults(func=cmd_rerun)

    rs = subparsers.add_parser(
        "rescore", help="re-apply the validators to a run's stored answers (no model call), "
        "then rewrite its verdicts, audit and report",
    )
    rs.add_argument("--run-id", required=True)
    rs.add_argument("--manifest", action="append",
                    help="dataset manifest URI to score with (repeat; default: the run's)")
    rs.add_argument("--scoring", choices=["spec", "recorded"], default="spec",
                    help="spec (default): re-derive ground truth and validators from the "
                    "current dataset spec (refused when its data version differs from the "
                    "run's); recorded: the datasets' scoring files as they are")
    rs.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    rs.set_defaults(func=cmd_rescore)

    s = subparsers.add_parser("status", help="a run's configuration and the state of its stages")
    s.add_argument("--run-id", required=True)
    s.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    s.add_argument("--json", action="store_true", help="print the records as JSON")
    s.set_defaults(func=cmd_status)

    ls = subparsers.add_parser("runs", help="every run: date, agents, datasets, status, pass@1")
    ls.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    ls.set_defaults(func=cmd_runs)


def _root(args: argparse.Namespace) -> str:
    from schemas.settings import Settings

    return args.artifacts or Settings.from_env().artifacts


def _plan(root: str, run_id: str, wanted: list[str] | None, retry_errors: bool = False) -> list[str]:
    """The stages to run, in DAG order; RunError when one cannot run. ``retry_errors``: the
    trials stage and everything after it (score, report)."""
    from tasks.core import runs

    record = runs.load_run(root, run_id)
    configured = runs.configured_stages(record)
    if retry_errors:
        if "trials" not in configured:
            raise runs.RunError(f"run {run_id!r} has no trials stage to retry")
        wanted = sorted({*(wanted or []), "trials", "score", "report"})
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
        if stage == "score":
            print(f"score:     {out['trials']} trials: {out['correct']} correct, "
                  f"{out['incorrect']} incorrect, {out['errored']} errored, "
                  f"{out['flagged']} flagged by the audit")


def cmd_rerun(args: argparse.Namespace) -> int:
    """``querylab rerun``: run the chosen (default: unfinished) stages of a run. Exit status 0
    when every stage completed, 1 when one failed (later stages are not run), the report names
    an oracle failure or errored trials remain above the allowed share (``--retry-errors``),
    2 for a bad run id or a run without the needed record."""
    from querylab.cli import first_line, quiet_tracebacks, run_preflight
    from querylab.cmd_report import print_report, with_run_details
    from tasks.core import runs

    root = _root(args)
    retry = getattr(args, "retry_errors", False)
    try:
        runs.valid_run_id(args.run_id)
        stages = _plan(root, args.run_id, args.stage, retry)
    except runs.RunError as exc:
        print(f"querylab rerun: {exc}", file=sys.stderr)
        return 2
    if not stages:
        print(f"run {args.run_id}: every stage has completed; name one with --stage to re-run it")
        return _errored_status(root, args.run_id, getattr(args, "max_error_share", None),
                               "rerun")
    try:
        lease = contextlib.ExitStack()
        lease.enter_context(runs.run_lease(root, args.run_id))  # refuses at once if it is running
    except runs.RunError as exc:
        print(f"querylab rerun: {exc}", file=sys.stderr)
        return 2
    with lease:  # held until the stages are done (released if preflight fails)
        if "trials" in stages:
            config = runs.benchmark_config(root, args.run_id)
            run_preflight(config.agents, config.agent_options, "rerun", (root, args.run_id))
        trials_before = _trials_digest(root, args.run_id) if "trials" in stages else None
        print(f"querylab rerun {args.run_id}: stages {', '.join(stages)}"
              + (" (errored trials only)" if retry else "") + f"; artifacts in {root}")
        from querylab.cli import _prefect_defaults

        _prefect_defaults()  # no telemetry attempts (and their ERROR lines) offline, as `run`
        from flows.stages import run_stage
        from tasks.core import interrupt
        from tasks.core.progress import console_progress

        if not getattr(args, "debug", False):
            quiet_tracebacks()
        status = 0
        with console_progress(args.progress):
            for stage in stages:
                params = {"retry_errors": True} if stage == "trials" and retry else {}
                try:
                    out = interrupt.run_interruptible(  # Ctrl-C / SIGTERM stop it
                        run_stage, dict(stage=stage, run_id=args.run_id, artifacts_root=root,
                                        **params), artifacts_root=root, run_id=args.run_id)
                except runs.RunError as exc:
                    print(f"querylab rerun: {exc}", file=sys.stderr)
                    return 2
                except Exception as exc:  # noqa: BLE001 - reported in one line, exit status 1
                    line = interrupt.interrupted_line("rerun", args.run_id)
                    if line is not None:
                        print(line, file=sys.stderr)
                        return 130
                    print(f"querylab rerun: stage {stage} of run {args.run_id} failed: "
                          f"{first_line(exc)}", file=sys.stderr)
                    return 1
                print(f"{stage}: completed")
                if stage == "report":
                    status = max(status, print_report(with_run_details(out, root, args.run_id)))
                else:
                    _print_outputs(stage, out)
    if "trials" in stages and "score" not in stages:
        unchanged = _trials_digest(root, args.run_id) == trials_before
        if unchanged and not {"score", "report"} & set(runs.pending_stages(root, args.run_id)):
            print("note: no trial changed (trials.parquet is as it was)")
        else:
            print(f"note: the trials changed; score and report them with `querylab rerun "
                  f"--run-id {args.run_id} --stage score --stage report`")
        return status
    return max(status, _errored_status(root, args.run_id,
                                       getattr(args, "max_error_share", None), "rerun"))


def _trials_digest(root: str, run_id: str) -> str | None:
    """SHA-256 of the run's combined ``trials.parquet`` (its bytes are deterministic for equal
    rows), None when it does not exist yet."""
    import hashlib

    from tasks.core import storage

    uri = RunLayout(root, run_id).trials("trials.parquet")
    if not storage.exists(uri):
        return None
    return hashlib.sha256(storage.read_bytes(uri)).hexdigest()


def _errored_status(root: str, run_id: str, max_share: float | None, command: str) -> int:
    """1 (the reason printed on stderr) when a scored benchmark run has an agent whose share
    of errored trials is above ``max_share`` (None: the run's recorded ``max_error_share``),
    else 0 — the rule ``querylab run`` exits by, so ``rerun`` of a finished run, ``rerun
    --stage report`` and ``rescore`` say the same. A run without a score summary is 0."""
    from tasks.core import runs

    if runs.score_summary(root, run_id) is None:
        return 0
    record = runs.find_run(root, run_id)
    recorded = record.benchmark.max_error_share if record and record.benchmark else 0.0
    allowed = recorded if max_share is None else max_share
    try:
        runs.check_error_share(root, run_id, allowed)
    except runs.TrialsErrored as exc:
        print(f"querylab {command}: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_rescore(args: argparse.Namespace) -> int:
    """``querylab rescore``: re-derive each dataset's scoring from its current spec (when the
    data version the trials saw is unchanged; ``--scoring recorded``: the scoring files as
    they are), re-apply it to the run's stored answers, rewrite ``score/`` and the report, and
    say which scoring it used, what changed and how many verdicts changed. No model is called
    and no Prefect server started. Exit 1 when the oracle failed a query or errored trials are
    above the run's allowed share; 2 for bad input and for a refused rescore (a changed data
    version), which writes nothing and leaves the run's stage records as they were."""
    import polars as pl

    from querylab.cmd_report import print_report, with_run_details
    from tasks.core import runs
    from tasks.core import storage
    from tasks.report.stage import report_run
    from tasks.scoring.stage import SCORER_VERSION, score_run, scores_uri

    from tasks.scoring.rescore import RescoreRefused, apply_rescore, plan_rescore

    root = _root(args)
    runs.valid_run_id(args.run_id)
    before = None
    if storage.exists(scores_uri(root, args.run_id)):
        before = pl.read_parquet(storage.read_bytes(scores_uri(root, args.run_id)),
                                 columns=["trial_key", "verdict"])
    record = runs.find_run(root, args.run_id)
    if record is None and not storage.list_uris(RunLayout(root, args.run_id).root):
        print(f"querylab rescore: no run {args.run_id!r} under {root}", file=sys.stderr)
        return 2
    try:  # everything checked before anything is written: a refusal records nothing
        plans = plan_rescore(args.run_id, root, args.manifest or None,
                             getattr(args, "scoring", "spec"))
    except RescoreRefused as exc:
        print(f"querylab rescore: {exc}", file=sys.stderr)
        return 2

    def score() -> dict:
        apply_rescore(plans)
        return score_run(args.run_id, root, args.manifest or None)

    if record is not None:
        with runs.stage_run(root, args.run_id, "score") as stage:
            out = score()
            stage.outputs = {k: v for k, v in out.items() if k != "manifests"}
    else:
        out = score()
    after = pl.read_parquet(storage.read_bytes(out["scores"]), columns=["trial_key", "verdict"])
    changed = None
    if before is not None:
        j = after.join(before, on="trial_key", how="left", suffix="_before")
        changed = j.filter(pl.col("verdict").ne_missing(pl.col("verdict_before")))
    print(f"rescored run {args.run_id} (scorer {SCORER_VERSION}): {out['trials']} trials, "
          f"{out['correct']} correct, {out['incorrect']} incorrect, {out['errored']} errored; "
          + ("first scoring" if changed is None else f"{changed.height} verdict(s) changed"))
    for plan in plans:
        print(f"  {plan.line()}")
        for change in plan.changes[:10]:
            print(f"    {change}")
        if len(plan.changes) > 10:
            print(f"    ... ({len(plan.changes)} in all)")
    if changed is not None:
        for row in changed.head(10).iter_rows(named=True):
            print(f"  {row['trial_key']}: {row['verdict_before']} -> {row['verdict']}")
    print(f"scores:    {out['scores']}")
    if record is not None:
        with runs.stage_run(root, args.run_id, "report") as stage:
            rep = report_run(args.run_id, root, args.manifest or None)
            stage.outputs = {k: v for k, v in rep.items() if isinstance(v, str | int | float | dict)}
    else:
        rep = report_run(args.run_id, root, args.manifest or None)
    status = print_report(with_run_details(rep, root, args.run_id))
    return max(status, _errored_status(root, args.run_id, None, "rescore"))


def cmd_runs(args: argparse.Namespace) -> int:
    """``querylab runs``: every run under the artifact root, newest first (date, agents,
    datasets, status, errored trials, pass@1 per agent)."""
    from tasks.core import runs

    listed = runs.list_runs(_root(args))
    if args.json:
        print(json.dumps(listed, indent=2, sort_keys=True))
        return 0
    if not listed:
        print(f"no runs under {_root(args)}")
        return 0
    rows = []
    for r in listed:
        p1 = ", ".join(f"{a} {v:.3f}" if v is not None else f"{a} –"
                       for a, v in r["pass_at_1"].items()) or "–"
        errored = "" if r["errored"] is None else f"{r['errored']}/{r['trials']}"
        rows.append([r["run_id"], r["created_at"].replace("T", " ").rstrip("Z"),
                     ", ".join(r["agents"]) or "–", ", ".join(r["datasets"]) or "–",
                     r["status"] + (" UNSAFE-SANDBOX" if r.get("unsafe_sandbox") else ""),
                     errored, p1])
    head = ["run", "created (UTC)", "agents", "datasets", "status", "errored", "pass@1"]
    width = [min(max(len(str(x)) for x in col), 48) for col in zip(head, *rows)]
    for row in [head, *rows]:
        print("  ".join(str(c)[:48].ljust(w) for c, w in zip(row, width)).rstrip())
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """``querylab status``: print the run record and each stage's latest attempt (exit 2 when
    the run has no record)."""
    from tasks.core import runs

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
              f"{b.n_trials} trials per query in batches of {b.batch_size}; at most "
              f"{b.max_concurrency} model calls in flight, "
              f"{resolve_max_trials(b.max_concurrency, b.max_trials)} trials admitted"
              f"{'' if b.max_trials is not None else ' (default)'}")
    for stage, params in record.stages.items():
        print(f"{stage}: {json.dumps(params, sort_keys=True)}")
    from tasks.sandbox.session import missing_text

    for agent, missing in runs.unsafe_agents(root, args.run_id).items():
        print(f"sandbox: UNSAFE: {agent} ran with --unsafe-sandbox; {missing_text(missing)}")
    alive = runs.lease_alive(root, args.run_id)
    print(f"\n{'stage':<12} {'status':<10} {'attempt':>7}  {'started':<20} {'finished':<20} error")
    for stage in runs.configured_stages(record) + [s for s in statuses
                                                   if s not in runs.configured_stages(record)]:
        st = statuses.get(stage)
        if st is None:
            print(f"{stage:<12} {'-':<10} {'':>7}  {'':<20} {'':<20}")
            continue
        error = (st.error or "").splitlines()[0][:100] if st.error else ""
        state = "interrupted" if runs.was_interrupted(st) else st.status
        if state == "running" and not alive:
            state = "interrupted"
            error = error or "recorded running, but no live process holds the run"
        print(f"{stage:<12} {state:<10} {st.attempt:>7}  {st.started_at:<20} "
              f"{st.finished_at or '':<20} {error}")
    summary = runs.score_summary(root, args.run_id)
    if summary:
        print(f"\nscored (scorer {summary.get('scorer_version')}, {summary.get('scored_at')}): "
              f"{summary['trials']} trials, {summary['correct']} correct, "
              f"{summary['incorrect']} incorrect, {summary['errored']} errored, "
              f"{summary.get('flagged', 0)} flagged by the audit")
        if summary["errored"]:
            print(f"errored trials have no verdict: `querylab rerun --run-id {args.run_id} "
                  "--retry-errors` retries them")
    pending = runs.pending_stages(root, args.run_id)
    if pending:
        print(f"\nnot completed: {', '.join(pending)} "
              f"(`querylab rerun --run-id {args.run_id}` runs them)")
    return 0
