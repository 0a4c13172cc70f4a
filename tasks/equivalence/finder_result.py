"""The counterexample finder's result for one pair (:class:`FinderResult`: verdict,
counterexample script, budget spent, readings and notes; its log line and ``details`` dict).

Split out of :mod:`tasks.equivalence.counterexample`; the code moved verbatim."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class FinderResult:
    """What the finder concluded for one pair.

    - ``verdict``: ``not_equivalent`` / ``no_counterexample_within_budget`` /
      ``nondeterministic`` (results differed only as an arbitrary choice explains:
      ``choices`` lists the constructs, ``choice_instances`` counts such instances) /
      ``error_on_instance`` (no instance separated the results, but on some instance exactly
      one query raised: ``error`` says which and why, ``error_script`` is a minimal such
      database) / ``error``;
    - ``counterexample``: the minimal instance as a CREATE TABLE + INSERT script (in the pair's
      dialect), ``instance`` the same rows as ``{table: [row, ...]}``, ``rows`` their number;
    - ``verified``: the rendered script, executed on a fresh database with the keys declared,
      separates the queries. Always True with ``not_equivalent``: a candidate that does not
      verify is rejected and the search goes on; ``verify_error`` is kept for callers that
      verify other scripts;
    - ``result1``/``result2``: previews of both results on the counterexample;
    - ``instances_tried``: instances executed during the search (the budget spent),
      ``search_s``/``shrink_s``/``seconds``: wall time in seconds (``seconds`` is all of it);
      ``hit_time_limit``: the search stopped at the time limit; ``timeouts``: instances on
      which a query hit the per-query time limit (never counted as an error or a difference);
      ``found_at``: index of the first separating instance (0 = the empty database);
      ``rows_before_shrink``: the size of the instance that separated the queries (rows over
      all tables), ``found_by`` how it was made (``random``, ``large``, ``guided: <predicate>
      → <n> rows in <table>``);
    - ``size_hints``: the instance shapes the predicates asked for (and those over the row
      budget); ``type_errors``: type-incorrect comparisons in the queries
      (``DNAME INT = 'SECURITY'``); ``readings``: every non-default reading of the SQL (schema
      DDL in another dialect, ``||`` as concatenation, a GROUP BY literal as a constant,
      ``now()`` frozen, the engine and what it approximates) — nothing is decided silently;
    - ``engine``: ``duckdb``, ``sqlite`` or ``postgres``; ``notes``: e.g. constraints the
      schema reader dropped, instances that did not load.
    """

    verdict: str
    counterexample: str | None = None
    instance: dict[str, list[list]] | None = None
    rows: int | None = None
    verified: bool | None = None
    verify_error: str | None = None
    result1: str | None = None
    result2: str | None = None
    instances_tried: int = 0
    found_at: int | None = None
    rows_before_shrink: int | None = None
    found_by: str | None = None
    search_s: float = 0.0
    shrink_s: float = 0.0
    seconds: float = 0.0
    hit_time_limit: bool = False
    timeouts: int = 0
    engine: str = "duckdb"
    error: str | None = None
    error_script: str | None = None
    one_sided_errors: int = 0
    choice_instances: int = 0
    choices: list[str] = field(default_factory=list)
    size_hints: list[str] = field(default_factory=list)
    type_errors: list[str] = field(default_factory=list)
    readings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def _spent(self) -> str:
        limit = " (time limit reached)" if self.hit_time_limit else ""
        timeouts = f", {self.timeouts} query timeout(s)" if self.timeouts else ""
        return f"{self.instances_tried} instance(s), {self.seconds:.2f} s{limit}{timeouts}"

    def summary(self) -> str:
        """One line for logs and the ``explanation`` column."""
        if self.verdict == "not_equivalent":
            return (f"counterexample with {self.rows} row(s) (found at {self.rows_before_shrink} "
                    f"row(s), {self.found_by}) after {self._spent()}: "
                    f"sql1 → {self.result1}; sql2 → {self.result2}")
        if self.verdict == "error":
            return f"error: {self.error}"
        if self.verdict == "error_on_instance":
            extra = f"; {self.type_errors[0]}" if self.type_errors else ""
            return (f"no counterexample in {self._spent()}, but on {self.one_sided_errors} "
                    f"instance(s) one query fails: {self.error}{extra} (an error is not a result)")
        if self.verdict == "nondeterministic":
            why = "; ".join(self.choices[:3]) or "an arbitrary choice"
            return (f"no counterexample in {self._spent()}; on {self.choice_instances} "
                    f"instance(s) the results differed only as the SQL's arbitrary choices allow "
                    f"({why}) — not a counterexample, and not a proof of equivalence")
        return f"no counterexample in {self._spent()} (not a proof of equivalence)"

    def details(self) -> dict[str, Any]:
        """The facts behind the verdict as a JSON-able dict (the ``details`` column)."""
        return {
            "engine": self.engine, "found_at": self.found_at,
            "rows_before_shrink": self.rows_before_shrink, "found_by": self.found_by,
            "search_s": self.search_s, "shrink_s": self.shrink_s, "seconds": self.seconds,
            "hit_time_limit": self.hit_time_limit, "timeouts": self.timeouts,
            "result1": self.result1, "result2": self.result2, "instance": self.instance,
            "one_sided_errors": self.one_sided_errors, "error_script": self.error_script,
            "choice_instances": self.choice_instances, "choices": self.choices,
            "size_hints": self.size_hints, "type_errors": self.type_errors,
            "readings": self.readings, "notes": self.notes,
        }
