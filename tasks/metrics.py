"""Benchmark metrics over trial tables (Polars)."""

from __future__ import annotations

from math import comb

import polars as pl

DEFAULT_KS = (1, 2, 3, 5, 10, 20, 50)


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """Unbiased pass@k estimator ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021).

    ``n`` trials of which ``c`` correct; returns a probability in [0, 1], or None when n < k.
    Raises ValueError for k < 1 or c outside [0, n].
    """
    if k < 1 or not 0 <= c <= n:
        raise ValueError(f"need k >= 1 and 0 <= c <= n, got n={n} c={c} k={k}")
    if n < k:
        return None
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_at_k_per_query(trials: pl.DataFrame, ks=DEFAULT_KS) -> pl.DataFrame:
    """pass@k per (agent, dataset, query_id, k).

    ``trials`` needs columns agent, dataset, query_id, is_correct (one row per trial). Returns a
    frame with agent, dataset, query_id, k, n, c, pass_at_k (null when n < k), sorted by
    agent, dataset, query_id, k. Every k in ``ks`` that is <= the largest n of the run is
    reported, so a query with fewer trials shows null rather than disappearing.
    """
    counts = (
        trials.group_by("agent", "dataset", "query_id")
        .agg(pl.len().cast(pl.Int32).alias("n"), pl.col("is_correct").sum().cast(pl.Int32).alias("c"))
    )
    max_n = int(counts["n"].max() or 0)
    used = [k for k in ks if 1 <= k <= max_n]
    rows = [
        {**r, "k": k, "pass_at_k": pass_at_k(r["n"], r["c"], k)}
        for r in counts.iter_rows(named=True)
        for k in used
    ]
    schema = {
        "agent": pl.String, "dataset": pl.String, "query_id": pl.String, "k": pl.Int32,
        "n": pl.Int32, "c": pl.Int32, "pass_at_k": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema).select(list(schema)).sort("agent", "dataset", "query_id", "k")


def pass_at_k_summary(per_query: pl.DataFrame) -> pl.DataFrame:
    """Mean pass@k per (agent, dataset, k) and overall per (agent, k).

    Dataset score = mean over its queries (null queries, n < k, are left out; ``queries`` counts
    those scored). Overall rows have dataset ``"ALL (queries)"`` (mean over all queries) and
    ``"ALL (datasets)"`` (stratified: mean of the dataset scores). Returns columns agent,
    dataset, k, queries, pass_at_k.
    """
    per_ds = per_query.group_by("agent", "dataset", "k").agg(
        pl.col("pass_at_k").count().cast(pl.Int32).alias("queries"), pl.col("pass_at_k").mean()
    )
    over_q = per_query.group_by("agent", "k").agg(
        pl.lit("ALL (queries)").alias("dataset"),
        pl.col("pass_at_k").count().cast(pl.Int32).alias("queries"),
        pl.col("pass_at_k").mean(),
    )
    strat = per_ds.group_by("agent", "k").agg(
        pl.lit("ALL (datasets)").alias("dataset"),
        pl.col("queries").sum().cast(pl.Int32),
        pl.col("pass_at_k").mean(),
    )
    cols = ["agent", "dataset", "k", "queries", "pass_at_k"]
    return pl.concat([per_ds.select(cols), over_q.select(cols), strat.select(cols)]).sort(
        "agent", "dataset", "k"
    )


def pass_at_k_wide(summary: pl.DataFrame) -> pl.DataFrame:
    """The summary as one row per (agent, dataset) and a ``pass@k`` column per k."""
    wide = summary.with_columns(("pass@" + pl.col("k").cast(pl.String)).alias("metric")).pivot(
        on="metric", index=["agent", "dataset"], values="pass_at_k", sort_columns=False
    )
    ks = sorted(summary["k"].unique().to_list())
    return wide.select("agent", "dataset", *[f"pass@{k}" for k in ks]).sort("agent", "dataset")
