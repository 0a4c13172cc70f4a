"""``querylab report``: recompute a run's report (tables, failure modes, tool use, plots,
Markdown + HTML, viewer) from its artifacts alone, optionally with LLM-judge failure labels;
``querylab view``: write (and optionally serve) the run's transcript viewer. Neither starts a
Prefect server nor imports Prefect."""

from __future__ import annotations

import argparse
import sys
from tasks.core.layout import RunLayout


def print_report(rep: dict) -> int:
    """Print a report result (see :func:`tasks.report.stage.report_run`, optionally extended by
    :func:`with_run_details`): the pass@k table, per-query pass@1, queries with incorrect
    trials, errored trials with the retry command, notes, and where the report and viewer
    are. Returns 1 when an ``oracle`` agent failed a query (a dataset bug: its reference
    solution does not reproduce the ground truth), else 0 (errored trials are the caller's
    business: :func:`tasks.core.runs.check_error_share`)."""
    print("\npass@k over scored trials (n = scored, n_errored = errored, left out; mean over "
          "queries per dataset; ALL rows: over all queries / over datasets)")
    print(rep["table"])
    if rep.get("queries_table"):
        print("\nqueries behind each pass@k: a query needs k scored trials for pass@k (fewer: "
              "left out of that mean); `all errored`: no scored trial, in no mean")
        print(rep["queries_table"])
    if rep.get("per_query_table"):
        print("\npass@1 per query")
        print(rep["per_query_table"])
    status = 0
    if rep["failed"]:
        print("\nQueries with incorrect trials:")
        for f in rep["failed"]:
            print(f"  {f['agent']} {f['dataset']}/{f['query_id']}: {f['c']}/{f['n']} correct")
        if any(f["agent"] == "oracle" for f in rep["failed"]):
            print(
                "ORACLE FAILED: the queries above are dataset bugs (the reference solution "
                "does not reproduce the ground truth)."
            )
            status = 1
    counts = rep.get("counts") or {}
    if counts.get("errored"):
        reasons = ", ".join(f"{r} {n}" for r, n in (rep.get("errored") or {}).get("by_reason", {}).items())
        print(f"\nErrored trials: {counts['errored']} of {counts['trials']} ({reasons}); no "
              "verdict, left out of every score.")
        from tasks.core.safe_text import terminal_text

        for agent, error in (rep.get("errors") or {}).items():  # endpoint text: no escapes
            print(f"  {agent}: e.g. {terminal_text(error, 300)}")
    if counts.get("flagged"):
        print(f"\nTrace audit: {counts['flagged']} trial(s) flagged (see the report and viewer).")
    for note in rep.get("notes", []):
        if note.startswith("Warning: "):  # e.g. every call answered from an earlier run's cache
            print(f"warning: {note.removeprefix('Warning: ')}", file=sys.stderr)
        else:
            print(f"note: {note}")
    print(f"\nreport:    {rep['markdown']}")
    if rep.get("html"):
        print(f"html:      {rep['html']}")
    if rep.get("viewer"):
        print(f"viewer:    {rep['viewer']}")
    print(f"pass@k:    {rep['pass_at_k']}")
    return status


def with_run_details(rep: dict, root: str, run_id: str) -> dict:
    """Add the per-query pass@1 table (scored n, errored, correct) and each agent's first
    error of an errored trial to a report."""
    import polars as pl

    from tasks.report.loaders import load_scored_trials

    trials = load_scored_trials(root, run_id)
    scored = pl.col("verdict") != "errored"
    per_query = (
        trials.group_by("agent", "dataset", "query_id")
        .agg(scored.sum().alias("n"), (~scored).sum().alias("n_errored"),
             (pl.col("verdict") == "correct").sum().alias("c"))
        .with_columns((pl.col("c") / pl.when(pl.col("n") > 0).then(pl.col("n"))).alias("pass@1"))
        .sort("agent", "dataset", "query_id")
    )
    errors = (
        trials.filter(~scored, pl.col("error").is_not_null())
        .group_by("agent").agg(pl.col("error").first())
        .sort("agent")
    )
    from tasks.report.html import POLARS_CONFIG_LOCK

    with POLARS_CONFIG_LOCK, pl.Config(
        tbl_formatting="MARKDOWN", tbl_hide_column_data_types=True,
        tbl_hide_dataframe_shape=True, tbl_rows=-1, float_precision=3, fmt_str_lengths=80,
    ):
        table = str(per_query)
    return {**rep, "per_query_table": table,
            "errors": {a: e.splitlines()[0][:300] for a, e in errors.iter_rows()}}


def _root(args: argparse.Namespace) -> str:
    from schemas.settings import Settings

    return args.artifacts or Settings.from_env().artifacts


def _check_run(root: str, run_id: str) -> None:
    from querylab import UsageError
    from tasks.core import storage
    from tasks.core.runs import valid_run_id

    valid_run_id(run_id)
    trials = RunLayout(root, run_id).trials("trials.parquet")
    if not storage.exists(trials):
        raise UsageError(f"no run {run_id!r} under {root} (missing {trials})")


def cmd_report(args: argparse.Namespace) -> int:
    """Recompute the report of ``args.run_id`` as plain function calls (no Prefect) and print
    it; a run id without artifacts is a :class:`querylab.UsageError`, a run not scored a
    ScoringError (``querylab rescore``)."""
    from tasks.report.stage import report_run

    root = _root(args)
    _check_run(root, args.run_id)
    rep = report_run(args.run_id, root, manifest_uris=args.manifest or None,
                     judge_model=args.judge_model, judge_limit=args.judge_limit)
    return print_report(with_run_details(rep, root, args.run_id))


def cmd_view(args: argparse.Namespace) -> int:
    """Write the run's transcript viewer (``report/viewer.html``) and print where it is; with
    ``--serve`` also serve it on 127.0.0.1 until interrupted."""
    from tasks.core import storage
    from tasks.report.viewer import serve_html, write_viewer

    root = _root(args)
    _check_run(root, args.run_id)
    uri = write_viewer(args.run_id, root, args.manifest or None)
    print(f"viewer:    {uri}")
    if not args.serve:
        return 0
    server = serve_html(storage.read_bytes(uri), args.port)
    print(f"serving:   http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)", flush=True)
    try:
        import threading

        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0


def register(subparsers) -> None:
    """Add the ``report`` and ``view`` subcommands to an argparse ``subparsers`` object."""
    rp = subparsers.add_parser(
        "report",
        help="recompute a run's report from its artifacts",
        description=__doc__,
    )
    rp.add_argument("--run-id", required=True, help="the run to report on")
    rp.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    rp.add_argument(
        "--manifest",
        action="append",
        help="dataset manifest URI to take query annotations from (repeat; default: the "
        "manifests recorded for the run, else found under the artifact root)",
    )
    rp.add_argument(
        "--judge-model",
        help="also label incorrect trials with an LLM judge, e.g. openai:gpt-4o-mini (base URL "
        "and key from QUERYLAB_OPENAI_BASE_URL / QUERYLAB_OPENAI_API_KEY)",
    )
    rp.add_argument(
        "--judge-limit",
        type=int,
        default=200,
        help="judge at most this many incorrect trials per call (default 200)",
    )
    rp.set_defaults(func=cmd_report)

    v = subparsers.add_parser(
        "view", help="write the run's transcript viewer (one self-contained HTML file)",
    )
    v.add_argument("--run-id", required=True, help="the run to view")
    v.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    v.add_argument("--manifest", action="append",
                   help="dataset manifest URI for questions and ground truth (repeat)")
    v.add_argument("--serve", action="store_true", help="also serve it on 127.0.0.1")
    v.add_argument("--port", type=int, default=0, help="port for --serve (default: any free)")
    v.set_defaults(func=cmd_view)
