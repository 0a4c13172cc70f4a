"""Benchmark: the counterexample finder on a hand-written corpus across its defect classes.

Default input: ``data/equivalence/finder_corpus.jsonl`` and ``finder_corpus_qa.jsonl`` — pairs
written for this benchmark (not taken from a published set), one JSON object a line:
``{"class", "expect", "note", "pair", "budget"?}`` with ``pair`` a
:class:`schemas.equivalence.QueryPair`, ``budget`` optional :class:`FinderBudget` fields, and
``expect`` one of

- ``not_equivalent``: the finder must separate the pair with a verified counterexample;
- ``no_counterexample``: the pair is equivalent; a counterexample would be false (any other
  verdict but ``error`` is fine);
- ``nondeterministic``: the pair differs only by an arbitrary choice its SQL leaves to the
  engine (ties under ORDER BY, LIMIT over ties, STRING_AGG's order, ...): the finder must say
  ``nondeterministic`` — a counterexample would be false;
- ``error_on_instance``: the queries agree wherever both run, one raises somewhere; the finder
  must say ``error_on_instance`` — a counterexample would be false;
- ``schema_error``: the schema must be refused with an error naming the statement (it would
  otherwise be read smaller than written).

Classes of the first file: MySQL/backtick DDL with queries in another dialect, one-sided
runtime errors, rewrite-engine SQL (``$f0``, ``EXPR$0``, ``VALUES ... AS t(EXPR$0)``, GROUP BY
literals, ``UNIX_TIMESTAMP``, MySQL ``||``), HAVING / COUNT thresholds that need more rows than
the random instances hold, NULL semantics, bag vs set, ORDER BY / LIMIT ties. The second file
holds the QA round's attacks: ties under ORDER BY, arbitrary choices (LIMIT, STRING_AGG, windows,
bare columns, DISTINCT ON), volatile functions, float tolerance, dialect semantics (PostgreSQL on a
real server, MySQL's collations and ``/``), the schema reader (untyped columns, generated
columns, MySQL/T-SQL/PostgreSQL key syntax, enums, SETs, lengths), bounded time (wide results,
timeouts), FK cycles and self-references, missed boundaries, qualified tables. The classic
fixtures (``classic_not_equivalent.jsonl``, ``equivalent_rewrites.jsonl``) run too, with the
expectation their label gives. Every pair runs with the default :class:`FinderBudget` unless
its line says otherwise. PostgreSQL pairs start the embedded server under ``QUERYLAB_HOME``.

Prints one line per pair (verdict, the size of the instance that separated it and how it was
made, seconds), found/expected per class, then the figure (last line)::

    counterexample corpus: <found>/<expected> inequivalent separated, <n> false counterexamples,
    nondeterministic <k>/<m>, error_on_instance <k>/<m>, schema errors <k>/<m>, median <s> s per
    pair (max <s>), load <1-min load average>

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
from tasks.equivalence.counterexample import find_counterexample
from tasks.equivalence.pairs import pair_schema
from tasks.equivalence.instances import SchemaError

DATA = ROOT / "data" / "equivalence"
DEFAULT = [DATA / "finder_corpus.jsonl", DATA / "finder_corpus_qa.jsonl",
           DATA / "classic_not_equivalent.jsonl", DATA / "equivalent_rewrites.jsonl"]
EXPECTS = ("not_equivalent", "no_counterexample", "nondeterministic", "error_on_instance", "schema_error")


def load_cases(path: Path) -> list[tuple[str, str, QueryPair, dict]]:
    """``(class, expect, pair, budget)`` for every line of a corpus file (``{"class",
    "expect", "pair", "budget"?}``) or of a plain pairs file (class = the file's stem, expect
    from the label)."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        obj = json.loads(line)
        if "pair" in obj:
            if obj["expect"] not in EXPECTS:
                raise SystemExit(f"{path}:{n}: expect must be one of {EXPECTS}")
            out.append((obj["class"], obj["expect"], QueryPair.model_validate(obj["pair"]),
                        obj.get("budget") or {}))
            continue
        pair = QueryPair.model_validate(obj)
        label = pair.label_for("semantic")
        if label is None:
            raise SystemExit(f"{path}:{n}: a plain pair needs a label to say what to expect")
        out.append((path.stem, "no_counterexample" if label else "not_equivalent", pair, {}))
    return out


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or DEFAULT
    cases = [c for p in paths for c in load_cases(p)]
    per_class: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    counts = {e: [0, 0] for e in EXPECTS}  # [as expected, expected]
    false = 0
    seconds: list[float] = []
    problems = []
    for cls, expect, pair, budget_fields in cases:
        budget = FinderBudget(**budget_fields)
        start = time.perf_counter()
        try:
            schema = pair_schema(pair)
        except SchemaError as exc:
            took = time.perf_counter() - start
            seconds.append(took)
            ok = expect == "schema_error"
            counts[expect][1] += 1
            counts[expect][0] += ok
            per_class[cls][0] += ok
            per_class[cls][1] += 1
            print(f"{'ok' if ok else 'MISS':5s} {cls:20s} {pair.id:34s} {expect:18s} → {'schema_error':32s} "
                  f"{took:6.2f}s  {str(exc)[:110]}", flush=True)
            if not ok:
                problems.append(f"{pair.id}: expected {expect}, the schema was refused: {exc}")
            continue
        res = find_counterexample(pair.sql1, pair.sql2, schema, dialect=pair.dialect, budget=budget)
        took = time.perf_counter() - start
        seconds.append(took)
        separated = res.verdict == "not_equivalent" and bool(res.verified)
        counts[expect][1] += 1
        if expect == "not_equivalent":
            ok = separated
        else:
            false += separated
            ok = not separated and res.verdict != "error" and (
                expect not in ("nondeterministic", "error_on_instance") or res.verdict == expect)
            ok = ok and expect != "schema_error"
        counts[expect][0] += ok
        per_class[cls][0] += ok
        per_class[cls][1] += 1
        status = "ok" if ok else ("FALSE" if separated else "MISS")
        size = (f"found at {res.rows_before_shrink} rows ({res.found_by}), minimal {res.rows}"
                if separated else res.error or "; ".join(res.choices[:1]))
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
    found, expected = counts["not_equivalent"]
    nd, eoi, se = counts["nondeterministic"], counts["error_on_instance"], counts["schema_error"]
    print(f"counterexample corpus: {found}/{expected} inequivalent separated, {false} false "
          f"counterexamples, nondeterministic {nd[0]}/{nd[1]}, error_on_instance {eoi[0]}/{eoi[1]}, "
          f"schema errors {se[0]}/{se[1]}, median {statistics.median(seconds):.2f} s per pair "
          f"(max {max(seconds):.2f}), load {load:.2f}")
    return 0 if not problems and not false else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
