"""Plots of the text-to-SQL suite: per-query feature histograms of several corpora and radar
charts of per-model scores, drawn with matplotlib's Figure API on the Agg canvas (no pyplot, so
safe in mapped tasks' threads) and returned as PNG bytes."""

from __future__ import annotations

import io


# --------------------------------------------------------------------------------------------
# Plots (matplotlib Figure API with the Agg canvas, no pyplot; PNG bytes)
# --------------------------------------------------------------------------------------------


def _figure(**kwargs):
    """A matplotlib Figure without pyplot (thread-safe in mapped tasks; Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


_LABELS = {
    "cte_count": "CTEs",
    "subquery_count": "subqueries (nested selects)",
    "join_count": "joins",
    "function_count": "functions",
    "predicate_count": "WHERE predicates",
    "column_count": "selected columns",
    "aggregation_count": "aggregations",
    "join_pair_count": "join pairs",
    "relation_count": "relations",
    "constant_count": "constants",
    "window_function_count": "window functions",
    "relations": "tables",
    "columns": "columns",
    "where_predicates": "WHERE predicates",
    "constants": "constants",
    "functions": "functions",
    "aggregations": "aggregation",
    "join_pairs": "joins",
    "window_functions": "window functions",
}


def histogram_png(values: dict[str, list[int]], feature: str, cap: int = 30) -> bytes:
    """Per-query distribution of one numeric feature for several corpora: grouped bars of the
    share of each corpus's queries (%) per count; counts above ``cap`` are pooled in the last
    bar ("≥cap"). Returns PNG bytes."""
    top = min(cap, max((max(v) for v in values.values() if v), default=0))
    xs = list(range(top + 1))
    fig = _figure(figsize=(9, 4))
    ax = fig.add_subplot()
    width = 0.8 / max(len(values), 1)
    for i, (name, vals) in enumerate(values.items()):
        n = len(vals) or 1
        shares = [100 * sum(1 for v in vals if (min(v, top) == x)) / n for x in xs]
        ax.bar(
            [x + (i - (len(values) - 1) / 2) * width for x in xs],
            shares,
            width=width,
            label=f"{name} (n={len(vals)})",
        )
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) if x < top or top < cap else f"≥{x}" for x in xs], fontsize=7)
    ax.set_xlabel(f"{_LABELS.get(feature, feature)} per query")
    ax.set_ylabel("share of queries (%)")
    ax.set_title(f"{_LABELS.get(feature, feature)} per query")
    ax.legend()
    return _png(fig)


def radar_png(
    scores: dict[str, dict[str, float]], features: list[str], title: str, rmax: float | None = None
) -> bytes:
    """A radar chart: one polygon per model over ``features`` (axes), e.g. Jaccard similarity
    per bag feature; the radial axis runs from 0 to ``rmax`` (default: fitted to the data).
    Missing values are drawn as 0. Returns PNG bytes."""
    import math

    angles = [2 * math.pi * i / len(features) for i in range(len(features))]
    fig = _figure(figsize=(6.5, 6.5))
    ax = fig.add_subplot(projection="polar")
    for model, vals in scores.items():
        ys = [vals.get(f) or 0.0 for f in features]
        ax.plot(angles + angles[:1], ys + ys[:1], label=model, linewidth=1.5)
        ax.fill(angles + angles[:1], ys + ys[:1], alpha=0.08)
    ax.set_xticks(angles)
    ax.set_xticklabels([_LABELS.get(f, f) for f in features], fontsize=8)
    if rmax is not None:
        ax.set_ylim(0, rmax)
    ax.set_title(title)
    ax.legend(loc="upper right", bbox_to_anchor=(1.35, 1.1), fontsize=8)
    return _png(fig)


__all__ = ["histogram_png", "radar_png"]
