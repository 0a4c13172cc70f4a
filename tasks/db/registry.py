"""The engine registry: an engine is one class in one file, decorated with
:func:`register_engine`, that knows how to load a built dataset's database into it, where it
lives and how to open it read-only for agents (see ``docs/architecture-engines.md``).

:mod:`tasks.db.engines` (``ensure_loaded`` / ``open_database``) dispatches through
:func:`get_engine`; the built-in engines register themselves in :mod:`tasks.db.sqlite`,
:mod:`tasks.db.duckdb`, :mod:`tasks.db.postgres` and :mod:`tasks.db.mongo`.

This module stays light (no pyarrow, psycopg or settings at import time): the engine modules it
is imported by also run inside the query worker (:mod:`tasks.db.db_worker`).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.core.registries import check_unclaimed, load_entry_points

if TYPE_CHECKING:  # pragma: no cover
    from schemas.settings import Settings
    from tasks.db.base import Database

__all__ = ["Engine", "FileEngine", "register_engine", "get_engine", "engine_names", "physical_name",
           "build_dir", "placed_tables"]


class Engine:
    """One database engine, as the materialiser sees it. Subclass, set ``name`` (the
    ``engine`` field of a dataset manifest's database entry) and decorate with
    :func:`register_engine`.

    Every method takes the dataset ``manifest`` (dict, see :mod:`tasks.datasets.build`), the
    logical database name ``db`` and the run's :class:`schemas.settings.Settings`; they are
    called under :mod:`tasks.db.engines`' process lock, so they need no locking of their own.
    """

    #: The manifest's ``engine`` value this class serves.
    name: str = ""

    def location(self, manifest: dict, db: str, settings: "Settings") -> str:
        """A short description of where the database lives (a file path, or
        ``<engine>:<physical name>``). The default is the physical database name."""
        return f"{self.name}:{physical_name(manifest, db)}"

    def load(self, manifest: dict, db: str, settings: "Settings") -> None:
        """Load database ``db`` from its placed Parquet tables unless the engine already holds
        this dataset version (idempotent). Engine errors propagate."""
        raise NotImplementedError

    def open(self, manifest: dict, db: str, settings: "Settings", timeout_ms: int) -> "Database":
        """A read-only :class:`tasks.db.base.Database` for the loaded database, with
        ``timeout_ms`` as its time limit per query."""
        raise NotImplementedError


class FileEngine(Engine):
    """An engine whose database is one local file, ``<build_dir>/<db>.<name>`` (SQLite, DuckDB):
    loaded once (a file that exists is loaded), opened as ``database(db, path, timeout_ms=...)``.
    Subclasses set ``name`` and ``database`` and implement :meth:`write`."""

    #: The :class:`tasks.db.base.Database` class that opens the file read-only.
    database: type

    def path(self, manifest: dict, db: str, settings: "Settings") -> Path:
        """The database file: ``<home>/build/<dataset>/<version>/<db>.<name>``."""
        return build_dir(manifest, settings) / f"{db}.{self.name}"

    def location(self, manifest: dict, db: str, settings: "Settings") -> str:
        return str(self.path(manifest, db, settings))

    def load(self, manifest: dict, db: str, settings: "Settings") -> None:
        from tasks.core.fsperm import private_dir

        path = self.path(manifest, db, settings)
        if not path.exists():
            private_dir(Path(settings.home) / "build")
            path.parent.mkdir(parents=True, exist_ok=True)
            with placed_tables(manifest, db) as tables:
                self.write(path, tables)

    def write(self, path: Path, tables: dict[str, Any]) -> None:
        """Write ``tables`` (name → Arrow table or stream) as a new database file ``path``."""
        raise NotImplementedError

    def open(self, manifest: dict, db: str, settings: "Settings", timeout_ms: int) -> "Database":
        return self.database(db, self.location(manifest, db, settings), timeout_ms=timeout_ms)


_ENGINES: dict[str, Engine] = {}
_lock = threading.Lock()


#: The modules of the four built-in engines, registered before any other engine (so a plugin
#: claiming a built-in name is the one refused, whichever is imported first).
_BUILTIN_MODULES = ("tasks.db.duckdb", "tasks.db.sqlite", "tasks.db.postgres", "tasks.db.mongo")


def register_engine(cls: type[Engine]) -> type[Engine]:
    """Class decorator: register one instance of ``cls`` under ``cls.name``. Raises ValueError
    for an empty name or a name already taken by another class (the built-ins are registered
    first)."""
    if not cls.name:
        raise ValueError(f"engine class {cls.__name__} has no name")
    if cls.__module__ not in _BUILTIN_MODULES:
        import tasks.db.databases  # noqa: F401 - the built-in engines first
    with _lock:
        have = _ENGINES.get(cls.name)
        check_unclaimed(None if have is None else type(have), cls, "engine", cls.name)
        _ENGINES[cls.name] = cls()
    return cls


def _builtin() -> None:
    import tasks.db.databases  # noqa: F401 - imports (and so registers) the four built-in engines

    load_entry_points()  # and engines of plugins (the ``querylab`` entry-point group)


def get_engine(name: str) -> Engine:
    """The registered engine called ``name``; ValueError ``unknown engine 'x'`` otherwise."""
    _builtin()
    try:
        return _ENGINES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown engine {name!r}") from None


def engine_names() -> list[str]:
    """Names of every registered engine, sorted."""
    _builtin()
    return sorted(_ENGINES)


def physical_name(manifest: dict, db: str) -> str:
    """The engine-side name of database ``db`` of a built dataset:
    ``ql_<dataset>_<db>_<first 8 hex of sha256(version)>``, lower-cased."""
    digest = hashlib.sha256(manifest["version"].encode()).hexdigest()[:8]
    return f"ql_{manifest['name']}_{db}_{digest}".lower()


def build_dir(manifest: dict, settings: "Settings") -> Path:
    """Local directory holding this dataset version's SQLite and DuckDB files."""
    return Path(settings.home) / "build" / manifest["name"] / manifest["version"]


@contextmanager
def placed_tables(manifest: dict, db: str) -> Iterator[dict[str, Any]]:
    """Table name → placed table of database ``db``, inside a ``with`` block. A table of its
    own Parquet file is a :class:`tasks.core.storage.ParquetStream` (the loaders stream it and never
    hold it whole: multi-GB imported tables load in bounded memory); the tables of a shard placement
    (entries with ``shard``, see :mod:`tasks.datasets.build`) are zero-copy slices of their family's
    file, read once, without the shard column."""
    from tasks.core import storage

    tables = manifest["databases"][db]["tables"]
    per_file: dict[str, int] = {}
    for t in tables.values():
        per_file[t["uri"]] = per_file.get(t["uri"], 0) + 1
    files: dict[str, Any] = {}
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
