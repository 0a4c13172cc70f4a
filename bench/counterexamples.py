"""Benchmark: the counterexample finder on the classic non-equivalent fixtures.

Runs :func:`tasks.counterexample.find_counterexample` with the default budget on every pair of
``data/equivalence/classic_not_equivalent.jsonl`` (COUNT bug, DISTINCT vs UNION ALL, ORDER BY
LIMIT 1 vs MAX with ties, NOT IN with NULLs, LEFT JOIN + WHERE on the right table, HAVING vs
WHERE, ...). A pair counts as found when the verdict is ``not_equivalent`` and the emitted
CREATE/INSERT script was verified by execution. Prints one line per pair, then the figure:

    counterexamples found: <found>/<total> verified, <seconds> s total (target: all, <= 10 s)

Usage: ``.venv/bin/python bench/counterexamples.py [PAIRS.jsonl]``; exit status 1 when a
counterexample is missing.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from schemas.equivalence import FinderBudget
from tasks.counterexample import find_counterexample
from tasks.equivalence import load_pairs, pair_schema

DEFAULT = ROOT / "data" / "equivalence" / "classic_not_equivalent.jsonl"


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT
    pairs = load_pairs(path)
    budget = FinderBudget()
    found = 0
    start = time.perf_counter()
    for pair in pairs:
        res = find_counterexample(pair.sql1, pair.sql2, pair_schema(pair), dialect=pair.dialect,
                                  budget=budget)
        ok = res.verdict == "not_equivalent" and bool(res.verified)
        found += ok
        print(f"{pair.id:32s} {res.verdict:32s} rows={res.rows} verified={res.verified} "
              f"instances={res.instances_tried} {res.seconds:.3f}s {res.engine}", flush=True)
    seconds = time.perf_counter() - start
    print(f"counterexamples found: {found}/{len(pairs)} verified, {seconds:.2f} s total "
          f"(target: all, <= 10 s)")
    return 0 if found == len(pairs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
