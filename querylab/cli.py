"""querylab command line: run (end-to-end benchmark), build (datasets), report (from artifacts).

Commands that only read artifacts (``report``, ``status``, ``view``, ``runs``, ``models``,
``datasets list``, ``rescore``, ``--help``) never start a Prefect server and do not import
Prefect. A user error prints one line (``querylab <command>: <first cause>``) and exits 2;
``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback

from querylab import UsageError, run_id_or_new
from tasks.core.settings import env_setdefault


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line: ``querylab <command>: <problem>``
    with a did-you-mean for a mistyped option or choice (:mod:`difflib`) and where to find
    the options, exit status 2 — not the usage block. Sub-command parsers are of this class
    too (``add_subparsers`` makes them so); an unknown option after a sub-command is
    reported by that sub-command."""

    def parse_args(self, args=None, namespace=None):  # noqa: D102 - argparse's contract
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            sub = self._chosen(parsed)
            (sub or self).error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed

    def _chosen(self, parsed) -> argparse.ArgumentParser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action.choices.get(getattr(parsed, action.dest, None) or "")
        return None

    def _options(self) -> list[str]:
        return [o for a in self._actions for o in a.option_strings if o.startswith("--")]

    def error(self, message: str):
        """Print ``<prog>: <message>`` (plus a suggestion) as one line and exit 2."""
        import difflib
        import re

        hint = ""
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        choice = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)",
                          message)
        if unknown:
            for token in unknown.group(1).split():
                if token.startswith("--"):
                    near = difflib.get_close_matches(token.split("=")[0], self._options(), 1, 0.6)
                    if near:
                        hint = f"; did you mean {near[0]}?"
                        break
        elif choice:
            options = re.findall(r"'([^']*)'", choice.group(3)) or [
                o.strip() for o in choice.group(3).split(",")]
            near = difflib.get_close_matches(choice.group(2), options, 1, 0.6)
            hint = f"; did you mean {near[0]!r}?" if near else ""
        print(f"{self.prog}: {message}{hint} (`{self.prog} --help` lists the options)",
              file=sys.stderr)
        sys.exit(2)


def _prefect_defaults() -> None:
    """Offline-friendly Prefect defaults (an explicit environment always wins)."""
    env_setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    env_setdefault("DO_NOT_TRACK", "1")
    env_setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


class _NoTraceback(logging.Filter):
    """Drops the traceback of a log record (keeps its one-line message)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


def quiet_tracebacks() -> None:
    """Strip tracebacks from Prefect's log output (flow and task failures are reported once,
    as one line, by the command itself); ``--debug`` leaves them in. Call after Prefect is
    imported (its logging is configured then)."""
    f = _NoTraceback()
    loggers = [logging.getLogger()] + [
        logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)
        if name.startswith("prefect")
    ]
    for logger in loggers:
        for handler in logger.handlers:
            if not any(isinstance(x, _NoTraceback) for x in handler.filters):
                handler.addFilter(f)


def check_datasets(names: list[str] | None, root: str | None = None) -> list[str]:
    """The named datasets (all by default are resolved later): querylab's own, or DAB datasets
    imported into the artifact ``root`` by DAB's name (``PATENTS``; a name that differs only
    in case is resolved to it). UsageError for an unknown name. Needs no Prefect."""
    import difflib

    from tasks.datasets.catalogue import dataset_names

    known = dataset_names()
    imported = {}
    if root is not None and any(n not in known for n in names or []):
        from tasks.datasets.dab_import import imported_datasets

        imported = imported_datasets(root)
    out, unknown = [], []
    for n in names or []:
        if n in known:
            out.append(n)
            continue
        folded = [m for m in imported if m == n] or [m for m in imported
                                                     if m.casefold() == n.casefold()]
        (out.append(folded[0]) if len(folded) == 1 else unknown.append(n))
    if unknown:
        near = difflib.get_close_matches(unknown[0], [*known, *imported], 1, 0.6)
        extra = f" and the imported DAB datasets {sorted(imported)}" if imported else ""
        raise UsageError(f"unknown dataset(s) {unknown}"
                         + (f" (did you mean {near[0]!r}?)" if near else "")
                         + f"; have {sorted(known)}{extra} "
                         "(`querylab import-dab PATH` imports DAB datasets)")
    return out


def check_specs(names: list[str], query_ids: list[str] | None = None,
                root: str | None = None) -> None:
    """Load the spec of each dataset (SpecError, one line, before anything starts) — or, for
    an imported DAB dataset, its manifest — and check that every ``--query`` id names a query
    of one of them (UsageError)."""
    from tasks.datasets.catalogue import SHARED_DATASETS, dataset_names, shared_data_dir
    from tasks.datasets.spec import check_sources, load_spec, spec_path

    ids: set[str] = set()
    built = set(dataset_names())
    for name in names:
        if name not in built:  # imported (check_datasets resolved it)
            from tasks.core import storage
            from tasks.datasets.dab_import import resolve_imported

            entry = resolve_imported(root, name) if root else None
            if entry is not None:
                queries = [q["id"] for q in storage.read_json(entry["manifest"])["queries"]]
                ids |= set(queries) | {f"{name}/{q}" for q in queries}
            continue
        path = spec_path(name)
        spec = load_spec(path)
        check_sources(path, spec, shared_data_dir() if name in SHARED_DATASETS else None)
        ids |= {q.id for q in spec.queries} | {f"{name}/{q.id}" for q in spec.queries}
    unknown = [q for q in query_ids or [] if q not in ids]
    if unknown:
        raise UsageError(f"unknown query id(s) {unknown} in datasets {names} (use <id> or "
                         "<dataset>/<id>; `querylab datasets list` shows the datasets)")


def check_agents_now(agents: list[str], options: dict | None, command: str) -> list[dict]:
    """:func:`tasks.trials.stage.check_agents` before anything starts, printing its warnings (an
    endpoint overriding the models table's, a model without prices) as one line each."""
    from tasks.trials.stage import check_agents

    described = check_agents(agents, options=options)
    for d in described:
        for warning in d.get("warnings", []):
            print(f"querylab {command}: warning: {warning}", file=sys.stderr)
    return described


def run_preflight(agents: list[str], options: dict | None, command: str,
                  record: tuple[str, str] | None = None) -> list:
    """Check every LLM agent with one minimal real request (:func:`tasks.trials.stage.preflight_agents`)
    before anything is built; UsageError with one line per failing agent (agent, endpoint,
    problem). Warnings (a rate limit at the check) are printed. ``record``: ``(artifacts root,
    run id)`` to record the checks with (:func:`tasks.core.runs.record_preflight`: they are paid
    requests; a failed check of a run that never started is not recorded). Returns the
    results."""
    from tasks.trials.stage import preflight_agents

    results = preflight_agents(agents, options)
    for r in results:
        if r.ok and r.warning:
            print(f"querylab {command}: warning: {r.warning}", file=sys.stderr)
    failed = [r for r in results if not r.ok]
    if failed:
        raise UsageError("preflight failed: " + "; ".join(r.line() for r in failed))
    if record is not None:
        from tasks.core.runs import record_preflight

        record_preflight(record[0], record[1], results)
    return results


def _agent_plans(args: argparse.Namespace, agents: list[str], names: list[str]) -> dict:
    """``--agent-datasets AGENT=D1,D2`` and ``--agent-trials AGENT=N`` as
    :class:`schemas.runs.AgentPlan` dicts by agent (UsageError for a bad value or a dataset
    that is not among the run's ``names``)."""
    from schemas.settings import Settings

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
                chosen = check_datasets([d.strip() for d in value.split(",") if d.strip()],
                                        args.artifacts or Settings.from_env().artifacts)
                outside = [d for d in chosen if d not in names]
                if outside:
                    raise UsageError(f"{flag} {text!r}: {outside} not among the run's datasets "
                                     f"{names}")
                plans.setdefault(agent, {})[field] = chosen
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
    from tasks.core import storage
    from schemas.runs import BENCHMARK_STAGES
    from tasks.core.runs import stage_status

    stages, summed = [], 0.0
    for stage in BENCHMARK_STAGES:
        st = stage_status(root, run_id, stage)
        if st is not None and st.started_at and st.finished_at:
            took = (datetime.fromisoformat(st.finished_at)
                    - datetime.fromisoformat(st.started_at)).total_seconds()
            stages.append(f"{stage} {took:.1f} s")
            summed += took
    stages.append(f"start-up and checks {max(total_s - summed, 0.0):.1f} s")  # Prefect, preflight
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
    """``querylab run``: validate the options and check the agents (before Prefect starts),
    run the benchmark flow, print the report. Exit 0; 1 when the oracle failed a query, a
    stage failed or more trials errored than ``--max-error-share`` allows; 2 for bad input."""
    from querylab import cmd_agents
    from schemas.settings import Settings
    from tasks.datasets.catalogue import default_datasets
    from tasks.core.llm import local_entry
    from tasks.core.runs import run_lease, valid_run_id
    from tasks.trials.stage import parse_agent

    started = time.monotonic()
    settings = Settings.from_env()
    root = args.artifacts or settings.artifacts
    run_id = valid_run_id(run_id_or_new(args.run_id))
    agents = args.agent or ["oracle"]
    for agent in agents:
        kind, name = parse_agent(agent)
        if kind == "local":  # installed? (one line before anything starts)
            local_entry(name)
    names = check_datasets(args.dataset, root) or replay_datasets(agents, root) or \
        default_datasets(lambda m: print(f"querylab run: {m}", file=sys.stderr))
    if args.trials < 1 or args.batch_size < 1:
        raise UsageError("--trials and --batch-size must be at least 1")
    if args.max_concurrency < 1:
        raise UsageError("--max-concurrency must be at least 1")
    if args.max_trials is not None and args.max_trials < 1:
        raise UsageError("--max-trials must be at least 1")
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    if not 0.0 <= args.max_error_share <= 1.0:
        raise UsageError("--max-error-share must be between 0 and 1")
    plans = _agent_plans(args, agents, names)
    check_specs(names, args.query, root)
    options = cmd_agents.agent_options_from_args(args)
    check_agents_now(agents, options, "run")

    hints = list(dict.fromkeys(args.hints or ["off"]))
    new_root = "://" not in root and not os.path.exists(root)
    try:
        with run_lease(root, run_id):  # refuses at once (LeaseHeld) when another process runs it
            # under the lease: a refused run pays nothing; the checks are recorded (paid)
            run_preflight(agents, options, "run", (root, run_id))
            own = "".join(f"; {a}: {p.get('n_trials', args.trials)} per query on "
                          f"{', '.join(p.get('datasets') or ['every dataset'])}"
                          for a, p in plans.items())  # --agent-trials / --agent-datasets
            print(f"querylab run {run_id}: agents {agents}, {args.trials} trials per query{own}, "
                  f"hints {'/'.join(hints)}, artifacts in {root}")
            return _run_benchmark(args, run_id, root, names, agents, options, hints, plans,
                                  started)
    except UsageError:  # the preflight failed: nothing was built, leave nothing behind
        if new_root:
            _remove_lease_only_root(root, run_id)
        raise


def _remove_lease_only_root(root: str, run_id: str) -> None:
    """Remove the local artifact ``root`` that this command created when it holds nothing but
    the lease's lock file of ``run_id`` (a run whose preflight failed builds nothing)."""
    import shutil
    from pathlib import Path

    from tasks.core.layout import RunLayout

    run_dir = Path(RunLayout(root, run_id).root)
    left = [p for p in Path(root).rglob("*") if p.is_file()]
    if all(p.parent == run_dir and p.name.startswith(".lease") for p in left):
        shutil.rmtree(root, ignore_errors=True)


def _run_benchmark(args, run_id, root, names, agents, options, hints, plans, started) -> int:
    _prefect_defaults()
    from flows.benchmark import benchmark
    from querylab.cmd_report import print_report, with_run_details
    from tasks.core import interrupt
    from tasks.core.progress import console_progress
    from tasks.core.runs import StageFailed, TrialsErrored

    if not getattr(args, "debug", False):
        quiet_tracebacks()
    status = 0
    try:
        with console_progress(args.progress):
            out = interrupt.run_interruptible(benchmark, dict(  # Ctrl-C / SIGTERM stop it
                run_id=run_id, datasets=names, agents=agents, n_trials=args.trials,
                batch_size=args.batch_size, artifacts_root=root, agent_options=options,
                hints=hints, query_ids=args.query or None, limit=args.limit,
                max_error_share=args.max_error_share, preflight=False, agent_plans=plans,
                score_no_tool_call=args.score_no_tool_call,
                max_concurrency=args.max_concurrency, max_trials=args.max_trials,
            ), artifacts_root=root, run_id=run_id)
    except TrialsErrored as exc:
        if exc.result is None:
            print(f"querylab run: {exc}", file=sys.stderr)
            return 1
        out, status = exc.result, 1
        error_line = str(exc)
    except Exception as exc:
        line = interrupt.interrupted_line("run", run_id)
        if line is not None:
            print(line, file=sys.stderr)
            return 130
        if not isinstance(exc, StageFailed):
            raise
        print(f"querylab run: {exc}", file=sys.stderr)
        return 1
    else:
        error_line = None
    status = max(status, print_report(with_run_details(out["report"], root, run_id)))
    for name in ("trials", "tool_calls", "llm_calls", "messages", "agents"):
        if name in out["trials"]:
            print(f"{name + ':':<10} {out['trials'][name]}")
    print(f"{'scores:':<10} {out['score']['scores']}")
    for uri in out["manifests"]:
        print(f"dataset:   {uri}")
    if error_line:
        print(f"querylab run: {error_line}", file=sys.stderr)
    _print_timings(root, run_id, out["trials"], time.monotonic() - started)
    status = max(status, check_scored(out["score"], "run"))
    print_dab_figures(root, run_id, out["manifests"])
    return status


def replay_datasets(agents: list[str], root: str) -> list[str]:
    """The datasets a run of replay agents only is about when none is named: those their
    answer files answer (querylab's own, or imported DAB datasets, matched ignoring case);
    UsageError naming the ones that are neither. [] when some agent is not a replay agent."""
    from tasks.agents.replay import load_answers
    from tasks.trials.stage import parse_agent

    if not agents or any(parse_agent(a)[0] != "replay" for a in agents):
        return []
    from tasks.datasets.catalogue import dataset_names
    from tasks.datasets.dab_import import imported_datasets

    known = {n.casefold(): n for n in (*imported_datasets(root), *dataset_names())}
    names: list[str] = []
    unknown: dict[str, int] = {}
    for agent in agents:
        answers = load_answers(parse_agent(agent)[1])
        for d in sorted(answers.datasets()):
            if d in known:
                names.append(known[d])
            else:
                unknown[answers.spelled.get(d, d)] = answers.count(d)
    if unknown:
        shown = ", ".join(f"{d!r} ({n} entries)" for d, n in unknown.items())
        raise UsageError(f"the answer file answers datasets that are neither querylab's nor "
                         f"imported: {shown}; import them (`querylab import-dab PATH`, "
                         "--scoring-only without data) or name the datasets to score "
                         "(--dataset)")
    return list(dict.fromkeys(names))


def check_scored(score: dict, command: str) -> int:
    """1 (with one line) when the run scored no trial at all — nothing was measured, whatever
    the tables say — else 0."""
    if score.get("trials", 0) == 0:
        print(f"querylab {command}: no trial was scored (no query matched the selection, or "
              "the answer file answers none of the run's queries)", file=sys.stderr)
        return 1
    return 0


def print_dab_figures(root: str, run_id: str, manifests: list[str]) -> None:
    """For a run on DAB datasets: DAB's leaderboard pass@1 per dataset and overall, computed
    as DAB's scripts compute it (:func:`tasks.scoring.dab_rules.leaderboard_pass_at_1`); the last line
    is ``DAB pass@1: 0.xxxx`` (one per agent when several)."""
    from tasks.core import storage
    from tasks.scoring.dab_rules import is_dab, leaderboard_pass_at_1
    from tasks.scoring.stage import load_scores

    dab = {m["name"] for m in (storage.read_json(u) for u in manifests) if is_dab(m)}
    if not dab:
        return
    import polars as pl

    scores = load_scores(root, run_id).filter(pl.col("dataset").is_in(sorted(dab)))
    figures = leaderboard_pass_at_1(scores)
    if not figures:
        return
    print("\nDAB leaderboard pass@1 (as DAB's stats_scripts: per query over its runs, mean "
          "over a dataset's queries, mean over datasets)")
    lines = []
    for agent, f in figures.items():
        print(f"  {agent}")
        print(f"    {'dataset':<22} {'queries':>7} {'runs':>5} {'correct':>7} {'pass@1':>7}")
        for d in f["datasets"]:
            print(f"    {d['dataset']:<22} {d['queries']:>7} {d['runs']:>5} {d['correct']:>7} "
                  f"{d['pass_at_1']:>7.4f}")
        if f["missing_runs"]:
            alt = f["pass_at_1_missing_as_failures"]
            print(f"    {f['missing_runs']} trial(s) have no answer in the file: DAB's scripts "
                  f"find no run there and leave them out; counted as failures: {alt:.4f}")
        if f["validator_errors"]:
            print(f"    {f['validator_errors']} trial(s) left out: their validate.py gave no "
                  "verdict (DAB's scripts would stop there)")
        value = "n/a" if f["pass_at_1"] is None else f"{f['pass_at_1']:.4f}"
        lines.append(value if len(figures) == 1 else f"{value} ({agent})")
    for line in lines:
        print(f"DAB pass@1: {line}")


def cmd_build(args: argparse.Namespace) -> int:
    """``querylab build``: build and load datasets; prints each manifest URI."""
    check_datasets(args.dataset)
    from querylab.cmd_datasets import load_shipped_spec

    for name in args.dataset or []:
        load_shipped_spec(name)  # SpecError: one line (main), before Prefect starts
    _prefect_defaults()
    from flows.datasets import dataset_flows, default_datasets

    if not getattr(args, "debug", False):
        quiet_tracebacks()
    flows = dataset_flows()
    for name in args.dataset or default_datasets():
        print(flows[name](artifacts_root=args.artifacts, source_dir=args.source_dir))
    return 0


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that are the user's input (one line, exit 2)."""
    from schemas.artifacts import ArtifactSchemaError
    from tasks.core.llm import AgentConfigError
    from tasks.core.runs import RunError
    from tasks.scoring.scoring_file import ScoringError
    from tasks.datasets.spec import SpecError
    from tasks.core.storage import StorageError

    return (UsageError, AgentConfigError, SpecError, StorageError, ArtifactSchemaError, RunError,
            ScoringError)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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

    p = Parser(prog="querylab", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--debug", action="store_true",
                   help="show tracebacks (and Prefect's) instead of one-line errors")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="build datasets, run agent trials, score, print pass@k")
    r.add_argument(
        "--agent", action="append",
        help="oracle (default), openai:<model>, openai:<model>@<base url> or local:<model> "
        "(see `querylab models`), replay:<answers.json>; repeat for several agents",
    )
    r.add_argument("--agent-datasets", action="append", metavar="AGENT=D1,D2",
                   help="run AGENT on these datasets only (default: all of the run's); repeat")
    r.add_argument("--agent-trials", action="append", metavar="AGENT=N",
                   help="trials per query for AGENT (default: --trials); repeat")
    r.add_argument("--dataset", action="append", help="dataset name (default: all); repeat")
    r.add_argument("--query", action="append", metavar="ID",
                   help="run only this query (<id> or <dataset>/<id>); repeat")
    r.add_argument("--limit", type=int, help="run only the first N queries of each dataset")
    r.add_argument("--trials", type=int, default=5, help="trials per query (default 5)")
    r.add_argument("--batch-size", type=int, default=25,
                   help="trials per mapped task (checkpoint / Parquet granularity; default 25)")
    r.add_argument("--max-concurrency", type=int, default=32, metavar="N",
                   help="model calls (HTTP requests) in flight at once across the whole trials "
                   "stage (default 32; Inspect AI's max_connections); a models-table entry's "
                   "max_concurrency caps its model's calls further")
    r.add_argument("--max-trials", type=int, default=None, metavar="M",
                   help="trials admitted at once (started, not finished; default 2 x "
                   "--max-concurrency; Inspect AI's max_samples): bounds sandbox sessions "
                   "and memory")
    r.add_argument("--run-id", help="reuse a run id to resume it (default: a new one)")
    r.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    r.add_argument("--max-error-share", type=float, default=0.0, metavar="X",
                   help="share of each agent's trials that may error (api_error / error) with "
                   "the run still exiting 0 (default 0)")
    r.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="progress bar (default: when stderr is a terminal)",
    )
    r.add_argument("--score-no-tool-call", action="store_true",
                   help="on DAB datasets, score the text of a no_tool_call ending (DAB scores "
                   "it invalid, the default)")
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

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # accepted anywhere on the line, not only before the command
    args = p.parse_args([a for a in argv if a != "--debug"])
    args.debug = debug
    try:
        status = args.func(args)
        sys.stdout.flush()  # inside the try: a closed pipe (`querylab runs | head`) is quiet
        return status
    except BrokenPipeError:  # the reader went away: stop quietly, as `cat | head` does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return 141
    except KeyboardInterrupt:
        print(f"querylab {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one line per error, the traceback on --debug
        if args.debug:
            traceback.print_exc()
        user = isinstance(exc, _user_errors())
        hint = "" if user or args.debug else " (run with --debug for the traceback)"
        kind = "" if user else f"{type(exc).__name__}: "
        print(f"querylab {args.command}: {kind}{first_line(exc)}{hint}", file=sys.stderr)
        return 2 if user else 1


if __name__ == "__main__":
    sys.exit(main())
