"""Run reports: pass@k tables from a run's ``trials.parquet``, as Parquet and Markdown."""

from __future__ import annotations

import polars as pl
from prefect import task

from schemas import artifacts
from tasks import storage
from tasks.metrics import pass_at_k_per_query, pass_at_k_summary, pass_at_k_wide


def markdown_table(df: pl.DataFrame, float_precision: int = 3) -> str:
    """A Polars frame as a GitHub Markdown table (all rows, no dtypes)."""
    with pl.Config(
        tbl_formatting="MARKDOWN",
        tbl_hide_column_data_types=True,
        tbl_hide_dataframe_shape=True,
        tbl_rows=-1,
        tbl_cols=-1,
        tbl_width_chars=400,
        fmt_str_lengths=200,
        float_precision=float_precision,
    ):
        return str(df)


def run_prefix(artifacts_root: str, run_id: str) -> str:
    """Artifact prefix of one run."""
    return storage.join(artifacts_root, "runs", run_id)


def load_trials(artifacts_root: str, run_id: str) -> pl.DataFrame:
    """A run's trials as a Polars frame (schema-checked)."""
    uri = storage.join(run_prefix(artifacts_root, run_id), "trials", "trials.parquet")
    return pl.from_arrow(storage.read_parquet(uri, artifacts.TRIALS))


@task(name="pass-at-k-report", persist_result=False)
def pass_at_k_report(run_id: str, artifacts_root: str) -> dict:
    """Compute pass@k for a run and write it next to the run.

    Writes ``report/pass_at_k.parquet`` (per query and k), ``report/pass_at_k_summary.parquet``
    (per agent × dataset × k, plus overall rows) and ``report/report.md``. Returns
    ``{"markdown": uri, "pass_at_k": uri, "summary": uri, "table": <markdown of the wide
    table>, "failed": [{agent, dataset, query_id, n, c}] for queries with a failed trial}``.
    """
    trials = load_trials(artifacts_root, run_id)
    per_query = pass_at_k_per_query(trials)
    summary = pass_at_k_summary(per_query)
    wide = pass_at_k_wide(summary)
    prefix = storage.join(run_prefix(artifacts_root, run_id), "report")
    pq_uri = storage.write_parquet(
        storage.join(prefix, "pass_at_k.parquet"), per_query.to_arrow(), artifacts.PASS_AT_K
    )
    summary_uri = storage.write_parquet(
        storage.join(prefix, "pass_at_k_summary.parquet"), summary.to_arrow()
    )
    failed = (
        per_query.filter(pl.col("k") == 1, pl.col("c") < pl.col("n"))
        .select("agent", "dataset", "query_id", "n", "c")
        .to_dicts()
    )
    per_query_k1 = per_query.filter(pl.col("k") == 1).select(
        "agent", "dataset", "query_id", "n", "c", pl.col("pass_at_k").alias("pass@1")
    )
    terminate = (
        trials.group_by("agent", "terminate_reason").agg(pl.len().alias("trials"))
        .sort("agent", "terminate_reason")
    )
    table = markdown_table(wide)
    md = "\n\n".join(
        [
            f"# querylab run `{run_id}`",
            f"{trials.height} trials, {trials['agent'].n_unique()} agent(s), "
            f"{trials['dataset'].n_unique()} dataset(s), "
            f"{trials.select('dataset', 'query_id').unique().height} queries.",
            "## pass@k (unbiased estimator, Chen et al. 2021)\n\nDataset score = mean over its "
            "queries; `ALL (queries)` = mean over all queries; `ALL (datasets)` = mean of the "
            "dataset scores.",
            table,
            "## Per query",
            markdown_table(per_query_k1),
            "## Terminate reasons",
            markdown_table(terminate),
        ]
    )
    md_uri = storage.write_bytes(storage.join(prefix, "report.md"), (md + "\n").encode())
    return {
        "markdown": md_uri,
        "pass_at_k": pq_uri,
        "summary": summary_uri,
        "table": table,
        "failed": failed,
    }
