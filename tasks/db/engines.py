"""Materialise a built dataset into its engines and open them for agents.

The placed Parquet artifacts (see :mod:`tasks.datasets.build`) are the source of truth; engines are a
cache rebuilt from them on demand:

- SQLite / DuckDB: files ``<home>/build/<dataset>/<version>/<database>.{sqlite,duckdb}``;
- PostgreSQL: database ``ql_<dataset>_<database>_<hash>`` on the embedded server (data under
  ``<home>/postgres``) or on ``QUERYLAB_POSTGRES_URL``; a ``querylab_meta.loaded`` marker table
  records a finished load. Agents connect as the database's SELECT-only login role
  (:mod:`tasks.db.pg_roles`), never as the administrator that loaded it;
- MongoDB: database ``ql_<dataset>_<database>_<hash>`` on ``QUERYLAB_MONGO_URI`` (the finished
  load is recorded in database ``querylab_meta``, outside the dataset's), else the process's
  mongomock worker (:mod:`tasks.db.db_worker`), loaded on first use.

Loads are idempotent and guarded by a process lock, so concurrent trial threads share one load.
``QUERYLAB_HOME`` is closed to other OS users on first use (:func:`tasks.core.fsperm.secure_state`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
from tasks.core.prefect_task import task

from schemas.settings import Settings
from tasks.core import storage
from tasks.db.databases import (
    Database,
    DuckDBDatabase,
    MongoDatabase,
    PostgresDatabase,
    SQLiteDatabase,
    load_duckdb,
    load_mongo,
    load_postgres,
    load_sqlite,
    mongo_client,
    mongo_loaded_version,
    mongo_mark_loaded,
    postgres_database_dsn,
    postgres_server_url,
)
from tasks.core.fsperm import private_dir, secure_state
from tasks.db.pg_roles import agent_dsn, ensure_agent_role

_LOCK = threading.RLock()
_OPEN: dict[tuple, Database] = {}
_LOADED: set[tuple] = set()


def _physical_name(manifest: dict, db: str) -> str:
    digest = hashlib.sha256(manifest["version"].encode()).hexdigest()[:8]
    return f"ql_{manifest['name']}_{db}_{digest}".lower()


@contextmanager
def _placed_tables(manifest: dict, db: str) -> Iterator[dict[str, Any]]:
    """Table name → placed table of database ``db``, inside a ``with`` block. A table of its
    own Parquet file is a :class:`tasks.core.storage.ParquetStream` (the loaders stream it and never
    hold it whole: multi-GB imported tables load in bounded memory); the tables of a shard placement
    (entries with ``shard``, see :mod:`tasks.datasets.build`) are zero-copy slices of their family's
    file, read once, without the shard column."""
    tables = manifest["databases"][db]["tables"]
    per_file: dict[str, int] = {}
    for t in tables.values():
        per_file[t["uri"]] = per_file.get(t["uri"], 0) + 1
    files: dict[str, pa.Table] = {}
    streams: list[storage.ParquetStream] = []
    out: dict[str, Any] = {}
    try:
        for name, t in tables.items():
            shard = t.get("shard")
            if shard is None and per_file[t["uri"]] == 1:
                stream = storage.ParquetStream(t["uri"])
                streams.append(stream)
                out[name] = stream
                continue
            if t["uri"] not in files:
                files[t["uri"]] = storage.read_parquet(t["uri"])
            tbl = files[t["uri"]]
            if shard is not None:
                tbl = tbl.slice(shard["offset"], t["rows"]).drop_columns([shard["column"]])
            out[name] = tbl
        yield out
    finally:
        for stream in streams:
            stream.close()


def _mongo_docs(table: Any) -> Any:
    """Rows as BSON-encodable documents (dates become ISO strings; lists stay arrays); a
    stream of batches stays a ``RecordBatchReader`` (its date columns cast to ISO text, batch
    by batch)."""
    if not hasattr(table, "to_pylist"):
        def batches():
            for batch in table:
                yield pa.RecordBatch.from_arrays(
                    [c.cast(pa.string()) if pa.types.is_date(c.type) else c
                     for c in batch.columns],
                    names=batch.schema.names)
        schema = pa.schema([pa.field(f.name, pa.string()) if pa.types.is_date(f.type) else f
                            for f in table.schema])
        return pa.RecordBatchReader.from_batches(schema, batches())
    docs = table.to_pylist()
    for d in docs:
        for k, v in d.items():
            if isinstance(v, dt.date) and not isinstance(v, dt.datetime):
                d[k] = v.isoformat()
    return docs


def build_dir(manifest: dict, settings: Settings) -> Path:
    """Local directory holding this dataset version's SQLite and DuckDB files."""
    return Path(settings.home) / "build" / manifest["name"] / manifest["version"]


def ensure_loaded(manifest: dict, db: str, settings: Settings) -> str:
    """Load database ``db`` of a built dataset into its engine unless already loaded.

    Returns a short description of where it lives (a file path, a PG database name or a Mongo
    database name). Raises KeyError for an unknown ``db``; engine errors propagate.
    """
    engine = manifest["databases"][db]["engine"]
    key = (manifest["name"], manifest["version"], db, settings.postgres_url, settings.mongo_uri,
           str(settings.home))
    with _LOCK:
        if key in _LOADED:
            return _location(manifest, db, settings)
        _secure_home(settings)
        if engine in ("sqlite", "duckdb"):
            path = build_dir(manifest, settings) / f"{db}.{engine}"
            if not path.exists():
                private_dir(Path(settings.home) / "build")
                path.parent.mkdir(parents=True, exist_ok=True)
                loader = load_sqlite if engine == "sqlite" else load_duckdb
                with _placed_tables(manifest, db) as tables:
                    loader(path, tables)
        elif engine == "postgres":
            server = postgres_server_url(settings.postgres_url, Path(settings.home))
            dsn = postgres_database_dsn(server, _physical_name(manifest, db), create=True)
            with psycopg.connect(dsn, autocommit=True) as conn:
                done = conn.execute(
                    "SELECT to_regclass('querylab_meta.loaded') IS NOT NULL"
                ).fetchone()[0]
            if not done:
                with _placed_tables(manifest, db) as tables:
                    load_postgres(dsn, tables)
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("CREATE SCHEMA IF NOT EXISTS querylab_meta")
                    conn.execute(
                        "CREATE TABLE IF NOT EXISTS querylab_meta.loaded (version text)"
                    )
                    conn.execute(
                        "INSERT INTO querylab_meta.loaded VALUES (%s)", (manifest["version"],)
                    )
            ensure_agent_role(server, _physical_name(manifest, db), Path(settings.home),
                              embedded=not settings.postgres_url, force=not done)
        elif engine == "mongodb":
            client = mongo_client(settings.mongo_uri)
            mdb = client[_physical_name(manifest, db)]
            if mongo_loaded_version(mdb) != manifest["version"]:
                with _placed_tables(manifest, db) as tables:
                    load_mongo(mdb, {n: _mongo_docs(t) for n, t in tables.items()})
                mongo_mark_loaded(mdb, manifest["version"])
        else:
            raise ValueError(f"unknown engine {engine!r}")
        _LOADED.add(key)
        return _location(manifest, db, settings)


_SECURED: set[tuple[str, str]] = set()


def _secure_home(settings: Settings) -> None:
    """:func:`tasks.core.fsperm.secure_state` for ``settings.home`` and ``settings.artifacts``,
    once per process."""
    home = str(Path(settings.home).expanduser().resolve())
    if (home, settings.artifacts) not in _SECURED:
        secure_state(home, settings.artifacts)
        _SECURED.add((home, settings.artifacts))


def _location(manifest: dict, db: str, settings: Settings) -> str:
    engine = manifest["databases"][db]["engine"]
    if engine in ("sqlite", "duckdb"):
        return str(build_dir(manifest, settings) / f"{db}.{engine}")
    return f"{engine}:{_physical_name(manifest, db)}"


def open_database(manifest: dict, db: str, settings: Settings) -> Database:
    """A read-only :class:`Database` for ``db`` (loaded first if needed), cached per process,
    with ``settings.statement_timeout_ms`` as its time limit per query. PostgreSQL databases
    are reached through their SELECT-only agent role."""
    ensure_loaded(manifest, db, settings)
    engine = manifest["databases"][db]["engine"]
    ms = settings.statement_timeout_ms
    key = (manifest["name"], manifest["version"], db, settings.postgres_url, settings.mongo_uri,
           str(settings.home), ms)
    with _LOCK:
        if key not in _OPEN:
            if engine == "sqlite":
                _OPEN[key] = SQLiteDatabase(db, _location(manifest, db, settings), timeout_ms=ms)
            elif engine == "duckdb":
                _OPEN[key] = DuckDBDatabase(db, _location(manifest, db, settings), timeout_ms=ms)
            elif engine == "postgres":
                server = postgres_server_url(settings.postgres_url, Path(settings.home))
                _OPEN[key] = PostgresDatabase(
                    db, agent_dsn(server, _physical_name(manifest, db), Path(settings.home)),
                    statement_timeout_ms=ms,
                )
            else:
                client = mongo_client(settings.mongo_uri)
                _OPEN[key] = MongoDatabase(db, client[_physical_name(manifest, db)], timeout_ms=ms)
        return _OPEN[key]


def open_databases(manifest: dict, settings: Settings) -> dict[str, Database]:
    """Every database of a built dataset, by logical name (see :func:`open_database`)."""
    return {db: open_database(manifest, db, settings) for db in manifest["databases"]}


@task(name="load-database", persist_result=False)
def load_database(manifest_uri: str, db: str) -> str:
    """Prefect task: :func:`ensure_loaded` for one database of a built dataset (settings from
    the environment). Returns where it lives."""
    return ensure_loaded(storage.read_json(manifest_uri), db, Settings.from_env())
