"""The tables of an equivalence run (read from ``equivalence.parquet`` alone): accuracy by
hardness, agreement with execution match, agreement with the labels, counterexamples on the
non-equivalent set, finder instance sizes, time and cost per method, written as Parquet under
``runs/<run_id>/equivalence/tables/`` and as ``equivalence.md`` (:func:`equivalence_tables`)."""

from __future__ import annotations

from typing import Any

import polars as pl

from schemas import equivalence as eqs
from schemas.equivalence import DECIDED, NOTIONS
from tasks.core import storage
from tasks.core.prefect_task import task
from tasks.equivalence.stage import stage_prefix


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def accuracy_table(df: pl.DataFrame) -> pl.DataFrame:
    """Accuracy per (method, hardness) over labelled pairs, plus ``hardness = "all"``.

    Pairs a method skipped (no database for execution match) are left out. Undecided verdicts (error, unparsed, no counterexample within budget) count as wrong;
    ``decided`` counts the decisions. Empty when no pair has a label."""
    lab = df.filter(pl.col("label").is_not_null(), pl.col("verdict") != "skipped")
    if lab.is_empty():
        return pl.DataFrame(schema=pl.from_arrow(eqs.EQUIVALENCE_ACCURACY.empty_table()).schema)

    def agg(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
        return frame.group_by(by).agg(
            pl.len().cast(pl.Int64).alias("n"),
            pl.col("correct").fill_null(False).sum().cast(pl.Int64).alias("correct"),
            pl.col("verdict").is_in(list(DECIDED)).sum().cast(pl.Int64).alias("decided"),
        )

    per = agg(lab.with_columns(pl.col("hardness").fill_null("-")), ["method", "notion", "hardness"])
    overall = agg(lab, ["method", "notion"]).with_columns(pl.lit("all").alias("hardness"))
    out = pl.concat([per.select(overall.columns), overall], how="vertical")
    if lab["hardness"].is_null().all():
        out = out.filter(pl.col("hardness") == "all")
    return out.with_columns((pl.col("correct") / pl.col("n")).alias("accuracy")).select(
        eqs.EQUIVALENCE_ACCURACY.names).sort("method", "hardness")


def agreement_table(df: pl.DataFrame) -> pl.DataFrame:
    """Agreement of every other method with ``exec_match`` on the pairs both decided."""
    empty = pl.DataFrame(schema=pl.from_arrow(eqs.EQUIVALENCE_AGREEMENT.empty_table()).schema)
    ex = df.filter(pl.col("method") == "exec_match", pl.col("verdict").is_in(list(DECIDED)))
    if ex.is_empty():
        return empty
    ex = ex.select("pair_id", (pl.col("verdict") == "equivalent").alias("exec_eq"))
    other = df.filter(pl.col("method") != "exec_match", pl.col("verdict").is_in(list(DECIDED)))
    joined = other.join(ex, on="pair_id").with_columns(
        (pl.col("verdict") == "equivalent").alias("m_eq"))
    if joined.is_empty():
        return empty
    out = joined.group_by("method").agg(
        pl.len().cast(pl.Int64).alias("n"),
        (pl.col("exec_eq") == pl.col("m_eq")).sum().cast(pl.Int64).alias("agree"),
        (pl.col("exec_eq") & pl.col("m_eq")).sum().cast(pl.Int64).alias("exec_eq_method_eq"),
        (pl.col("exec_eq") & ~pl.col("m_eq")).sum().cast(pl.Int64).alias("exec_eq_method_neq"),
        (~pl.col("exec_eq") & pl.col("m_eq")).sum().cast(pl.Int64).alias("exec_neq_method_eq"),
        (~pl.col("exec_eq") & ~pl.col("m_eq")).sum().cast(pl.Int64).alias("exec_neq_method_neq"),
    ).with_columns((pl.col("agree") / pl.col("n")).alias("agreement"))
    return out.select(eqs.EQUIVALENCE_AGREEMENT.names).sort("method")


def label_agreement_table(df: pl.DataFrame) -> pl.DataFrame:
    """Agreement of each method's decisions with the labels of each notion (see
    :data:`schemas.equivalence.EQUIVALENCE_LABEL_AGREEMENT`): one row per (method, label
    notion) with at least one decided, labelled pair; labels of the other notion than the
    method's only count on pairs without a label of the method's own (so plain labels, which
    stand for both notions, give no second row). Undecided verdicts are left out (the accuracy
    table counts them as wrong). Empty when no decided pair has any label."""
    empty = pl.DataFrame(schema=pl.from_arrow(eqs.EQUIVALENCE_LABEL_AGREEMENT.empty_table()).schema)
    decided = df.filter(pl.col("verdict").is_in(list(DECIDED)))
    parts = []
    for notion in NOTIONS:
        col = f"label_{notion}"
        if col not in decided.columns:
            continue
        own_missing = pl.when(pl.col("notion") == "semantic").then(pl.col("label_semantic")) \
            .otherwise(pl.col("label_relaxed")).is_null() if {"label_semantic", "label_relaxed"} <= set(
                decided.columns) else pl.lit(True)
        # a method is compared with the other notion's labels only where the pair has none of
        # its own notion (published sets with relaxed labels only)
        sub = decided.filter(pl.col(col).is_not_null(),
                             (pl.col("notion") == notion) | own_missing).with_columns(
            pl.col(col).alias("lab"), (pl.col("verdict") == "equivalent").alias("m_eq"))
        if sub.is_empty():
            continue
        parts.append(sub.group_by("method", "notion").agg(
            pl.len().cast(pl.Int64).alias("n"),
            (pl.col("lab") == pl.col("m_eq")).sum().cast(pl.Int64).alias("agree"),
            (pl.col("lab") & pl.col("m_eq")).sum().cast(pl.Int64).alias("label_eq_method_eq"),
            (pl.col("lab") & ~pl.col("m_eq")).sum().cast(pl.Int64).alias("label_eq_method_neq"),
            (~pl.col("lab") & pl.col("m_eq")).sum().cast(pl.Int64).alias("label_neq_method_eq"),
            (~pl.col("lab") & ~pl.col("m_eq")).sum().cast(pl.Int64).alias("label_neq_method_neq"),
        ).with_columns(pl.lit(notion).alias("label_notion"),
                       (pl.col("agree") / pl.col("n")).alias("agreement")))
    if not parts:
        return empty
    return pl.concat(parts).select(eqs.EQUIVALENCE_LABEL_AGREEMENT.names).sort("method", "label_notion")


def empty_result_pairs(df: pl.DataFrame) -> list[str]:
    """Pairs whose execution match compared only empty results (``details.all_empty``)."""
    ex = df.filter(pl.col("method") == "exec_match", pl.col("details").is_not_null())
    if ex.is_empty():
        return []
    flag = ex["details"].str.json_path_match("$.all_empty")
    return sorted(ex.filter(flag == "true")["pair_id"].to_list())


def counterexample_table(df: pl.DataFrame) -> pl.DataFrame:
    """Per method, on the non-equivalent set (pairs whose semantic label is *not equivalent*;
    every pair when no pair is labelled): flagged, with a counterexample, verified (skipped
    pairs left out)."""
    sem = df.filter(pl.col("notion") == "semantic")
    labelled = df.filter(pl.col("label").is_not_null())
    if labelled.is_empty():
        ids, pair_set = df["pair_id"].unique(), "all pairs (no labels)"
    else:
        # a pair is non-equivalent when its semantic label says so (any method row carries it)
        ids = sem.filter(pl.col("label") == False)["pair_id"].unique()
        pair_set = "labelled not equivalent"
    sub = df.filter(pl.col("pair_id").is_in(ids.implode()), pl.col("verdict") != "skipped")
    if sub.is_empty():
        return pl.DataFrame(schema=pl.from_arrow(eqs.EQUIVALENCE_COUNTEREXAMPLES.empty_table()).schema)
    out = sub.group_by("method").agg(
        pl.col("pair_id").n_unique().cast(pl.Int64).alias("n_pairs"),
        (pl.col("verdict") == "not_equivalent").sum().cast(pl.Int64).alias("flagged"),
        (pl.col("counterexample").is_not_null()
         | ((pl.col("method") == "exec_match") & pl.col("verified").fill_null(False)))
        .sum().cast(pl.Int64).alias("with_counterexample"),
        pl.col("verified").fill_null(False).sum().cast(pl.Int64).alias("verified"),
    ).with_columns(
        pl.lit(pair_set).alias("pair_set"),
        (pl.col("verified") / pl.col("n_pairs")).alias("found_rate"),
    )
    return out.select(eqs.EQUIVALENCE_COUNTEREXAMPLES.names).sort("method")


def finder_sizes_table(df: pl.DataFrame) -> pl.DataFrame:
    """Per pair the finder separated: instance size, how it was made, counterexample rows
    (:data:`schemas.equivalence.EQUIVALENCE_FINDER_SIZES`), read from the rows' ``details``."""
    found = df.filter(pl.col("method") == "finder", pl.col("verdict") == "not_equivalent",
                      pl.col("details").is_not_null())
    if found.is_empty():
        return pl.DataFrame(schema=pl.from_arrow(eqs.EQUIVALENCE_FINDER_SIZES.empty_table()).schema)
    d = pl.col("details")
    out = found.select(
        "pair_id", "method",
        d.str.json_path_match("$.rows_before_shrink").cast(pl.Int64).alias("found_rows"),
        d.str.json_path_match("$.found_by").alias("found_by"),
        pl.col("counterexample_rows").cast(pl.Int64).alias("rows"),
        d.str.json_path_match("$.found_at").cast(pl.Int64).alias("found_at"),
    )
    return out.select(eqs.EQUIVALENCE_FINDER_SIZES.names).sort("pair_id")


def time_table(df: pl.DataFrame) -> pl.DataFrame:
    """Seconds per pair (mean, median, max, total), tokens and cost per method (skipped
    pairs left out)."""
    df = df.filter(pl.col("verdict") != "skipped")
    if df.is_empty():
        return pl.DataFrame(schema=pl.from_arrow(eqs.EQUIVALENCE_TIME.empty_table()).schema)
    out = df.group_by("method").agg(
        pl.len().cast(pl.Int64).alias("n"),
        pl.col("seconds").mean().alias("mean_s"),
        pl.col("seconds").median().alias("median_s"),
        pl.col("seconds").max().alias("max_s"),
        pl.col("seconds").sum().alias("total_s"),
        pl.col("prompt_tokens").sum().cast(pl.Int64).alias("prompt_tokens"),
        pl.col("completion_tokens").sum().cast(pl.Int64).alias("completion_tokens"),
        pl.col("cost_usd").sum().alias("cost_usd"),
    )
    return out.select(eqs.EQUIVALENCE_TIME.names).sort("method")


def _accuracy_wide(acc: pl.DataFrame) -> pl.DataFrame:
    if acc.is_empty():
        return acc
    order = [h for h in ("easy", "medium", "hard", "extra") if h in acc["hardness"].to_list()]
    order += sorted(set(acc["hardness"].to_list()) - set(order) - {"all"}) + ["all"]
    wide = acc.pivot(on="hardness", index=["method", "notion"], values="accuracy")
    return wide.select(["method", "notion"] + [h for h in order if h in wide.columns]).sort("method")


def _problems_section(df: pl.DataFrame, limit: int = 20) -> str:
    """Markdown naming every errored (pair, method) with its one-line reason, and the reasons
    methods skipped pairs (counted)."""
    parts = []
    errors = df.filter(pl.col("verdict") == "error").sort("pair_id", "method")
    if not errors.is_empty():
        lines = [f"- `{r['pair_id']}` × {r['method']}: {_one_line(r['error'])}"
                 for r in errors.head(limit).iter_rows(named=True)]
        more = f"\n- … and {errors.height - limit} more (the `error` column of equivalence.parquet)" \
            if errors.height > limit else ""
        parts.append(f"{errors.height} errored (pair, method):\n\n" + "\n".join(lines) + more)
    skipped = df.filter(pl.col("verdict") == "skipped")
    if not skipped.is_empty():
        counts = skipped.group_by("method", "error").agg(pl.len().alias("n")).sort("method")
        parts.append("Skipped:\n\n" + "\n".join(
            f"- {r['method']}: {r['n']} pair(s) — {_one_line(r['error'])}" for r in counts.iter_rows(named=True)))
    return "\n\n".join(parts) if parts else "_none_"


def _one_line(text: str | None, n: int = 200) -> str:
    one = " ".join((text or "?").split())
    return one if len(one) <= n else one[: n - 1] + "…"


def _finder_false_counterexamples(df: pl.DataFrame) -> str:
    """``"k false counterexample(s) on n pair(s) labelled equivalent"`` for the finder ('' when
    no finder row has an equivalent label)."""
    eq = df.filter(pl.col("method") == "finder", pl.col("label_semantic") == True)
    if eq.is_empty():
        return ""
    false = eq.filter(pl.col("verdict") == "not_equivalent").height
    return f"{false} false counterexample(s) on {eq.height} pair(s) labelled equivalent"


@task(name="equivalence-tables", persist_result=False)
def equivalence_tables(run_id: str, artifacts_root: str) -> dict:
    """The tables of a run, as Parquet under ``tables/`` and as ``equivalence.md``.

    Returns ``{"markdown", "accuracy", "agreement", "label_agreement", "counterexamples",
    "finder_sizes", "time", "text"}`` (URIs, and the Markdown text). Reads only
    ``equivalence.parquet``."""
    from tasks.report.stage import markdown_table

    prefix = stage_prefix(artifacts_root, run_id)
    df = pl.from_arrow(storage.read_parquet(storage.join(prefix, "equivalence.parquet"), eqs.EQUIVALENCE))
    tables = {
        "accuracy": (accuracy_table(df), eqs.EQUIVALENCE_ACCURACY),
        "agreement": (agreement_table(df), eqs.EQUIVALENCE_AGREEMENT),
        "label_agreement": (label_agreement_table(df), eqs.EQUIVALENCE_LABEL_AGREEMENT),
        "counterexamples": (counterexample_table(df), eqs.EQUIVALENCE_COUNTEREXAMPLES),
        "finder_sizes": (finder_sizes_table(df), eqs.EQUIVALENCE_FINDER_SIZES),
        "time": (time_table(df), eqs.EQUIVALENCE_TIME),
    }
    out: dict[str, Any] = {}
    for name, (frame, schema) in tables.items():
        out[name] = storage.write_parquet(storage.join(prefix, "tables", f"{name}.parquet"),
                                          frame.to_arrow(), schema)
    verdicts = (df.group_by("method", "verdict").agg(pl.len().alias("pairs"))
                .sort("method", "verdict"))
    empty = empty_result_pairs(df)
    warning = ""
    if empty:
        shown = ", ".join(f"`{p}`" for p in empty[:10]) + (" …" if len(empty) > 10 else "")
        warning = (f"\n\n**Warning:** execution match compared only empty results on "
                   f"{len(empty)} pair(s) ({shown}): *equivalent* there says nothing about the "
                   "queries.")
    accuracy = tables["accuracy"][0]
    relaxed_only = df.filter(pl.col("label_semantic").is_null(), pl.col("label_relaxed").is_not_null())
    if not accuracy.is_empty():
        accuracy_text = markdown_table(_accuracy_wide(accuracy))
    elif not relaxed_only.is_empty():
        accuracy_text = (f"_no pair carries a label for the notion its methods decide; "
                         f"{relaxed_only['pair_id'].n_unique()} pair(s) carry relaxed labels only: "
                         "see the agreement with the labels below_")
    else:
        accuracy_text = "_no labelled pairs_"
    problems_text = _problems_section(df)
    finder_false = _finder_false_counterexamples(df)
    sizes = tables["finder_sizes"][0]
    sizes_text = "_the finder separated no pair_"
    if not sizes.is_empty():
        kind = pl.col("found_by").str.extract(r"^(\w+)", 1).fill_null("-")
        sizes_text = markdown_table(
            sizes.with_columns(kind.alias("made_by")).group_by("made_by").agg(
                pl.len().alias("pairs"), pl.col("found_rows").median().alias("median_rows"),
                pl.col("found_rows").max().alias("max_rows"),
                pl.col("rows").median().alias("median_counterexample_rows")).sort("made_by"))
        if sizes.height <= 50:
            sizes_text += "\n\n" + markdown_table(sizes.drop("method"))
    sections = [
        f"# SQL equivalence, run `{run_id}`",
        f"{df['pair_id'].n_unique()} pairs × {df['method'].n_unique()} methods = {df.height} rows.",
        "## Verdicts\n\n" + markdown_table(verdicts) + warning,
        "## Errors and skipped pairs\n\n" + problems_text,
        "## Accuracy by hardness\n\nUndecided verdicts (error, error on instance, "
        "nondeterministic, unparsed, no counterexample within budget) count as wrong. The finder "
        "never answers *equivalent* (search is no proof), so on pairs labelled equivalent it is "
        "wrong by construction; what matters there is that it reports no false counterexample"
        + (f": {finder_false}" if finder_false else "") + ".\n\n" + accuracy_text,
        "## Agreement with execution match\n\n"
        + (markdown_table(tables["agreement"][0]) if not tables["agreement"][0].is_empty()
           else "_no execution-match decisions to compare with_"),
        "## Agreement with the labels\n\nEach method's decisions against the labels of its "
        "notion, and against the other notion's labels on pairs that carry none of its own "
        "(e.g. a semantic method against relaxed-only labels); undecided verdicts are left "
        "out.\n\n"
        + (markdown_table(tables["label_agreement"][0]) if not tables["label_agreement"][0].is_empty()
           else "_no decided, labelled pairs_"),
        "## Counterexamples on the non-equivalent set\n\nFor execution match the counterexample "
        "is the pair's own database (it counts when the results differ there).\n\n"
        + (markdown_table(tables["counterexamples"][0]) if not tables["counterexamples"][0].is_empty()
           else "_no non-equivalent pairs_"),
        "## Finder: instance size that separated each pair\n\nRows over all tables of the "
        "instance that first separated the pair (before shrinking) and how it was made.\n\n"
        + sizes_text,
        "## Time per pair (seconds) and cost\n\n" + markdown_table(tables["time"][0]),
    ]
    text = "\n\n".join(sections) + "\n"
    out["markdown"] = storage.write_bytes(storage.join(prefix, "equivalence.md"), text.encode())
    out["text"] = text
    return out


__all__ = [
    "accuracy_table",
    "agreement_table",
    "counterexample_table",
    "empty_result_pairs",
    "equivalence_tables",
    "finder_sizes_table",
    "label_agreement_table",
    "time_table",
]
