"""The one guarded executor for untrusted SQL on SQLite (model-written, or from a pairs file).

Every place that runs such SQL on SQLite goes through :func:`guarded` (the agents' query tool,
:func:`tasks.db.databases.sqlite_run_local`; Spider EX, :func:`tasks.text2sql.spider.run_sqlite`; the
lifecycle suite, :func:`tasks.lifecycle.schema.run_readonly`; the equivalence instance
databases, :meth:`tasks.equivalence.instance_db.InstanceDB.run`, through a :class:`ReadGate`; a
model's DDL or DML script on a private in-memory copy, :func:`run_sandbox_script`, used by
:func:`tasks.lifecycle.schema.run_script`). For the duration of one query it puts on the
connection:

- an authorizer that allows only reads (``SELECT``, reading a column, calling a function, a
  recursive CTE): every write, ``ATTACH``/``DETACH`` (an ATTACH creates a file even on a
  read-only connection), ``PRAGMA`` (``writable_schema``, ...), ``VACUUM``, DDL, transaction
  control is refused with SQLite's ``not authorized``; ``load_extension()`` fails too
  (extension loading is never enabled on these connections);
- ``SQLITE_LIMIT_ATTACHED`` 0 and ``SQLITE_LIMIT_LENGTH`` :data:`SQLITE_MAX_LENGTH` (a query
  cannot build a string or blob larger than that);
- a progress handler that interrupts the query after ``timeout_ms`` (a runaway recursive CTE
  ends with ``interrupted``) or when the caller's ``stopped()`` says so;

(a sandbox script, :func:`run_sandbox_script`, runs under :func:`sandbox_authorizer` instead:
writes and DDL are allowed on its private copy, ``ATTACH``/``DETACH``, ``VACUUM``,
``load_extension`` and the :data:`DENIED_FUNCTIONS` are not)

and removes them afterwards (so a private connection that the harness itself writes to, an
instance database, can be loaded again). :func:`fetch_rows` bounds what a caller that needs
every row holds: past ``max_result_bytes`` it raises :class:`ResultTooLarge` — a result is
never silently cut (a cut result would be a wrong EX verdict).
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Authorizer actions a guarded query may perform (everything else is denied).
READ_ONLY_ACTIONS = frozenset({
    sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
})
#: Longest string or blob a guarded query may build (``SQLITE_LIMIT_LENGTH``), bytes.
SQLITE_MAX_LENGTH = 64 << 20
#: Default bound of :func:`fetch_rows` (bytes, approximate: text/blob lengths + 8 per other
#: value and per row).
DEFAULT_MAX_RESULT_BYTES = 256 << 20
#: SQLite virtual-machine steps between two checks of the deadline.
PROGRESS_STEPS = 10_000


class ResultTooLarge(sqlite3.DataError):
    """A query's result is larger than the caller's ``max_result_bytes``."""


#: SQL functions a guarded query may not call even though reads are allowed: ``fts3_tokenizer``
#: leaks a pointer and (two arguments) overwrites a tokenizer in a shared query worker; the
#: others touch files or load code when an extension provides them.
DENIED_FUNCTIONS = frozenset({
    "fts3_tokenizer", "load_extension", "readfile", "writefile", "edit", "fsdir", "zipfile",
})


def read_only_authorizer(action: int, arg1: Any = None, arg2: Any = None, *_args: Any) -> int:
    """SQLite authorizer: ``SQLITE_OK`` for :data:`READ_ONLY_ACTIONS` (except calls of
    :data:`DENIED_FUNCTIONS`), else ``SQLITE_DENY``."""
    if action not in READ_ONLY_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and str(arg2 or "").lower() in DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


#: Authorizer actions a sandbox script may not perform (nothing can reach another file).
SANDBOX_DENIED_ACTIONS = frozenset({sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH})
#: Words refused anywhere in a sandbox script before it runs (``VACUUM INTO`` writes a file and
#: has no authorizer action of its own; ``load_extension`` would load code).
SANDBOX_FORBIDDEN = re.compile(r"\b(vacuum|load_extension)\b", re.IGNORECASE)


def sandbox_authorizer(action: int, arg1: Any = None, arg2: Any = None, *_args: Any) -> int:
    """SQLite authorizer of a sandbox script (a private in-memory copy): ``SQLITE_DENY`` for
    :data:`SANDBOX_DENIED_ACTIONS` and calls of :data:`DENIED_FUNCTIONS`, else ``SQLITE_OK``
    (writes, DDL, ``PRAGMA`` and transactions are allowed)."""
    if action in SANDBOX_DENIED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and str(arg2 or "").lower() in DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


@dataclass
class Guard:
    """State of one guarded query: ``deadline`` (``time.monotonic()`` seconds) and
    ``timed_out`` (set when the progress handler interrupted the query for it)."""

    deadline: float
    timed_out: bool = False


@contextmanager
def guarded(conn: sqlite3.Connection, timeout_ms: float,
            stopped: Callable[[], bool] | None = None,
            steps: int = PROGRESS_STEPS, authorize: bool = True,
            authorizer: Callable[..., int] = read_only_authorizer) -> Iterator[Guard]:
    """Run the block's statements on ``conn`` under the read-only guard (module docstring):
    authorizer, no ATTACH, values ≤ :data:`SQLITE_MAX_LENGTH`, interrupted after
    ``timeout_ms`` milliseconds or once ``stopped()`` is true (checked every ``steps`` VM
    steps). A refused statement raises ``sqlite3.DatabaseError`` (``not authorized``), an
    interrupted one ``sqlite3.OperationalError`` (``interrupted``; :attr:`Guard.timed_out`
    tells a timeout from a stop). The previous limits are restored and the authorizer and
    progress handler removed on exit. ``authorize=False``: leave the authorizer to the caller
    (a :class:`ReadGate` keeps its own on the connection); ``authorizer``: the policy installed
    (default :func:`read_only_authorizer`; :func:`sandbox_authorizer` for a sandbox script)."""
    guard = Guard(time.monotonic() + timeout_ms / 1000)

    def progress() -> int:
        if stopped is not None and stopped():
            return 1
        if time.monotonic() > guard.deadline:
            guard.timed_out = True
            return 1
        return 0

    attached = conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    length = conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, SQLITE_MAX_LENGTH)
    if authorize:
        conn.set_authorizer(authorizer)
    conn.set_progress_handler(progress, steps)
    try:
        yield guard
    finally:
        if authorize:
            conn.set_authorizer(None)
        conn.set_progress_handler(None, 0)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, attached)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, length)


def fetch_rows(rows: Iterable[Any], max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
               ) -> list[tuple]:
    """Every row of ``rows`` (a cursor) as tuples; :class:`ResultTooLarge` once their size
    (text/blob lengths, 8 bytes per other value and per row) passes ``max_result_bytes``."""
    out: list[tuple] = []
    size = 0
    for row in rows:
        size += 8 + sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in row)
        if size > max_result_bytes:
            raise ResultTooLarge(
                f"the query's result is larger than {max_result_bytes >> 20} MiB; it was stopped")
        out.append(tuple(row))
    return out


def run_query(conn: sqlite3.Connection, sql: str, timeout_ms: float, *,
              max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
              steps: int = PROGRESS_STEPS) -> list[tuple]:
    """All rows of one untrusted statement on ``conn`` under :func:`guarded`, at most
    ``max_result_bytes`` (:func:`fetch_rows`). Raises ``sqlite3.Error``: ``not authorized``
    for anything but a read, ``interrupted`` after ``timeout_ms``, :class:`ResultTooLarge`,
    ``ProgrammingError`` for more than one statement."""
    with guarded(conn, timeout_ms, steps=steps):
        return fetch_rows(conn.execute(sql), max_result_bytes)


def run_sandbox_script(conn: sqlite3.Connection, sql: str, timeout_ms: float, *,
                       steps: int = PROGRESS_STEPS) -> None:
    """Execute an untrusted script ``sql`` (one or more statements: a model's DDL or DML) on
    ``conn``, a private connection the harness discards (an in-memory copy), under
    :func:`guarded` with :func:`sandbox_authorizer`: a script naming ``VACUUM`` or
    ``load_extension`` (:data:`SANDBOX_FORBIDDEN`) is refused before it runs, ``ATTACH``,
    ``DETACH`` and the :data:`DENIED_FUNCTIONS` while it runs, and it is interrupted after
    ``timeout_ms``. Raises ``sqlite3.Error`` with SQLite's message (``not authorized``,
    ``interrupted``)."""
    if SANDBOX_FORBIDDEN.search(sql):
        raise sqlite3.DatabaseError("not authorized: VACUUM and load_extension are not allowed")
    with guarded(conn, timeout_ms, steps=steps, authorizer=sandbox_authorizer):
        conn.executescript(sql)


class ReadGate:
    """The guard for a private connection that the harness writes to between untrusted
    queries (an instance database: load rows, run both queries, load the next instance).

    Setting an authorizer expires every prepared statement, so switching it per query would
    re-prepare everything (about twice the cost of a finder instance). The gate installs one
    authorizer for the connection's life instead: it allows everything to the harness and only
    :data:`READ_ONLY_ACTIONS` while :meth:`query` runs. The harness's statements go through
    :meth:`trusted`, which tags them with a comment holding a random token, so an untrusted
    query can never reuse a statement the harness prepared (the statement cache is keyed by
    the SQL text, and the token is made after the query was written)."""

    def __init__(self, conn: sqlite3.Connection):
        import secrets

        self.conn = conn
        self.reading = False
        self.tag = f"/* harness {secrets.token_hex(8)} */ "
        conn.set_authorizer(self._authorize)

    def _authorize(self, action: int, *args: Any) -> int:
        if self.reading:
            return read_only_authorizer(action, *args)
        return sqlite3.SQLITE_OK

    def trusted(self, sql: str) -> str:
        """``sql`` (a statement of the harness) tagged so no untrusted query shares it."""
        return self.tag + sql

    @contextmanager
    def read_only(self, timeout_ms: float, steps: int = PROGRESS_STEPS) -> Iterator[Guard]:
        """The block's statements run as untrusted queries: only reads are authorised, under
        :func:`guarded` (limits, ``timeout_ms``); fetch with :func:`fetch_rows`."""
        self.reading = True
        try:
            with guarded(self.conn, timeout_ms, steps=steps, authorize=False) as guard:
                yield guard
        finally:
            self.reading = False

    def query(self, sql: str, timeout_ms: float, *,
              max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
              steps: int = PROGRESS_STEPS) -> list[tuple]:
        """:func:`run_query` on the gate's connection (same limits and errors)."""
        if sql.startswith(self.tag):  # cannot happen unless the token leaked: refuse
            raise sqlite3.DatabaseError("not authorized: a harness statement")
        with self.read_only(timeout_ms, steps):
            return fetch_rows(self.conn.execute(sql), max_result_bytes)


def open_read_only(path: str | Path) -> sqlite3.Connection:
    """The SQLite file ``path`` opened read-only (URI ``mode=ro``; never created), invalid
    UTF-8 in text decoded with replacement characters. ``sqlite3.OperationalError`` when it
    cannot be opened."""
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True,
                           check_same_thread=False, isolation_level=None)
    conn.text_factory = lambda b: b.decode("utf-8", errors="replace")
    return conn


def run_file_query(path: str | Path, sql: str, timeout_ms: float, *,
                   max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> list[tuple]:
    """:func:`run_query` on the SQLite file ``path`` opened with :func:`open_read_only`."""
    conn = open_read_only(path)
    try:
        return run_query(conn, sql, timeout_ms, max_result_bytes=max_result_bytes)
    finally:
        conn.close()
