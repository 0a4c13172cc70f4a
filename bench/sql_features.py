"""Benchmark: SQL feature extraction over every gold query of TPC-DS (99), Spider dev (1,034)
and BIRD dev (1,534).

Loads the corpora first (not timed), then times :func:`tasks.text2sql.sql_features.extract_features`
(parse + scope analysis + all features) over all queries, best of ``--repeat`` passes (default 3;
the machine is shared and noisy). Prints per-corpus throughput, then the figure:

    sql features: <q/s> queries/s (<n> queries in <s> s; target >= 200/s)

Usage: ``.venv/bin/python bench/sql_features.py [--shared-data DIR] [--repeat N]``; exit status 1
when a query could not be read or the target is missed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.text2sql.corpora import load_corpus, load_tpcds_corpus
from tasks.text2sql.sql_features import SQLFeatureError, extract_features, prepare_schema

TARGET_QPS = 200.0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared-data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    data = Path(args.shared_data)
    corpora = [
        load_tpcds_corpus(),
        load_corpus(
            data / "sql_corpora" / "spider_dev_gold.sql",
            tables_json=data / "spider" / "tables.json",
        ),
        load_corpus(data / "sql_corpora" / "bird_dev_gold.sql"),
    ]
    work = []
    for c in corpora:
        schemas = {db: prepare_schema(s) for db, s in c.schemas.items()}
        work.append((c.name, [(q.sql, c.dialect, schemas.get(q.db_id)) for q in c]))
    n = sum(len(items) for _, items in work)
    best: dict[str, float] = {}
    failures = 0
    for _ in range(max(1, args.repeat)):
        for name, items in work:
            start = time.perf_counter()
            for sql, dialect, schema in items:
                try:
                    extract_features(sql, dialect, schema)
                except SQLFeatureError:
                    failures += 1
            elapsed = time.perf_counter() - start
            best[name] = min(best.get(name, float("inf")), elapsed)
    for name, items in work:
        print(f"{name:>7}: {len(items):5d} queries, {len(items) / best[name]:8.1f} queries/s")
    total = sum(best.values())
    qps = n / total
    if failures:
        print(f"{failures // max(1, args.repeat)} queries could not be read")
    print(
        f"sql features: {qps:.0f} queries/s ({n} queries in {total:.2f} s; target >= {TARGET_QPS:.0f}/s)"
    )
    return 0 if qps >= TARGET_QPS and not failures else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
