"""TPC-DS schema in PostgreSQL and validation of generated SQL by ``EXPLAIN``.

The 24 TPC-DS tables are created empty in the PostgreSQL database :data:`TPCDS_PG_DATABASE`
(:func:`tpcds_postgres_dsn`, on ``QUERYLAB_POSTGRES_URL`` or the embedded server); model-written
SQL is planned, never run, by :class:`PostgresValidator`, logged in as that database's
least-privilege agent role (:func:`tpcds_validator_dsn`). PostgreSQL's message for an invalid
query, with the error position mapped back into the SQL, is what the model is shown on a retry
(:mod:`tasks.text2sql.generators`).

The DSN is never a task parameter (it may hold a password): tasks rebuild it from
:class:`schemas.settings.Settings`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Self

from prefect import task

from schemas.settings import Settings
from tasks.text2sql.corpora import tpcds_schema

TPCDS_PG_DATABASE = "querylab_tpcds"


# --------------------------------------------------------------------------------------------
# TPC-DS schema in PostgreSQL, validation by EXPLAIN
# --------------------------------------------------------------------------------------------


def tpcds_postgres_dsn(settings: Settings | None = None, dbname: str = TPCDS_PG_DATABASE) -> str:
    """DSN of the PostgreSQL database holding the TPC-DS schema (24 empty tables), creating the
    database and the tables when missing (idempotent; safe to call from concurrent tasks).

    The server is ``QUERYLAB_POSTGRES_URL`` or the embedded one under ``QUERYLAB_HOME``.
    Raises ``psycopg.Error`` when the server cannot be reached."""
    import psycopg

    from tasks.db.databases import postgres_database_dsn, postgres_server_url

    settings = settings or Settings.from_env()
    dsn = postgres_database_dsn(
        postgres_server_url(settings.postgres_url, settings.home), dbname, create=True
    )
    tables = tpcds_schema()
    with psycopg.connect(dsn, autocommit=True) as conn:
        present = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        }
        if not set(tables) <= present:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('querylab_tpcds_schema'))")
                present = {
                    r[0]
                    for r in conn.execute(
                        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
                    )
                }
                for table, cols in tables.items():
                    if table in present:
                        continue
                    body = ", ".join(f"{c} {t}" for c, t in cols)
                    conn.execute(f"CREATE TABLE {table} ({body})")
    return dsn


def tpcds_validator_dsn(settings: Settings | None = None, dbname: str = TPCDS_PG_DATABASE) -> str:
    """DSN of the TPC-DS schema database as its least-privilege agent role ``<db>_ro``
    (:func:`tasks.db.pg_roles.ensure_agent_role`: SELECT on its tables, read-only transactions,
    no server-file or signalling functions): what model-written SQL is validated as, never the
    administrator that created the schema. Creates the schema first (:func:`tpcds_postgres_dsn`).
    Raises ``psycopg.Error`` when the server cannot be reached or refuses the role."""
    from tasks.db.databases import postgres_server_url
    from tasks.db.pg_roles import agent_dsn, ensure_agent_role

    settings = settings or Settings.from_env()
    tpcds_postgres_dsn(settings, dbname)
    server = postgres_server_url(settings.postgres_url, settings.home)
    home = Path(settings.home)
    ensure_agent_role(server, dbname, home, embedded=not settings.postgres_url)
    return agent_dsn(server, dbname, home)


@task(name="tpcds-postgres-schema", persist_result=False)
def prepare_tpcds_postgres() -> str:
    """Create (if missing) the PostgreSQL database holding the empty TPC-DS schema; returns the
    database name (the DSN, which may hold a password, stays out of task parameters)."""
    tpcds_postgres_dsn()
    return TPCDS_PG_DATABASE


def _pg_error_text(e: Exception, sql: str, offset: int) -> str:
    """PostgreSQL's message with the error position mapped back into ``sql`` (line/column and
    the text there), plus DETAIL/HINT."""
    diag = getattr(e, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    if not primary:
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    parts = [primary]
    pos = getattr(diag, "statement_position", None)
    if pos:
        i = int(pos) - 1 - offset
        if 0 <= i < len(sql):
            line = sql.count("\n", 0, i) + 1
            col = i - (sql.rfind("\n", 0, i) + 1) + 1
            near = sql[i:].splitlines()[0][:60] if sql[i:].strip() else ""
            parts.append(f"at line {line}, column {col}" + (f": {near!r}" if near else ""))
    for label, attr in (("DETAIL", "message_detail"), ("HINT", "message_hint")):
        value = getattr(diag, attr, None)
        if value:
            parts.append(f"{label}: {value}")
    return "\n".join(parts)


def clean_sql(sql: str) -> str:
    """``sql`` without surrounding whitespace and trailing semicolons."""
    return re.sub(r"[\s;]+$", "", sql.strip())


#: How a query the validator plans may begin (comments and parentheses first): it is prefixed
#: with ``EXPLAIN``, so anything else, e.g. ``ANALYZE`` or an option list, would turn the plan
#: into an execution.
_QUERY_START = re.compile(
    r"(?is)(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/|\()*(?:select|with|values|table)\b")


class PostgresValidator:
    """Validates SQL with ``EXPLAIN`` (the query is planned, never run) on one PostgreSQL
    connection opened read-only with a ``statement_timeout``; ``dsn`` should log in as the
    database's agent role (:func:`tpcds_validator_dsn`). Text that does not begin as a query
    (``ANALYZE ...``, which ``EXPLAIN`` would execute) is refused. Use as a context manager or
    call :meth:`close`. ``validate(sql)`` returns None when PostgreSQL accepts the query, else the
    error message shown to the model."""

    def __init__(self, dsn: str, statement_timeout_ms: int = 10_000):
        import psycopg

        self._conn = psycopg.connect(
            dsn,
            autocommit=True,
            options=f"-c default_transaction_read_only=on -c statement_timeout={int(statement_timeout_ms)}",
        )

    def validate(self, sql: str) -> str | None:
        import psycopg
        import sqlglot
        from sqlglot import exp

        sql = clean_sql(sql)
        if not sql:
            return "empty query"
        try:
            trees = [t for t in sqlglot.parse(sql, read="postgres") if t is not None]
        except Exception:
            trees = []  # PostgreSQL is the judge of syntax
        if len(trees) > 1:
            return f"{len(trees)} statements found; write exactly one SELECT query"
        if trees and not isinstance(trees[0], exp.Query):
            return f"not a query: a {type(trees[0]).__name__.upper()} statement; write one SELECT query"
        if not _QUERY_START.match(sql):  # e.g. "ANALYZE SELECT ...": EXPLAIN would run it
            first = sql.split(None, 1)[0][:40]
            return f"not a query: it starts with {first!r}; write one SELECT query"
        prefix = "EXPLAIN "
        try:
            self._conn.execute(prefix + sql, prepare=False)
        except psycopg.Error as e:
            return _pg_error_text(e, sql, len(prefix))
        return None

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



__all__ = [
    "TPCDS_PG_DATABASE",
    "PostgresValidator",
    "clean_sql",
    "prepare_tpcds_postgres",
    "tpcds_postgres_dsn",
    "tpcds_validator_dsn",
]
