"""Execution match semantics (test-suite style)."""

import datetime as dt
from decimal import Decimal

from tasks.scoring.result_match import has_top_level_order_by, results_match


def test_bag_vs_set_and_order():
    gold = [(1, "a"), (1, "a"), (2, "b")]
    assert results_match(gold, [(2, "b"), (1, "a"), (1, "a")])
    assert not results_match(gold, [(1, "a"), (2, "b")])  # bag: duplicates count
    assert results_match(gold, [(1, "a"), (2, "b")], bag=False)
    assert not results_match(gold, [(2, "b"), (1, "a"), (1, "a")], ordered=True)
    assert results_match(gold, list(gold), ordered=True)


def test_column_permutation():
    gold = [(1, "x", 3.0), (2, "y", 4.0)]
    pred = [("x", 3, 1), ("y", 4, 2)]
    assert results_match(gold, pred)
    assert not results_match(gold, pred, permute_columns=False)
    # a permutation must keep rows together, not just column bags
    assert not results_match([(1, 2), (3, 4)], [(1, 4), (3, 2)])


def test_values_normalised_across_engines():
    assert results_match([(1, Decimal("2.50"), dt.date(2020, 1, 2))], [(1.0, 2.5, "2020-01-02")])
    assert not results_match([("A",)], [("a",)])
    assert results_match([(None,)], [(None,)])
    assert not results_match([(None,)], [(0,)])


def test_shapes():
    assert results_match([], [])
    assert not results_match([(1,)], [])
    assert not results_match([(1, 2)], [(1,)])


def test_order_by_detection():
    assert has_top_level_order_by("SELECT a FROM t ORDER BY a")
    assert not has_top_level_order_by("SELECT a FROM (SELECT a FROM t ORDER BY a LIMIT 3) s")
    assert has_top_level_order_by("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1")
