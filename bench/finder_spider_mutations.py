"""Benchmark: the counterexample finder on mutated Spider dev gold queries (real schemas).

Each Spider dev gold query (``../shared/data/spider/dev.json``, or under
``$QUERYLAB_SHARED_DATA``; its database's MySQL DDL from
``databases/<db>/schema.sql``) is mutated once per applicable rule — a comparison made strict or
loose, ``=`` → ``<>``, DISTINCT dropped or added, ORDER BY direction flipped, LIMIT + 1, an
integer constant + 1, AND → OR, JOIN → LEFT JOIN, UNION → UNION ALL, MAX ↔ MIN,
COUNT(DISTINCT c) → COUNT(c) — and the finder (default budget) searches each (gold, mutant)
pair. Most mutants are not equivalent to their gold query, some are (a LIMIT on a one-row
result), so the figure is the number separated, to compare between versions of the finder on
the same pairs, not a rate to reach 100 %. Every separation is verified by executing the
emitted script, so none is false.

Usage: ``.venv/bin/python bench/finder_spider_mutations.py [--limit N] [--every K]`` (every
K-th (query, rule) pair, default 4, so a run takes a few minutes). Prints one line per
unseparated pair, the verdict counts, then the figure:

    spider mutations: <separated>/<pairs> separated, <errors> errors, median <s> s per pair
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sqlglot
from sqlglot import exp

from schemas.equivalence import FinderBudget, QueryPair
from tasks.equivalence.counterexample import find_counterexample
from tasks.equivalence.pairs import pair_schema
from tasks.equivalence.instances import RelSchema

SPIDER = Path(os.environ.get("QUERYLAB_SHARED_DATA", ROOT.parent / "shared" / "data")) / "spider"

_FLIP = {exp.GT: exp.GTE, exp.GTE: exp.GT, exp.LT: exp.LTE, exp.LTE: exp.LT, exp.EQ: exp.NEQ}


def _first(tree: exp.Expression, kinds) -> exp.Expression | None:
    return next(iter(tree.find_all(*kinds)), None)


def mutants(sql: str) -> list[tuple[str, str]]:
    """``(rule, mutated SQL)`` for every rule that applies to ``sql`` (SQLite dialect)."""
    try:
        base = sqlglot.parse_one(sql, read="sqlite")
    except sqlglot.errors.SqlglotError:
        return []
    out = []

    def rule(name, fn):
        tree = base.copy()
        if fn(tree):
            text = tree.sql(dialect="sqlite")
            if text != base.sql(dialect="sqlite"):
                out.append((name, text))

    def comparison(tree):
        node = _first(tree, tuple(_FLIP))
        if node is None:
            return False
        node.replace(_FLIP[type(node)](this=node.this.copy(), expression=node.expression.copy()))
        return True

    def drop_distinct(tree):
        sel = tree if isinstance(tree, exp.Select) else None
        if sel is None or not sel.args.get("distinct"):
            return False
        sel.set("distinct", None)
        return True

    def add_distinct(tree):
        if not isinstance(tree, exp.Select) or tree.args.get("distinct"):
            return False
        tree.set("distinct", exp.Distinct())
        return True

    def flip_order(tree):
        order = tree.args.get("order")
        if order is None or tree.args.get("limit") is None:
            return False
        for o in order.expressions:
            o.set("desc", not o.args.get("desc"))
        return True

    def limit_plus(tree):
        limit = tree.args.get("limit")
        lit = limit.args.get("expression") if limit is not None else None
        if not isinstance(lit, exp.Literal):
            return False
        lit.replace(exp.Literal.number(int(lit.this) + 1))
        return True

    def constant_plus(tree):
        for lit in tree.find_all(exp.Literal):
            if not lit.is_string and lit.this.isdigit() and not isinstance(lit.parent, exp.Limit):
                lit.replace(exp.Literal.number(int(lit.this) + 1))
                return True
        return False

    def and_or(tree):
        node = _first(tree, (exp.And,))
        if node is None:
            return False
        node.replace(exp.Or(this=node.this.copy(), expression=node.expression.copy()))
        return True

    def left_join(tree):
        join = _first(tree, (exp.Join,))
        if join is None or join.args.get("side"):
            return False
        join.set("side", "LEFT")
        join.set("kind", None)
        return True

    def union_all(tree):
        node = _first(tree, (exp.Union,))
        if node is None or not node.args.get("distinct", True):
            return False
        node.set("distinct", False)
        return True

    def max_min(tree):
        node = _first(tree, (exp.Max, exp.Min))
        if node is None:
            return False
        node.replace((exp.Min if isinstance(node, exp.Max) else exp.Max)(this=node.this.copy()))
        return True

    def count_distinct(tree):
        node = next((c for c in tree.find_all(exp.Count) if isinstance(c.this, exp.Distinct)), None)
        if node is None:
            return False
        node.set("this", node.this.expressions[0].copy())
        return True

    for name, fn in [("comparison", comparison), ("drop_distinct", drop_distinct),
                     ("add_distinct", add_distinct), ("flip_order", flip_order),
                     ("limit_plus", limit_plus), ("constant_plus", constant_plus),
                     ("and_or", and_or), ("left_join", left_join), ("union_all", union_all),
                     ("max_min", max_min), ("count_distinct", count_distinct)]:
        rule(name, fn)
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=4, help="take every K-th pair (default 4)")
    ap.add_argument("--limit", type=int, default=None, help="at most N pairs")
    args = ap.parse_args(argv)
    if not (SPIDER / "dev.json").exists():
        print(f"spider mutations: skipped (no Spider data at {SPIDER})")
        return 0
    dev = json.loads((SPIDER / "dev.json").read_text())
    schemas: dict[str, RelSchema] = {}
    pairs = []
    for item in dev:
        for rule, mutant in mutants(item["query"]):
            pairs.append((item["db_id"], rule, item["query"], mutant))
    pairs = pairs[:: args.every][: args.limit]
    verdicts: Counter = Counter()
    seconds = []
    for db, rule, gold, mutant in pairs:
        if db not in schemas:  # read as a pairs file's pair would be: DDL text, SQLite queries
            ddl = (SPIDER / "databases" / db / "schema.sql").read_text()
            schemas[db] = pair_schema(QueryPair.model_validate(
                {"id": db, "sql1": gold, "sql2": gold, "schema": ddl, "dialect": "sqlite"}))
        res = find_counterexample(gold, mutant, schemas[db], dialect="sqlite", budget=FinderBudget())
        verdicts[res.verdict] += 1
        seconds.append(res.seconds)
        if res.verdict != "not_equivalent":
            why = f"  [{res.error[:120]}]" if res.error else ""
            print(f"{res.verdict:32s} {db:24s} {rule:14s} {gold}  ||  {mutant}{why}", flush=True)
    print(dict(verdicts))
    print(f"spider mutations: {verdicts['not_equivalent']}/{len(pairs)} separated, "
          f"{verdicts['error']} errors, median {statistics.median(seconds):.2f} s per pair")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
