"""Report plots as PNG bytes (matplotlib, Agg backend; no pyplot, so it is thread-safe).

Each function takes a small report table (the Polars frames of :mod:`tasks.report.metrics`,
:mod:`tasks.report.failure_modes`) and returns the PNG image as ``bytes``. They never fail on an
empty or degenerate table: the figure then says what is missing (e.g. "no incorrect trials").
"""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")

import polars as pl
from matplotlib.figure import Figure

from schemas.report import ALL, ALL_QUERIES, FAILURE_MODES

DPI = 110
FM_COLORS = {
    "FM1": "#8c8c8c",  # other
    "FM2": "#4c72b0",  # wrong plan
    "FM3": "#dd8452",  # wrong data source
    "FM4": "#c44e52",  # wrong implementation
    "FM5": "#8172b3",  # runtime
}
FM_NAMES = {
    "FM1": "FM1 other",
    "FM2": "FM2 wrong plan",
    "FM3": "FM3 wrong data source",
    "FM4": "FM4 wrong implementation",
    "FM5": "FM5 runtime",
}


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def _empty(ax, text: str) -> None:
    ax.text(
        0.5,
        0.5,
        text,
        ha="center",
        va="center",
        fontsize=11,
        color="#555555",
        transform=ax.transAxes,
    )
    ax.set_xticks([])
    ax.set_yticks([])


def pass_at_k_curves(summary: pl.DataFrame, dataset: str = ALL_QUERIES) -> bytes:
    """pass@k (solid) and pass^k (dashed) against k, one colour per agent, for ``dataset``
    (default the mean over all queries). ``summary``: :func:`tasks.report.metrics.pass_at_k_summary`
    output. Returns PNG bytes."""
    fig = Figure(figsize=(7.0, 4.2))
    ax = fig.add_subplot()
    rows = summary.filter(pl.col("dataset") == dataset).sort("agent", "k")
    if rows.is_empty():
        _empty(ax, "no trials")
        return _png(fig)
    ks = sorted(rows["k"].unique().to_list())
    for i, ((agent,), part) in enumerate(rows.group_by("agent", maintain_order=True)):
        color = f"C{i % 10}"
        ax.plot(part["k"], part["pass_at_k"], marker="o", color=color, label=f"{agent} pass@k")
        if "pass_hat_k" in part.columns:
            ax.plot(
                part["k"],
                part["pass_hat_k"],
                marker=".",
                linestyle="--",
                color=color,
                alpha=0.7,
                label=f"{agent} pass^k",
            )
    if len(ks) > 1:
        ax.set_xscale("log")
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks])
    ax.minorticks_off()
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("k (trials)")
    ax.set_ylabel("probability")
    ax.set_title(f"pass@k and pass^k ({dataset})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)


def cost_vs_pass_at_1(cost: pl.DataFrame, ci: pl.DataFrame) -> bytes:
    """Scatter of mean cost per trial (USD) against pass@1 (mean over queries) per agent, with
    the Wilson interval as a vertical error bar; agents whose cost is unknown (unpriced model
    calls) or without a scored trial (every trial errored) are left out and named in a note.
    ``cost``: :func:`tasks.report.metrics.cost_table`; ``ci``: :func:`tasks.report.metrics.pass_at_1_ci`. Returns PNG bytes."""
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.add_subplot()
    pts = (
        cost.filter(pl.col("dataset") == ALL)
        .select("agent", "cost_per_trial_usd")
        .join(
            ci.filter(pl.col("dataset") == ALL_QUERIES).select(
                "agent", "pass_at_1", "ci_low", "ci_high"
            ),
            on="agent",
        )
        .sort("agent")
    )
    unknown = pts.filter(pl.col("cost_per_trial_usd").is_null())["agent"].to_list()
    unscored = pts.filter(pl.col("pass_at_1").is_null())["agent"].to_list()
    pts = pts.filter(pl.col("cost_per_trial_usd").is_not_null() & pl.col("pass_at_1").is_not_null())
    notes = ([f"cost unknown (unpriced model): {', '.join(unknown)}"] if unknown else []) + (
        [f"no scored trial (all errored): {', '.join(unscored)}"] if unscored else [])
    if notes:
        ax.text(0.5, 0.96, "; ".join(notes),
                ha="center", transform=ax.transAxes, fontsize=8, color="#555555")
    if pts.is_empty():
        _empty(ax, "no trials" if not notes else "no agent with a known cost and a score")
        return _png(fig)
    for i, r in enumerate(pts.iter_rows(named=True)):  # one point per agent
        x, y = r["cost_per_trial_usd"], r["pass_at_1"]
        yerr = [[y - r["ci_low"]], [r["ci_high"] - y]]
        ax.errorbar([x], [y], yerr=yerr, fmt="o", color=f"C{i % 10}", capsize=4, label=r["agent"])
        ax.annotate(r["agent"], (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    if float(pts["cost_per_trial_usd"].max()) == 0.0:
        ax.set_xlim(-0.01, 0.01)
        ax.text(
            0.5,
            0.04,
            "all agents cost $0 (offline or cached)",
            ha="center",
            transform=ax.transAxes,
            fontsize=8,
            color="#555555",
        )
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("mean cost per trial (USD)")
    ax.set_ylabel("pass@1 (95% Wilson interval)")
    ax.set_title("Cost vs pass@1")
    ax.grid(alpha=0.3)
    return _png(fig)


def failure_mode_bars(fm_table: pl.DataFrame) -> bytes:
    """Stacked horizontal bars per agent: share of its incorrect trials in each failure mode
    FM1–FM5 (``dataset == "ALL"`` rows of :func:`tasks.report.failure_modes.failure_mode_table`),
    labelled with the number of incorrect trials. Returns PNG bytes."""
    rows = fm_table.filter(pl.col("dataset") == ALL).sort("agent", descending=True)
    fig = Figure(figsize=(7.5, 1.6 + 0.45 * max(1, rows.height)))
    ax = fig.add_subplot()
    if rows.is_empty() or int(rows["incorrect"].sum()) == 0:
        _empty(ax, "no incorrect trials: nothing to classify")
        ax.set_title("Failure modes of incorrect trials")
        return _png(fig)
    agents = rows["agent"].to_list()
    left = [0.0] * rows.height
    for mode in FAILURE_MODES:
        share = rows[f"{mode}_share"].fill_null(0.0).to_list()
        ax.barh(agents, share, left=left, color=FM_COLORS[mode], label=FM_NAMES[mode])
        left = [a + b for a, b in zip(left, share)]
    for y, n in enumerate(rows["incorrect"].to_list()):
        ax.text(1.01, y, f"n={n}", va="center", fontsize=8)
    ax.set_xlim(0, 1.12)
    ax.set_xlabel("share of incorrect trials")
    ax.set_title("Failure modes of incorrect trials")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.1, 0.5), frameon=False)
    return _png(fig)


def pass_at_1_heatmap(ci: pl.DataFrame) -> bytes:
    """Agent × dataset heatmap of pass@1 (per-dataset rows of
    :func:`tasks.report.metrics.pass_at_1_ci`), each cell annotated. Returns PNG bytes."""
    rows = ci.filter(~pl.col("dataset").str.starts_with("ALL"))
    agents = sorted(rows["agent"].unique().to_list())
    datasets = sorted(rows["dataset"].unique().to_list())
    fig = Figure(figsize=(1.6 + 1.1 * max(1, len(datasets)), 1.2 + 0.5 * max(1, len(agents))))
    ax = fig.add_subplot()
    if rows.is_empty():
        _empty(ax, "no trials")
        return _png(fig)
    lookup = {(r["agent"], r["dataset"]): r["pass_at_1"] for r in rows.iter_rows(named=True)}
    grid = [[float("nan") if lookup.get((a, d)) is None else lookup[(a, d)] for d in datasets]
            for a in agents]  # blank: no scored trial (all errored, or not run)
    im = ax.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(datasets)))
    ax.set_xticklabels(datasets, rotation=30, ha="right")
    ax.set_yticks(range(len(agents)))
    ax.set_yticklabels(agents)
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if not math.isnan(v):
                ax.text(
                    j,
                    i,
                    f"{v:.2f}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="black" if 0.25 < v < 0.85 else "white",
                )
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="pass@1")
    ax.set_title("pass@1 by agent and dataset")
    return _png(fig)
