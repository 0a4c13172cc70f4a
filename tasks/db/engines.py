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
Each engine is one class registered in :mod:`tasks.db.registry` (``load`` / ``location`` /
``open``); this module dispatches through the registry.
``QUERYLAB_HOME`` is closed to other OS users on first use (:func:`tasks.core.fsperm.secure_state`).
"""

from __future__ import annotations

import threading
from pathlib import Path

from tasks.core.prefect_task import task

from schemas.settings import Settings
from tasks.core import storage
from tasks.core.fsperm import secure_state
from tasks.db.base import Database
from tasks.db.registry import build_dir, get_engine
from tasks.db.registry import physical_name as _physical_name
from tasks.db.registry import placed_tables as _placed_tables

__all__ = ["build_dir", "ensure_loaded", "open_database", "open_databases", "load_database",
           "warm_up"]

_LOCK = threading.RLock()
_OPEN: dict[tuple, Database] = {}
_LOADED: set[tuple] = set()


def ensure_loaded(manifest: dict, db: str, settings: Settings) -> str:
    """Load database ``db`` of a built dataset into its engine unless already loaded.

    Returns a short description of where it lives (a file path, a PG database name or a Mongo
    database name). Raises KeyError for an unknown ``db``, ValueError for an engine no module
    registered (:mod:`tasks.db.registry`); engine errors propagate.
    """
    engine = manifest["databases"][db]["engine"]
    key = (manifest["name"], manifest["version"], db, settings.postgres_url, settings.mongo_uri,
           str(settings.home))
    with _LOCK:
        if key in _LOADED:
            return _location(manifest, db, settings)
        _secure_home(settings)
        get_engine(engine).load(manifest, db, settings)
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
    return get_engine(manifest["databases"][db]["engine"]).location(manifest, db, settings)


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
            _OPEN[key] = get_engine(engine).open(manifest, db, settings, ms)
        return _OPEN[key]


def open_databases(manifest: dict, settings: Settings) -> dict[str, Database]:
    """Every database of a built dataset, by logical name (see :func:`open_database`)."""
    return {db: open_database(manifest, db, settings) for db in manifest["databases"]}


_WARMED: set[type] = set()


def warm_up(databases: dict[str, Database]) -> None:
    """Run each database class's :meth:`Database.warm_up` once per process, in a daemon thread
    (the trials stage calls it while its first model calls wait: otherwise the first
    ``query_db`` of every trial queues behind one parser import and one worker start, ~0.5 s
    each at 64 trials in flight). Returns at once; errors are left to the first query."""
    with _LOCK:
        todo = [d for d in {type(d): d for d in databases.values()}.values()
                if type(d) not in _WARMED]
        _WARMED.update(type(d) for d in todo)
    if not todo:
        return

    def run() -> None:
        for d in todo:
            try:
                d.warm_up()
            except Exception:  # noqa: BLE001 - the first query reports what fails
                pass

    threading.Thread(target=run, daemon=True, name="warm-up-databases").start()


@task(name="load-database", persist_result=False)
def load_database(manifest_uri: str, db: str) -> str:
    """Prefect task: :func:`ensure_loaded` for one database of a built dataset (settings from
    the environment). Returns where it lives."""
    return ensure_loaded(storage.read_json(manifest_uri), db, Settings.from_env())
