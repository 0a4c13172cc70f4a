"""Instance databases for SQL equivalence (:class:`InstanceDB`): an in-memory DuckDB or SQLite
database, or a schema of its own in a scratch PostgreSQL database, holding a schema's tables, to
load small instances into (:meth:`InstanceDB.load`, parents before children, unique indexes on
expressions checked after) and run the two queries on (:meth:`InstanceDB.run`, with a per-query
time limit; SQLite reads through :class:`tasks.db.sqlite_guard.ReadGate`).

Split out of :mod:`tasks.equivalence.instances`; the code moved verbatim."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Self

import duckdb

from tasks.db.sqlite_guard import ReadGate, fetch_rows
from tasks.equivalence.instances import ENGINES, Outcome, _short, literal
from tasks.equivalence.relschema import RelSchema, SchemaError
from tasks.equivalence.relschema import ident as _ident


class UniqueIndexViolation(Exception):
    """An instance breaks a unique index on expressions or a partial one
    (:class:`tasks.equivalence.relschema.UniqueIndex`), checked after it loads."""


_ENGINE_ERRORS: tuple[type[BaseException], ...] = (duckdb.Error, sqlite3.Error, UniqueIndexViolation)


def _pg_errors() -> tuple[type[BaseException], ...]:
    import psycopg

    return (psycopg.Error,)


class InstanceDB:
    """A database holding ``tables`` of ``schema`` — in-memory DuckDB (single thread) or
    SQLite, or a schema of its own in a scratch PostgreSQL database (``pg``: a shared
    :class:`tasks.db.pg_scratch.ScratchDatabase`, else one is created and dropped on close) — to
    load instances into (:meth:`load`) and run queries on (:meth:`run`).

    With ``constraints`` the tables carry their keys (NOT NULL, PK, UNIQUE, FK; SQLite with
    ``PRAGMA foreign_keys=ON``; self-references and cycles deferred to commit on SQLite and
    PostgreSQL, not declared on DuckDB — :attr:`notes`), so inserting an instance that breaks
    one raises; the finder's search sandbox omits them for speed (its generator keeps them),
    the verification sandbox keeps them. ``checks`` (default: ``constraints``) declares the
    CHECK constraints (the finder's search sandbox keeps them, so an instance breaking one does
    not load); when the engine cannot create one, the table is created without and
    :attr:`notes` says so. ``mysql``: text columns compare case-insensitively (MySQL's
    default collations); ``integer_division``: DuckDB's ``/`` divides integers as integers;
    ``many_joins``: DuckDB skips its join-order search (planning dominates on tiny data). A
    query running over its time limit is interrupted and returns an outcome with ``timeout``.
    Use as a context manager or call :meth:`close`.
    """

    def __init__(self, schema: RelSchema, tables: Sequence[str], engine: str = "duckdb",
                 *, constraints: bool = False, checks: bool | None = None,
                 query_timeout_s: float = 5.0, mysql: bool = False,
                 integer_division: bool = False, pg=None, many_joins: bool = False) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: use one of {ENGINES}")
        self.schema = schema
        self.engine = engine
        self.mysql = mysql
        self.tables = schema.closure(tables)
        self.query_timeout_s = query_timeout_s
        self.constraints = constraints
        self._loaded: set[str] = set()
        self._names = {t: _ident(schema.tables[t].name, engine) for t in self.tables}
        self._prefixes: dict[str, str] = {}
        self._current: dict[str, list[tuple]] = {}
        self._deadline: float | None = None
        self._interrupted = False
        self._closed = threading.Event()
        self._own_pg = None
        self._pg_timeout_ms: int | None = None
        self.notes: list[str] = []
        self._errors = _ENGINE_ERRORS
        if engine == "duckdb":
            # a pair's SQL may be a model's: no file, extension or network access, and no
            # setting it can change back (COPY ... TO, read_csv, ATTACH, INSTALL all refused)
            self.con = duckdb.connect(":memory:", config={"threads": 1,
                                                          "enable_external_access": False})
            if integer_division:
                self.con.execute("SET integer_division = true")
            if many_joins:
                # planning a many-way join costs DuckDB ~30 ms, the tiny instances ~1 ms:
                # the join-order search is skipped (the results are the same)
                self.con.execute("SET disabled_optimizers = 'join_order'")
            self.con.execute("SET lock_configuration = true")
            self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                              name="equivalence-sandbox-watchdog")
            self._watchdog.start()
        elif engine == "sqlite":
            self.con = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            self._gate = ReadGate(self.con)  # queries read only; the harness loads
            if constraints:
                self.con.execute("PRAGMA foreign_keys = ON")
        else:
            from tasks.db.pg_scratch import ScratchDatabase

            self._errors = _ENGINE_ERRORS + _pg_errors()
            if pg is None:
                pg = self._own_pg = ScratchDatabase()
            self.con = pg.connect()
        try:
            self._create(checks)
        except SchemaError:
            self.close()
            raise

    def _create(self, checks: bool | None) -> None:
        schema, engine, constraints = self.schema, self.engine, self.constraints
        checks = constraints if checks is None else checks
        if engine in ("duckdb", "postgres"):
            for name, values in schema.enum_types(self.tables).items():
                vals = ", ".join(literal(v, engine) for v in values)
                try:
                    self._exec(f"CREATE TYPE {_ident(name, engine)} AS ENUM ({vals})")
                except self._errors as exc:
                    raise SchemaError(f"cannot create enum type {name} on {engine}: {_short(exc)}") from None
        for name in self.tables:
            attempts = [(False, checks), (True, checks)]
            first_error = ""
            if checks and schema.tables[name].checks:
                attempts.append((True, False))
            for n, (category_types, with_checks) in enumerate(attempts):
                ddl = schema.create_sql(name, engine, constraints=constraints, tables=self.tables,
                                        category_types=category_types, checks=with_checks,
                                        nocase=self.mysql)
                try:
                    self._exec(ddl)
                    if checks and not with_checks:
                        self.notes.append(f"CHECK constraints of table {name} not enforced: "
                                          f"{engine} cannot create them ({first_error})")
                    break
                except self._errors as exc:
                    if n == 0:
                        first_error = _short(exc)
                    if n == len(attempts) - 1:
                        raise SchemaError(f"cannot create table {name} on {engine}: {first_error}") from None
        if constraints:
            statements, notes = schema.deferred_fk_sql(self.tables, engine)
            self.notes.extend(notes)
            for st in statements:
                try:
                    self._exec(st)
                except self._errors as exc:
                    raise SchemaError(f"cannot declare a foreign key on {engine}: {_short(exc)}") from None

    # -- plumbing ----------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._closed.wait(0.02):
            d = self._deadline
            if d is not None and time.monotonic() > d:
                try:
                    self._interrupted = True
                    self.con.interrupt()
                except Exception:  # noqa: BLE001, S110 - connection already closed
                    pass
                self._deadline = None

    def _exec(self, sql: str) -> None:
        self.con.execute(self._gate.trusted(sql) if self.engine == "sqlite" else sql)

    def close(self) -> None:
        """Close the connection (and drop the scratch database this sandbox made)."""
        self._closed.set()
        try:
            self.con.close()
        except Exception:  # noqa: BLE001, S110 - already closed
            pass
        if self._own_pg is not None:
            self._own_pg.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- use ---------------------------------------------------------------------------------

    def _insert(self, t: str, rows: Sequence[tuple]) -> str:
        prefix = self._prefixes.get(t)
        table = self.schema.tables[t]
        cols = table.inserted
        if prefix is None:
            names = ", ".join(_ident(table.columns[i].name, self.engine) for i in cols)
            prefix = self._prefixes[t] = f"INSERT INTO {self._names[t]} ({names}) VALUES "
        engine = self.engine
        return prefix + ", ".join("(" + ", ".join(literal(row[i], engine) for i in cols) + ")" for row in rows)

    def load(self, instance: Mapping[str, Sequence[tuple]]) -> None:
        """Replace the contents of the sandbox's tables with ``instance`` (tables missing from
        it are left empty). Inserts parents before children, in one transaction where foreign
        keys are deferred. Raises the engine's error (e.g. a constraint violation) and
        KeyError for a table outside the sandbox."""
        for t in instance:
            if t not in self.tables:
                raise KeyError(f"table {t!r} is not in this sandbox ({self.tables})")
        want = {t: list(instance.get(t) or []) for t in self.tables}
        # only the tables whose rows change are emptied and refilled (children first / last)
        changed = [t for t in self.tables if want[t] != self._current.get(t, [])]
        if self.constraints:  # a changed parent may be referenced: refill its children too
            changed = list(self.tables) if changed else []
        statements = [f"DELETE FROM {self._names[t]}" for t in reversed(changed) if t in self._loaded]
        for t in changed:
            self._loaded.discard(t)
            if want[t]:
                self._loaded.add(t)
                statements.append(self._insert(t, want[t]))
        self._current = {}
        try:
            self.execute_all(statements)
            self._check_unique_indexes(changed)
        except BaseException:
            self._loaded = set(self.tables)  # unknown state: empty everything next time
            raise
        self._current = want

    def _check_unique_indexes(self, tables: Sequence[str]) -> None:
        """Raise UniqueIndexViolation when a loaded table breaks one of its unique indexes on
        expressions / partial ones (no engine here declares both forms)."""
        for t in tables:
            for ux in self.schema.tables[t].unique_indexes:
                sql = ux.violation_sql(self._names[t], self.engine)
                cur = self.con.execute(self._gate.trusted(sql) if self.engine == "sqlite" else sql)
                if cur.fetchone() is not None:
                    raise UniqueIndexViolation(f"the rows of {self.schema.tables[t].name} break the "
                                               f"unique index {ux.name}")

    def execute_all(self, statements: Sequence[str]) -> None:
        """Run DDL/DML statements in the engine's dialect, in one transaction when the engine
        checks deferred foreign keys at commit; engine errors propagate (and roll back)."""
        if not statements:
            return
        if self.engine == "duckdb":  # one call: DuckDB's per-call overhead dominates tiny loads
            self._exec(";\n".join(statements))
            return
        if self.engine == "postgres":
            body = ";\n".join(statements)
            try:
                self._exec(f"BEGIN;\n{body};\nCOMMIT")
            except self._errors:
                try:
                    self._exec("ROLLBACK")
                except self._errors:
                    pass
                raise
            return
        transaction = self.constraints and len(statements) > 1
        if transaction:
            self._exec("BEGIN")
        try:
            for st in statements:
                self._exec(st)
            if transaction:
                self._exec("COMMIT")
        except self._errors:
            if transaction:
                try:
                    self._exec("ROLLBACK")
                except self._errors:
                    pass
            raise

    def execute(self, sql: str) -> None:
        """Run one statement (DDL/DML) in the engine's dialect; engine errors propagate."""
        self._exec(sql)

    def clear(self) -> None:
        """Delete every row of the sandbox's tables (children first)."""
        self.execute_all([f"DELETE FROM {self._names[t]}" for t in reversed(self.tables)])
        self._loaded.clear()
        self._current = {}

    def run(self, sql: str, timeout_s: float | None = None) -> Outcome:
        """Run one query (in the engine's dialect) and fetch every row; errors and timeouts
        (``timeout_s``, default and at most the sandbox's per-query limit) become an
        :class:`Outcome` with ``error`` (and ``timeout``). On SQLite the query runs under
        :class:`tasks.db.sqlite_guard.ReadGate`: only reads are authorised (no ATTACH, no write,
        no PRAGMA), interrupted after the limit, the result bounded in bytes."""
        limit = self.query_timeout_s if timeout_s is None else max(0.05, min(timeout_s, self.query_timeout_s))
        if self.engine == "sqlite":  # the guarded executor: reads only, time and byte limits
            if sql.startswith(self._gate.tag):  # cannot happen unless the token leaked
                return Outcome(error="not authorized: a harness statement")
            guard = None
            try:
                with self._gate.read_only(limit * 1000, steps=20_000) as guard:
                    cur = self.con.execute(sql)
                    rows = fetch_rows(cur)
                return Outcome(rows=rows, ncols=len(cur.description or ()))
            except (sqlite3.Error, ValueError, OverflowError) as exc:
                timed_out = guard is not None and guard.timed_out
                return Outcome(error=_short(exc) if not timed_out else f"timed out after {limit:.1f} s",
                               timeout=timed_out)
        if self.engine == "postgres":
            ms = max(1, int(limit * 1000))
            try:
                if ms != self._pg_timeout_ms:
                    self.con.execute(f"SET statement_timeout = {ms}")
                    self._pg_timeout_ms = ms
                cur = self.con.execute(sql)
                rows = [tuple(r) for r in cur.fetchall()] if cur.description else []
                return Outcome(rows=rows, ncols=len(cur.description or ()))
            except self._errors as exc:
                import psycopg

                if isinstance(exc, psycopg.errors.QueryCanceled):
                    return Outcome(error=f"timed out after {limit:.1f} s", timeout=True)
                from tasks.db.postgres import _pg_message

                return Outcome(error=_pg_message(exc))
            except (ValueError, OverflowError) as exc:
                return Outcome(error=_short(exc))
        self._interrupted = False
        self._deadline = time.monotonic() + limit
        try:
            res = self.con.execute(sql)
            rows = [tuple(r) for r in res.fetchall()]
            return Outcome(rows=rows, ncols=len(res.description or ()))
        except (duckdb.Error, ValueError, OverflowError, RuntimeError) as exc:
            if self._interrupted:
                return Outcome(error=f"timed out after {limit:.1f} s", timeout=True)
            return Outcome(error=_short(exc))
        finally:
            self._deadline = None
