"""The methods of the equivalence stage and how one (pair × method) row is computed
(:func:`evaluate`).

Methods (the ``method`` column):

- ``exec_match``: execution match on the pair's database (``db``): both queries run read-only,
  results compared with test-suite semantics (:mod:`tasks.scoring.result_match`): bag or set, row order
  only when both queries sort, columns permutable. ``equivalent`` means *the results match on
  this database*, which is how execution accuracy scores pairs (when every compared result is
  empty it is still the verdict, with a warning in ``details`` and the report); a mismatch is
  a verified counterexample (the database itself) unless an arbitrary choice the SQL leaves to
  the engine explains it (ties under ORDER BY, LIMIT over ties, ...: ``nondeterministic``, see
  :func:`tasks.equivalence.instances.separation`); exactly one query failing on the database is
  ``error_on_instance`` (an error is not a result).
- ``finder``: the automatic counterexample finder (:mod:`tasks.equivalence.counterexample`); verdicts
  ``not_equivalent`` (verified minimal counterexample), ``no_counterexample_within_budget`` or
  ``error_on_instance``; ``details`` holds the size of the instance that separated the pair,
  the readings of the SQL (schema dialect, ``||``, GROUP BY literals, engine fallback) and any
  type-incorrect comparison.
- ``judge:<technique>:<notion>:<model>``: an LLM judge (:mod:`tasks.equivalence.judges`), technique one of
  ``counter_example``, ``miniature_mull``, ``explain_compare``, notion ``semantic`` or
  ``relaxed``; a counterexample the model proposes is executed and recorded as verified or not
  (a database on which only one query raises is not verified).

Labels: ``label`` is the pair's label for the method's notion; ``label_semantic`` /
``label_relaxed`` carry both, so that pairs labelled under the other notion only (published sets
with relaxed labels) still count in the agreement-with-labels table.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlglot.errors import SqlglotError

from schemas.equivalence import (
    DECIDED,
    NOTIONS,
    TECHNIQUES,
    EquivalenceOptions,
    MatchOptions,
    QueryPair,
)
from tasks.equivalence.counterexample import find_counterexample
from tasks.equivalence.instances import RelSchema, SchemaError, database_engine
from tasks.equivalence.pairs import pair_schema, resolve_db, schema_text
from tasks.equivalence.verification import verify_counterexample
from tasks.scoring.result_match import results_match

log = logging.getLogger(__name__)

#: Revision of the methods' semantics, part of every batch key.
FINDER_REVISION = 3  # 3: unique expression / partial indexes, unenforceable CHECKs

#: Why execution match skips a pair without a database.
SKIPPED_NO_DB = ("the pair has no database (db): execution match runs both queries on the "
                 "pair's own database (a SQLite/DuckDB file, a postgresql:// URL or a name under "
                 "--db-root)")


# --------------------------------------------------------------------------------------------
# Methods
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Method:
    """A parsed method name: ``kind`` (``exec_match``/``finder``/``judge``) and, for judges,
    ``technique``, ``notion``, ``model``. ``name`` is the canonical text."""

    name: str
    kind: str
    technique: str | None = None
    notion: str = "semantic"
    model: str | None = None


def parse_method(text: str) -> Method:
    """``exec_match`` | ``finder`` | ``judge:<technique>:<notion>:<model>`` (the model may
    contain ``:``). Raises ValueError with the accepted forms."""
    text = text.strip()
    if text in ("exec_match", "finder"):
        return Method(text, text)
    parts = text.split(":", 3)
    if parts[0] == "judge" and len(parts) == 4 and all(parts):
        _, technique, notion, model = parts
        if technique not in TECHNIQUES:
            raise ValueError(f"method {text!r}: technique must be one of {list(TECHNIQUES)}")
        if notion not in NOTIONS:
            raise ValueError(f"method {text!r}: notion must be one of {list(NOTIONS)}")
        return Method(text, "judge", technique, notion, model)
    raise ValueError(
        f"unknown method {text!r}; use exec_match, finder or "
        "judge:<counter_example|miniature_mull|explain_compare>:<semantic|relaxed>:<model>"
    )


def _empty_row(pair: QueryPair, method: Method) -> dict[str, Any]:
    label = pair.label_for(method.notion)
    return {
        "pair_id": pair.id, "method": method.name, "technique": method.technique,
        "notion": method.notion, "model": method.model, "verdict": "error", "label": label,
        "label_semantic": pair.label_for("semantic"), "label_relaxed": pair.label_for("relaxed"),
        "correct": None, "hardness": pair.hardness, "counterexample": None,
        "counterexample_rows": None, "verified": None, "verify_error": None, "explanation": None,
        "response": None, "details": None, "instances_tried": None, "prompt_tokens": 0,
        "completion_tokens": 0, "cost_usd": 0.0, "seconds": 0.0, "error": None,
    }


#: Largest query result execution match compares (bytes of JSON; a larger one is an error).
EXEC_MATCH_BYTES = 64 << 20


def _open_database(ref: str, timeout_s: float):
    from tasks.db.databases import DuckDBDatabase, PostgresDatabase, SQLiteDatabase

    ms = int(timeout_s * 1000)
    if "://" in ref:
        return PostgresDatabase("db", ref, statement_timeout_ms=ms), "postgres"
    engine = database_engine(ref)
    if engine == "duckdb":
        return DuckDBDatabase("db", ref, timeout_ms=ms), "duckdb"
    return SQLiteDatabase("db", ref, timeout_ms=ms), "sqlite"


def execution_match(pair: QueryPair, match: MatchOptions | None = None,
                    db_root: str | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
    """Run both queries of ``pair`` on its database (read-only) and compare the results.

    Returns ``{"verdict", "verified", "explanation", "details", "error"}``: ``equivalent``
    when the results match under ``match`` (row order only when both queries have a
    top-level ORDER BY unless ``match.order`` says otherwise), ``not_equivalent`` when they
    differ (``verified`` True: the database separates them; ``details`` show the rows only one
    side returns), ``nondeterministic`` when they differ only as an arbitrary choice the SQL
    leaves to the engine allows (probes run read-only on the database), ``error_on_instance`` when
    exactly one query fails on the database (an error is not a result, so the database is no
    counterexample), ``error`` when a query does not parse or both fail or the database cannot
    be opened, ``skipped`` without ``db``. Queries are read and normalised by
    :func:`tasks.equivalence.sql_dialects.read_query` and written for the database's engine; the readings
    are in ``details["readings"]``. When every compared result is empty the verdict is kept,
    but it says nothing about the queries: ``details["all_empty"]`` is True, a warning is
    logged and put in ``details["warnings"]`` and the explanation.
    """
    from tasks.db.databases import QueryError
    from tasks.equivalence.sql_dialects import engine_sql, read_query

    match = match or MatchOptions()
    if not pair.db:
        return {"verdict": "skipped", "error": SKIPPED_NO_DB}
    try:
        ref = resolve_db(pair.db, db_root)
    except FileNotFoundError as exc:
        return {"verdict": "error", "error": str(exc)}
    readings: list[str] = []
    texts = []
    for n, sql in enumerate((pair.sql1, pair.sql2), start=1):
        try:
            q = read_query(sql, pair.dialect)
            readings.extend(f"sql{n}: {r}" for r in q.readings)
            texts.append(q)
        except ValueError as exc:
            return {"verdict": "error", "error": f"sql{n} {exc}"}
    database, engine = _open_database(ref, timeout_s)
    outcomes: list[tuple[list[tuple] | None, str | None]] = []
    ordered = match.order == "always" or (
        match.order == "auto" and all(q.tree.args.get("order") is not None for q in texts))
    sep = None
    try:
        for q in texts:
            try:
                res = database.query(engine_sql(q, pair.dialect, engine), max_rows=10_000_000,
                                     max_result_bytes=EXEC_MATCH_BYTES,
                                     max_value_bytes=EXEC_MATCH_BYTES)
                if res.truncated or res.cut_values:  # a cut result cannot be compared
                    return {"verdict": "error", "error": f"a result is larger than "
                            f"{EXEC_MATCH_BYTES >> 20} MiB; the results were not compared"}
                outcomes.append(([tuple(r[c] for c in res.columns) for r in res.rows], None))
            except (QueryError, SqlglotError, ValueError) as exc:
                outcomes.append((None, str(exc).splitlines()[0][:300]))
        (rows1, err1), (rows2, err2) = outcomes
        same = err1 is None and err2 is None and results_match(
            rows1, rows2, ordered=ordered, bag=match.bag, permute_columns=match.permute_columns)
        if err1 is None and err2 is None and not same:
            sep = _database_separation(database, engine, ref, pair, texts, rows1, rows2, ordered, match)
    finally:
        database.close()
    details: dict[str, Any] = {
        "db": pair.db, "engine": engine, "ordered": ordered,
        "rows1": None if rows1 is None else len(rows1),
        "rows2": None if rows2 is None else len(rows2), "readings": readings}
    if err1 and err2:
        return {"verdict": "error", "error": f"both queries fail: sql1: {err1}; sql2: {err2}",
                "details": details}
    if err1 or err2:
        which, other = ("sql1", "sql2") if err1 else ("sql2", "sql1")
        message = f"{which} fails on {pair.db} ({other} runs): {err1 or err2}"
        return {"verdict": "error_on_instance", "details": details, "error": message,
                "explanation": message + " — an error is not a result, so the database is no "
                               "counterexample"}
    if same:
        explanation = f"same result on {pair.db} ({len(rows1)} rows)"
        if not rows1 and not rows2:
            warning = (f"every compared result is empty on {pair.db}: the database does not "
                       "exercise these queries, so the match says nothing about them")
            log.warning("execution match %s: %s", pair.id, warning)
            details.update(all_empty=True, warnings=[warning])
            explanation += f"; WARNING: {warning}"
        return {"verdict": "equivalent", "details": details, "explanation": explanation}
    if sep is not None and not sep.certain:
        details.update(result1=_preview(rows1), result2=_preview(rows2), choices=sep.reason)
        return {"verdict": "nondeterministic", "details": details,
                "explanation": f"results differ on {pair.db}, but only as an arbitrary choice of "
                               f"the SQL allows ({sep.reason}): the database is no counterexample"}
    only1, only2 = _row_differences(rows1, rows2)
    details.update(result1=_preview(rows1), result2=_preview(rows2), only_in_sql1=only1, only_in_sql2=only2)
    shown = "; ".join(x for x in (f"only sql1 returns {only1}" if only1 else "",
                                  f"only sql2 returns {only2}" if only2 else "") if x) \
        or "the same rows in a different order"
    return {"verdict": "not_equivalent", "verified": True, "details": details,
            "explanation": f"results differ on {pair.db} ({len(rows1)} vs {len(rows2)} rows): {shown}"}


def _database_separation(database, engine: str, ref: str, pair: QueryPair, texts, rows1, rows2,
                         ordered: bool, match: MatchOptions):
    """:func:`tasks.equivalence.instances.separation` of two differing results on the pair's database
    (probes run read-only on it): None when it cannot be decided (then the difference
    stands, as before)."""
    from tasks.db.databases import QueryError
    from tasks.equivalence.instances import EngineChoice, Outcome, prepare_query, separation

    schema = None
    if "://" not in ref:
        try:
            schema = RelSchema.from_database(ref)
        except SchemaError:
            schema = None
    choice = EngineChoice(engine, mysql=(pair.dialect or "").lower() == "mysql" and engine != "mysql")

    def run(sql: str) -> Outcome:
        try:
            res = database.query(sql, max_rows=10_000_000, max_result_bytes=EXEC_MATCH_BYTES,
                                 max_value_bytes=EXEC_MATCH_BYTES)
        except (QueryError, ValueError) as exc:
            return Outcome(error=str(exc).splitlines()[0][:300])
        if res.truncated or res.cut_values:
            return Outcome(error=f"the probe's result is larger than {EXEC_MATCH_BYTES >> 20} MiB")
        return Outcome(rows=[tuple(r[c] for c in res.columns) for r in res.rows], ncols=len(res.columns))

    try:
        q1, q2 = (prepare_query(q, schema, choice) for q in texts)
    except (SqlglotError, ValueError):
        return None
    w1 = len(rows1[0]) if rows1 else None
    w2 = len(rows2[0]) if rows2 else None
    return separation(run, q1, q2, Outcome(rows=rows1, ncols=w1), Outcome(rows=rows2, ncols=w2),
                      ordered=ordered, bag=match.bag, permute_columns=match.permute_columns,
                      fold=choice.mysql, abs_tol=choice.abs_tol(*(q.tree for q in texts)))


def _preview(rows: list[tuple], n: int = 5) -> str:
    more = f", … (+{len(rows) - n})" if len(rows) > n else ""
    return "[" + ", ".join(repr(tuple(r)) for r in rows[:n]) + more + "]"


def _row_differences(rows1: list[tuple], rows2: list[tuple], n: int = 3) -> tuple[str, str]:
    """Up to ``n`` rows (with multiplicity) one result holds and the other does not, each as
    text ('' when there are none)."""
    from collections import Counter

    from tasks.scoring.result_match import canonical_rows

    c1, c2 = Counter(canonical_rows(rows1)), Counter(canonical_rows(rows2))
    a, b = list((c1 - c2).elements()), list((c2 - c1).elements())
    return (_preview(a, n) if a else ""), (_preview(b, n) if b else "")


def evaluate(pair: QueryPair, method: Method, options: EquivalenceOptions,
             client: Any = None, client_error: str | None = None) -> dict[str, Any]:
    """One row of ``equivalence.parquet`` (without ``run_id``) for ``pair`` × ``method``.

    ``client`` is the judge model for judge methods, a :class:`tasks.core.llm.ChatModel` from
    :func:`tasks.equivalence.judges.judge_model` (``client_error`` explains why there is none). Never
    raises for a bad pair: failures become ``verdict="error"`` rows."""
    row = _empty_row(pair, method)
    start = time.perf_counter()
    try:
        if method.kind == "exec_match":
            out = execution_match(pair, options.match, options.db_root, options.exec_timeout_s)
            row.update({k: v for k, v in out.items() if k != "details"})
            row["details"] = json.dumps(out.get("details"), default=str) if out.get("details") else None
        elif method.kind == "finder":
            _finder_row(row, pair, options)
        else:
            _judge_row(row, pair, method, options, client, client_error)
    except SchemaError as exc:
        row.update(verdict="error", error=f"schema: {exc}")
    except Exception as exc:
        log.exception("equivalence %s on %s failed", method.name, pair.id)
        row.update(verdict="error", error=f"{type(exc).__name__}: {exc}")
    if not row["seconds"]:
        row["seconds"] = time.perf_counter() - start
    if row["label"] is not None and row["verdict"] in DECIDED:
        row["correct"] = (row["verdict"] == "equivalent") == row["label"]
    return row


def _finder_row(row: dict, pair: QueryPair, options: EquivalenceOptions) -> None:
    schema = pair_schema(pair, options.db_root)
    res = find_counterexample(pair.sql1, pair.sql2, schema, dialect=pair.dialect,
                              budget=options.budget, match=options.match)
    row.update(
        verdict=res.verdict, counterexample=res.counterexample, counterexample_rows=res.rows,
        verified=res.verified, verify_error=res.verify_error, explanation=res.summary(),
        instances_tried=res.instances_tried, seconds=res.seconds, error=res.error,
        details=json.dumps({**res.details(), "budget": options.budget.model_dump()}, default=str),
    )


def _judge_row(row: dict, pair: QueryPair, method: Method, options: EquivalenceOptions,
               client: Any, client_error: str | None) -> None:
    from tasks.equivalence.judges import run_judge

    if client is None:
        row.update(verdict="error", error=client_error or "no judge model configured")
        return
    try:
        schema: RelSchema | None = pair_schema(pair, options.db_root)
    except SchemaError:
        schema = None
    ddl = schema_text(pair, options.db_root) if (schema is not None or isinstance(pair.schema_, str)) else ""
    trial = int.from_bytes(hashlib.sha256(pair.id.encode()).digest()[:6], "big")
    out = run_judge(client, method.technique, method.notion, sql1=pair.sql1, sql2=pair.sql2,
                    schema_ddl=ddl, dialect=pair.dialect, trial=trial)
    row.update(
        verdict=out.verdict, response=out.response, explanation=out.explanation,
        counterexample=out.counterexample, prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens, cost_usd=out.cost_usd, seconds=out.seconds,
        error=out.error,
    )
    details: dict[str, Any] = {"finish_reason": out.finish_reason, "priced": out.priced,
                               "cache_hit": out.cache_hit, "attempts": out.attempts}
    if out.counterexample:
        check = verify_counterexample(
            pair.sql1, pair.sql2, out.counterexample, dialect=pair.dialect, schema=schema,
            bag=options.match.bag, permute_columns=options.match.permute_columns,
            query_timeout_s=options.budget.query_timeout_s,
            ordered=None if options.match.order == "auto" else options.match.order == "always",
        )
        row.update(verified=check.separates, verify_error=check.error,
                   counterexample_rows=check.rows)
        details.update(result1=check.result1, result2=check.result2, engine=check.engine,
                       error_on_instance=check.error_on_instance)
    row["details"] = json.dumps(details, default=str)



__all__ = [
    "EXEC_MATCH_BYTES",
    "FINDER_REVISION",
    "SKIPPED_NO_DB",
    "Method",
    "evaluate",
    "execution_match",
    "parse_method",
]
