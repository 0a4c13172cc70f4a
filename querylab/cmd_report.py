"""``querylab report``: recompute a run's report (tables, failure modes, tool use, plots,
Markdown + HTML) from its artifacts alone, optionally with LLM-judge failure labels."""

from __future__ import annotations

import argparse


def print_report(rep: dict) -> int:
    """Print a report flow result (see :func:`flows.report.report`, optionally extended by
    :func:`with_run_details`): the pass@k table, per-query pass@1, queries with failed trials
    and each erroring agent's first error, notes, and where the report is. Returns 1 when an
    ``oracle`` agent failed a query (a dataset bug: its reference solution does not reproduce
    the ground truth), else 0."""
    print("\npass@k (mean over queries per dataset; ALL rows: over all queries / over datasets)")
    print(rep["table"])
    if rep.get("per_query_table"):
        print("\npass@1 per query")
        print(rep["per_query_table"])
    status = 0
    if rep["failed"]:
        print("\nQueries with failed trials:")
        for f in rep["failed"]:
            print(f"  {f['agent']} {f['dataset']}/{f['query_id']}: {f['c']}/{f['n']} correct")
        for agent, error in (rep.get("errors") or {}).items():
            print(f"  {agent}: trials ended with an error, e.g. {error}")
        if any(f["agent"] == "oracle" for f in rep["failed"]):
            print(
                "ORACLE FAILED: the queries above are dataset bugs (the reference solution "
                "does not reproduce the ground truth)."
            )
            status = 1
    for note in rep.get("notes", []):
        print(f"note: {note}")
    print(f"\nreport:    {rep['markdown']}")
    if rep.get("html"):
        print(f"html:      {rep['html']}")
    print(f"pass@k:    {rep['pass_at_k']}")
    return status


def with_run_details(rep: dict, root: str, run_id: str) -> dict:
    """Add the per-query pass@1 table and each erroring agent's first error to a report."""
    import polars as pl

    from schemas import artifacts
    from tasks import storage

    trials = pl.from_arrow(
        storage.read_parquet(
            storage.join(root, "runs", run_id, "trials", "trials.parquet"), artifacts.TRIALS
        )
    )
    per_query = (
        trials.group_by("agent", "dataset", "query_id")
        .agg(pl.len().alias("n"), pl.col("is_correct").sum().alias("c"))
        .with_columns((pl.col("c") / pl.col("n")).alias("pass@1"))
        .sort("agent", "dataset", "query_id")
    )
    errors = (
        trials.filter(pl.col("error").is_not_null())
        .group_by("agent").agg(pl.col("error").first())
    )
    with pl.Config(
        tbl_formatting="MARKDOWN", tbl_hide_column_data_types=True,
        tbl_hide_dataframe_shape=True, tbl_rows=-1, float_precision=3, fmt_str_lengths=80,
    ):
        table = str(per_query)
    return {**rep, "per_query_table": table, "errors": dict(errors.iter_rows())}


def cmd_report(args: argparse.Namespace) -> int:
    """Run the report flow for ``args.run_id`` and print the result; a run id without
    artifacts is a :class:`querylab.UsageError`."""
    from flows.report import report
    from querylab import UsageError
    from schemas.settings import Settings
    from tasks import storage

    root = args.artifacts or Settings.from_env().artifacts
    trials = storage.join(root, "runs", args.run_id, "trials", "trials.parquet")
    if not storage.exists(trials):
        raise UsageError(f"no run {args.run_id!r} under {root} (missing {trials})")
    rep = report(
        args.run_id,
        artifacts_root=root,
        manifest_uris=args.manifest or None,
        judge_model=args.judge_model,
        judge_limit=args.judge_limit,
    )
    return print_report(with_run_details(rep, root, args.run_id))


def register(subparsers) -> None:
    """Add the ``report`` subcommand to an argparse ``subparsers`` object."""
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
