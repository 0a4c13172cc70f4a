"""Benchmark metrics over trial tables (Polars, vectorised).

- pass@k — unbiased estimator ``1 - C(n-c, k) / C(n, k)`` per query (Chen et al. 2021), null
  when n < k; pass^k — ``C(c, k) / C(n, k)`` (all k sampled trials succeed).
- dataset score = mean over its queries; overall both as mean over all queries
  (``"ALL (queries)"``) and stratified, mean over datasets (``"ALL (datasets)"``).
- pass@1 with a Wilson score interval.
- cost and effort (USD, tokens, latency, iterations, cache hits) per agent and dataset.

Everything here works on Polars frames of *scored trials*: the columns of
``schemas.artifacts.TRIALS`` with the verdict of ``SCORES`` joined on (``verdict`` —
``correct`` / ``incorrect`` / ``errored`` — and ``is_correct``, null for errored trials; see
:func:`tasks.scoring.stage.scored_trials`). A frame without ``verdict`` is read as every trial
scored by ``is_correct``. Errored trials (infrastructure or harness failures) have no verdict:
they are left out of every pass@k / pass^k / interval denominator and counted beside it
(``n_errored`` / ``errored``). No Python loop runs over rows.
"""

from __future__ import annotations

from math import comb, sqrt
from statistics import NormalDist

import polars as pl

from schemas.report import ALL, ALL_DATASETS, ALL_QUERIES
from tasks.report.tool_use import filter_partition, partition_sums, trial_id_expr

DEFAULT_KS = (1, 2, 3, 5, 10, 20, 50)

_QUERY_KEYS = ("agent", "dataset", "query_id")


def as_strings(*columns: str) -> list[pl.Expr]:
    """``columns`` cast to String: the tables' key columns come out as String whether the
    trials hold them as String or as ``pl.Categorical``
    (:func:`tasks.report.loaders.load_report_trials`); a no-op on String columns."""
    return [pl.col(c).cast(pl.String) for c in columns]

#: Sort key putting the overall rows (``ALL``, ``ALL (queries)``, ``ALL (datasets)``) after an
#: agent's datasets.
_overall_last = pl.col("dataset").is_in([ALL, ALL_QUERIES, ALL_DATASETS])


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


def pass_hat_k(n: int, c: int, k: int) -> float | None:
    """pass^k ``C(c, k) / C(n, k)``: the probability that k trials drawn without replacement
    from the n (c correct) are all correct. None when n < k; ValueError as :func:`pass_at_k`."""
    if k < 1 or not 0 <= c <= n:
        raise ValueError(f"need k >= 1 and 0 <= c <= n, got n={n} c={c} k={k}")
    if n < k:
        return None
    return comb(c, k) / comb(n, k)


def _require(df: pl.DataFrame, columns: tuple[str, ...] | list[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} needs columns {missing}; got {df.columns}")


def with_verdicts(trials: pl.DataFrame) -> pl.DataFrame:
    """``trials`` with a ``verdict`` column: kept when present (nulls or unknown values raise
    ValueError), else ``correct`` / ``incorrect`` from ``is_correct`` (whose nulls raise:
    an unscored trial would silently shrink a denominator). ``is_correct`` is made consistent
    (null for errored trials)."""
    if "verdict" in trials.columns:
        bad = trials.filter(
            pl.col("verdict").is_null() | ~pl.col("verdict").is_in(["correct", "incorrect", "errored"])
        )
        if bad.height:
            raise ValueError(f"{bad.height} trials have no valid verdict: every trial must be scored")
        return trials.with_columns(
            pl.when(pl.col("verdict") == "errored").then(None)
            .otherwise(pl.col("verdict") == "correct").alias("is_correct")
        )
    _require(trials, ["is_correct"], "with_verdicts")
    if trials["is_correct"].null_count():
        raise ValueError("is_correct has nulls: every trial must be scored")
    return trials.with_columns(
        pl.when(pl.col("is_correct")).then(pl.lit("correct")).otherwise(pl.lit("incorrect"))
        .alias("verdict")
    )


_ERRORED = pl.col("verdict") == "errored"
_CORRECT = pl.col("verdict") == "correct"


def query_counts(trials: pl.DataFrame) -> pl.DataFrame:
    """Scored trials ``n``, correct trials ``c`` and errored trials ``n_errored`` per (agent,
    dataset, query_id), all Int32 (see :func:`with_verdicts`; ``n`` excludes the errored).

    ``trials`` needs agent, dataset, query_id and ``verdict`` or ``is_correct``.
    """
    _require(trials, list(_QUERY_KEYS), "query_counts")
    verdict = [c for c in ("verdict", "is_correct") if c in trials.columns]
    trials = with_verdicts(trials.select(*_QUERY_KEYS, *verdict))  # only what is counted
    # a streaming aggregation: memory is the groups', not a copy of the trials' keys
    return (
        trials.lazy()
        .group_by(*_QUERY_KEYS)
        .agg(
            (~_ERRORED).sum().cast(pl.Int32).alias("n"),
            _CORRECT.sum().cast(pl.Int32).alias("c"),
            _ERRORED.sum().cast(pl.Int32).alias("n_errored"),
        )
        .collect(engine="streaming")
        .with_columns(as_strings(*_QUERY_KEYS))
        .sort(*_QUERY_KEYS)  # streaming groups come in any order: means over them must not
    )


def pass_at_k_per_query(trials: pl.DataFrame, ks=DEFAULT_KS) -> pl.DataFrame:
    """pass@k and pass^k per (agent, dataset, query_id, k) over the scored trials.

    ``trials`` needs columns agent, dataset, query_id and ``verdict`` or ``is_correct`` (one
    row per trial). Returns agent, dataset, query_id, k, n (scored trials), n_errored, c,
    pass_at_k, pass_hat_k (both null when n < k), sorted by agent, dataset, query_id, k. Every
    k in ``ks`` with 1 <= k <= the largest n of the run is reported (k = 1 always, so a query
    whose trials all errored still shows with n = 0 and null scores).

    Vectorised: both estimators are the running products over i < k of
    ``(n-c-i)/(n-i)`` (pass@k = 1 - product) and ``(c-i)/(n-i)`` (pass^k = product), which
    equal the binomial ratios exactly up to float rounding (~1e-15 relative).
    """
    counts = query_counts(trials)
    schema = {
        "agent": pl.String,
        "dataset": pl.String,
        "query_id": pl.String,
        "k": pl.Int32,
        "n": pl.Int32,
        "n_errored": pl.Int32,
        "c": pl.Int32,
        "pass_at_k": pl.Float64,
        "pass_hat_k": pl.Float64,
    }
    max_n = max(int(counts["n"].max() or 0), 1 if counts.height else 0)
    used = sorted({int(k) for k in ks if 1 <= int(k) <= max_n} | ({1} if counts.height else set()))
    if not used:
        return pl.DataFrame(schema=schema)
    steps = pl.DataFrame({"i": pl.int_range(0, used[-1], eager=True, dtype=pl.Int32)})
    n, c, i = pl.col("n").cast(pl.Float64), pl.col("c").cast(pl.Float64), pl.col("i")
    grid = (
        counts.with_row_index("gid")
        .join(steps, how="cross")
        .sort("gid", "i")
        .with_columns(
            pl.when(i < pl.col("n"))
            .then(((n - c - i) / (n - i)).clip(lower_bound=0.0))
            .alias("fail_term"),
            pl.when(i < pl.col("n"))
            .then(((c - i) / (n - i)).clip(lower_bound=0.0))
            .alias("ok_term"),
        )
        .with_columns(
            pl.col("fail_term").cum_prod().over("gid").alias("all_fail"),
            pl.col("ok_term").cum_prod().over("gid").alias("all_ok"),
            (i + 1).alias("k"),
        )
        .filter(pl.col("k").is_in(used))
    )
    scored = pl.col("k") <= pl.col("n")
    out = grid.select(
        *_QUERY_KEYS,
        "k",
        "n",
        "n_errored",
        "c",
        pl.when(scored).then(1.0 - pl.col("all_fail")).alias("pass_at_k"),
        pl.when(scored).then(pl.col("all_ok")).alias("pass_hat_k"),
    )
    return out.cast(schema).select(list(schema)).sort(*_QUERY_KEYS, "k")


def pass_at_k_summary(per_query: pl.DataFrame) -> pl.DataFrame:
    """Mean pass@k (and pass^k) per (agent, dataset, k) and overall per (agent, k).

    Dataset score = mean over its queries (null queries, n < k, are left out; ``queries``
    counts those scored at this k). Overall rows have dataset ``"ALL (queries)"`` (mean over
    all queries) and ``"ALL (datasets)"`` (stratified: mean of the dataset scores). ``n`` is
    the number of scored trials and ``n_errored`` of errored trials behind the row (the same
    for every k). With ``n`` in ``per_query`` the queries left out of a k's mean are counted,
    never silently dropped: ``queries_short`` (some but fewer than k scored trials) and
    ``queries_errored`` (every trial errored: no scored trial at all). Returns agent, dataset,
    k, queries, [queries_short, queries_errored,] n, n_errored, pass_at_k, pass_hat_k
    (pass_hat_k only when ``per_query`` has it; ``n`` / ``n_errored`` only when it has them).
    """
    metrics = [m for m in ("pass_at_k", "pass_hat_k") if m in per_query.columns]
    counts = [c for c in ("n", "n_errored") if c in per_query.columns]
    left_out = []
    if "n" in per_query.columns:
        n = pl.col("n")
        left_out = [((n > 0) & (n < pl.col("k"))).sum().cast(pl.Int32).alias("queries_short"),
                    (n == 0).sum().cast(pl.Int32).alias("queries_errored")]
    short = [c.meta.output_name() for c in left_out]
    sums = [pl.col(c).sum().cast(pl.Int64) for c in counts]
    per_ds = per_query.group_by("agent", "dataset", "k").agg(
        pl.col("pass_at_k").count().cast(pl.Int32).alias("queries"),
        *left_out,
        *sums,
        *[pl.col(m).mean() for m in metrics],
    )
    over_q = per_query.group_by("agent", "k").agg(
        pl.lit(ALL_QUERIES).alias("dataset"),
        pl.col("pass_at_k").count().cast(pl.Int32).alias("queries"),
        *left_out,
        *sums,
        *[pl.col(m).mean() for m in metrics],
    )
    strat = per_ds.group_by("agent", "k").agg(
        pl.lit(ALL_DATASETS).alias("dataset"),
        pl.col("queries").sum().cast(pl.Int32),
        *[pl.col(c).sum().cast(pl.Int32) for c in short],
        *sums,
        *[pl.col(m).mean() for m in metrics],
    )
    cols = ["agent", "dataset", "k", "queries", *short, *counts, *metrics]
    return pl.concat([per_ds.select(cols), over_q.select(cols), strat.select(cols)]).sort(
        "agent", _overall_last, "dataset", "k"
    )


def pass_at_k_wide(summary: pl.DataFrame, metric: str = "pass_at_k") -> pl.DataFrame:
    """The summary as one row per (agent, dataset) and a column per k.

    ``metric`` is ``"pass_at_k"`` (columns ``pass@1``, ``pass@2``, ...) or ``"pass_hat_k"``
    (columns ``pass^1``, ...). Overall rows keep their ``ALL (...)`` dataset names. When the
    summary has them, ``n`` (scored trials) and ``n_errored`` (errored trials, left out of n)
    come right after the dataset.
    """
    label = {"pass_at_k": "pass@", "pass_hat_k": "pass^"}[metric]
    ks = sorted(summary["k"].unique().to_list())
    counts = [c for c in ("n", "n_errored") if c in summary.columns]
    if not ks:
        return pl.DataFrame(schema={"agent": pl.String, "dataset": pl.String,
                                    **{c: pl.Int64 for c in counts}})
    wide = summary.with_columns(
        (pl.lit(label) + pl.col("k").cast(pl.String)).alias("metric")
    ).pivot(on="metric", index=["agent", "dataset", *counts], values=metric, sort_columns=False)
    return wide.select("agent", "dataset", *counts, *[f"{label}{k}" for k in ks]).sort(
        "agent", _overall_last, "dataset"
    )


def pass_at_k_queries(summary: pl.DataFrame) -> pl.DataFrame:
    """How many queries each pass@k mean of ``summary`` (:func:`pass_at_k_summary`) is over:
    one row per (agent, dataset) with ``queries`` (all of them), ``all errored`` (no scored
    trial: in no mean) and a column ``pass@<k> over`` per k (queries with at least k scored
    trials; the rest have too few for that k and are left out of its mean)."""
    ks = sorted(summary["k"].unique().to_list())
    if not ks or "queries_errored" not in summary.columns:
        return pl.DataFrame(schema={"agent": pl.String, "dataset": pl.String})
    first = summary.filter(pl.col("k") == ks[0]).select(
        "agent", "dataset",
        (pl.col("queries") + pl.col("queries_short") + pl.col("queries_errored"))
        .alias("queries"),
        pl.col("queries_errored").alias("all errored"),
    )
    wide = summary.with_columns(
        (pl.lit("pass@") + pl.col("k").cast(pl.String) + pl.lit(" over")).alias("metric")
    ).pivot(on="metric", index=["agent", "dataset"], values="queries", sort_columns=False)
    return first.join(wide, on=["agent", "dataset"], how="left").select(
        "agent", "dataset", "queries", "all errored", *[f"pass@{k} over" for k in ks]
    ).sort("agent", _overall_last, "dataset")


def z_value(confidence: float) -> float:
    """Two-sided standard-normal quantile for ``confidence`` in (0, 1) (0.95 → 1.95996...)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def wilson_interval(p: float, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """Wilson score interval for a proportion ``p`` observed over ``n`` Bernoulli trials.

    Returns (low, high) within [0, 1], or None when n == 0. Raises ValueError for p outside
    [0, 1] or n < 0. Same formula as :func:`wilson_expr` (Wilson 1927).
    """
    if n < 0 or not 0.0 <= p <= 1.0:
        raise ValueError(f"need n >= 0 and 0 <= p <= 1, got p={p} n={n}")
    if n == 0:
        return None
    z = z_value(confidence)
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    low = 0.0 if p == 0.0 else max(0.0, center - half)  # exact at the bounds, no float dust
    high = 1.0 if p == 1.0 else min(1.0, center + half)
    return low, high


def wilson_expr(p: pl.Expr, n: pl.Expr, confidence: float = 0.95) -> tuple[pl.Expr, pl.Expr]:
    """Polars expressions (low, high) of the Wilson score interval for proportion ``p`` over
    ``n`` trials; null where n == 0 or p is null."""
    z = z_value(confidence)
    z2 = z * z
    nf = pl.when(n > 0).then(n.cast(pl.Float64))
    denom = 1.0 + z2 / nf
    center = (p + z2 / (2 * nf)) / denom
    half = z * (p * (1 - p) / nf + z2 / (4 * nf * nf)).sqrt() / denom
    low = pl.when(p == 0.0).then(0.0).otherwise((center - half).clip(lower_bound=0.0))
    high = pl.when(p == 1.0).then(1.0).otherwise((center + half).clip(upper_bound=1.0))
    return pl.when(nf.is_not_null()).then(low), pl.when(nf.is_not_null()).then(high)


def pass_at_1_ci(trials: pl.DataFrame, confidence: float = 0.95) -> pl.DataFrame:
    """pass@1 with a Wilson score interval per (agent, dataset) and the two overall rows.

    pass@1 is the mean over queries of c/n (dataset rows and ``ALL (queries)``) or the mean of
    the dataset scores (``ALL (datasets)``). The interval is Wilson's for p̂ = that pass@1 and
    n = the number of scored trials behind it; it treats trials as independent Bernoulli draws
    (it ignores clustering by query) and equals the pooled-count Wilson interval whenever every
    query has the same number of trials. Errored trials are left out (``errored`` counts
    them); a query whose trials all errored is not scored (``queries`` counts those scored).
    Returns the columns of ``schemas.report.PASS_AT_1_CI`` sorted by agent, dataset.
    """
    counts = query_counts(trials).with_columns(
        (pl.col("c") / pl.when(pl.col("n") > 0).then(pl.col("n"))).alias("p")
    )
    agg = [
        pl.col("p").count().cast(pl.Int32).alias("queries"),
        pl.col("n").sum().cast(pl.Int64).alias("trials"),
        pl.col("n_errored").sum().cast(pl.Int64).alias("errored"),
        pl.col("c").sum().cast(pl.Int64).alias("correct"),
        pl.col("p").mean().alias("pass_at_1"),
    ]
    per_ds = counts.group_by("agent", "dataset").agg(*agg)
    over_q = counts.group_by("agent").agg(*agg).with_columns(pl.lit(ALL_QUERIES).alias("dataset"))
    strat = (
        per_ds.group_by("agent")
        .agg(
            pl.col("queries").sum(),
            pl.col("trials").sum(),
            pl.col("errored").sum(),
            pl.col("correct").sum(),
            pl.col("pass_at_1").mean(),
        )
        .with_columns(pl.lit(ALL_DATASETS).alias("dataset"))
    )
    cols = ["agent", "dataset", "queries", "trials", "errored", "correct", "pass_at_1"]
    out = pl.concat([per_ds.select(cols), over_q.select(cols), strat.select(cols)])
    low, high = wilson_expr(pl.col("pass_at_1"), pl.col("trials"), confidence)
    return out.with_columns(
        low.alias("ci_low"), high.alias("ci_high"), pl.lit(confidence).alias("confidence")
    ).sort("agent", _overall_last, "dataset")


def _effort_aggs() -> list[pl.Expr]:
    lat, it = pl.col("latency_s"), pl.col("n_llm_calls").cast(pl.Float64)
    return [
        pl.len().cast(pl.Int64).alias("trials"),
        _ERRORED.sum().cast(pl.Int64).alias("errored"),
        _CORRECT.sum().cast(pl.Int64).alias("correct"),
        pl.col("cost_usd").sum().alias("cost_usd"),
        pl.col("prompt_tokens").sum().cast(pl.Int64).alias("prompt_tokens"),
        pl.col("completion_tokens").sum().cast(pl.Int64).alias("completion_tokens"),
        pl.col("cached_tokens").sum().cast(pl.Int64).alias("cached_tokens"),
        lat.mean().alias("latency_mean_s"),
        lat.quantile(0.5, "linear").alias("latency_p50_s"),
        lat.quantile(0.95, "linear").alias("latency_p95_s"),
        it.mean().alias("iterations_mean"),
        it.quantile(0.5, "linear").alias("iterations_p50"),
        it.quantile(0.95, "linear").alias("iterations_p95"),
    ]


def cost_table(
    trials: pl.DataFrame, llm_calls: pl.DataFrame | pl.LazyFrame | None = None
) -> pl.DataFrame:
    """Cost and effort per (agent, dataset) plus one ``dataset == "ALL"`` row per agent.

    ``trials`` has the ``TRIALS`` columns (agent, dataset, cost_usd in USD, token counts,
    latency_s in seconds, n_llm_calls) and ``verdict`` or ``is_correct``. Every trial counts
    here, errored ones too (they cost money and time): ``trials`` is all of them, ``errored``
    those that errored, ``correct`` the correct ones. ``llm_calls`` (``LLM_CALLS`` columns, optional:
    a run of offline agents or from before per-call accounting has none; a lazy scan of the
    artifact is streamed, only its four columns read) adds ``llm_calls``,
    ``response_cache_hit_share`` (share of model calls answered from querylab's response cache),
    ``retries`` (HTTP attempts beyond the first) and ``unpriced_calls`` (calls with ``priced``
    false: no price configured); without it those are null. A row with unpriced calls has
    null ``cost_usd`` and per-trial / per-correct costs: unknown, not $0.

    Per-correct figures divide by correct trials and are null when there are none; per-trial
    figures divide by all trials. ``prompt_cache_share`` = cached_tokens / prompt_tokens (the
    provider's prompt cache), null without prompt tokens. Latency p50/p95 and iteration
    quantiles use linear interpolation. Returns ``schemas.report.COST`` columns.
    """
    _require(
        trials,
        [
            "agent",
            "dataset",
            "trial_key",
            "cost_usd",
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "latency_s",
            "n_llm_calls",
        ],
        "cost_table",
    )
    verdict = [c for c in ("verdict", "is_correct") if c in trials.columns]
    effort = ["cost_usd", "prompt_tokens", "completion_tokens", "cached_tokens", "latency_s",
              "n_llm_calls"]
    # for the llm_calls join: on the keys' 64-bit hash when they hash without a collision
    # (at 10M trials a join on the key strings took ~0.8 GB more memory)
    tid = trial_id_expr(trials) if llm_calls is not None else None
    keys = trials.select(tid, "agent", "dataset") if tid is not None else None
    # in memory, not streamed: float sums in row order, the same figures run after run
    trials = with_verdicts(trials.select("agent", "dataset", *effort, *verdict))
    per_ds = trials.group_by("agent", "dataset").agg(_effort_aggs()).with_columns(
        as_strings("agent", "dataset"))
    per_agent = trials.group_by("agent").agg(_effort_aggs()).with_columns(
        *as_strings("agent"), pl.lit(ALL).alias("dataset"))
    table = pl.concat([per_ds, per_agent.select(per_ds.columns)])
    if llm_calls is not None:
        names = llm_calls.collect_schema().names()
        missing = [c for c in ("trial_key", "cache_hit", "attempts") if c not in names]
        if missing:
            raise ValueError(f"cost_table llm_calls needs columns {missing}; got {names}")
        priced = pl.col("priced") if "priced" in names else pl.lit(None, pl.Boolean)
        calls = llm_calls.lazy().filter(pl.col("trial_key").is_not_null()).select(  # as a join
            tid, "cache_hit", "attempts", priced.alias("priced"))  # on the keys: nulls match none
        sums = [
            pl.len().cast(pl.Int64).alias("llm_calls"),
            pl.col("cache_hit").sum().cast(pl.Int64).alias("_hits"),
            pl.col("cache_hit").count().cast(pl.Int64).alias("_hit_n"),
            (pl.col("attempts") - 1).clip(lower_bound=0).sum().cast(pl.Int64).alias("retries"),
            (~pl.col("priced")).sum().cast(pl.Int64).alias("unpriced_calls"),
        ]
        # integer sums per (agent, dataset), one partition of the trials at a time (the join's
        # table holds at most PARTITION_TRIALS keys), merged; the shares from the merged sums
        per_ds, per_agent = partition_sums(
            lambda where: filter_partition(calls, where)
            .join(filter_partition(keys.lazy(), where), on="tid", how="inner")
            .group_by("agent", "dataset").agg(sums),
            keys.height,
        )
        share = (pl.col("_hits") / pl.when(pl.col("_hit_n") > 0).then(pl.col("_hit_n"))).alias(
            "response_cache_hit_share")
        cols = ["llm_calls", share, "retries", "unpriced_calls"]
        by = pl.concat([
            per_ds.select(*as_strings("agent", "dataset"), *cols),
            per_agent.select(*as_strings("agent"), pl.lit(ALL).alias("dataset"), *cols),
        ])
        table = table.join(by, on=["agent", "dataset"], how="left").with_columns(
            *[pl.col(c).fill_null(0) for c in ("llm_calls", "retries", "unpriced_calls")]
        )
    else:
        table = table.with_columns(
            pl.lit(None, pl.Int64).alias("llm_calls"),
            pl.lit(None, pl.Float64).alias("response_cache_hit_share"),
            pl.lit(None, pl.Int64).alias("retries"),
            pl.lit(None, pl.Int64).alias("unpriced_calls"),
        )
    table = table.with_columns(
        pl.when(pl.col("unpriced_calls").fill_null(0) > 0)
        .then(pl.lit(None, pl.Float64))
        .otherwise(pl.col("cost_usd"))
        .alias("cost_usd")
    )
    tokens = pl.col("prompt_tokens") + pl.col("completion_tokens")
    correct = pl.when(pl.col("correct") > 0).then(pl.col("correct"))
    table = table.with_columns(
        (pl.col("cost_usd") / pl.col("trials")).alias("cost_per_trial_usd"),
        (pl.col("cost_usd") / correct).alias("cost_per_correct_usd"),
        (tokens / pl.col("trials")).alias("tokens_per_trial"),
        (tokens / correct).alias("tokens_per_correct"),
        (
            pl.col("cached_tokens")
            / pl.when(pl.col("prompt_tokens") > 0).then(pl.col("prompt_tokens"))
        ).alias("prompt_cache_share"),
    )
    cols = [
        "agent",
        "dataset",
        "trials",
        "errored",
        "correct",
        "cost_usd",
        "cost_per_trial_usd",
        "cost_per_correct_usd",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "tokens_per_trial",
        "tokens_per_correct",
        "prompt_cache_share",
        "llm_calls",
        "response_cache_hit_share",
        "retries",
        "unpriced_calls",
        "latency_mean_s",
        "latency_p50_s",
        "latency_p95_s",
        "iterations_mean",
        "iterations_p50",
        "iterations_p95",
    ]
    return table.select(cols).sort("agent", _overall_last, "dataset")
