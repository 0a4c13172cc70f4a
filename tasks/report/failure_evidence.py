"""Trajectory evidence for the failure-mode rules (:mod:`tasks.report.failure_modes`): per
incorrect trial, from its tool calls, the data calls made, the databases queried, the sources
touched and the checked operations evident (``CHECKED_OPERATIONS``), computed by streaming
passes over ``tool_calls`` (or, for an older artifact without the stored per-call features,
slice by slice with the features parsed per call)."""

from __future__ import annotations

import polars as pl

from tasks.report.features import DATA_TOOLS, EXTRACTION_METHODS, call_features, source_refs

#: Operations whose presence can be checked in a trajectory (see
#: :mod:`tasks.report.failure_modes`).
CHECKED_OPERATIONS = ("join_reformatted_key", "extract_from_text", "use_adjusted_close")


def evident_operations(stats: pl.LazyFrame) -> pl.LazyFrame:
    """(tid, evident_ops) from :func:`trajectory_evidence` stats: a UInt8 bit mask, bit ``i``
    set when ``CHECKED_OPERATIONS[i]`` is evident in the trajectory."""
    evident = {
        "join_reformatted_key": (pl.col("first_db") != pl.col("last_db")).fill_null(False)
        & pl.col("key_reformat"),
        "extract_from_text": pl.any_horizontal(*EXTRACTION_METHODS),
        "use_adjusted_close": pl.col("adj_close"),
    }
    return stats.select(
        "tid",
        pl.sum_horizontal(
            evident[op].cast(pl.UInt8) * (1 << i) for i, op in enumerate(CHECKED_OPERATIONS)
        ).cast(pl.UInt8).alias("evident_ops"),
    )


#: Tool calls parsed per slice by the classifier when ``tool_calls`` lacks the stored per-call
#: features (an older artifact): bounds its memory (about 200 bytes a call) whatever the size
#: of the run. With the stored features the calls are streamed in one pass instead.
CALLS_PER_SLICE = 2_000_000

_FM_FEATURES = (*EXTRACTION_METHODS, "key_reformat", "adj_close")


def _split_sources(codes: pl.DataFrame) -> pl.DataFrame:
    """``codes`` (normalised ``source`` → ``sid``) as (db, ref, sid) rows, one per way of
    cutting ``source`` at a dot: a call on database ``db`` referencing ``ref`` touches ``sid``
    exactly when ``db + "." + ref`` is its source (a database or collection name may hold
    dots), so the calls are joined on two columns without building a string per call."""
    rows = [
        (source[:i], source[i + 1:], sid)
        for source, sid in codes.select("source", "sid").iter_rows()
        for i, ch in enumerate(source)
        if ch == "."
    ]
    return pl.DataFrame(rows, schema={"db": pl.String, "ref": pl.String, "sid": pl.UInt32},
                        orient="row")


def _call_evidence(features: pl.LazyFrame, split: pl.DataFrame) -> list[pl.LazyFrame]:
    """Lazy per-trial evidence of ``features`` (per-call rows with tid, tool, db,
    source_refs and the :data:`_FM_FEATURES` booleans): [stats (tid, data_calls, one any-of
    column per feature, first_db / last_db: the least and greatest database queried with
    ``query_db``, so that two or more were queried exactly when they differ), pairs
    (distinct tid, sid touched; ``split``: :func:`_split_sources`)]."""
    tool = pl.col("tool")
    queried = (tool == "query_db") & pl.col("db").is_not_null()
    # per-call values as columns, then plain sums / any-ofs / min / max (the streaming engine's
    # own aggregations, not an expression evaluated per group)
    stats = features.with_columns(
        tool.is_in(DATA_TOOLS).alias("data_calls"),
        pl.when(queried).then(pl.col("db")).alias("qdb"),
    ).group_by("tid").agg(
        pl.col("data_calls").sum().cast(pl.Int64),
        *[pl.col(f).any() for f in _FM_FEATURES],
        pl.col("qdb").min().alias("first_db"),
        pl.col("qdb").max().alias("last_db"),
    )
    pairs = (
        features.filter(queried)
        .select("tid", "db", pl.col("source_refs").alias("ref"))
        .explode("ref")
        .join(split.lazy(), on=["db", "ref"])
        .select("tid", "sid")
        .unique()
    )
    return [stats, pairs]


def trajectory_evidence(
    tool_calls: pl.LazyFrame, tid: pl.Expr, bad: pl.DataFrame, codes: pl.DataFrame,
    stored: bool,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The incorrect trials' per-trial stats (:func:`_call_evidence`: tid, data_calls, the
    :data:`_FM_FEATURES` any-ofs, first_db and last_db; one row per ``tid`` with calls) and
    touched (tid, sid) pairs (``codes``: normalised ``source`` → ``sid``).

    ``tool_calls`` (possibly a scanned artifact, never loaded whole) carrying the stored
    per-call features is streamed once (only their small typed columns and trial_key are
    read; the calls of trials not in ``bad`` are dropped in the scan, the rest reduced per
    trial as they stream). An older artifact is read :data:`CALLS_PER_SLICE` rows at a time,
    each slice's calls of ``bad`` trials parsed eagerly
    (:func:`tasks.report.features.call_features`, both cores); the slices' partial results are
    merged (sums, any-ofs, least / greatest database, distinct pairs), so a trial whose calls straddle two slices gets the same figures as in one pass.
    ``stored``: whether ``tool_calls`` carries the stored features
    (:func:`tasks.report.features.features_for_report`)."""
    split = _split_sources(codes)
    cols = ("tid", "tool", "db", "source_refs", *_FM_FEATURES)
    if stored:
        calls = (
            tool_calls.select("trial_key", *cols[1:])
            .with_columns(tid)
            .join(bad.lazy(), on="tid", how="semi")
            .select(cols)
        )
        # two streaming passes over the scan, one per result: collected together they would
        # share (materialise) the selected calls
        parts = [[e.collect(engine="streaming") for e in _call_evidence(calls, split)]]
    else:
        lf = tool_calls.select("trial_key", "turn", "tool", "arguments", "success")
        n = lf.select(pl.len()).collect().item()
        parts = []
        for offset in range(0, n, CALLS_PER_SLICE):
            calls = (
                lf.slice(offset, CALLS_PER_SLICE)
                .with_columns(tid)
                .join(bad.lazy(), on="tid", how="semi")
                .drop("trial_key")
                .collect(engine="streaming")
            )
            features = call_features(calls, _FM_FEATURES, with_db=True).lazy()
            features = features.with_columns(source_refs()).select(cols)
            parts.append(pl.collect_all(_call_evidence(features, split)))
            del calls, features
    tid_type = bad.schema["tid"]
    empty = _call_evidence(
        pl.LazyFrame(schema={"tid": tid_type, "tool": pl.String, "db": pl.String,
                             "source_refs": pl.List(pl.String),
                             **{f: pl.Boolean for f in _FM_FEATURES}}),
        split,
    )
    stats, pairs = (
        pl.concat([e.collect(), *[p[i] for p in parts]]) for i, e in enumerate(empty)
    )
    if len(parts) > 1:  # merge the slices' partial results
        stats = stats.group_by("tid").agg(
            pl.col("data_calls").sum(),
            *[pl.col(f).any() for f in _FM_FEATURES],
            pl.col("first_db").min(),
            pl.col("last_db").max(),
        )
        pairs = pairs.unique()
    return stats, pairs
