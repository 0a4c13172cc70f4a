"""Automatic counterexample finder for SQL (non-)equivalence.

Given two queries and a schema with its keys, search small database instances for one on which
the two queries return different results; shrink the first one found to a minimal one; emit it
as CREATE TABLE + INSERT statements. Verdicts:

- ``not_equivalent``: a counterexample was found, shrunk, rendered and *verified* by executing
  the rendered script on a fresh database with the schema's keys declared: no result the first
  query may return on it equals a result the second may return (:func:`tasks.equivalence.instances.separation`);
- ``no_counterexample_within_budget``: the budget (instances, seconds) ran out. Search alone
  never proves equivalence, so the finder never says ``equivalent``;
- ``nondeterministic``: no counterexample, but on some instances the two queries returned
  different results only in a way an arbitrary choice the SQL leaves to the engine explains
  (rows tied under ORDER BY, which tied rows a LIMIT keeps, STRING_AGG's order, a window
  function over peers, a bare column, ``random()``: :mod:`tasks.equivalence.outcomes`); the reason says
  which. Such a difference is never a counterexample;
- ``error_on_instance``: no instance separated the results, but on some instance exactly one
  query raised a runtime error (DuckDB's conversion error for ``DNAME INT = 'SECURITY'``, a
  scalar subquery returning two rows, PostgreSQL's division by zero). An error is not a result:
  such an instance is never a counterexample, the search goes on, and the first one (shrunk) is
  reported with its error. A query that hits the per-query time limit is a *timeout*, counted
  and reported, never a runtime error;
- ``error``: a query does not parse, reads an unknown table, or fails on the empty database.

Engines (:func:`tasks.equivalence.instances.engine_for`): a PostgreSQL pair runs on a real PostgreSQL
server (a scratch database, dropped at the end), SQLite on SQLite, DuckDB on DuckDB, MySQL on
DuckDB with MySQL's comparison rules approximated, other dialects on DuckDB; every
approximation, every non-default reading of the SQL (:mod:`tasks.equivalence.sql_dialects`: rewrite-engine
identifiers, MySQL ``||``, ``GROUP BY`` literals, ``UNIX_TIMESTAMP``, ``now()`` frozen to one
instant) and a fallback from DuckDB to SQLite is listed in :attr:`FinderResult.readings`.
Comparisons of a typed column with a string it cannot hold are listed as ``type_errors``.

How instances are made (deterministic for a given seed):

- tables: the tables both queries read plus those they reference through foreign keys;
- values per column: a small base pool of its type (``-1, 0, 1, 2`` / ``'a', 'b'`` / dates /
  timestamps at midnight and at noon ..., shared by all columns of a type so joins hit), the
  constants of both queries that are compared with the column (directly, through an aggregate,
  in IN / BETWEEN / LIKE, through ``LENGTH``) and their neighbours (``c-1, c, c+1``; a string
  matching a LIKE pattern; the next/previous string; the string with a leading / trailing space
  and in the other case; strings of the length around a ``LENGTH`` constant; ±1 day, ±1 second
  and +12 hours of a date or timestamp), spread over columns linked by equality predicates and
  foreign keys; NULL when the column is nullable — only values the declared type holds
  (``VARCHAR(n)``, unsigned and small integer ranges, ``DECIMAL(p, s)``, enums and SETs);
- instance shapes: empty tables, 1 row per table first and growing to ``max_rows``, profiles
  with no/some/many NULLs and with duplicated rows (copies that differ only in their key
  columns, which also makes ties at MIN/MAX and in ORDER BY); later, now and then, *large*
  instances of up to ``3 × max_rows`` rows per table;
- predicate-guided shapes: ``COUNT`` compared with a constant (in HAVING, a correlated scalar
  subquery, an aggregate's alias tested outside, ``BETWEEN`` and ``IN`` lists of counts),
  ``LIMIT`` / ``OFFSET``, ``NTILE`` / ``LAG`` arguments and long IN lists ask for a number of
  rows (the constant and its neighbours); every third instance then puts that many rows in one
  of the predicate's tables, in one group (its GROUP BY and correlation columns held equal, a
  COUNT(DISTINCT c) column varied), up to the ``row_budget``. The size of the instance that
  separated a pair and how it was made are reported (``rows_before_shrink``, ``found_by``);
- CHECK constraints are declared in the search sandbox too, so an instance breaking one does not
  load (and is not counted as separating); generated columns are computed by the engine;
- keys honoured: PRIMARY KEY and UNIQUE values distinct (NULLs too under ``NULLS NOT
  DISTINCT``; case-insensitively for MySQL), NOT NULL never NULL, FOREIGN KEY values taken from
  the referenced table's rows (or NULL when the column allows it) — a self-reference from the
  table's own rows (a row may reference itself), a foreign key closing a cycle filled once both
  tables have rows.

An instance *separates* the queries when their results differ under the match options (bag
semantics by default, row order only when both queries have a top-level ORDER BY, column order
free, numbers within a relative/absolute tolerance) in a way no arbitrary choice explains
(:func:`tasks.equivalence.instances.separation`: rows tied under ORDER BY compared as bags, the rows a LIMIT
may keep computed from the tie groups, cells an arbitrary choice fills matching anything). A
runtime error in one query while the other returns rows is *not* a difference (see
``error_on_instance``).

Time: the search stops at ``time_limit_s``; each query's own limit is the smaller of
``query_timeout_s`` and the time left; shrinking and verifying a candidate get at most half
the time limit more (a partly shrunk, still verified instance is reported when that runs
out). A run that hit its limit says so (``hit_time_limit``).

Shrinking: delta debugging (``ddmin``, Zeller & Hildebrandt, "Simplifying and Isolating
Failure-Inducing Input", TSE 2002) over the instance's rows, removing rows that reference a
removed row; the result is 1-minimal (removing any one row no longer separates the queries).
Then non-key values are simplified (``0``, ``'a'``, ...) where the queries stay separated. A
large guided instance shrinks the same way (the rows a threshold needs stay).

Why not a property-testing library (hypothesis): its engine shrinks well but is built to run
as a test, with health checks, deadlines, an example database and non-deterministic stopping;
we need a fixed, reported budget (instances and seconds), schema- and key-aware generation,
and the first separating instance. The search here is a deterministic seeded loop; ``ddmin``
is the textbook algorithm (about thirty lines).
"""

from __future__ import annotations

import time

from sqlglot import exp
from sqlglot.errors import SqlglotError

from schemas.equivalence import FinderBudget, MatchOptions
from tasks.equivalence.instances import (
    EngineChoice,
    EngineQuery,
    Instance,
    Outcome,
    RelSchema,
    SchemaError,
    adapt_to_schema,
    engine_for,
    one_sided_error,
    one_sided_timeout,
    prepare_query,
    separation,
)
from tasks.equivalence.sql_dialects import read_query, sqlglot_dialect
from tasks.equivalence.finder_result import FinderResult
from tasks.equivalence.instance_db import InstanceDB
from tasks.equivalence.instance_generator import InstanceGenerator
from tasks.equivalence.shrinking import _instance_key, _shrink
from tasks.equivalence.value_domains import _Analysis, build_domains
from tasks.equivalence.verification import instance_rows, render_instance, verify_counterexample


# --------------------------------------------------------------------------------------------
# The finder
# --------------------------------------------------------------------------------------------


class _Runner:
    """Runs both queries on instances in one sandbox and decides separation
    (:func:`tasks.equivalence.instances.separation`). An instance on which exactly one query raises
    separates nothing; the first such instance and its error are kept (:attr:`one_sided`).
    A query over the per-query time limit is a timeout (counted, never an error). Each query
    gets at most the time left until :attr:`deadline`."""

    def __init__(self, box: InstanceDB, q1: EngineQuery, q2: EngineQuery, match: MatchOptions,
                 ordered: bool, fold: bool, deadline: float, abs_tol: float | None = None) -> None:
        self.box, self.q1, self.q2 = box, q1, q2
        self.opts = {"ordered": ordered, "bag": match.bag, "permute_columns": match.permute_columns,
                     "fold": fold, "abs_tol": abs_tol}
        self.deadline = deadline
        self.runs = 0
        self.load_errors = 0
        self.last_load_error: str | None = None
        self.one_sided: tuple[Instance, str] | None = None
        self.one_sided_count = 0
        self.timeouts = 0
        self.last_timeout: str | None = None
        self.choice_count = 0
        self.choice_reasons: list[str] = []

    def _run(self, sql: str) -> Outcome:
        left = self.deadline - time.perf_counter()
        return self.box.run(sql, timeout_s=max(0.05, left))

    def outcomes(self, inst: Instance) -> tuple[Outcome, Outcome]:
        self.runs += 1
        try:
            self.box.load(inst)
        except self.box._errors as exc:
            # a value the engine refuses for a column type, or a CHECK the instance breaks:
            # not an instance, never separating
            self.load_errors += 1
            self.last_load_error = str(exc).splitlines()[0][:200]
            failed = Outcome(error="instance does not load")
            return failed, failed
        return self._run(self.q1.sql), self._run(self.q2.sql)

    def decide(self, outs: tuple[Outcome, Outcome], count: bool = False):
        """The :class:`tasks.equivalence.instances.Separation` of the loaded instance (``count``: record
        timeouts and choices for the report)."""
        a, b = outs
        if a.timeout or b.timeout:
            if count:
                self.timeouts += 1
                self.last_timeout = one_sided_timeout(a, b)
            return None
        if a.error is not None or b.error is not None:
            return None
        sep = separation(self._run, self.q1, self.q2, a, b, **self.opts)
        if count and sep.kind == "choice":
            self.choice_count += 1
            for part in sep.reason.split(" | "):
                if part not in self.choice_reasons and len(self.choice_reasons) < 6:
                    self.choice_reasons.append(part)
        return sep

    def note_one_sided(self, inst: Instance, outs: tuple[Outcome, Outcome]) -> None:
        """Count a search instance on which exactly one query fails (keep the first)."""
        message = one_sided_error(*outs)
        if message is not None:
            self.one_sided_count += 1
            if self.one_sided is None:
                self.one_sided = (inst, message)

    def separates(self, inst: Instance) -> bool:
        """``inst`` is a counterexample (the results differ in a way no arbitrary choice
        explains)."""
        sep = self.decide(self.outcomes(inst))
        return sep is not None and sep.certain

    def one_side_fails(self, inst: Instance) -> bool:
        """Exactly one query raises on ``inst`` (not counted as a search result)."""
        return one_sided_error(*self.outcomes(inst)) is not None


def find_counterexample(
    sql1: str,
    sql2: str,
    schema: RelSchema,
    *,
    dialect: str | None = "duckdb",
    budget: FinderBudget | None = None,
    match: MatchOptions | None = None,
    engine: str = "auto",
    shrink: bool = True,
) -> FinderResult:
    """Search for a database instance on which ``sql1`` and ``sql2`` return different results
    (see :func:`_find`; a query nested too deeply for sqlglot is an ``error`` verdict, never a
    traceback)."""
    start = time.perf_counter()
    try:
        return _find(sql1, sql2, schema, dialect, budget, match, engine, shrink)
    except RecursionError:
        return FinderResult("error", error="a query is nested too deeply to analyse (sqlglot's "
                            "recursion limit)", seconds=time.perf_counter() - start)


def _find(sql1: str, sql2: str, schema: RelSchema, dialect: str | None, budget: FinderBudget | None,
          match: MatchOptions | None, engine: str, shrink: bool) -> FinderResult:
    """Search for a database instance on which ``sql1`` and ``sql2`` return different results.

    ``schema``: the tables with their keys (:class:`tasks.equivalence.instances.RelSchema`); ``dialect``:
    the sqlglot dialect of both queries (or ``ansi`` / ``calcite``); ``engine``: ``auto``
    (:func:`tasks.equivalence.instances.engine_for`: PostgreSQL for the postgres dialect, SQLite for
    sqlite, else DuckDB, falling back to SQLite — stated in ``readings`` — when DuckDB cannot
    bind a query that SQLite runs), or one of ``duckdb`` / ``sqlite`` / ``postgres``.
    ``budget``/``match``: see :class:`FinderBudget` and :class:`MatchOptions`. Returns a
    :class:`FinderResult` (errors are reported in it, not raised).
    """
    budget = budget or FinderBudget()
    match = match or MatchOptions()
    shown = dialect = dialect or "duckdb"
    start = time.perf_counter()
    deadline = start + budget.time_limit_s
    result = FinderResult("error", notes=[n for n in schema.notes if not n.startswith("schema DDL")],
                          readings=[n for n in schema.notes if n.startswith("schema DDL")])

    def fail(message: str) -> FinderResult:
        result.error = message
        result.seconds = time.perf_counter() - start
        return result

    try:
        dialect = sqlglot_dialect(dialect)  # ansi / calcite → sqlglot's neutral dialect
        reads = []
        for n, sql in enumerate((sql1, sql2), start=1):
            try:
                reads.append(adapt_to_schema(read_query(sql, dialect), schema))
            except ValueError as exc:
                return fail(f"sql{n} {exc}")
    except ValueError as exc:
        return fail(f"query does not parse: {exc}")
    for n, q in enumerate(reads, start=1):
        result.readings.extend(f"sql{n}: {r}" for r in q.readings)
    try:
        analysis = _Analysis(schema, [q.tree for q in reads], dialect)
    except KeyError as exc:
        return fail(str(exc).strip('"'))
    except RecursionError:
        return fail("a query is nested too deeply to analyse")
    for q in reads:
        from tasks.equivalence.sql_dialects import strip_qualifiers

        _, dropped = strip_qualifiers(q.tree)
        if dropped:
            result.readings.append(f"table qualifiers dropped for the sandbox ({', '.join(dropped[:4])} → "
                                   "one schema holds every table)")
            break
    result.type_errors = list(analysis.type_errors)
    ordered = match.order == "always" or (
        match.order == "auto" and all(q.tree.args.get("order") is not None for q in reads))
    first = engine_for(shown, engine)
    result.engine = first.engine
    domains = build_domains(schema, analysis, fold=first.mysql)
    tables = analysis.tables
    result.size_hints = [f"{h.reason} → {h.size} rows" for h in analysis.hints
                         if h.size <= budget.row_budget]
    over = sorted({(h.reason, h.size) for h in analysis.hints if h.size > budget.row_budget})
    if over:
        result.notes.append(f"{len(over)} instance size(s) the predicates ask for exceed the row "
                            f"budget {budget.row_budget} and were not tried (e.g. {over[0][0]} → "
                            f"{over[0][1]} rows)")
    candidates = [first]
    if engine == "auto" and first.engine == "duckdb" and not first.integer_division:
        candidates.append(EngineChoice("sqlite", mysql=first.mysql, readings=[
            r.replace("DuckDB", "SQLite") for r in first.readings]))
    pg = None
    box = runner = None
    chosen: EngineChoice | None = None
    errors = []
    try:
        if first.engine == "postgres":
            from tasks.db.pg_scratch import PostgresUnavailable, ScratchDatabase

            try:
                pg = ScratchDatabase()
            except (PostgresUnavailable, Exception) as exc:  # noqa: BLE001 - stated, then DuckDB
                return fail(f"no scratch PostgreSQL database: {exc}")
        for cand in candidates:
            eng = cand.engine
            try:
                q1, q2 = prepare_query(reads[0], schema, cand), prepare_query(reads[1], schema, cand)
                many = max(sum(1 for _ in q.tree.find_all(exp.Table)) for q in reads) >= 6
                box = InstanceDB(schema, tables, eng, checks=True, query_timeout_s=budget.query_timeout_s,
                              mysql=cand.mysql, integer_division=cand.integer_division, pg=pg,
                              many_joins=many)
            except (SqlglotError, SchemaError, ValueError) as exc:
                errors.append(f"{eng}: {exc}")
                continue
            except RecursionError:
                errors.append(f"{eng}: a query is nested too deeply to write for the engine")
                continue
            runner = _Runner(box, q1, q2, match, ordered, cand.mysql, deadline,
                             cand.abs_tol(reads[0].tree, reads[1].tree))
            empty_outcome = runner.outcomes({t: [] for t in tables})
            bad = [(i + 1, o.error) for i, o in enumerate(empty_outcome) if o.error is not None and not o.timeout]
            if not bad:
                chosen = cand
                result.engine = eng
                result.notes.extend(box.notes)
                result.readings.extend(cand.readings)
                if eng != candidates[0].engine:
                    result.readings.append(
                        f"engine fallback: ran on {eng}, whose semantics differ from {shown}'s "
                        f"(type affinity, comparisons), because {errors[-1]}")
                break
            errors.append(f"{eng}: " + "; ".join(f"sql{i} fails on the empty database: {e}" for i, e in bad))
            box.close()
            box = runner = None
        if box is None or runner is None or chosen is None:
            return fail(errors[0] if errors else "no engine")
        for n, q in enumerate((q1, q2), start=1):
            if q.plan.choices:
                result.choices.extend(f"sql{n}: {c}" for c in q.plan.choices if f"sql{n}: {c}" not in result.choices)
        _search(result, runner, schema, tables, analysis, domains, budget, match, ordered, chosen,
                sql1, sql2, dialect, pg, shrink, start, deadline, empty_outcome)
    finally:
        if box is not None:
            box.close()
        if pg is not None:
            pg.close()
    result.seconds = time.perf_counter() - start
    return result


def _search(result: FinderResult, runner: _Runner, schema: RelSchema, tables: list[str],
            analysis: _Analysis, domains, budget: FinderBudget, match: MatchOptions,
            ordered: bool, chosen: EngineChoice, sql1: str, sql2: str, dialect: str, pg,
            shrink: bool, start: float, deadline: float, empty_outcome) -> None:
    """The search loop of :func:`find_counterexample` (fills ``result``)."""
    box = runner.box
    gen = InstanceGenerator(schema, tables, domains, budget, analysis.hints, fold=chosen.mysql)
    seen: set = set()
    tried = misses = rejected = failed_checks = 0
    uncertifiable: str | None = None
    last_check_error = ""
    shrink_s = 0.0
    exhausted = False
    shrink_deadline = deadline

    def verify(inst: Instance):
        script = render_instance(schema, inst, dialect, tables=analysis.queried)
        check = verify_counterexample(
            sql1, sql2, script, dialect=dialect, schema=schema, choice=chosen,
            ordered=ordered, bag=match.bag, permute_columns=match.permute_columns,
            query_timeout_s=budget.query_timeout_s, pg=pg,
        )
        return script, check

    def stop() -> bool:
        return time.perf_counter() > shrink_deadline

    while tried < budget.max_instances and time.perf_counter() < deadline:
        inst = gen.next()
        key = _instance_key(inst)
        if key in seen:
            misses += 1
            if misses > 2000:  # consecutive repeats: the small instance space is used up
                exhausted = True
                result.notes.append("instance space exhausted before the budget")
                break
            continue
        misses = 0
        seen.add(key)
        if tried == 0:
            outs = empty_outcome
            box.load(inst)
        else:
            outs = runner.outcomes(inst)
        tried += 1
        runner.note_one_sided(inst, outs)
        sep = runner.decide(outs, count=True)
        if sep is None or not sep.certain:
            continue
        # a candidate: shrink it, render it, and check the script on a fresh database
        t0 = time.perf_counter()
        shrink_deadline = max(deadline, t0 + budget.time_limit_s / 4)
        runner.deadline = shrink_deadline
        small = _shrink(schema, tables, inst, runner.separates, stop) if shrink else inst
        script, check = verify(small)
        if not check.separates and small is not inst:
            small = inst
            script, check = verify(small)
            if check.separates:
                result.notes.append("the shrunk instance did not verify; reporting it unshrunk")
        runner.deadline = deadline
        shrink_s += time.perf_counter() - t0
        if not check.separates:
            # e.g. an arbitrary choice the fresh database made another way: keep searching
            if check.choice or not check.error:
                rejected += 1
            else:
                failed_checks += 1
                last_check_error = check.error
                if check.error.startswith("CHECK constraints of table"):
                    uncertifiable = check.error
                    break  # no database can be certified on this engine: stop searching
            continue
        if stop():
            result.notes.append("shrinking stopped at the time limit: the counterexample is "
                                "verified but may not be minimal")
        result.verdict = "not_equivalent"
        result.found_at = tried - 1
        result.rows_before_shrink = instance_rows(inst)
        result.found_by = gen.origin
        result.instance = {t: [list(r) for r in rows] for t, rows in small.items() if rows}
        result.rows = instance_rows(small)
        result.counterexample = script
        result.verified = True
        result.result1, result.result2 = check.result1, check.result2
        break
    result.one_sided_errors = runner.one_sided_count
    result.timeouts = runner.timeouts
    result.choice_instances = runner.choice_count
    for r in runner.choice_reasons:
        if r not in result.choices:
            result.choices.append(r)
    result.hit_time_limit = (result.verdict != "not_equivalent" and not exhausted
                             and tried < budget.max_instances and time.perf_counter() >= deadline)
    if result.verdict != "not_equivalent":
        result.verdict = "no_counterexample_within_budget"
        if runner.one_sided is not None:
            t0 = time.perf_counter()
            shrink_deadline = t0 + budget.time_limit_s / 4
            failing, message = runner.one_sided
            runner.deadline = shrink_deadline
            small = _shrink(schema, tables, failing, runner.one_side_fails, stop) if shrink else failing
            shrink_s += time.perf_counter() - t0
            result.verdict = "error_on_instance"
            result.error = message
            result.error_script = render_instance(schema, small, dialect, tables=analysis.queried)
        elif runner.choice_count or rejected:
            result.verdict = "nondeterministic"
            result.choice_instances = runner.choice_count + rejected
        if runner.choice_count and result.verdict == "error_on_instance":
            result.notes.append(f"{runner.choice_count} instance(s) gave results that differ only "
                                "as an arbitrary choice of the SQL allows (not counted as differences)")
    elif runner.one_sided is not None:
        result.notes.append(f"{runner.one_sided_count} instance(s) made one query fail "
                            f"(first: {runner.one_sided[1]}); not counted as differences")
    if runner.timeouts:
        result.notes.append(f"{runner.timeouts} instance(s): a query hit the per-query time limit "
                            f"(last: {runner.last_timeout}); a timeout is neither an error nor a "
                            "result, those instances separate nothing")
    if runner.load_errors:
        result.notes.append(f"{runner.load_errors} instance(s) did not load "
                            f"(last: {runner.last_load_error})")
    if rejected:
        result.notes.append(f"{rejected} candidate(s) did not verify on a fresh database "
                            "(a difference an arbitrary choice explains there)")
    if failed_checks:
        result.notes.append(f"{failed_checks} candidate(s) could not be verified: {last_check_error} "
                            "(not counted as counterexamples)")
    if uncertifiable is not None and result.verdict != "not_equivalent":
        result.verdict = "error"
        result.error = (f"the queries differ on an instance, but {uncertifiable} (the pair needs an "
                        "engine that evaluates them)")
    if result.hit_time_limit:
        result.notes.append(f"the search stopped at its time limit ({budget.time_limit_s:g} s) "
                            f"after {tried} of {budget.max_instances} instance(s)")
    result.instances_tried = tried
    result.shrink_s = shrink_s
    result.search_s = time.perf_counter() - start - shrink_s
