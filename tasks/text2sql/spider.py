"""Spider: build the dev databases into SQLite, and score predictions by execution accuracy (EX).

Databases
---------
:func:`build_spider_databases` turns ``<source_dir>/<db_id>/schema.sql`` (MySQL DDL, as published
by cloudera/spiderman) plus ``<source_dir>/<db_id>/data/<table>.csv`` into one SQLite file per
database, ``<out_dir>/<db_id>.sqlite``:

- the DDL is translated with sqlglot (MySQL → SQLite): the ``db.`` qualifier of table names is
  dropped and inline ``INDEX name (cols)`` definitions become ``CREATE INDEX`` statements; types,
  primary keys, foreign keys and defaults are kept (so SQLite's type affinity converts CSV text
  to numbers as in the original Spider databases);
- CSV cells: ``NULL`` is SQL NULL; an empty cell is NULL in a numeric column (INT, REAL, FLOAT,
  DECIMAL, NUMERIC...) and ``''`` in a text column;
- a database is rebuilt only when its output is older than one of its sources (or missing);
  each file is written to a temporary name and renamed into place.

Execution accuracy
------------------
:func:`score_execution_accuracy` runs each gold query and its prediction on the query's database
and compares the results with :func:`tasks.scoring.result_match.results_match` (test-suite semantics of
Zhong, Yu & Klein 2020): results are compared as bags of rows, row order matters only when the
gold query has a top-level ``ORDER BY``, and columns may be permuted. A query is left out of EX
(and listed) when its gold query cannot be scored: its database was not built, the gold query
fails, or it reads a table that holds no rows in the built database (missing data — e.g.
``wta_1.rankings``, whose source file is not distributed).
"""

from __future__ import annotations

import csv
import os
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from tasks.core.jsonl import parse_jsonl
from tasks.scoring.result_match import has_top_level_order_by, results_match
from tasks.db.sqlite_guard import run_file_query

__all__ = [
    "EX_STATUSES",
    "SpiderError",
    "build_spider_database",
    "build_spider_databases",
    "execution_accuracy_summary",
    "load_predictions",
    "run_sqlite",
    "score_execution_accuracy",
    "translate_mysql_ddl",
]

#: ``status`` values of a scored query: counted in EX (``match`` = correct; ``mismatch``,
#: ``pred_error``, ``no_prediction`` = wrong) or left out (``missing_data``, ``gold_error``,
#: ``no_database``).
EX_STATUSES = (
    "match",
    "mismatch",
    "pred_error",
    "no_prediction",
    "missing_data",
    "gold_error",
    "no_database",
)
_EXCLUDED = ("missing_data", "gold_error", "no_database")

_NUMERIC_TYPE = re.compile(r"INT|REAL|FLOA|DOUB|DEC|NUM|BOOL", re.IGNORECASE)


class SpiderError(ValueError):
    """A Spider source or predictions file is missing or malformed (the message names it)."""


# --------------------------------------------------------------------------------------------
# Building the SQLite databases
# --------------------------------------------------------------------------------------------


def translate_mysql_ddl(schema_sql: str) -> tuple[list[str], dict[str, list[tuple[str, str]]]]:
    """MySQL ``CREATE TABLE`` statements → SQLite statements, with sqlglot.

    Returns ``(statements, tables)``: the SQLite DDL (``CREATE TABLE`` then ``CREATE INDEX``) and
    ``{table: [(column, declared SQLite type), ...]}`` in column order. Raises
    :class:`SpiderError` when the DDL does not parse or holds no table.
    """
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ParseError, TokenError

    try:
        statements = [s for s in sqlglot.parse(schema_sql, read="mysql") if s is not None]
    except (ParseError, TokenError) as e:
        raise SpiderError(f"cannot parse MySQL DDL: {str(e).splitlines()[0][:300]}") from None
    creates: list[str] = []
    indexes: list[str] = []
    tables: dict[str, list[tuple[str, str]]] = {}
    for stmt in statements:
        if not isinstance(stmt, exp.Create) or (stmt.args.get("kind") or "").upper() != "TABLE":
            continue
        for t in stmt.find_all(exp.Table):
            t.set("db", None)
            t.set("catalog", None)
        schema = stmt.this
        table = schema.this.name if isinstance(schema, exp.Schema) else stmt.this.name
        cols: list[tuple[str, str]] = []
        for i, item in enumerate(
            list(schema.expressions) if isinstance(schema, exp.Schema) else []
        ):
            if isinstance(item, exp.IndexColumnConstraint):
                idx_cols = ", ".join(c.sql(dialect="sqlite") for c in item.expressions)
                idx_name = item.this.name if item.this else f"idx_{table}_{i}"
                indexes.append(f'CREATE INDEX "{table}_{idx_name}" ON "{table}" ({idx_cols})')
                item.pop()
            elif isinstance(item, exp.ColumnDef):
                kind = item.args.get("kind")
                cols.append((item.name, kind.sql(dialect="sqlite") if kind is not None else ""))
        creates.append(stmt.sql(dialect="sqlite"))
        tables[table] = cols
    if not tables:
        raise SpiderError("no CREATE TABLE statement in the DDL")
    return creates + indexes, tables


def _csv_rows(path: Path, columns: list[tuple[str, str]]) -> tuple[list[str], list[tuple]]:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            return [c for c, _ in columns], []
        declared = {c.lower(): t for c, t in columns}
        unknown = [h for h in header if h.lower() not in declared]
        if unknown:
            raise SpiderError(f"{path}: columns {unknown} are not in the table's DDL")
        numeric = [bool(_NUMERIC_TYPE.search(declared[h.lower()])) for h in header]
        rows = []
        for lineno, rec in enumerate(reader, start=2):
            if not rec:
                continue
            if len(rec) != len(header):
                raise SpiderError(f"{path}:{lineno}: {len(rec)} fields, header has {len(header)}")
            rows.append(
                tuple(
                    None if v == "NULL" or (v == "" and num) else v for v, num in zip(rec, numeric)
                )
            )
        return header, rows


def build_spider_database(db_dir: str | Path, out_path: str | Path) -> Path:
    """Build one Spider database (``db_dir`` holds ``schema.sql`` and ``data/*.csv``) into the
    SQLite file ``out_path`` (replaced atomically). A table without a CSV file stays empty; a CSV
    whose table is not in the DDL raises :class:`SpiderError`. Returns ``out_path``."""
    db_dir, out_path = Path(db_dir), Path(out_path)
    schema_file = db_dir / "schema.sql"
    if not schema_file.is_file():
        raise SpiderError(f"{schema_file}: not found")
    statements, tables = translate_mysql_ddl(schema_file.read_text(encoding="utf-8"))
    by_lower = {t.lower(): t for t in tables}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        conn = sqlite3.connect(tmp)
        try:
            for stmt in statements:
                conn.execute(stmt)
            for csv_file in sorted((db_dir / "data").glob("*.csv")):
                table = by_lower.get(csv_file.stem.lower())
                if table is None:
                    raise SpiderError(f"{csv_file}: no table {csv_file.stem!r} in {schema_file}")
                header, rows = _csv_rows(csv_file, tables[table])
                if not rows:
                    continue
                cols = ", ".join(f'"{h}"' for h in header)
                marks = ", ".join("?" * len(header))
                try:
                    conn.executemany(f'INSERT INTO "{table}" ({cols}) VALUES ({marks})', rows)
                except sqlite3.Error as e:
                    raise SpiderError(f"{csv_file}: cannot load into {table}: {e}") from None
            conn.commit()
        finally:
            conn.close()
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path


def _newest_source(db_dir: Path) -> float:
    files = [db_dir / "schema.sql", *sorted((db_dir / "data").glob("*.csv"))]
    return max(f.stat().st_mtime for f in files if f.exists())


def build_spider_databases(
    source_dir: str | Path, out_dir: str | Path, db_ids: Iterable[str] | None = None
) -> dict[str, Path]:
    """Build every Spider database under ``source_dir`` (each ``<db_id>/schema.sql`` +
    ``<db_id>/data/*.csv``) into ``<out_dir>/<db_id>.sqlite``; ``db_ids`` restricts the set.

    Returns ``{db_id: path}`` sorted by db_id. Up-to-date files are reused (not rebuilt).
    Raises :class:`SpiderError` when ``source_dir`` holds no database or a requested db_id is
    missing; the error of one malformed database names it.
    """
    src, out = Path(source_dir), Path(out_dir)
    available = (
        sorted(p.name for p in src.iterdir() if (p / "schema.sql").is_file())
        if src.is_dir()
        else []
    )
    if not available:
        raise SpiderError(f"{src}: no Spider databases (<db_id>/schema.sql) found")
    wanted = list(db_ids) if db_ids is not None else available
    missing = [d for d in wanted if d not in available]
    if missing:
        raise SpiderError(f"{src}: no source for databases {missing}")
    paths: dict[str, Path] = {}
    for db_id in sorted(wanted):
        target = out / f"{db_id}.sqlite"
        if not (target.exists() and target.stat().st_mtime >= _newest_source(src / db_id)):
            try:
                build_spider_database(src / db_id, target)
            except SpiderError as e:
                raise SpiderError(f"database {db_id}: {e}") from None
        paths[db_id] = target
    return paths


# --------------------------------------------------------------------------------------------
# Execution
# --------------------------------------------------------------------------------------------


def run_sqlite(path: str | Path, sql: str, timeout_ms: int = 30_000) -> list[tuple]:
    """All rows of ``sql`` on the SQLite file ``path``, opened read-only (``mode=ro``), through
    the guarded executor (:mod:`tasks.db.sqlite_guard`): only reads authorised (no ATTACH — which
    would create a file even on a read-only connection — no PRAGMA, no VACUUM INTO), results
    bounded by :data:`tasks.db.sqlite_guard.DEFAULT_MAX_RESULT_BYTES`.

    The query is interrupted after ``timeout_ms`` milliseconds. Raises ``sqlite3.Error`` for an
    engine error (``interrupted`` on timeout, ``not authorized`` for a refused statement,
    :class:`tasks.db.sqlite_guard.ResultTooLarge`)."""
    return run_file_query(path, sql, timeout_ms)


def _table_row_counts(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {n.lower(): conn.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0] for n in names}
    finally:
        conn.close()


def _tables_read(sql: str) -> set[str]:
    import sqlglot
    from sqlglot import exp

    for dialect in ("sqlite", "mysql"):
        try:
            tree = sqlglot.parse_one(sql, read=dialect)
        except Exception:
            continue
        ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
        return {t.name.lower() for t in tree.find_all(exp.Table) if t.name.lower() not in ctes}
    return set()


def _ordered(sql: str) -> bool:
    for dialect in ("sqlite", "mysql"):
        try:
            return has_top_level_order_by(sql, dialect)
        except Exception:
            continue
    return bool(re.search(r"\border\s+by\b[^)]*$", sql, re.IGNORECASE))


def load_predictions(path: str | Path) -> list[str] | dict[str, str]:
    """Read a predictions file.

    - ``.jsonl``: one JSON object per line with ``query_id`` (or ``index``) and ``sql`` (or
      ``pred``/``prediction``) → ``{query_id: sql}``;
    - anything else: one SQL per line, in the order of the gold file (Spider's format); a
      ``<TAB>db_id`` suffix is allowed and dropped; blank lines are kept as empty predictions
      only between non-blank ones (trailing blank lines are ignored) → ``[sql, ...]``.

    Raises :class:`SpiderError` naming the file and line for malformed JSONL.
    """
    p = Path(path)
    if not p.is_file():
        raise SpiderError(f"{p}: predictions file not found")
    text = p.read_text(encoding="utf-8")
    if p.suffix.lower() == ".jsonl":

        def parse(obj) -> tuple[Any, Any]:
            qid = obj["query_id"] if "query_id" in obj else obj["index"]
            return qid, next(obj[k] for k in ("sql", "pred", "prediction") if k in obj)

        def bad_line(lineno: int, _exc: Exception) -> SpiderError:
            return SpiderError(f"{p}:{lineno}: expected a JSON object with query_id and sql")

        out: dict[str, str] = {}
        for _, (qid, sql) in parse_jsonl(text, parse, bad_line,
                                         (ValueError, KeyError, StopIteration, TypeError)):
            out[str(qid)] = "" if sql is None else str(sql)
        return out
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    return [ln.rsplit("\t", 1)[0].strip() if "\t" in ln else ln.strip() for ln in lines]


def score_execution_accuracy(
    predictions: Sequence[str] | Mapping[str, str],
    gold: Iterable,
    db_paths: Mapping[str, str | Path],
    timeout_ms: int = 30_000,
) -> pl.DataFrame:
    """Execution accuracy (EX) of ``predictions`` against ``gold`` on the Spider databases.

    - ``predictions``: SQL strings aligned with ``gold`` (list), or ``{query_id: sql}``.
    - ``gold``: a :class:`tasks.text2sql.corpora.Corpus` / iterable of ``CorpusQuery`` (``query_id``,
      ``sql``, ``db_id``) or of ``(sql, db_id)`` pairs (query ids ``"0"``, ``"1"``...).
    - ``db_paths``: ``{db_id: SQLite path}`` (from :func:`build_spider_databases`).
    - ``timeout_ms``: per-query execution limit (a timed-out prediction is ``pred_error``).

    Returns one row per gold query: ``query_id``, ``db_id``, ``gold_sql``, ``pred_sql``,
    ``ordered`` (gold has a top-level ORDER BY, so row order is compared), ``status`` (see
    :data:`EX_STATUSES`), ``ex`` (True/False; null for queries left out), ``error`` (engine
    message for ``pred_error``/``gold_error``, the empty tables for ``missing_data``).
    Raises :class:`SpiderError` when a list of predictions has a different length than gold.
    """
    items = []
    for i, g in enumerate(gold):
        if hasattr(g, "sql") and hasattr(g, "db_id"):
            items.append((str(g.query_id), g.sql, g.db_id))
        else:
            sql, db_id = g
            items.append((str(i), sql, db_id))
    if isinstance(predictions, Mapping):
        preds = {str(k): v for k, v in predictions.items()}
    else:
        preds_list = list(predictions)
        if len(preds_list) != len(items):
            raise SpiderError(
                f"{len(preds_list)} predictions for {len(items)} gold queries; a predictions "
                "list must have one SQL per gold query, in order"
            )
        preds = {qid: p for (qid, _, _), p in zip(items, preds_list)}
    counts: dict[str, dict[str, int]] = {}
    rows = []
    for qid, gold_sql, db_id in items:
        pred_sql = preds.get(qid)
        row = {
            "query_id": qid,
            "db_id": db_id,
            "gold_sql": gold_sql,
            "pred_sql": pred_sql,
            "ordered": _ordered(gold_sql),
            "status": None,
            "ex": None,
            "error": None,
        }
        rows.append(row)
        path = db_paths.get(db_id)
        if path is None or not Path(path).is_file():
            row.update(status="no_database", error=f"database {db_id!r} was not built")
            continue
        if db_id not in counts:
            counts[db_id] = _table_row_counts(Path(path))
        empty = sorted(t for t in _tables_read(gold_sql) if counts[db_id].get(t) == 0)
        if empty:
            row.update(status="missing_data", error=f"no rows in {db_id}: {', '.join(empty)}")
            continue
        try:
            gold_rows = run_sqlite(path, gold_sql, timeout_ms)
        except sqlite3.Error as e:
            row.update(status="gold_error", error=str(e))
            continue
        if pred_sql is None or not str(pred_sql).strip():
            row.update(status="no_prediction", ex=False)
            continue
        try:
            pred_rows = run_sqlite(path, pred_sql, timeout_ms)
        except (sqlite3.Error, sqlite3.Warning, ValueError) as e:
            row.update(status="pred_error", ex=False, error=str(e) or type(e).__name__)
            continue
        ok = results_match(gold_rows, pred_rows, ordered=row["ordered"])
        row.update(status="match" if ok else "mismatch", ex=ok)
    schema = {
        "query_id": pl.String,
        "db_id": pl.String,
        "gold_sql": pl.String,
        "pred_sql": pl.String,
        "ordered": pl.Boolean,
        "status": pl.String,
        "ex": pl.Boolean,
        "error": pl.String,
    }
    return pl.DataFrame(rows, schema=schema)


def execution_accuracy_summary(scores: pl.DataFrame) -> dict:
    """Summary of :func:`score_execution_accuracy` rows: ``{"ex": mean over scored queries
    (None when none), "n_scored", "n_correct", "n_excluded", "excluded": [{"query_id", "db_id",
    "status", "error"}, ...], "by_status": {status: count}}``."""
    scored = scores.filter(pl.col("ex").is_not_null())
    excluded = scores.filter(pl.col("status").is_in(list(_EXCLUDED)))
    n_correct = int(scored["ex"].sum()) if scored.height else 0
    return {
        "ex": n_correct / scored.height if scored.height else None,
        "n_scored": scored.height,
        "n_correct": n_correct,
        "n_excluded": excluded.height,
        "excluded": excluded.select("query_id", "db_id", "status", "error").to_dicts(),
        "by_status": dict(scores.group_by("status").len().sort("status").iter_rows()),
    }
