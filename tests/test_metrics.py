"""pass@k: the unbiased estimator against brute-force enumeration, and the Polars tables."""

from itertools import combinations

import polars as pl
import pytest

from tasks.metrics import pass_at_k, pass_at_k_per_query, pass_at_k_summary, pass_at_k_wide


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
