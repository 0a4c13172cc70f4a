"""The paper's tables from lifecycle results (Polars), and the Markdown report.

All tables are means over items of the per-item metrics in :data:`schemas.lifecycle.RESULTS`
(an item where a metric does not apply — e.g. ACC-Key of a design without keys — is left out
of that metric's ``n``):

- :func:`main_table` — every phase's metrics per model (Text2SQL on the original schemas,
  Progressive-Text2SQL at perturbation level 0), with the phase's cost;
- :func:`robustness_table` — G-EX and final-node EX per perturbation level, over the graphs
  that have every level in the run (so levels are compared on the same graphs);
- :func:`variant_cv_table` — EX per schema variant over the questions that have every variant,
  with the coefficient of variation (population std / mean) across variants;
- :func:`ex_vs_gex_table` — plain Text2SQL EX vs Progressive final-node EX and G-EX on the
  questions both phases have (original schema, level 0);
- :func:`design_by_k_table` — design accuracy by the number of tables asked for;
- :func:`debug_by_kind_table` — debugging EX by mutation kind.
"""

from __future__ import annotations

import polars as pl

from schemas.lifecycle import PAPER_PHASE, PHASE_METRICS, PHASES
from tasks.lifecycle.metrics import coefficient_of_variation

__all__ = [
    "debug_by_kind_table",
    "design_by_k_table",
    "ex_vs_gex_table",
    "main_table",
    "main_table_wide",
    "robustness_table",
    "variant_cv_table",
]


def _phase_rows(results: pl.DataFrame, phase: str) -> pl.DataFrame:
    df = results.filter(pl.col("phase") == phase)
    if phase == "text2sql":
        df = df.filter(pl.col("variant") == "original")
    if phase == "progressive":
        df = df.filter(pl.col("level") == 0)
    return df


def main_table(results: pl.DataFrame) -> pl.DataFrame:
    """Long table ``model, paper_phase, phase, metric, n, value, cost_usd`` (cost in USD of
    all the phase's items for the model — every schema variant and perturbation level; null
    when a call had no price)."""
    rows = []
    for phase in PHASES:
        df = _phase_rows(results, phase)
        if not df.height:
            continue
        every = results.filter(pl.col("phase") == phase)  # cost: all the phase's items
        for (model,), g in df.group_by("model", maintain_order=True):
            c = every.filter(pl.col("model") == model)["cost_usd"]
            cost = None if c.null_count() else float(c.sum())
            for metric in PHASE_METRICS[phase]:
                vals = g[metric].drop_nulls()
                rows.append(
                    {
                        "model": model,
                        "paper_phase": PAPER_PHASE[phase],
                        "phase": phase,
                        "metric": metric,
                        "n": vals.len(),
                        "value": float(vals.mean()) if vals.len() else None,
                        "cost_usd": cost,
                    }
                )
    schema = {
        "model": pl.String,
        "paper_phase": pl.String,
        "phase": pl.String,
        "metric": pl.String,
        "n": pl.Int32,
        "value": pl.Float64,
        "cost_usd": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema).sort("model", maintain_order=True)


def main_table_wide(main: pl.DataFrame) -> pl.DataFrame:
    """:func:`main_table` with one row per model and one column per ``phase:metric``."""
    if not main.height:
        return pl.DataFrame({"model": []}, schema={"model": pl.String})
    wide = main.with_columns((pl.col("phase") + ":" + pl.col("metric")).alias("col")).pivot(
        on="col", index="model", values="value"
    )
    return wide.sort("model")


def robustness_table(results: pl.DataFrame) -> pl.DataFrame:
    """``model, level, n_graphs, g_ex, final_ex`` over the graphs with every level."""
    df = results.filter(pl.col("phase") == "progressive")
    schema = {
        "model": pl.String,
        "level": pl.Int32,
        "n_graphs": pl.Int32,
        "g_ex": pl.Float64,
        "final_ex": pl.Float64,
    }
    if not df.height:
        return pl.DataFrame([], schema=schema)
    levels = df.group_by("model").agg(pl.col("level").n_unique().alias("n_levels"))
    full = (
        df.group_by("model", "base_id")
        .agg(pl.col("level").n_unique().alias("k"))
        .join(levels, on="model")
        .filter(pl.col("k") == pl.col("n_levels"))
        .select("model", "base_id")
    )
    out = (
        df.join(full, on=["model", "base_id"])
        .group_by("model", "level")
        .agg(
            pl.col("base_id").n_unique().cast(pl.Int32).alias("n_graphs"),
            pl.col("g_ex").mean().alias("g_ex"),
            pl.col("final_ex").mean().alias("final_ex"),
        )
        .sort("model", "level")
    )
    return out.select(list(schema)).cast(schema)


def variant_cv_table(results: pl.DataFrame) -> pl.DataFrame:
    """``model, variant, n, ex, mean_ex, std_ex, cv`` over the questions with every variant."""
    df = results.filter(pl.col("phase") == "text2sql")
    schema = {
        "model": pl.String,
        "variant": pl.String,
        "n": pl.Int32,
        "ex": pl.Float64,
        "mean_ex": pl.Float64,
        "std_ex": pl.Float64,
        "cv": pl.Float64,
    }
    if not df.height:
        return pl.DataFrame([], schema=schema)
    nvar = df.group_by("model").agg(pl.col("variant").n_unique().alias("n_var"))
    full = (
        df.group_by("model", "base_id")
        .agg(pl.col("variant").n_unique().alias("k"))
        .join(nvar, on="model")
        .filter((pl.col("k") == pl.col("n_var")) & (pl.col("n_var") > 1))
        .select("model", "base_id")
    )
    per = (
        df.join(full, on=["model", "base_id"])
        .group_by("model", "variant")
        .agg(pl.len().cast(pl.Int32).alias("n"), pl.col("ex").mean().alias("ex"))
        .sort("model", "variant")
    )
    rows = []
    for (model,), g in per.group_by("model", maintain_order=True):
        exs = g["ex"].to_list()
        mean = sum(exs) / len(exs)
        std = (sum((x - mean) ** 2 for x in exs) / len(exs)) ** 0.5
        cv = coefficient_of_variation(exs)
        for r in g.iter_rows(named=True):
            rows.append({**r, "mean_ex": mean, "std_ex": std, "cv": cv})
    return pl.DataFrame(rows, schema=schema)


def ex_vs_gex_table(results: pl.DataFrame) -> pl.DataFrame:
    """``model, n, ex, final_ex, g_ex`` on the questions with both a Text2SQL item (original
    schema) and a progressive item at level 0."""
    schema = {
        "model": pl.String,
        "n": pl.Int32,
        "ex": pl.Float64,
        "final_ex": pl.Float64,
        "g_ex": pl.Float64,
    }
    t = _phase_rows(results, "text2sql").select("model", "base_id", "ex")
    p = _phase_rows(results, "progressive").select("model", "base_id", "final_ex", "g_ex")
    both = t.join(p, on=["model", "base_id"])
    if not both.height:
        return pl.DataFrame([], schema=schema)
    return (
        both.group_by("model")
        .agg(
            pl.len().cast(pl.Int32).alias("n"),
            pl.col("ex").mean(),
            pl.col("final_ex").mean(),
            pl.col("g_ex").mean(),
        )
        .sort("model")
        .select(list(schema))
    )


def design_by_k_table(results: pl.DataFrame) -> pl.DataFrame:
    """``model, k, n, acc_entity, acc_data, acc_key`` (k read from the item id
    ``design/<db>/k<k>/<n>``)."""
    schema = {
        "model": pl.String,
        "k": pl.Int32,
        "n": pl.Int32,
        "acc_entity": pl.Float64,
        "acc_data": pl.Float64,
        "acc_key": pl.Float64,
    }
    df = results.filter(pl.col("phase") == "design")
    if not df.height:
        return pl.DataFrame([], schema=schema)
    return (
        df.with_columns(pl.col("item_id").str.extract(r"/k(\d+)/", 1).cast(pl.Int32).alias("k"))
        .group_by("model", "k")
        .agg(
            pl.len().cast(pl.Int32).alias("n"),
            pl.col("acc_entity").mean(),
            pl.col("acc_data").mean(),
            pl.col("acc_key").mean(),
        )
        .sort("model", "k")
        .select(list(schema))
    )


def debug_by_kind_table(results: pl.DataFrame) -> pl.DataFrame:
    """``model, kind, n, ex_single, ex_multi`` by mutation kind (from the result details)."""
    schema = {
        "model": pl.String,
        "kind": pl.String,
        "n": pl.Int32,
        "ex_single": pl.Float64,
        "ex_multi": pl.Float64,
    }
    df = results.filter(pl.col("phase") == "debug")
    if not df.height:
        return pl.DataFrame([], schema=schema)
    return (
        df.with_columns(pl.col("details").str.json_path_match("$.kind").alias("kind"))
        .group_by("model", "kind")
        .agg(
            pl.len().cast(pl.Int32).alias("n"),
            pl.col("ex_single").mean(),
            pl.col("ex_multi").mean(),
        )
        .sort("model", "kind")
        .select(list(schema))
    )
