"""PostgreSQL dumps of a DAB checkout: parsed without ``psql`` and restored by an unprivileged
throw-away role into a scratch database, whose tables are then streamed out in chunks.

A dump is input from elsewhere, so it is treated as hostile (see :mod:`tasks.datasets.dab_import`):
:func:`split_sql_dump` refuses every psql meta-command, and :func:`postgres_dump_tables` runs
the statements as a login role that owns only the scratch database. The dump's text is parsed
whole (memory ≈ the dump's size); the restored tables are read back with server-side cursors
in chunks (:func:`tasks.datasets.dab_stream.postgres_table`), never whole.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from schemas.settings import Settings
from tasks.datasets.dab_stream import LazyTables, Table, postgres_table


class DabImportError(ValueError):
    """A DAB directory cannot be imported. ``str(err)`` is ``"<path>: <problem>"``."""

    def __init__(self, path: str | Path, problem: str):
        self.path, self.problem = str(path), problem
        super().__init__(f"{path}: {problem}")


#: psql meta-commands of recent ``pg_dump`` output that only restrict psql itself (no effect
#: here: no meta-command runs at all); every other line starting with ``\`` is refused.
_IGNORED_META = ("\\restrict", "\\unrestrict")
#: Statements a dump may hold that need privileges the import role lacks and that do not
#: change the data read back (ownership, grants, comments on extensions, replication
#: settings): when the server refuses one it is skipped, and counted.
_SKIPPABLE = re.compile(
    r"^\s*(ALTER\s+[^;]*\bOWNER\s+TO\b|GRANT\b|REVOKE\b|COMMENT\s+ON\s+EXTENSION\b|"
    r"ALTER\s+DEFAULT\s+PRIVILEGES\b|CREATE\s+EXTENSION\b|SET\s+session_replication_role\b|"
    r"SELECT\s+pg_catalog\.set_config\s*\(\s*'search_path')",
    re.IGNORECASE,
)
_COPY_FROM_STDIN = re.compile(r"^\s*COPY\b.*\bFROM\s+STDIN\b", re.IGNORECASE | re.DOTALL)
#: Seconds one statement of a dump may run, and the whole restore. Enforced by querylab (a
#: watchdog cancels the statement), not only by ``statement_timeout``: a dump's own
#: ``SET statement_timeout = 0`` (pg_dump writes one) cannot lift them.
DUMP_STATEMENT_TIMEOUT_S = 600
DUMP_TOTAL_TIMEOUT_S = 3600


def split_sql_dump(text: str, source: str | Path = "dump") -> Iterator[tuple[int, str, str | None]]:
    """The statements of a plain-format SQL dump, without running anything.

    Yields ``(line, statement, copy_data)``: the 1-based line where the statement starts, its
    text (the ``;`` dropped), and for ``COPY ... FROM stdin`` the data lines that follow it
    up to the ``\\.`` terminator (else None). Quotes are honoured: ``'...'`` (``''``),
    ``E'...'`` (backslash escapes), ``"..."``, dollar quotes ``$tag$...$tag$``, ``--`` and
    nested ``/* */`` comments. Raises DabImportError for a psql meta-command (any ``\\`` outside
    quotes and comments — ``\\!`` runs a shell, ``\\copy`` reads files, ``\\connect`` switches
    databases; only ``\\restrict``/``\\unrestrict`` lines are ignored), an unterminated quote
    or comment, or COPY data without its terminator."""
    i, n, line = 0, len(text), 1
    start, start_line = 0, 1

    def fail(problem: str, at: int) -> DabImportError:
        return DabImportError(source, f"line {at}: {problem}")

    while True:
        m = _INTERESTING.search(text, i)  # plain text is skipped at C speed
        if m is None:
            line += text.count("\n", i, n)
            break
        line += text.count("\n", i, m.start())
        i = m.start()
        c = text[i]
        if c == "-":
            if not text.startswith("--", i):
                i += 1
                continue
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c == "/":
            if not text.startswith("/*", i):
                i += 1
                continue
            depth, j, at = 1, i + 2, line
            while depth:
                k = _COMMENT_MARK.search(text, j)
                if k is None:
                    raise fail("unterminated /* comment", at)
                depth += 1 if k.group() == "/*" else -1
                j = k.end()
            line += text.count("\n", i, j)
            i = j
            continue
        if c in "'\"":
            escapes = c == "'" and i > 0 and text[i - 1] in "eE" and (
                i < 2 or not (text[i - 2].isalnum() or text[i - 2] == "_"))
            pattern = _E_STRING_END if escapes else (_STRING_END if c == "'" else _IDENT_END)
            k = pattern.match(text, i + 1)
            if k is None:
                raise fail(f"unterminated {c}quoted text", line)
            line += text.count("\n", i, k.end())
            i = k.end()
            continue
        if c == "$":
            if i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_"):
                i += 1
                continue
            k = _DOLLAR_TAG.match(text, i)
            if k is None:
                i += 1
                continue
            tag = k.group()
            end = text.find(tag, k.end())
            if end < 0:
                raise fail(f"unterminated {tag} quoted text", line)
            line += text.count("\n", i, end + len(tag))
            i = end + len(tag)
            continue
        if c == "\\":
            ls = text.rfind("\n", 0, i) + 1
            le = text.find("\n", i)
            le = n if le < 0 else le
            whole = text[ls:le].strip()
            if (text[ls:i].strip() == "" and whole.split()[0] in _IGNORED_META
                    and not _strip_sql_comments(text[start:ls]).strip()):
                i, start = le, le
                continue
            raise fail(f"psql meta-command refused: {whole[:80]!r} (querylab runs no psql)", line)
        # c == ";": the end of a statement
        stmt = text[start:i].strip()
        i += 1
        if stmt:
            data = None
            if _COPY_FROM_STDIN.match(_strip_sql_comments(stmt)):
                nl = text.find("\n", i)
                body_start = n if nl < 0 else nl + 1
                if text[i:body_start].strip():
                    raise fail("COPY data must start on the line after COPY ... FROM stdin;", line)
                k = _COPY_END.search(text, body_start)
                if k is None:
                    raise fail("COPY data without its \\. terminator", line)
                data = text[body_start:k.start()]
                line += 1 + data.count("\n")
                i = k.end()
            yield _first_line(text, start, start_line, stmt), stmt, data
        start, start_line = i, line
    rest = text[start:].strip()
    if _strip_sql_comments(rest).strip():
        yield _first_line(text, start, start_line, rest), rest, None


_INTERESTING = re.compile(r"[-/'\"$\\;]")
_COMMENT_MARK = re.compile(r"/\*|\*/")
_STRING_END = re.compile(r"[^']*+(?:''[^']*+)*+'")
_E_STRING_END = re.compile(r"[^'\\]*+(?:(?:\\.|'')[^'\\]*+)*+'", re.DOTALL)
_IDENT_END = re.compile(r'[^"]*+(?:""[^"]*+)*+"')
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")
_COPY_END = re.compile(r"(?m)^\\\.[ \t]*\r?$")


def _first_line(text: str, start: int, start_line: int, stmt: str) -> int:
    """The line of a statement's first token (after blank lines and leading comments)."""
    j = start
    while j < len(text) and text[j] in " \t\r\n":
        start_line += text[j] == "\n"
        j += 1
    lead = stmt[: len(stmt) - len(_strip_sql_comments(stmt))]
    return start_line + lead.count("\n")


def _strip_sql_comments(stmt: str) -> str:
    """``stmt`` without leading ``--`` / ``/* */`` comments (for classifying it)."""
    out = stmt.lstrip()
    while out.startswith(("--", "/*")):
        if out.startswith("--"):
            j = out.find("\n")
            out = "" if j < 0 else out[j + 1:].lstrip()
        else:
            j = out.find("*/")
            out = "" if j < 0 else out[j + 2:].lstrip()
    return out


def _restore(dsn: str, sql_file: Path) -> int:
    """Run the statements of ``sql_file`` (:func:`split_sql_dump`) on ``dsn`` in one
    transaction, COPY data through ``COPY FROM STDIN``; returns how many skippable statements
    the server refused. DabImportError names the first failing statement's line."""
    import psycopg

    text = sql_file.read_text(encoding="utf-8", errors="replace")
    skipped = 0
    with psycopg.connect(dsn, autocommit=False) as conn, _Watchdog(conn) as dog:
        conn.execute(f"SET statement_timeout = '{DUMP_STATEMENT_TIMEOUT_S}s'")
        for line, stmt, data in split_sql_dump(text, sql_file):
            skippable = bool(_SKIPPABLE.match(_strip_sql_comments(stmt)))
            dog.statement_started()
            try:
                with conn.transaction():
                    with conn.cursor() as cur:
                        if data is None:
                            cur.execute(stmt)
                        else:
                            with cur.copy(stmt) as copy:
                                copy.write(data.encode())
            except psycopg.Error as exc:
                if dog.fired:
                    raise DabImportError(sql_file, f"line {line}: {dog.fired} (in: "
                                                   f"{stmt[:120]!r})") from None
                if skippable:
                    skipped += 1
                    continue
                msg = exc.diag.message_primary if exc.diag and exc.diag.message_primary else str(exc)
                raise DabImportError(sql_file, f"line {line}: {msg} (in: {stmt[:120]!r})") from None
            finally:
                dog.statement_ended()
        conn.commit()
    return skipped


class _Watchdog:
    """Cancels the running statement of ``conn`` when it has run longer than
    :data:`DUMP_STATEMENT_TIMEOUT_S` or the restore longer than :data:`DUMP_TOTAL_TIMEOUT_S`;
    ``fired`` then says which limit (None before)."""

    def __init__(self, conn) -> None:
        import threading

        self.conn, self.fired = conn, None
        self._t0 = time.monotonic()
        self._stmt_t0: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="dab-dump-watchdog",
                                        daemon=True)

    def __enter__(self) -> "_Watchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def statement_started(self) -> None:
        self._stmt_t0 = time.monotonic()

    def statement_ended(self) -> None:
        self._stmt_t0 = None

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            now, started = time.monotonic(), self._stmt_t0
            if started is None or self.fired:
                continue
            if now - started > DUMP_STATEMENT_TIMEOUT_S:
                self.fired = (f"a statement ran longer than {DUMP_STATEMENT_TIMEOUT_S} s "
                              "(querylab's limit; a dump cannot lift it)")
            elif now - self._t0 > DUMP_TOTAL_TIMEOUT_S:
                self.fired = f"the restore ran longer than {DUMP_TOTAL_TIMEOUT_S} s"
            else:
                continue
            try:
                self.conn.cancel_safe(timeout=10)
            except Exception:  # noqa: BLE001 - the statement may have just ended
                pass


@contextmanager
def postgres_dump_tables(sql_file: str | Path, settings: Settings) -> Iterator[dict[str, Table]]:
    """Restore a SQL dump (``pg_dump`` plain format or plain SQL) into a scratch database on
    querylab's PostgreSQL server (``QUERYLAB_POSTGRES_URL`` or the embedded one) and yield its
    user tables as ``name → (schema, batches)`` (streamed with a server-side cursor, see
    :func:`tasks.datasets.dab_stream.postgres_table`); the scratch database and its role are dropped
    when the ``with`` block ends. Tables outside schema ``public`` are named
    ``<schema>.<table>``.

    No ``psql`` and no superuser: the dump's statements (:func:`split_sql_dump`, which refuses
    every psql meta-command) run as a throw-away login role (``NOSUPERUSER``, no other role
    memberships, a random password) that owns only the scratch database, so a hostile dump
    cannot read or write the server's files, run programs, make roles or touch other
    databases; ownership and grant statements it may not run are skipped. The tables are read
    back as that role too. Raises DabImportError naming the file and line."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from tasks.db.databases import postgres_server_url
    from tasks.db.pg_roles import scram_verifier

    sql_file = Path(sql_file)
    server = postgres_server_url(settings.postgres_url, Path(settings.home))
    h = hashlib.sha256()
    with sql_file.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    scratch = f"ql_dabimport_{h.hexdigest()[:10]}_{os.getpid()}"
    role, password = f"{scratch}_owner", secrets.token_hex(24)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(scratch)))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL(
            "CREATE ROLE {} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT "
            "NOREPLICATION NOBYPASSRLS PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(scram_verifier(password))))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
            sql.Identifier(scratch), sql.Identifier(role)))
        conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(scratch)))
        conn.execute(sql.SQL("GRANT CONNECT, CREATE, TEMPORARY ON DATABASE {} TO {}").format(
            sql.Identifier(scratch), sql.Identifier(role)))
    params = conninfo_to_dict(server)
    params.update(dbname=scratch, user=role, password=password)
    dsn = make_conninfo(**params)
    try:
        _restore(dsn, sql_file)
        # not autocommit: server-side cursors live in the read transaction
        with psycopg.connect(dsn, autocommit=False) as conn:
            conn.execute("SET TRANSACTION READ ONLY")
            names = conn.execute(
                "SELECT table_schema, table_name FROM information_schema.tables "
                "WHERE table_type = 'BASE TABLE' AND table_schema NOT IN "
                "('pg_catalog', 'information_schema') ORDER BY 1, 2"
            ).fetchall()
            yield LazyTables({
                (table if schema == "public" else f"{schema}.{table}"):
                    (lambda s=schema, t=table: postgres_table(conn, s, t))
                for schema, table in names
            })
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(scratch)))
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def read_postgres_dump(sql_file: str | Path, settings: Settings) -> dict[str, pa.Table]:
    """:func:`postgres_dump_tables` with every table read whole into an Arrow table (for
    small dumps and tests; the importer streams instead)."""
    with postgres_dump_tables(sql_file, settings) as tables:
        out = {}
        for name, (schema, batches) in tables.items():
            out[name] = pa.Table.from_batches(list(batches()), schema=schema)
        return out
