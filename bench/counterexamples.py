"""Benchmark: the counterexample finder on a hand-written corpus across its defect classes.

Default input: ``data/equivalence/finder_corpus.jsonl`` — pairs written for this benchmark (not
taken from a published set), one JSON object a line: ``{"class", "expect", "note", "pair"}``
with ``pair`` a :class:`schemas.equivalence.QueryPair` and ``expect`` one of

- ``not_equivalent``: the finder must separate the pair with a verified counterexample;
- ``no_counterexample``: the pair is equivalent; a counterexample would be false;
- ``error_on_instance``: the queries agree wherever both run, one raises somewhere; the finder
  must say ``error_on_instance`` — a counterexample would be false.

Classes: MySQL/backtick DDL with queries in another dialect, one-sided runtime errors,
rewrite-engine SQL (``$f0``, ``EXPR$0``, ``VALUES ... AS t(EXPR$0)``, GROUP BY literals,
``UNIX_TIMESTAMP``, MySQL ``||``), HAVING / COUNT thresholds that need more rows than the
random instances hold, NULL semantics, bag vs set, ORDER BY / LIMIT ties. The classic
fixtures (``classic_not_equivalent.jsonl``, ``equivalent_rewrites.jsonl``) run too, with the
expectation their label gives. Every pair runs with the default :class:`FinderBudget`.

Prints one line per pair (verdict, the size of the instance that separated it and how it was
made, seconds), found/expected per class, then the figure (last line)::

    counterexample corpus: <found>/<expected> inequivalent separated, <n> false counterexamples,
    error_on_instance <k>/<m>, median <s> s per pair (max <s>), load <1-min load average>

Usage: ``.venv/bin/python bench/counterexamples.py [FILE.jsonl ...]``. Exit status 1 when an
inequivalent pair is not separated or any counterexample is false.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from schemas.equivalence import FinderBudget, QueryPair
from tasks.counterexample import find_counterexample
from tasks.equivalence import pair_schema

DATA = ROOT / "data" / "equivalence"
DEFAULT = [DATA / "finder_corpus.jsonl", DATA / "classic_not_equivalent.jsonl",
           DATA / "equivalent_rewrites.jsonl"]


def load_cases(path: Path) -> list[tuple[str, str, QueryPair]]:
    """``(class, expect, pair)`` for every line of a corpus file (``{"class", "expect",
    "pair"}``) or of a plain pairs file (class = the file's stem, expect from the label)."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        obj = json.loads(line)
        if "pair" in obj:
            out.append((obj["class"], obj["expect"], QueryPair.model_validate(obj["pair"])))
            continue
        pair = QueryPair.model_validate(obj)
        label = pair.label_for("semantic")
        if label is None:
            raise SystemExit(f"{path}:{n}: a plain pair needs a label to say what to expect")
        out.append((path.stem, "no_counterexample" if label else "not_equivalent", pair))
    return out


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or DEFAULT
    cases = [c for p in paths for c in load_cases(p)]
    budget = FinderBudget()
    per_class: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    found = expected = false = eoi = eoi_expected = 0
    seconds: list[float] = []
    problems = []
    for cls, expect, pair in cases:
        start = time.perf_counter()
        res = find_counterexample(pair.sql1, pair.sql2, pair_schema(pair), dialect=pair.dialect,
                                  budget=budget)
        took = time.perf_counter() - start
        seconds.append(took)
        separated = res.verdict == "not_equivalent" and bool(res.verified)
        if expect == "not_equivalent":
            expected += 1
            found += separated
            ok = separated
        else:
            false += separated
            ok = not separated and (expect != "error_on_instance" or res.verdict == "error_on_instance")
            if expect == "error_on_instance":
                eoi_expected += 1
                eoi += res.verdict == "error_on_instance"
        per_class[cls][0] += ok
        per_class[cls][1] += 1
        status = "ok" if ok else ("FALSE" if separated else "MISS")
        size = (f"found at {res.rows_before_shrink} rows ({res.found_by}), minimal {res.rows}"
                if separated else res.error or "")
        print(f"{status:5s} {cls:20s} {pair.id:34s} {expect:18s} → {res.verdict:32s} "
              f"{took:6.2f}s  {size[:110]}", flush=True)
        if not ok:
            problems.append(f"{pair.id}: expected {expect}, got {res.verdict} ({res.summary()[:200]})")
    print()
    for cls, (ok, n) in sorted(per_class.items()):
        print(f"  {cls:24s} {ok}/{n} as expected")
    for p in problems:
        print(f"  problem: {p}")
    load = os.getloadavg()[0]
    print(f"counterexample corpus: {found}/{expected} inequivalent separated, {false} false "
          f"counterexamples, error_on_instance {eoi}/{eoi_expected}, median "
          f"{statistics.median(seconds):.2f} s per pair (max {max(seconds):.2f}), load {load:.2f}")
    return 0 if found == expected and not false and eoi == eoi_expected else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
