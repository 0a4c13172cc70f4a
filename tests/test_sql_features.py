"""SQL features on hand-written queries with hand-computed bags and counts (definitions in
``tasks/text2sql/sql_features.py``)."""

from __future__ import annotations

import pytest

from tasks.text2sql.sql_features import (
    JACCARD_FEATURES,
    SQLFeatureError,
    extract_features,
    feature_similarity,
    jaccard,
)


def test_comma_joins_tpcds_style():
    f = extract_features(
        """
        SELECT i.i_brand, sum(ss.ss_ext_sales_price) AS revenue
        FROM store_sales ss, date_dim d, item i
        WHERE ss.ss_sold_date_sk = d.d_date_sk AND ss.ss_item_sk = i.i_item_sk
          AND d.d_year = 2000 AND (i.i_manager_id = 28 OR i.i_category = 'Books')
        GROUP BY i.i_brand ORDER BY 2 DESC LIMIT 100
        """
    )
    assert f.relations == ("date_dim", "item", "store_sales")
    assert f.join_count == 2  # comma joins are joins
    assert f.join_pairs == ("date_dim JOIN store_sales", "item JOIN store_sales")
    assert f.where_predicates == (
        "date_dim.d_date_sk = store_sales.ss_sold_date_sk",
        "date_dim.d_year = 2000",
        "item.i_category = 'Books'",  # the OR counts each basic predicate
        "item.i_item_sk = store_sales.ss_item_sk",
        "item.i_manager_id = 28",
    )
    assert f.predicate_count == 5
    assert f.columns == ("item.i_brand", "store_sales.ss_ext_sales_price")
    assert f.aggregations == ("sum(store_sales.ss_ext_sales_price)",)
    assert f.constants == ("'Books'", "2000", "28")  # not ORDER BY 2, not LIMIT 100
    assert (f.cte_count, f.subquery_count, f.function_count) == (0, 0, 0)


def test_unqualified_columns_are_attributed_with_a_schema():
    sql = "SELECT i_brand FROM store_sales, item WHERE ss_item_sk = i_item_sk AND i_category = 'Music'"
    schema = {
        "store_sales": ["ss_item_sk", "ss_quantity"],
        "item": ["i_item_sk", "i_brand", "i_category"],
    }
    f = extract_features(sql, schema=schema)
    assert f.columns == ("item.i_brand",)
    assert f.join_pairs == ("item JOIN store_sales",)
    assert f.where_predicates == (
        "item.i_category = 'Music'",
        "item.i_item_sk = store_sales.ss_item_sk",
    )
    # without a schema two FROM items make the owner unknown: bare names, no join pair
    g = extract_features(sql)
    assert g.columns == ("i_brand",) and g.join_pairs == ()
    assert g.join_count == 1
    # a single FROM item owns every unqualified column
    assert extract_features("SELECT name FROM singer WHERE age > 30").columns == ("singer.name",)


def test_explicit_joins():
    f = extract_features(
        """
        SELECT T1.name, T3.title FROM student AS T1
        JOIN has_pet AS T2 ON T1.stuid = T2.stuid
        LEFT JOIN pets AS T3 ON T3.petid = T2.petid AND T3.pettype = 'cat'
        CROSS JOIN config
        """
    )
    assert f.join_count == 3
    assert f.join_pairs == ("has_pet JOIN pets", "has_pet JOIN student")  # CROSS JOIN: no pair
    assert f.relations == ("config", "has_pet", "pets", "student")
    assert f.where_predicates == ()  # ON conditions are not WHERE predicates
    assert f.columns == ("pets.title", "student.name")
    assert f.constants == ("'cat'",)
    # JOIN ... USING / NATURAL JOIN pair the joined table with the one before it
    assert extract_features("SELECT * FROM a JOIN b USING (id) NATURAL JOIN c").join_pairs == (
        "a JOIN b",
        "b JOIN c",
    )
    # composite keys make one pair
    g = extract_features("SELECT 1 FROM cs, cr WHERE cs.item = cr.item AND cs.ord = cr.ord")
    assert g.join_pairs == ("cr JOIN cs",) and g.predicate_count == 2


TPCDS_Q1 = """
WITH customer_total_return AS (
  SELECT sr_customer_sk AS ctr_customer_sk, sr_store_sk AS ctr_store_sk,
         sum(sr_return_amt) AS ctr_total_return
  FROM store_returns, date_dim
  WHERE sr_returned_date_sk = d_date_sk AND d_year = 2000
  GROUP BY sr_customer_sk, sr_store_sk)
SELECT c_customer_id
FROM customer_total_return ctr1, store, customer
WHERE ctr1.ctr_total_return > (SELECT avg(ctr_total_return) * 1.2
                               FROM customer_total_return ctr2
                               WHERE ctr1.ctr_store_sk = ctr2.ctr_store_sk)
  AND s_store_sk = ctr1.ctr_store_sk AND s_state = 'TN' AND ctr1.ctr_customer_sk = c_customer_sk
ORDER BY c_customer_id
LIMIT 100;
"""
Q1_SCHEMA = {
    "store_returns": ["sr_customer_sk", "sr_store_sk", "sr_return_amt", "sr_returned_date_sk"],
    "date_dim": ["d_date_sk", "d_year"],
    "store": ["s_store_sk", "s_state"],
    "customer": ["c_customer_sk", "c_customer_id"],
}


def test_cte_correlated_subquery_and_alias_normalisation():
    f = extract_features(TPCDS_Q1, schema=Q1_SCHEMA)
    assert (f.cte_count, f.subquery_count, f.join_count) == (1, 1, 3)
    assert f.relations == ("customer", "date_dim", "store", "store_returns")  # CTE refs left out
    assert f.columns == (
        "customer.c_customer_id",
        "customer_total_return.ctr_total_return",  # ctr2 is the CTE
        "store_returns.sr_customer_sk",
        "store_returns.sr_return_amt",
        "store_returns.sr_store_sk",
    )
    assert f.aggregations == (
        "avg(customer_total_return.ctr_total_return)",
        "sum(store_returns.sr_return_amt)",
    )
    assert f.constants == ("'TN'", "1.2", "2000")
    assert f.join_pairs == (
        "customer JOIN customer_total_return",
        "customer_total_return JOIN customer_total_return",  # ctr1 = ctr2 (correlation)
        "customer_total_return JOIN store",
        "date_dim JOIN store_returns",
    )
    assert f.where_predicates == (
        "customer.c_customer_sk = customer_total_return.ctr_customer_sk",
        "customer_total_return.ctr_store_sk = customer_total_return.ctr_store_sk",
        "customer_total_return.ctr_store_sk = store.s_store_sk",
        "customer_total_return.ctr_total_return > (subquery)",
        "date_dim.d_date_sk = store_returns.sr_returned_date_sk",
        "date_dim.d_year = 2000",
        "store.s_state = 'TN'",
    )


def test_aliases_and_predicate_orientation_do_not_change_features():
    a = extract_features("SELECT x.a FROM t AS x JOIN u AS y ON x.id = y.tid WHERE y.b > 5")
    b = extract_features("SELECT T.A FROM t JOIN u ON u.tid = t.id WHERE 5 < u.b")
    assert a == b
    assert a.where_predicates == ("u.b > 5",) and a.columns == ("t.a",)


def test_subqueries_are_counted_by_scope():
    f = extract_features(
        """
        SELECT a.x FROM a
        WHERE EXISTS (SELECT 1 FROM b WHERE b.id = a.id)
          AND a.y IN (SELECT c.y FROM c UNION SELECT d.y FROM d)
          AND a.z > (SELECT max(e.z) FROM e)
          AND a.w IN (SELECT f.w FROM (SELECT g.w FROM g) AS f)
        """
    )
    # EXISTS, IN (a UNION: its branches are not subqueries), scalar, IN + its derived table
    assert f.subquery_count == 5
    assert f.cte_count == 0 and f.join_count == 0
    assert f.relations == ("a", "b", "c", "d", "e", "g")
    assert f.where_predicates == (
        "EXISTS(subquery)",
        "a.id = b.id",
        "a.w IN (subquery)",
        "a.y IN (subquery)",
        "a.z > (subquery)",
    )
    assert f.join_pairs == ("a JOIN b",)  # the correlated equality joins b to a
    assert f.columns == ("a.x", "c.y", "d.y", "e.z", "f.w", "g.w")
    assert f.aggregations == ("max(e.z)",) and f.constants == ("1",)


def test_union_branches_and_nested_ctes():
    f = extract_features(
        """
        WITH w1 AS (SELECT id FROM t1), w2 AS (WITH inner_cte AS (SELECT id FROM t2) SELECT id FROM inner_cte)
        SELECT id FROM w1 UNION ALL SELECT id FROM w2 UNION SELECT t3.id FROM t3 WHERE t3.k = 1
        """
    )
    assert f.cte_count == 3 and f.subquery_count == 0
    assert f.relations == ("t1", "t2", "t3")
    assert f.columns == ("inner_cte.id", "t1.id", "t2.id", "t3.id", "w1.id", "w2.id")
    assert f.where_predicates == ("t3.k = 1",)


def test_window_functions_are_not_aggregates():
    f = extract_features(
        """
        SELECT s.store, sum(s.amount) AS total,
               rank() OVER (PARTITION BY s.region ORDER BY sum(s.amount) DESC) AS rnk,
               avg(s.amount) OVER (PARTITION BY s.region) AS region_avg,
               coalesce(s.note, 'n/a') AS note
        FROM sales s GROUP BY s.store, s.region, s.note
        """
    )
    assert f.aggregations == ("sum(sales.amount)", "sum(sales.amount)")
    assert f.window_functions == ("avg(sales.amount)", "rank()")
    assert f.functions == ("coalesce",)
    assert f.constants == ("'n/a'",)
    assert (f.aggregation_count, f.window_function_count, f.function_count) == (2, 2, 1)
    named = extract_features("SELECT sum(a) OVER w FROM t WINDOW w AS (PARTITION BY b)")
    assert named.window_functions == ("sum(t.a)",) and named.aggregations == ()


def test_tpcds_day_arithmetic_reads_as_an_interval():
    days = extract_features(
        "SELECT count(*) FROM web_sales ws, date_dim d WHERE ws.ws_sold_date_sk = d.d_date_sk "
        "AND d.d_date BETWEEN cast('2002-02-01' AS date) AND (cast('2002-02-01' AS date) + 60 days)"
    )
    assert days.constants == ("'2002-02-01'", "'2002-02-01'", "interval '60 day'")
    assert days.functions == ("cast", "cast")
    assert days.aggregations == ("count(*)",) and days.columns == ()
    assert days.predicate_count == 2 and days.join_pairs == ("date_dim JOIN web_sales",)
    interval = extract_features(
        "SELECT count(*) FROM web_sales ws, date_dim d WHERE ws.ws_sold_date_sk = d.d_date_sk "
        "AND d.d_date BETWEEN cast('2002-02-01' AS date) AND (cast('2002-02-01' AS date) + interval '60 days')"
    )
    assert days == interval
    # a string holding "30 days" is left alone
    assert extract_features("SELECT 'x + 30 days' FROM t").constants == ("'x + 30 days'",)


def test_constants_numbers_signs_and_spider_strings():
    f = extract_features("SELECT -1.50, 7 FROM t WHERE t.a IN (1, 2.0) AND NOT t.b LIKE 'A%'")
    assert f.constants == ("'A%'", "-1.5", "1", "2.0", "7")
    assert f.where_predicates == ("NOT t.b LIKE 'A%'", "t.a IN (1, 2.0)")
    # Spider writes strings in double quotes: read as MySQL they are constants
    g = extract_features('SELECT name FROM singer WHERE country = "France"', dialect="mysql")
    assert g.constants == ("'France'",) and g.where_predicates == ("singer.country = 'France'",)


@pytest.mark.parametrize(
    "sql, message",
    [
        ("", "empty"),
        ("SELEC name FROM t", "cannot parse"),
        ("SELECT 1; SELECT 2", "one SQL statement"),
        ("DROP TABLE t", "not a query"),
        ("SELECT (a FROM t", "cannot parse"),
    ],
)
def test_bad_sql_is_a_clear_error(sql, message):
    with pytest.raises(SQLFeatureError, match=message):
        extract_features(sql)


def test_jaccard_similarity():
    assert jaccard(["a", "b"], ["b", "c"]) == pytest.approx(1 / 3)
    assert jaccard([], []) == 1.0
    assert jaccard(["a"], []) == 0.0
    assert jaccard(["a", "a", "b"], ["a", "b"]) == 1.0  # sets by default
    assert jaccard(["a", "a", "b"], ["a", "b"], multiset=True) == pytest.approx(2 / 3)
    gold = extract_features(TPCDS_Q1, schema=Q1_SCHEMA)
    assert feature_similarity(gold, gold) == {f: 1.0 for f in JACCARD_FEATURES}
    pred = extract_features(
        "SELECT c_customer_id FROM customer, store WHERE s_state = 'TN'", schema=Q1_SCHEMA
    )
    sims = feature_similarity(pred, gold)
    assert sims["relations"] == pytest.approx(2 / 4)
    assert sims["constants"] == pytest.approx(1 / 3)
    assert sims["join_pairs"] == 0.0 and sims["aggregations"] == 0.0
