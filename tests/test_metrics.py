"""pass@k: the unbiased estimator against brute-force enumeration, and the Polars tables."""

from itertools import combinations

import polars as pl
import pytest

from tasks.report.metrics import pass_at_k, pass_at_k_per_query, pass_at_k_summary, pass_at_k_wide


def brute_force(n: int, c: int, k: int) -> float:
    """Share of all k-subsets of n trials (c correct) that contain a correct trial."""
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(combinations(range(n), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 10])
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12)


def test_pass_at_k_null_when_fewer_trials_than_k():
    assert pass_at_k(3, 3, 5) is None


def test_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 0)


def test_tables_by_hand():
    # dataset d: q1 1/3 correct, q2 2/2; dataset e: q3 0/2.
    trials = pl.DataFrame(
        {
            "agent": ["a"] * 7,
            "dataset": ["d"] * 5 + ["e"] * 2,
            "query_id": ["q1"] * 3 + ["q2"] * 2 + ["q3"] * 2,
            "is_correct": [True, False, False, True, True, False, False],
        }
    )
    per_query = pass_at_k_per_query(trials)
    got = {(r["query_id"], r["k"]): r["pass_at_k"] for r in per_query.iter_rows(named=True)}
    assert got[("q1", 1)] == pytest.approx(1 / 3)
    assert got[("q1", 2)] == pytest.approx(2 / 3)  # 1 - C(2,2)/C(3,2)
    assert got[("q1", 3)] == 1.0
    assert got[("q2", 1)] == 1.0 and got[("q2", 3)] is None  # n < k
    assert got[("q3", 1)] == 0.0
    wide = pass_at_k_wide(pass_at_k_summary(per_query))
    rows = {r["dataset"]: r for r in wide.iter_rows(named=True)}
    assert rows["d"]["pass@1"] == pytest.approx((1 / 3 + 1) / 2)
    assert rows["e"]["pass@1"] == 0.0
    assert rows["ALL (queries)"]["pass@1"] == pytest.approx((1 / 3 + 1 + 0) / 3)
    assert rows["ALL (datasets)"]["pass@1"] == pytest.approx(((1 / 3 + 1) / 2 + 0) / 2)
    assert rows["d"]["pass@3"] == 1.0  # q2 is null at k=3 and left out of the mean
    assert rows["e"]["pass@3"] is None


# --- pass^k, vectorised estimators, Wilson intervals, cost table --------------------------------

import math

from schemas.report import ALL, ALL_DATASETS, ALL_QUERIES
from tasks.report.metrics import (
    cost_table,
    pass_at_1_ci,
    pass_hat_k,
    wilson_interval,
)


def brute_force_all(n: int, c: int, k: int) -> float:
    """Share of all k-subsets of n trials (c correct) in which every trial is correct."""
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(combinations(range(n), k))
    return sum(all(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_pass_hat_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_hat_k(n, c, k) == pytest.approx(brute_force_all(n, c, k), abs=1e-12)
    assert pass_hat_k(n, n, n + 1) is None


def _trials(counts: dict[tuple[str, str, str], tuple[int, int]]) -> pl.DataFrame:
    """One row per trial from {(agent, dataset, query): (n, c)} (first c trials correct)."""
    rows = []
    for (agent, dataset, query), (n, c) in counts.items():
        rows += [
            {"agent": agent, "dataset": dataset, "query_id": query, "is_correct": i < c}
            for i in range(n)
        ]
    return pl.DataFrame(rows)


def test_vectorised_tables_equal_scalar_estimators_for_every_n_c():
    counts = {
        ("a", "d", f"q{n}_{c}"): (n, c)
        for n in range(1, 53)
        for c in (0, 1, n // 3, n - 1, n)
        if 0 <= c <= n
    }
    per_query = pass_at_k_per_query(_trials(counts))
    assert per_query["k"].unique().sort().to_list() == [1, 2, 3, 5, 10, 20, 50]
    for r in per_query.iter_rows(named=True):
        want_at = pass_at_k(r["n"], r["c"], r["k"])
        want_hat = pass_hat_k(r["n"], r["c"], r["k"])
        if want_at is None:
            assert r["pass_at_k"] is None and r["pass_hat_k"] is None
        else:
            assert r["pass_at_k"] == pytest.approx(want_at, rel=1e-12, abs=1e-12)
            assert r["pass_hat_k"] == pytest.approx(want_hat, rel=1e-12, abs=1e-15)


def test_all_correct_none_correct_and_short_queries():
    per_query = pass_at_k_per_query(
        _trials({("a", "d", "all"): (3, 3), ("a", "d", "none"): (3, 0), ("a", "d", "one"): (1, 1)})
    )
    got = {
        (r["query_id"], r["k"]): (r["pass_at_k"], r["pass_hat_k"])
        for r in per_query.iter_rows(named=True)
    }
    assert got[("all", 1)] == (1.0, 1.0) and got[("all", 3)] == (1.0, 1.0)
    assert got[("none", 1)] == (0.0, 0.0) and got[("none", 3)] == (0.0, 0.0)
    assert got[("one", 1)] == (1.0, 1.0)
    assert got[("one", 2)] == (None, None) and got[("one", 3)] == (None, None)  # n < k → null
    summary = pass_at_k_summary(per_query)
    at3 = summary.filter(pl.col("k") == 3, pl.col("dataset") == "d").row(0, named=True)
    assert at3["queries"] == 2 and at3["pass_at_k"] == 0.5 and at3["pass_hat_k"] == 0.5
    # overall rows come after the agent's datasets
    assert summary.filter(pl.col("k") == 1)["dataset"].to_list() == ["d", ALL_DATASETS, ALL_QUERIES]
    hat = pass_at_k_wide(summary, "pass_hat_k")
    assert hat.columns == ["agent", "dataset", "n", "n_errored", "pass^1", "pass^2", "pass^3"]


def test_no_trials_and_bad_input():
    empty = pl.DataFrame(
        schema={
            "agent": pl.String,
            "dataset": pl.String,
            "query_id": pl.String,
            "is_correct": pl.Boolean,
        }
    )
    assert pass_at_k_per_query(empty).is_empty()
    with pytest.raises(ValueError, match="is_correct"):
        pass_at_k_per_query(
            pl.DataFrame(
                {"agent": ["a"], "dataset": ["d"], "query_id": ["q"], "is_correct": [None]},
                schema_overrides={"is_correct": pl.Boolean},
            )
        )
    with pytest.raises(ValueError, match="query_id"):
        pass_at_k_per_query(pl.DataFrame({"agent": ["a"], "dataset": ["d"], "is_correct": [True]}))


def test_wilson_interval_by_hand():
    # p = 0.5, n = 4, z = 1.959964: center = (0.5 + z²/8) / (1 + z²/4) = 0.5,
    # half = z * sqrt(0.25/4 + z²/64) / (1 + z²/4)
    z = 1.959963984540054
    half = z * math.sqrt(0.25 / 4 + z * z / 64) / (1 + z * z / 4)
    low, high = wilson_interval(0.5, 4)
    assert low == pytest.approx(0.5 - half) and high == pytest.approx(0.5 + half)
    # none correct: lower bound 0, upper z²/(n + z²); all correct: mirror image
    low, high = wilson_interval(0.0, 10)
    assert low == 0.0 and high == pytest.approx(z * z / (10 + z * z))
    low1, high1 = wilson_interval(1.0, 10)
    assert high1 == 1.0 and low1 == pytest.approx(1 - z * z / (10 + z * z))
    assert wilson_interval(0.3, 0) is None
    with pytest.raises(ValueError):
        wilson_interval(1.5, 3)
    assert wilson_interval(0.5, 4, 0.99)[0] < wilson_interval(0.5, 4, 0.95)[0]


def test_pass_at_1_ci_table_by_hand_with_ties():
    # agents a and b have identical counts → identical intervals (ties); d: q1 1/2, q2 2/2;
    # e: q3 0/2.
    counts = {}
    for agent in ("a", "b"):
        counts |= {
            (agent, "d", "q1"): (2, 1),
            (agent, "d", "q2"): (2, 2),
            (agent, "e", "q3"): (2, 0),
        }
    ci = pass_at_1_ci(_trials(counts))
    rows = {(r["agent"], r["dataset"]): r for r in ci.iter_rows(named=True)}
    d = rows[("a", "d")]
    assert (d["queries"], d["trials"], d["correct"], d["pass_at_1"]) == (2, 4, 3, 0.75)
    assert (d["ci_low"], d["ci_high"]) == pytest.approx(wilson_interval(0.75, 4))
    over_q = rows[("a", ALL_QUERIES)]
    assert over_q["pass_at_1"] == pytest.approx(0.5) and over_q["trials"] == 6
    assert (over_q["ci_low"], over_q["ci_high"]) == pytest.approx(wilson_interval(0.5, 6))
    strat = rows[("a", ALL_DATASETS)]
    assert strat["pass_at_1"] == pytest.approx((0.75 + 0.0) / 2)
    assert (strat["ci_low"], strat["ci_high"]) == pytest.approx(wilson_interval(0.375, 6))
    e = rows[("a", "e")]
    assert e["pass_at_1"] == 0.0 and e["ci_low"] == 0.0 and e["ci_high"] > 0
    for key in ("d", "e", ALL_QUERIES, ALL_DATASETS):
        ra, rb = rows[("a", key)], rows[("b", key)]
        assert (ra["ci_low"], ra["ci_high"]) == (rb["ci_low"], rb["ci_high"])
    assert ci.filter(pl.col("agent") == "a")["dataset"].to_list() == [
        "d",
        "e",
        ALL_DATASETS,
        ALL_QUERIES,
    ]


def _cost_trials() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "trial_key": ["t1", "t2", "t3", "t4"],
            "agent": ["a", "a", "a", "b"],
            "dataset": ["d", "d", "e", "d"],
            "is_correct": [True, False, True, False],
            "cost_usd": [0.10, 0.30, 0.20, 0.05],
            "prompt_tokens": [100, 300, 200, 0],
            "completion_tokens": [10, 30, 20, 0],
            "cached_tokens": [50, 0, 100, 0],
            "latency_s": [1.0, 3.0, 10.0, 2.0],
            "n_llm_calls": [1, 5, 2, 0],
        }
    )


def test_cost_table_by_hand_without_llm_calls():
    cost = cost_table(_cost_trials())
    rows = {(r["agent"], r["dataset"]): r for r in cost.iter_rows(named=True)}
    d = rows[("a", "d")]
    assert d["trials"] == 2 and d["correct"] == 1
    assert d["cost_usd"] == pytest.approx(0.4)
    assert d["cost_per_trial_usd"] == pytest.approx(0.2)
    assert d["cost_per_correct_usd"] == pytest.approx(0.4)
    assert d["tokens_per_trial"] == pytest.approx(220.0) and d["tokens_per_correct"] == 440.0
    assert d["prompt_cache_share"] == pytest.approx(50 / 400)
    assert d["latency_mean_s"] == 2.0 and d["latency_p50_s"] == 2.0
    assert d["latency_p95_s"] == pytest.approx(1.0 + 0.95 * 2.0)  # linear interpolation
    assert d["iterations_mean"] == 3.0 and d["iterations_p95"] == pytest.approx(1 + 0.95 * 4)
    assert d["llm_calls"] is None and d["response_cache_hit_share"] is None
    total = rows[("a", ALL)]
    assert total["trials"] == 3 and total["correct"] == 2
    assert total["cost_per_correct_usd"] == pytest.approx(0.6 / 2)
    assert total["latency_p50_s"] == 3.0
    b = rows[("b", "d")]
    assert b["cost_per_correct_usd"] is None and b["tokens_per_correct"] is None
    assert b["prompt_cache_share"] is None  # no prompt tokens
    assert cost["dataset"].to_list() == ["d", "e", ALL, "d", ALL]


def test_cost_table_with_llm_calls():
    calls = pl.DataFrame(
        {
            "trial_key": ["t1", "t2", "t2", "t2", "t3", "zz"],  # zz: not a trial of the run
            "cache_hit": [True, False, False, True, False, True],
            "attempts": [1, 1, 3, 1, 2, 1],
        }
    )
    cost = cost_table(_cost_trials(), calls)
    rows = {(r["agent"], r["dataset"]): r for r in cost.iter_rows(named=True)}
    assert rows[("a", "d")]["llm_calls"] == 4
    assert rows[("a", "d")]["response_cache_hit_share"] == 0.5
    assert rows[("a", "d")]["retries"] == 2
    assert rows[("a", ALL)]["llm_calls"] == 5 and rows[("a", ALL)]["retries"] == 3
    assert (
        rows[("b", "d")]["llm_calls"] == 0 and rows[("b", "d")]["response_cache_hit_share"] is None
    )
