"""SQL corpora: TPC-DS (schema, 99 gold queries, business questions), Spider dev, BIRD dev.

- **TPC-DS** comes from PyPI, offline: ``duckdb==1.4.4`` plus ``duckdb-ext-tpcds`` (the wheel
  ships ``duckdb_ext/extensions/v<duckdb version>/<platform>/tpcds.duckdb_extension``). The
  extension is ``LOAD``-ed by path with DuckDB's extension auto-install/auto-load off, so nothing
  is ever downloaded; ``CALL dsdgen(sf=0)`` creates the 24 tables empty and
  ``tpcds_queries()`` returns the 99 queries. The queries parse as PostgreSQL and run on it as
  they are (date arithmetic is written ``date + integer``).
- **Descriptions** of the 99 queries (the "business questions" of the TPC-DS specification,
  appendix B, and their substitution parameters) are read from a JSON file given by path,
  ``{"descriptions": {"1": text, ...}, "params": {"1": ["YEAR.01=2000", ...], ...}}``.
- **Spider / BIRD** gold SQL: any text file of ``SQL<TAB>db_id`` lines (Spider's
  ``gold_example.txt`` format) is a :class:`Corpus` via :func:`load_corpus`; Spider's
  ``tables.json`` gives the per-database schemas used to attribute unqualified columns.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "DEFAULT_DIALECTS",
    "Corpus",
    "CorpusError",
    "CorpusQuery",
    "load_business_questions",
    "load_corpus",
    "load_spider_tables",
    "load_tpcds_corpus",
    "tpcds_connection",
    "tpcds_ddl",
    "tpcds_extension_path",
    "tpcds_gold_queries",
    "tpcds_schema",
]

#: sqlglot dialect to read each known corpus in: Spider writes strings in double quotes (MySQL
#: style, SQLite accepts them) so it is read as MySQL; BIRD uses ``"Match"`` identifiers and
#: ``||`` (SQLite); TPC-DS is PostgreSQL.
DEFAULT_DIALECTS = {"spider": "mysql", "bird": "sqlite", "tpcds": "postgres"}

TPCDS_EXTENSION_PACKAGE = "duckdb-ext-tpcds"


class CorpusError(ValueError):
    """A corpus file is missing or malformed; the message names the file (and line)."""


@dataclass(frozen=True)
class CorpusQuery:
    """One gold query: ``query_id`` (unique in its corpus), ``sql``, ``db_id`` (the database it
    runs on; ``"tpcds"`` for TPC-DS), and for TPC-DS its ``description`` (business question) and
    substitution ``params`` (e.g. ``("YEAR.01=2000", "STATE.01=TN")``)."""

    query_id: str
    sql: str
    db_id: str
    description: str | None = None
    params: tuple[str, ...] = ()


@dataclass
class Corpus:
    """A named list of gold queries in one SQL ``dialect`` (sqlglot name).

    ``schemas`` maps ``db_id`` → ``{table: [column, ...]}`` when known (used to attribute
    unqualified columns when extracting features); ``source`` says where it was read from.
    """

    name: str
    dialect: str
    queries: list[CorpusQuery]
    schemas: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    source: str = ""

    def __len__(self) -> int:
        return len(self.queries)

    def __iter__(self) -> Iterator[CorpusQuery]:
        return iter(self.queries)

    def schema_for(self, db_id: str) -> dict[str, list[str]] | None:
        """The ``{table: columns}`` of ``db_id``, or None when unknown."""
        return self.schemas.get(db_id)

    def by_id(self) -> dict[str, CorpusQuery]:
        """``{query_id: query}``."""
        return {q.query_id: q for q in self.queries}


def load_corpus(
    path: str | Path,
    name: str | None = None,
    dialect: str | None = None,
    tables_json: str | Path | None = None,
) -> Corpus:
    """Read a ``SQL<TAB>db_id`` file (one query per line; blank lines skipped).

    - ``name``: corpus name (default: the file name up to the first ``_`` or ``.``, e.g.
      ``spider`` for ``spider_dev_gold.sql``).
    - ``dialect``: sqlglot dialect (default from :data:`DEFAULT_DIALECTS` by name, else
      ``"sqlite"``).
    - ``tables_json``: optional Spider-format ``tables.json`` giving the schemas.

    ``query_id`` is the 0-based index of the query among the file's non-blank lines (so it
    lines up with a predictions file written in the same order). The SQL is everything before the
    last tab. Raises :class:`CorpusError` naming the file and line for a line without a tab or
    with an empty SQL or db_id, and for a missing or empty file.
    """
    p = Path(path)
    if not p.is_file():
        raise CorpusError(f"{p}: corpus file not found")
    name = name or p.name.split("_")[0].split(".")[0]
    dialect = dialect or DEFAULT_DIALECTS.get(name, "sqlite")
    queries: list[CorpusQuery] = []
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            sql, tab, db_id = line.rpartition("\t")
            if not tab:
                raise CorpusError(f"{p}:{lineno}: expected 'SQL<TAB>db_id', found no tab")
            sql, db_id = sql.strip(), db_id.strip()
            if not sql or not db_id:
                raise CorpusError(f"{p}:{lineno}: empty SQL or db_id")
            queries.append(CorpusQuery(str(len(queries)), sql, db_id))
    if not queries:
        raise CorpusError(f"{p}: no queries")
    schemas = load_spider_tables(tables_json) if tables_json else {}
    return Corpus(name, dialect, queries, schemas, str(p))


def load_spider_tables(path: str | Path) -> dict[str, dict[str, list[str]]]:
    """Spider ``tables.json`` → ``{db_id: {table: [column, ...]}}`` (original names, as in the
    SQL). Raises :class:`CorpusError` when the file is missing or not in that format."""
    p = Path(path)
    try:
        entries = json.loads(p.read_text(encoding="utf-8"))
        out: dict[str, dict[str, list[str]]] = {}
        for db in entries:
            tables = list(db["table_names_original"])
            cols: dict[str, list[str]] = {t: [] for t in tables}
            for table_index, column in db["column_names_original"]:
                if table_index >= 0:
                    cols[tables[table_index]].append(column)
            out[db["db_id"]] = cols
        return out
    except FileNotFoundError:
        raise CorpusError(f"{p}: tables.json not found") from None
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise CorpusError(f"{p}: not a Spider tables.json ({type(e).__name__}: {e})") from None


# --------------------------------------------------------------------------------------------
# TPC-DS from duckdb + duckdb-ext-tpcds
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def tpcds_extension_path() -> Path:
    """Path of ``tpcds.duckdb_extension`` for the installed DuckDB version, from the files of
    the installed ``duckdb-ext-tpcds`` wheel. Raises RuntimeError with the pip command when the
    wheel (or a build for this DuckDB version) is missing."""
    import importlib.metadata as md

    import duckdb

    version = f"v{duckdb.__version__}"
    hint = (
        f"install it with: pip install '{TPCDS_EXTENSION_PACKAGE}=={duckdb.__version__}.*' "
        f"(matching duckdb=={duckdb.__version__})"
    )
    try:
        dist = md.distribution(TPCDS_EXTENSION_PACKAGE)
    except md.PackageNotFoundError:
        raise RuntimeError(f"the TPC-DS extension package is not installed; {hint}") from None
    found = [
        Path(dist.locate_file(f))
        for f in (dist.files or [])
        if f.name == "tpcds.duckdb_extension" and version in f.parts
    ]
    found = [f for f in found if f.is_file()]
    if not found:
        raise RuntimeError(
            f"{TPCDS_EXTENSION_PACKAGE} {dist.version} has no tpcds extension built "
            f"for duckdb {duckdb.__version__}; {hint}"
        )
    return found[0].resolve()


def tpcds_connection():
    """A new in-memory DuckDB connection with the TPC-DS extension loaded from its file and the
    24 tables created empty (``dsdgen(sf=0)``). Extension auto-install and auto-load are off,
    so DuckDB never tries the network."""
    import duckdb

    conn = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    path = str(tpcds_extension_path()).replace("'", "''")
    conn.execute(f"LOAD '{path}'")
    conn.execute("CALL dsdgen(sf=0)")
    return conn


@functools.lru_cache(maxsize=1)
def _tpcds_catalog() -> tuple[dict[str, list[tuple[str, str]]], dict[int, str]]:
    conn = tpcds_connection()
    try:
        rows = conn.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "ORDER BY table_name, ordinal_position"
        ).fetchall()
        queries = conn.execute("SELECT query_nr, query FROM tpcds_queries() ORDER BY 1").fetchall()
    finally:
        conn.close()
    schema: dict[str, list[tuple[str, str]]] = {}
    for table, column, dtype in rows:
        schema.setdefault(table, []).append((column, dtype))
    return schema, {int(n): q.strip() for n, q in queries}


def tpcds_schema() -> dict[str, list[tuple[str, str]]]:
    """The 24 TPC-DS tables: ``{table: [(column, type), ...]}`` in column order (DuckDB type
    names: BIGINT, INTEGER, DECIMAL(7,2), VARCHAR, DATE — all valid in PostgreSQL)."""
    schema, _ = _tpcds_catalog()
    return {t: list(cols) for t, cols in schema.items()}


def tpcds_ddl() -> str:
    """``CREATE TABLE`` statements for the 24 TPC-DS tables (PostgreSQL-compatible), one per
    paragraph, in table-name order: the schema part of the generation prompt."""
    parts = []
    for table, cols in tpcds_schema().items():
        body = ",\n".join(f"    {c} {t}" for c, t in cols)
        parts.append(f"CREATE TABLE {table} (\n{body}\n);")
    return "\n\n".join(parts)


def tpcds_gold_queries() -> dict[str, str]:
    """The 99 TPC-DS queries from the extension: ``{"1": sql, ..., "99": sql}`` (trailing ``;``
    and whitespace removed)."""
    _, queries = _tpcds_catalog()
    return {str(n): q.rstrip().rstrip(";").rstrip() for n, q in sorted(queries.items())}


def load_business_questions(path: str | Path) -> dict[str, dict]:
    """The TPC-DS business questions file → ``{query_id: {"description": str, "params":
    [str, ...]}}`` for ids ``"1"``..``"99"``. Raises :class:`CorpusError` when the file is
    missing, not JSON, or lacks the ``descriptions`` mapping."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CorpusError(f"{p}: business questions file not found") from None
    except ValueError as e:
        raise CorpusError(f"{p}: not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("descriptions"), dict):
        raise CorpusError(f"{p}: expected {{'descriptions': {{id: text}}, 'params': {{...}}}}")
    params = data.get("params") or {}
    return {
        str(k).strip(): {
            "description": str(v).strip(),
            "params": [str(x) for x in params.get(k, [])],
        }
        for k, v in data["descriptions"].items()
    }


def load_tpcds_corpus(descriptions_path: str | Path | None = None) -> Corpus:
    """The 99 TPC-DS gold queries as a :class:`Corpus` (name ``tpcds``, dialect ``postgres``,
    ``db_id`` ``tpcds``, schema attached). With ``descriptions_path`` each query carries its
    business question and substitution parameters; a query without a description there raises
    :class:`CorpusError` (listing the missing ids)."""
    gold = tpcds_gold_queries()
    questions = load_business_questions(descriptions_path) if descriptions_path else {}
    if questions:
        missing = [qid for qid in gold if qid not in questions]
        if missing:
            raise CorpusError(f"{descriptions_path}: no description for TPC-DS queries {missing}")
    queries = [
        CorpusQuery(
            qid,
            sql,
            "tpcds",
            description=questions.get(qid, {}).get("description"),
            params=tuple(questions.get(qid, {}).get("params", ())),
        )
        for qid, sql in gold.items()
    ]
    schema = {t: [c for c, _ in cols] for t, cols in tpcds_schema().items()}
    return Corpus("tpcds", "postgres", queries, {"tpcds": schema}, "duckdb-ext-tpcds")
