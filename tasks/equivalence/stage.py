"""SQL equivalence tasks: read query pairs, judge each (pair × method), write
``equivalence.parquet`` and the tables of the study "LLM-SQL-Solver: Can LLMs Determine SQL
Equivalence?" (Zhao et al.).

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

Layout under the artifact root: ``runs/<run_id>/equivalence/pairs.jsonl`` (the validated input),
``batches/<key>.parquet`` (one per mapped batch; a finished batch is skipped on re-run),
``equivalence.parquet`` (all rows), ``tables/*.parquet`` (accuracy, agreement with execution
match, agreement with the labels, counterexamples, finder instance sizes, time) and
``equivalence.md``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
from pydantic import ValidationError
from sqlglot.errors import SqlglotError

from schemas import equivalence as eqs
from schemas.equivalence import (
    DECIDED,
    NOTIONS,
    TECHNIQUES,
    EquivalenceOptions,
    MatchOptions,
    QueryPair,
)
from schemas.settings import Settings
from tasks.core import storage
from tasks.equivalence.counterexample import find_counterexample
from tasks.equivalence.instances import (
    RelSchema,
    SchemaError,
    database_engine,
    load_schema,
)
from tasks.equivalence.verification import verify_counterexample
from tasks.core.prefect_task import task
from tasks.scoring.result_match import results_match
from tasks.core.layout import RunLayout

log = logging.getLogger(__name__)


class PairsError(ValueError):
    """A pairs file cannot be read; the message names the file and line."""


#: Revision of the methods' semantics, part of every batch key.
FINDER_REVISION = 3  # 3: unique expression / partial indexes, unenforceable CHECKs

#: Why execution match skips a pair without a database.
SKIPPED_NO_DB = ("the pair has no database (db): execution match runs both queries on the "
                 "pair's own database (a SQLite/DuckDB file, a postgresql:// URL or a name under "
                 "--db-root)")


# --------------------------------------------------------------------------------------------
# Input
# --------------------------------------------------------------------------------------------


def load_pairs(path: str | Path) -> list[QueryPair]:
    """Read and validate a pairs JSONL file (one :class:`QueryPair` per non-blank line).

    Raises PairsError naming ``file:line`` for invalid JSON, a missing/extra field, a bad
    label, or a duplicate ``id``; FileNotFoundError-style PairsError for a missing file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PairsError(f"{p}: cannot read pairs file ({exc.strerror or exc})") from None
    pairs: list[QueryPair] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PairsError(f"{p}:{n}: not valid JSON ({exc.msg})") from None
        try:
            pair = QueryPair.model_validate(obj)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(x) for x in first["loc"]) or "-"
            raise PairsError(f"{p}:{n}: {loc}: {first['msg']}") from None
        if pair.id in seen:
            raise PairsError(f"{p}:{n}: duplicate id {pair.id!r} (first on line {seen[pair.id]})")
        seen[pair.id] = n
        pairs.append(pair)
    if not pairs:
        raise PairsError(f"{p}: no pairs")
    return pairs


def resolve_db(db: str, db_root: str | Path | None = None) -> str:
    """A database reference as something :func:`execution_match` can open: a
    ``postgresql://`` URL unchanged, an existing file path, or a name looked up under
    ``db_root`` as ``<name>.sqlite|.sqlite3|.db|.duckdb`` or ``<name>/<name>.<same>`` (the
    Spider layout). Raises FileNotFoundError listing where it looked."""
    if re.match(r"^postgres(?:ql)?://", db):
        return db
    p = Path(db).expanduser()
    if p.is_file():
        return str(p)
    looked = [str(p)]
    if db_root is not None:
        root = Path(db_root).expanduser()
        if (root / db).is_file():
            return str(root / db)
        for base in (root / db, root / db / db):
            for suffix in (".sqlite", ".sqlite3", ".db", ".duckdb"):
                cand = base.with_name(base.name + suffix)
                looked.append(str(cand))
                if cand.is_file():
                    return str(cand)
    raise FileNotFoundError(f"database {db!r} not found (looked at {', '.join(looked[:4])}...)")


def pair_schema(pair: QueryPair, db_root: str | None = None) -> RelSchema:
    """The pair's :class:`RelSchema` (from its DDL/mapping, else from its SQLite/DuckDB
    database). Raises SchemaError."""
    db_path = None
    if pair.schema_ is None and pair.db:
        try:
            ref = resolve_db(pair.db, db_root)
        except FileNotFoundError as exc:
            raise SchemaError(str(exc)) from None
        if "://" in ref:
            raise SchemaError("a schema is needed for a PostgreSQL database (give 'schema')")
        db_path = ref
    return load_schema(pair.schema_, pair.schema_dialect, db_path, query_dialect=pair.dialect)


def schema_text(pair: QueryPair, db_root: str | None = None) -> str:
    """The schema as DDL text for a prompt: the pair's own DDL verbatim, else rendered (in the
    pair's dialect) from the mapping or the database."""
    if isinstance(pair.schema_, str):
        return pair.schema_
    return pair_schema(pair, db_root).ddl(pair.dialect)


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


# --------------------------------------------------------------------------------------------
# Batches (the unit Prefect maps over)
# --------------------------------------------------------------------------------------------


def stage_prefix(artifacts_root: str, run_id: str) -> str:
    """``<root>/runs/<run_id>/equivalence``."""
    return RunLayout(artifacts_root, run_id).path("equivalence")


@task(name="prepare-equivalence-pairs", persist_result=False)
def prepare_pairs(pairs_path: str, run_id: str, artifacts_root: str) -> dict:
    """Validate a pairs file and store it as ``pairs.jsonl`` of the run.

    Returns ``{"pairs_uri", "ids", "n_pairs"}``. Raises PairsError for a bad file (nothing is
    written then)."""
    pairs = load_pairs(pairs_path)
    text = "".join(json.dumps(p.model_dump(by_alias=True), ensure_ascii=False, sort_keys=True) + "\n"
                   for p in pairs)
    uri = storage.write_bytes(storage.join(stage_prefix(artifacts_root, run_id), "pairs.jsonl"),
                              text.encode())
    return {"pairs_uri": uri, "ids": [p.id for p in pairs], "n_pairs": len(pairs)}


def plan_equivalence_batches(pair_ids: list[str], methods: list[str], batch_size: int,
                             options: EquivalenceOptions | None = None,
                             pairs_uri: str | None = None) -> list[dict]:
    """Expand methods × pairs into batches of at most ``batch_size`` pairs of one method.

    Returns JSON-able ``{"key", "method", "pair_ids"}``; keys are stable for the same inputs
    and options (so a re-run finds finished batches, and changed options start new ones).
    ``pairs_uri`` (the run's ``pairs.jsonl``): keys also digest each pair's content, so a pair
    whose SQL, schema or label changed under the same id is judged again. Raises ValueError
    for an unknown method or a bad batch size, KeyError for an id not in ``pairs_uri``."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    parsed = [parse_method(m) for m in methods]
    if not parsed:
        raise ValueError("no methods given")
    # the artifact schema version is part of the key: batches written by an older version are
    # never combined with new ones
    # ... and so is the version of the methods' semantics (FINDER_REVISION: tie groups,
    # arbitrary choices, real PostgreSQL), so a resumed run never mixes two of them
    opts = (options or EquivalenceOptions()).model_dump_json() + f"|v{eqs.SCHEMA_VERSION}|r{FINDER_REVISION}"
    pairs = _read_pairs(pairs_uri) if pairs_uri is not None else None
    from tasks.core.batching import label_slug, plan

    def material(name: str, chunk: list[str]) -> list:
        if pairs is None:
            return [name, chunk, opts]
        return [name, chunk, opts, [pairs[p].model_dump(mode="json", by_alias=True)
                                    for p in chunk]]

    batches = []
    for m in parsed:
        # these keys predate tasks.core.batching: the slug is the whole method name, unstripped
        for key, chunk in plan(m.name, pair_ids, batch_size, lambda c: material(m.name, c),
                               slug=label_slug(m.name, limit=None, strip=False)):
            batches.append({"key": key, "method": m.name, "pair_ids": chunk})
    return batches


def equivalence_batches():
    """The judging stage's batches (:class:`tasks.core.batching.BatchedStage`):
    ``equivalence/batches/<key>.parquet`` of :data:`schemas.equivalence.EQUIVALENCE` rows, with
    per-pair checkpoints ``<key>.parts/``."""
    from tasks.core.batching import BatchedStage

    return BatchedStage("equivalence", (("", eqs.EQUIVALENCE),))


def batch_uri(artifacts_root: str, run_id: str, key: str) -> str:
    """URI of one batch's rows."""
    return equivalence_batches().uri(artifacts_root, run_id, key)


def _read_pairs(uri: str) -> dict[str, QueryPair]:
    lines = storage.read_bytes(uri).decode().splitlines()
    pairs = [QueryPair.model_validate(json.loads(x)) for x in lines if x.strip()]
    return {p.id: p for p in pairs}


def _logger():
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # noqa: BLE001 - outside a Prefect run
        return log


@task(name="run-equivalence-batch", persist_result=False, retries=0)
def run_equivalence_batch(run_id: str, artifacts_root: str, pairs_uri: str, batch: dict,
                          options: dict | None = None) -> str:
    """Judge every pair of one batch with its method; write the batch's rows.

    Returns the batch URI; skips all work when it already exists, and the pairs an interrupted
    attempt judged (checkpointed one by one). The judge model of judge
    methods is resolved from the models table / the environment (``QUERYLAB_MODELS``,
    ``QUERYLAB_OPENAI_*``), never from parameters; its responses are cached under
    ``<artifacts_root>/cache/llm``."""
    stage = equivalence_batches()
    if stage.finished(artifacts_root, run_id, batch["key"]):
        return stage.uri(artifacts_root, run_id, batch["key"])
    opts = EquivalenceOptions.model_validate(options or {})
    method = parse_method(batch["method"])
    pairs = _read_pairs(pairs_uri)
    client, client_error = None, None
    if method.kind == "judge":
        from tasks.equivalence.judges import judge_model

        try:
            client = judge_model(method.model, Settings.from_env(), opts.judge, artifacts_root)
        except ValueError as exc:
            client_error = str(exc)
    logger = _logger()
    try:
        rows = stage.run_items(
            artifacts_root, run_id, batch["key"], batch["pair_ids"],
            lambda pid: {"": [{"run_id": run_id,
                               **evaluate(pairs[pid], method, opts, client, client_error)}]},
        )[""]
    finally:
        if client is not None:
            client.close()
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    logger.info("equivalence batch %s: %d pairs, %s", batch["key"], len(rows), counts)
    for r in rows:
        if r["verdict"] == "error":
            logger.warning("equivalence %s on %s: error: %s", r["method"], r["pair_id"],
                           (r["error"] or "").splitlines()[0][:200] if r["error"] else "?")
    return stage.write(artifacts_root, run_id, batch["key"], {"": rows})


@task(name="combine-equivalence", persist_result=False)
def combine_equivalence(run_id: str, artifacts_root: str, batch_keys: list[str]) -> str:
    """Concatenate the batches into ``equivalence.parquet`` (sorted by pair, method; streamed,
    :func:`tasks.core.batching.combine`)."""
    from tasks.core.batching import combine

    return combine([batch_uri(artifacts_root, run_id, k) for k in batch_keys], eqs.EQUIVALENCE,
                   ["pair_id", "method"],
                   storage.join(stage_prefix(artifacts_root, run_id), "equivalence.parquet"),
                   nulls_last=True)


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def accuracy_table(df: pl.DataFrame) -> pl.DataFrame:
    """Accuracy per (method, hardness) over labelled pairs, plus ``hardness = "all"``.

    Pairs a method skipped (no database for execution match) are left out. Undecided verdicts (error, unparsed, no counterexample within budget) count as wrong;
    ``decided`` counts the decisions. Empty when no pair has a label."""
    lab = df.filter(pl.col("label").is_not_null(), pl.col("verdict") != "skipped")
    if lab.is_empty():
        return pl.DataFrame(schema=pl.from_arrow(eqs.EQUIVALENCE_ACCURACY.empty_table()).schema)

    def agg(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
        return frame.group_by(by).agg(
            pl.len().cast(pl.Int64).alias("n"),
            pl.col("correct").fill_null(False).sum().cast(pl.Int64).alias("correct"),
            pl.col("verdict").is_in(list(DECIDED)).sum().cast(pl.Int64).alias("decided"),
        )

    per = agg(lab.with_columns(pl.col("hardness").fill_null("-")), ["method", "notion", "hardness"])
    overall = agg(lab, ["method", "notion"]).with_columns(pl.lit("all").alias("hardness"))
    out = pl.concat([per.select(overall.columns), overall], how="vertical")
    if lab["hardness"].is_null().all():
        out = out.filter(pl.col("hardness") == "all")
    return out.with_columns((pl.col("correct") / pl.col("n")).alias("accuracy")).select(
        eqs.EQUIVALENCE_ACCURACY.names).sort("method", "hardness")


def agreement_table(df: pl.DataFrame) -> pl.DataFrame:
    """Agreement of every other method with ``exec_match`` on the pairs both decided."""
    empty = pl.DataFrame(schema=pl.from_arrow(eqs.EQUIVALENCE_AGREEMENT.empty_table()).schema)
    ex = df.filter(pl.col("method") == "exec_match", pl.col("verdict").is_in(list(DECIDED)))
    if ex.is_empty():
        return empty
    ex = ex.select("pair_id", (pl.col("verdict") == "equivalent").alias("exec_eq"))
    other = df.filter(pl.col("method") != "exec_match", pl.col("verdict").is_in(list(DECIDED)))
    joined = other.join(ex, on="pair_id").with_columns(
        (pl.col("verdict") == "equivalent").alias("m_eq"))
    if joined.is_empty():
        return empty
    out = joined.group_by("method").agg(
        pl.len().cast(pl.Int64).alias("n"),
        (pl.col("exec_eq") == pl.col("m_eq")).sum().cast(pl.Int64).alias("agree"),
        (pl.col("exec_eq") & pl.col("m_eq")).sum().cast(pl.Int64).alias("exec_eq_method_eq"),
        (pl.col("exec_eq") & ~pl.col("m_eq")).sum().cast(pl.Int64).alias("exec_eq_method_neq"),
        (~pl.col("exec_eq") & pl.col("m_eq")).sum().cast(pl.Int64).alias("exec_neq_method_eq"),
        (~pl.col("exec_eq") & ~pl.col("m_eq")).sum().cast(pl.Int64).alias("exec_neq_method_neq"),
    ).with_columns((pl.col("agree") / pl.col("n")).alias("agreement"))
    return out.select(eqs.EQUIVALENCE_AGREEMENT.names).sort("method")


def label_agreement_table(df: pl.DataFrame) -> pl.DataFrame:
    """Agreement of each method's decisions with the labels of each notion (see
    :data:`schemas.equivalence.EQUIVALENCE_LABEL_AGREEMENT`): one row per (method, label
    notion) with at least one decided, labelled pair; labels of the other notion than the
    method's only count on pairs without a label of the method's own (so plain labels, which
    stand for both notions, give no second row). Undecided verdicts are left out (the accuracy
    table counts them as wrong). Empty when no decided pair has any label."""
    empty = pl.DataFrame(schema=pl.from_arrow(eqs.EQUIVALENCE_LABEL_AGREEMENT.empty_table()).schema)
    decided = df.filter(pl.col("verdict").is_in(list(DECIDED)))
    parts = []
    for notion in NOTIONS:
        col = f"label_{notion}"
        if col not in decided.columns:
            continue
        own_missing = pl.when(pl.col("notion") == "semantic").then(pl.col("label_semantic")) \
            .otherwise(pl.col("label_relaxed")).is_null() if {"label_semantic", "label_relaxed"} <= set(
                decided.columns) else pl.lit(True)
        # a method is compared with the other notion's labels only where the pair has none of
        # its own notion (published sets with relaxed labels only)
        sub = decided.filter(pl.col(col).is_not_null(),
                             (pl.col("notion") == notion) | own_missing).with_columns(
            pl.col(col).alias("lab"), (pl.col("verdict") == "equivalent").alias("m_eq"))
        if sub.is_empty():
            continue
        parts.append(sub.group_by("method", "notion").agg(
            pl.len().cast(pl.Int64).alias("n"),
            (pl.col("lab") == pl.col("m_eq")).sum().cast(pl.Int64).alias("agree"),
            (pl.col("lab") & pl.col("m_eq")).sum().cast(pl.Int64).alias("label_eq_method_eq"),
            (pl.col("lab") & ~pl.col("m_eq")).sum().cast(pl.Int64).alias("label_eq_method_neq"),
            (~pl.col("lab") & pl.col("m_eq")).sum().cast(pl.Int64).alias("label_neq_method_eq"),
            (~pl.col("lab") & ~pl.col("m_eq")).sum().cast(pl.Int64).alias("label_neq_method_neq"),
        ).with_columns(pl.lit(notion).alias("label_notion"),
                       (pl.col("agree") / pl.col("n")).alias("agreement")))
    if not parts:
        return empty
    return pl.concat(parts).select(eqs.EQUIVALENCE_LABEL_AGREEMENT.names).sort("method", "label_notion")


def empty_result_pairs(df: pl.DataFrame) -> list[str]:
    """Pairs whose execution match compared only empty results (``details.all_empty``)."""
    ex = df.filter(pl.col("method") == "exec_match", pl.col("details").is_not_null())
    if ex.is_empty():
        return []
    flag = ex["details"].str.json_path_match("$.all_empty")
    return sorted(ex.filter(flag == "true")["pair_id"].to_list())


def counterexample_table(df: pl.DataFrame) -> pl.DataFrame:
    """Per method, on the non-equivalent set (pairs whose semantic label is *not equivalent*;
    every pair when no pair is labelled): flagged, with a counterexample, verified (skipped
    pairs left out)."""
    sem = df.filter(pl.col("notion") == "semantic")
    labelled = df.filter(pl.col("label").is_not_null())
    if labelled.is_empty():
        ids, pair_set = df["pair_id"].unique(), "all pairs (no labels)"
    else:
        # a pair is non-equivalent when its semantic label says so (any method row carries it)
        ids = sem.filter(pl.col("label") == False)["pair_id"].unique()
        pair_set = "labelled not equivalent"
    sub = df.filter(pl.col("pair_id").is_in(ids.implode()), pl.col("verdict") != "skipped")
    if sub.is_empty():
        return pl.DataFrame(schema=pl.from_arrow(eqs.EQUIVALENCE_COUNTEREXAMPLES.empty_table()).schema)
    out = sub.group_by("method").agg(
        pl.col("pair_id").n_unique().cast(pl.Int64).alias("n_pairs"),
        (pl.col("verdict") == "not_equivalent").sum().cast(pl.Int64).alias("flagged"),
        (pl.col("counterexample").is_not_null()
         | ((pl.col("method") == "exec_match") & pl.col("verified").fill_null(False)))
        .sum().cast(pl.Int64).alias("with_counterexample"),
        pl.col("verified").fill_null(False).sum().cast(pl.Int64).alias("verified"),
    ).with_columns(
        pl.lit(pair_set).alias("pair_set"),
        (pl.col("verified") / pl.col("n_pairs")).alias("found_rate"),
    )
    return out.select(eqs.EQUIVALENCE_COUNTEREXAMPLES.names).sort("method")


def finder_sizes_table(df: pl.DataFrame) -> pl.DataFrame:
    """Per pair the finder separated: instance size, how it was made, counterexample rows
    (:data:`schemas.equivalence.EQUIVALENCE_FINDER_SIZES`), read from the rows' ``details``."""
    found = df.filter(pl.col("method") == "finder", pl.col("verdict") == "not_equivalent",
                      pl.col("details").is_not_null())
    if found.is_empty():
        return pl.DataFrame(schema=pl.from_arrow(eqs.EQUIVALENCE_FINDER_SIZES.empty_table()).schema)
    d = pl.col("details")
    out = found.select(
        "pair_id", "method",
        d.str.json_path_match("$.rows_before_shrink").cast(pl.Int64).alias("found_rows"),
        d.str.json_path_match("$.found_by").alias("found_by"),
        pl.col("counterexample_rows").cast(pl.Int64).alias("rows"),
        d.str.json_path_match("$.found_at").cast(pl.Int64).alias("found_at"),
    )
    return out.select(eqs.EQUIVALENCE_FINDER_SIZES.names).sort("pair_id")


def time_table(df: pl.DataFrame) -> pl.DataFrame:
    """Seconds per pair (mean, median, max, total), tokens and cost per method (skipped
    pairs left out)."""
    df = df.filter(pl.col("verdict") != "skipped")
    if df.is_empty():
        return pl.DataFrame(schema=pl.from_arrow(eqs.EQUIVALENCE_TIME.empty_table()).schema)
    out = df.group_by("method").agg(
        pl.len().cast(pl.Int64).alias("n"),
        pl.col("seconds").mean().alias("mean_s"),
        pl.col("seconds").median().alias("median_s"),
        pl.col("seconds").max().alias("max_s"),
        pl.col("seconds").sum().alias("total_s"),
        pl.col("prompt_tokens").sum().cast(pl.Int64).alias("prompt_tokens"),
        pl.col("completion_tokens").sum().cast(pl.Int64).alias("completion_tokens"),
        pl.col("cost_usd").sum().alias("cost_usd"),
    )
    return out.select(eqs.EQUIVALENCE_TIME.names).sort("method")


def _accuracy_wide(acc: pl.DataFrame) -> pl.DataFrame:
    if acc.is_empty():
        return acc
    order = [h for h in ("easy", "medium", "hard", "extra") if h in acc["hardness"].to_list()]
    order += sorted(set(acc["hardness"].to_list()) - set(order) - {"all"}) + ["all"]
    wide = acc.pivot(on="hardness", index=["method", "notion"], values="accuracy")
    return wide.select(["method", "notion"] + [h for h in order if h in wide.columns]).sort("method")


def _problems_section(df: pl.DataFrame, limit: int = 20) -> str:
    """Markdown naming every errored (pair, method) with its one-line reason, and the reasons
    methods skipped pairs (counted)."""
    parts = []
    errors = df.filter(pl.col("verdict") == "error").sort("pair_id", "method")
    if not errors.is_empty():
        lines = [f"- `{r['pair_id']}` × {r['method']}: {_one_line(r['error'])}"
                 for r in errors.head(limit).iter_rows(named=True)]
        more = f"\n- … and {errors.height - limit} more (the `error` column of equivalence.parquet)" \
            if errors.height > limit else ""
        parts.append(f"{errors.height} errored (pair, method):\n\n" + "\n".join(lines) + more)
    skipped = df.filter(pl.col("verdict") == "skipped")
    if not skipped.is_empty():
        counts = skipped.group_by("method", "error").agg(pl.len().alias("n")).sort("method")
        parts.append("Skipped:\n\n" + "\n".join(
            f"- {r['method']}: {r['n']} pair(s) — {_one_line(r['error'])}" for r in counts.iter_rows(named=True)))
    return "\n\n".join(parts) if parts else "_none_"


def _one_line(text: str | None, n: int = 200) -> str:
    one = " ".join((text or "?").split())
    return one if len(one) <= n else one[: n - 1] + "…"


def _finder_false_counterexamples(df: pl.DataFrame) -> str:
    """``"k false counterexample(s) on n pair(s) labelled equivalent"`` for the finder ('' when
    no finder row has an equivalent label)."""
    eq = df.filter(pl.col("method") == "finder", pl.col("label_semantic") == True)
    if eq.is_empty():
        return ""
    false = eq.filter(pl.col("verdict") == "not_equivalent").height
    return f"{false} false counterexample(s) on {eq.height} pair(s) labelled equivalent"


@task(name="equivalence-tables", persist_result=False)
def equivalence_tables(run_id: str, artifacts_root: str) -> dict:
    """The tables of a run, as Parquet under ``tables/`` and as ``equivalence.md``.

    Returns ``{"markdown", "accuracy", "agreement", "label_agreement", "counterexamples",
    "finder_sizes", "time", "text"}`` (URIs, and the Markdown text). Reads only
    ``equivalence.parquet``."""
    from tasks.report.stage import markdown_table

    prefix = stage_prefix(artifacts_root, run_id)
    df = pl.from_arrow(storage.read_parquet(storage.join(prefix, "equivalence.parquet"), eqs.EQUIVALENCE))
    tables = {
        "accuracy": (accuracy_table(df), eqs.EQUIVALENCE_ACCURACY),
        "agreement": (agreement_table(df), eqs.EQUIVALENCE_AGREEMENT),
        "label_agreement": (label_agreement_table(df), eqs.EQUIVALENCE_LABEL_AGREEMENT),
        "counterexamples": (counterexample_table(df), eqs.EQUIVALENCE_COUNTEREXAMPLES),
        "finder_sizes": (finder_sizes_table(df), eqs.EQUIVALENCE_FINDER_SIZES),
        "time": (time_table(df), eqs.EQUIVALENCE_TIME),
    }
    out: dict[str, Any] = {}
    for name, (frame, schema) in tables.items():
        out[name] = storage.write_parquet(storage.join(prefix, "tables", f"{name}.parquet"),
                                          frame.to_arrow(), schema)
    verdicts = (df.group_by("method", "verdict").agg(pl.len().alias("pairs"))
                .sort("method", "verdict"))
    empty = empty_result_pairs(df)
    warning = ""
    if empty:
        shown = ", ".join(f"`{p}`" for p in empty[:10]) + (" …" if len(empty) > 10 else "")
        warning = (f"\n\n**Warning:** execution match compared only empty results on "
                   f"{len(empty)} pair(s) ({shown}): *equivalent* there says nothing about the "
                   "queries.")
    accuracy = tables["accuracy"][0]
    relaxed_only = df.filter(pl.col("label_semantic").is_null(), pl.col("label_relaxed").is_not_null())
    if not accuracy.is_empty():
        accuracy_text = markdown_table(_accuracy_wide(accuracy))
    elif not relaxed_only.is_empty():
        accuracy_text = (f"_no pair carries a label for the notion its methods decide; "
                         f"{relaxed_only['pair_id'].n_unique()} pair(s) carry relaxed labels only: "
                         "see the agreement with the labels below_")
    else:
        accuracy_text = "_no labelled pairs_"
    problems_text = _problems_section(df)
    finder_false = _finder_false_counterexamples(df)
    sizes = tables["finder_sizes"][0]
    sizes_text = "_the finder separated no pair_"
    if not sizes.is_empty():
        kind = pl.col("found_by").str.extract(r"^(\w+)", 1).fill_null("-")
        sizes_text = markdown_table(
            sizes.with_columns(kind.alias("made_by")).group_by("made_by").agg(
                pl.len().alias("pairs"), pl.col("found_rows").median().alias("median_rows"),
                pl.col("found_rows").max().alias("max_rows"),
                pl.col("rows").median().alias("median_counterexample_rows")).sort("made_by"))
        if sizes.height <= 50:
            sizes_text += "\n\n" + markdown_table(sizes.drop("method"))
    sections = [
        f"# SQL equivalence, run `{run_id}`",
        f"{df['pair_id'].n_unique()} pairs × {df['method'].n_unique()} methods = {df.height} rows.",
        "## Verdicts\n\n" + markdown_table(verdicts) + warning,
        "## Errors and skipped pairs\n\n" + problems_text,
        "## Accuracy by hardness\n\nUndecided verdicts (error, error on instance, "
        "nondeterministic, unparsed, no counterexample within budget) count as wrong. The finder "
        "never answers *equivalent* (search is no proof), so on pairs labelled equivalent it is "
        "wrong by construction; what matters there is that it reports no false counterexample"
        + (f": {finder_false}" if finder_false else "") + ".\n\n" + accuracy_text,
        "## Agreement with execution match\n\n"
        + (markdown_table(tables["agreement"][0]) if not tables["agreement"][0].is_empty()
           else "_no execution-match decisions to compare with_"),
        "## Agreement with the labels\n\nEach method's decisions against the labels of its "
        "notion, and against the other notion's labels on pairs that carry none of its own "
        "(e.g. a semantic method against relaxed-only labels); undecided verdicts are left "
        "out.\n\n"
        + (markdown_table(tables["label_agreement"][0]) if not tables["label_agreement"][0].is_empty()
           else "_no decided, labelled pairs_"),
        "## Counterexamples on the non-equivalent set\n\nFor execution match the counterexample "
        "is the pair's own database (it counts when the results differ there).\n\n"
        + (markdown_table(tables["counterexamples"][0]) if not tables["counterexamples"][0].is_empty()
           else "_no non-equivalent pairs_"),
        "## Finder: instance size that separated each pair\n\nRows over all tables of the "
        "instance that first separated the pair (before shrinking) and how it was made.\n\n"
        + sizes_text,
        "## Time per pair (seconds) and cost\n\n" + markdown_table(tables["time"][0]),
    ]
    text = "\n\n".join(sections) + "\n"
    out["markdown"] = storage.write_bytes(storage.join(prefix, "equivalence.md"), text.encode())
    out["text"] = text
    return out
