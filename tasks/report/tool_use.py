"""The tool-use table per agent and dataset (:func:`tool_use_table`), and the report's
per-trial groupings over millions of calls: trial ids (:func:`trial_id_expr`), tid-hash
partitions (:func:`trial_partitions`, :func:`partition_sums`) and per-trial tool statistics
(:func:`trial_tool_stats`). What each call did is :mod:`tasks.report.features`.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from schemas.report import ALL
from tasks.report.features import (
    DATA_TOOLS,
    DB_TOOLS,
    EXTRACTION_METHODS,
    TOOL_USE_FEATURES,
    call_features,
    features_for_report,
)


def trial_id_expr(trials: pl.DataFrame) -> pl.Expr:
    """The expression that turns ``trial_key`` into the grouping id ``tid`` for this run.

    Grouping and joining millions of calls on strings is slow, so ``tid`` is the key's 64-bit
    hash when the run's trial keys hash without a collision (checked here on ``trials``), else
    the key itself (exact either way for every call whose trial is in ``trials``)."""
    hashed = pl.col("trial_key").hash(seed=0x5157)
    if trials.select(hashed.n_unique()).item() == trials.height:
        return hashed.alias("tid")
    return pl.col("trial_key").alias("tid")


#: Trials per partition of the report's per-trial groupings (:func:`trial_partitions`): a run
#: with more is grouped one tid-hash partition at a time, so the grouping's memory is that of
#: at most this many trials (at 10M trials the tool-use table's peak fell by about 1 GB).
PARTITION_TRIALS = 2_500_000


def trial_partitions(n_trials: int) -> list[pl.Expr | None]:
    """Filters on ``tid`` (:func:`trial_id_expr`) that cut ``n_trials`` trials into
    ``ceil(n_trials / PARTITION_TRIALS)`` disjoint parts by a hash of tid (every trial, and every
    call of it, in exactly one part); ``[None]`` (no filter) for a run of at most
    :data:`PARTITION_TRIALS` trials. A table grouped part by part streams its calls once per
    part (a pass of a few columns: about 0.8 s for 50M calls here)."""
    k = max(1, -(-int(n_trials) // PARTITION_TRIALS))
    if k == 1:
        return [None]
    part = pl.col("tid").hash(seed=0x9E3779B9) % k
    return [part == i for i in range(k)]


def filter_partition(lf: pl.LazyFrame, where: pl.Expr | None) -> pl.LazyFrame:
    """``lf`` (with a ``tid`` column) cut to one part of :func:`trial_partitions` (unchanged for
    ``None``)."""
    return lf if where is None else lf.filter(where)


def partition_sums(
    partial: Callable[[pl.Expr | None], pl.LazyFrame], n_trials: int,
    maxima: tuple[str, ...] = (),
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(per_dataset, per_agent)``: the figures of ``partial(where)`` — one part's rows per
    (agent, dataset) of integer sums, and of maxima for the ``maxima`` columns — for every part
    of :func:`trial_partitions` (``n_trials`` trials), each collected streaming, merged per
    (agent, dataset) and per agent: sums summed, maxima maxed (exact in any number of parts)."""
    def merge(df: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
        return df.group_by(keys).agg((pl.exclude(*maxima) if maxima else pl.all()).sum(),
                                     *[pl.col(m).max() for m in maxima])

    parts = [partial(where).collect(engine="streaming") for where in trial_partitions(n_trials)]
    per_dataset = merge(pl.concat(parts), ["agent", "dataset"])
    return per_dataset, merge(per_dataset.drop("dataset"), ["agent"])


#: Turn numbers below this are counted per trial in byte lanes by :func:`trial_tool_stats`
#: (8 turns a UInt64 lane); a run with a greater (or negative) turn takes the two-key path.
LANE_TURNS = 64
#: Calls a trial may have for its per-turn counts to fit a lane byte (a count <= 255).
LANE_MAX_CALLS = 255


def _turn_counts(calls: pl.LazyFrame) -> pl.LazyFrame:
    """Per tid: turns, max_calls_per_turn, parallel_turns, by calls per (tid, turn) (the
    exact two-key grouping)."""
    return (
        calls.group_by("tid", "turn")
        .agg(pl.len().alias("calls_in_turn"))
        .group_by("tid")
        .agg(
            pl.len().cast(pl.Int64).alias("turns"),
            pl.col("calls_in_turn").max().cast(pl.Int32).alias("max_calls_per_turn"),
            (pl.col("calls_in_turn") > 1).sum().cast(pl.Int64).alias("parallel_turns"),
        )
    )


def _turn_lanes(features: pl.LazyFrame) -> int | None:
    """How many byte lanes (:data:`LANE_TURNS`) count the turns of ``features``: None when a
    turn is negative or >= LANE_TURNS (one streaming pass over ``turn``)."""
    lo, hi, n = features.select(
        pl.col("turn").min().alias("lo"), pl.col("turn").max().alias("hi"), pl.len()
    ).collect(engine="streaming").row(0)
    if not n:
        return 1
    if lo is None or lo < 0 or hi >= LANE_TURNS:
        return None
    return hi // 8 + 1


_CHECK = object()


def trial_tool_stats(
    features: pl.LazyFrame, with_dbs: bool = False, per_turn: bool = True, lanes=_CHECK
) -> pl.LazyFrame:
    """Per-trial aggregates of :func:`call_features` output with a ``tid`` column (see
    :func:`trial_id_expr`), one row per tid with calls: tool_calls, failed_calls,
    explore_calls, explore_base (calls other than ``return_answer``), db_calls, python_calls,
    data_calls, turns, max_calls_per_turn, parallel_turns (turns with ≥ 2 calls), the any-of
    booleans sql_pattern, python_regex, python_string, model_call, key_reformat, adj_close,
    and with ``with_dbs`` also query_dbs (distinct databases queried with ``query_db``).
    Without ``per_turn`` the three turn columns are left out (one grouping pass fewer).

    The calls are grouped once, by trial, into a few UInt64 sums of byte lanes: byte ``t % 8``
    of turn lane ``t // 8`` counts turn ``t``'s calls, and the counts and any-ofs above are
    bytes of their own lanes (a call adds 0 or 1). Exact when turns are in
    [0, :data:`LANE_TURNS`) and a trial has at most :data:`LANE_MAX_CALLS` calls (no byte
    overflows); trials with more calls are counted again by (trial, turn) (:func:`_turn_counts`),
    and a run with turns outside the lanes is counted that way throughout. With ``per_turn``
    the lane check streams ``turn`` once and the grouping is collected (the returned
    LazyFrame decodes its lanes as it is read); otherwise the plan stays lazy. ``lanes``: the
    lane check's result (:func:`_turn_lanes`) when the caller made it already, e.g. once over
    all calls before grouping them partition by partition."""
    tool = pl.col("tool")
    names = features.collect_schema().names()
    flags = [f for f in (*EXTRACTION_METHODS, "key_reformat", "adj_close") if f in names]
    counts = {
        "failed_calls": ~pl.col("success"),
        "explore_base": tool != "return_answer",
        "db_calls": tool.is_in(DB_TOOLS),
        "python_calls": tool == "execute_python",
        "data_calls": tool.is_in(DATA_TOOLS),
    }
    if "explore" in names:
        counts["explore_calls"] = pl.col("explore")
    # per-call values as columns, then plain sums / any-ofs: the streaming engine's own
    # aggregations (an expression inside ``agg`` would make it gather each group's rows)
    features = features.with_columns(e.alias(name) for name, e in counts.items())
    per_trial = [
        pl.len().cast(pl.Int64).alias("tool_calls"),
        *[pl.col(name).sum().cast(pl.Int64) for name in counts],
        *[pl.col(f).any() for f in flags],
    ]
    turn_cols = ["turns", "max_calls_per_turn", "parallel_turns"]
    order = ["tid", "tool_calls", *counts, *(turn_cols if per_turn else []), *flags]
    if lanes is _CHECK:
        lanes = _turn_lanes(features) if per_turn else 0
    if not per_turn:
        stats = features.group_by("tid").agg(per_trial)
    elif lanes is None:  # turns outside the lanes: by (trial, turn), then by trial
        stats = features.group_by("tid").agg(per_trial).join(
            _turn_counts(features), on="tid", how="left"
        ).select(order).collect(engine="streaming").lazy()
    else:
        # the per-trial counts and any-ofs are byte lanes too (a call adds 0 or 1 to its
        # bytes): the grouping keeps a few UInt64 sums per trial instead of a state per figure
        turn = pl.col("turn")
        unit = (turn % 8).replace_strict({b: 256**b for b in range(8)}, return_dtype=pl.UInt64)
        zero = pl.lit(0, pl.UInt64)
        lane = [f"_lane{j}" for j in range(lanes)]
        fields = [*counts, *flags]
        words = [fields[i:i + 8] for i in range(0, len(fields), 8)]
        packed = [f"_count{k}" for k in range(len(words))]
        raw = (
            features.with_columns(
                *[pl.when(turn // 8 == j).then(unit).otherwise(zero).alias(c)
                  for j, c in enumerate(lane)],
                *[pl.sum_horizontal(pl.col(f).cast(pl.UInt64) * pl.lit(256**b, pl.UInt64)
                                    for b, f in enumerate(w)).alias(c)
                  for w, c in zip(words, packed)],
            )
            .group_by("tid")
            .agg(pl.len().cast(pl.Int64).alias("tool_calls"),
                 *[pl.col(c).sum() for c in (*packed, *lane)])
            .collect(engine="streaming")
        )
        # decoded lazily: a streaming consumer reads the figures morsel by morsel, never as
        # whole columns beside the lanes
        def byte(col: str, b: int) -> pl.Expr:
            return (pl.col(col) // pl.lit(256**b, pl.UInt64)) % pl.lit(256, pl.UInt64)

        calls_in_turn = [byte(c, b) for c in lane for b in range(8)]
        stats = raw.lazy().select(
            "tid",
            "tool_calls",
            *[(byte(c, b) > 0 if f in flags else byte(c, b).cast(pl.Int64)).alias(f)
              for w, c in zip(words, packed) for b, f in enumerate(w)],
            pl.sum_horizontal(n > 0 for n in calls_in_turn).cast(pl.Int64).alias("turns"),
            pl.max_horizontal(calls_in_turn).cast(pl.Int32).alias("max_calls_per_turn"),
            pl.sum_horizontal(n > 1 for n in calls_in_turn).cast(pl.Int64)
            .alias("parallel_turns"),
        ).select(order)
        many = raw.filter(pl.col("tool_calls") > LANE_MAX_CALLS).select("tid")
        if many.height:  # a count may have overflowed its byte: these trials counted exactly
            heavy = features.join(many.lazy(), on="tid", how="semi")
            exact = heavy.group_by("tid").agg(per_trial).join(
                _turn_counts(heavy), on="tid", how="left"
            ).select(order).collect(engine="streaming")
            stats = stats.update(exact.lazy(), on="tid")
    if not with_dbs:
        return stats
    dbs = (
        features.filter(tool == "query_db", pl.col("db").is_not_null())
        .group_by("tid")
        .agg(pl.col("db").n_unique().cast(pl.Int64).alias("query_dbs"))
    )
    return stats.join(dbs, on="tid", how="left").with_columns(pl.col("query_dbs").fill_null(0))


def tool_use_table(trials: pl.DataFrame, tool_calls: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """The tool-use table per (agent, dataset) and per agent (``dataset == "ALL"``).

    ``trials`` (``TRIALS`` columns; trial_key, agent, dataset used) gives the denominators, so a
    trial without any tool call counts; ``tool_calls`` are the ``TOOL_CALLS`` rows (calls of
    trials not in ``trials`` are ignored). Columns (``schemas.report.TOOL_USE``): trials;
    tool_calls and calls_per_trial; failed_call_share (calls with success = false);
    exploration_share = exploratory calls / calls other than ``return_answer``; db_calls
    (``list_db`` + ``query_db``), python_calls (``execute_python``) and db_python_ratio (null
    without Python calls); turns (model turns that asked for tools), parallel_turn_share (turns
    with ≥ 2 calls / turns) and max_calls_per_turn; extract_<method> = share of trials whose
    trajectory used that extraction method (``sql_pattern``, ``python_regex``,
    ``python_string``, ``model_call``).

    The calls are grouped by trial one partition of trials at a time (:func:`trial_partitions`),
    each reduced to integer sums per (agent, dataset) at once; the shares and means are taken
    from the merged sums (exact: integer sums, the same figures in one part or many).
    """
    tid = trial_id_expr(trials)
    calls, stored = features_for_report(tool_calls, "tool use")
    cols = ["trial_key", "turn", "tool", "success"]
    # one streaming pass over the calls per partition: only the flags and counts per trial kept
    if stored:
        features = calls.select(*cols, *TOOL_USE_FEATURES).with_columns(tid)
    else:
        features = call_features(calls.select(*cols, "arguments").with_columns(tid),
                                 TOOL_USE_FEATURES, with_db=False, lazy=True)
    features = features.select("tid", "turn", "tool", "success", *TOOL_USE_FEATURES)
    lanes = _turn_lanes(features)  # once, for every partition
    keys = trials.lazy().select(tid, "agent", "dataset")
    counts = ["tool_calls", "failed_calls", "explore_calls", "explore_base", "db_calls",
              "python_calls", "turns", "parallel_turns"]
    sums = [
        pl.len().cast(pl.Int64).alias("trials"),
        *[pl.col(c).sum().cast(pl.Int64) for c in counts],
        pl.col("max_calls_per_turn").max().cast(pl.Int32),
        *[pl.col(m).sum().cast(pl.Int64) for m in EXTRACTION_METHODS],
    ]

    def partial(where: pl.Expr | None) -> pl.LazyFrame:
        per_trial = trial_tool_stats(filter_partition(features, where), lanes=lanes)  # collected
        joined = filter_partition(keys, where).join(per_trial, on="tid", how="left").with_columns(
            *[pl.col(c).fill_null(0) for c in counts],
            *[pl.col(m).fill_null(False) for m in EXTRACTION_METHODS],
        )
        return joined.group_by("agent", "dataset").agg(sums)  # integer sums: any order

    per_ds, per_agent = partition_sums(partial, trials.height, maxima=("max_calls_per_turn",))

    def figures() -> list[pl.Expr]:
        def ratio(a: str, b: str) -> pl.Expr:
            return pl.col(a) / pl.when(pl.col(b) > 0).then(pl.col(b))

        return [
            "trials",
            "tool_calls",
            (pl.col("tool_calls") / pl.col("trials")).alias("calls_per_trial"),
            ratio("failed_calls", "tool_calls").alias("failed_call_share"),
            ratio("explore_calls", "explore_base").alias("exploration_share"),
            "db_calls",
            "python_calls",
            ratio("db_calls", "python_calls").alias("db_python_ratio"),
            "turns",
            ratio("parallel_turns", "turns").alias("parallel_turn_share"),
            "max_calls_per_turn",
            *[(pl.col(m) / pl.col("trials")).alias(f"extract_{m}") for m in EXTRACTION_METHODS],
        ]

    out = pl.concat([
        per_ds.select(pl.col("agent", "dataset").cast(pl.String), *figures()),
        per_agent.select(pl.col("agent").cast(pl.String), pl.lit(ALL).alias("dataset"),
                         *figures()),
    ])  # agent / dataset: String or Categorical in the trials
    return out.sort("agent", pl.col("dataset") == ALL, "dataset")
