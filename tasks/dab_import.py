"""Import datasets in the Data Agent Benchmark (DAB) layout so they run through querylab's trials
and report stages like any built dataset.

A DAB dataset is a directory ``query_<name>/`` holding:

- ``db_config.yaml``: ``db_clients: {<db>: {db_type, ...}}`` with ``db_type`` ``sqlite`` /
  ``duckdb`` (``db_path``), ``postgres`` (``sql_file``: a SQL dump, see :func:`read_postgres_dump`) or
  ``mongo`` / ``mongodb`` (``dump_folder``: ``<collection>.bson`` files as written by
  ``mongodump`` or ``<collection>.json`` files — a JSON array or one extended-JSON document per
  line; a single ``.json``/``.bson`` file in ``db_path`` works too);
- ``db_description.txt`` (the schema description agents see) and optionally
  ``db_description_withhint.txt`` (the same with DAB's hints);
- ``query<N>/`` folders with ``query.json`` (the question: a JSON string, or an object with
  ``query`` / ``question``), ``validate.py`` (``validate(llm_output: str) -> (bool, reason)``)
  and ``ground_truth.csv`` (the expected answer, as text).

:func:`import_dab_dataset` reads every database into Arrow tables, writes them as the
dataset's *placed* Parquet artifacts (``<root>/datasets/dab_<name>/<version>/placed/...``) and
writes a public ``manifest.json`` and a private ``scoring.json`` of the same shapes
:mod:`tasks.build` writes (:func:`tasks.scoring.split_manifest`), so engines load it and trials
run it unchanged. Differences, because DAB ships neither canonical tables nor reference
solutions:

- a query's validator is ``{"kind": "dab_script", "script": <uri of its validate.py>,
  "folder": <uri of a copy of its query folder>, "support": <uri of a copy of the checkout's
  common_scaffold helpers, or null>}``; answers are judged by :func:`run_validate_script`,
  which runs ``validate.py`` in the validators' own sandbox (not the one agents' cells use),
  in a fresh directory holding only that query folder (and the helpers) — never in querylab's
  process;
- the oracle's reference solution answers with ``ground_truth.csv`` verbatim (one
  ``execute_python`` step): it checks that the import, the engines, the trial machinery and the
  dataset's own ``validate.py`` agree, not that the question is solvable.

A DAB checkout is input from elsewhere, so it is treated as hostile: every path in
``db_config.yaml`` (and every file read: dumps, questions, validators) must resolve — symlinks
followed — inside the dataset's folder; a PostgreSQL dump is parsed and run statement by
statement (no ``psql``: its meta-commands, e.g. ``\\! <shell command>``, are refused) by a
throw-away login role that owns only the scratch database, so the dump cannot reach the
server's files, programs, roles or other databases; SQLite and DuckDB files are opened
read-only (DuckDB without file access).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import sqlite3
import tempfile
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml
from prefect import task

from schemas.settings import Settings
from tasks import storage
from tasks.scoring import is_current_dataset, split_manifest

#: DAB ``db_type`` → querylab engine.
DAB_ENGINES = {
    "sqlite": "sqlite",
    "duckdb": "duckdb",
    "postgres": "postgres",
    "postgresql": "postgres",
    "mongo": "mongodb",
    "mongodb": "mongodb",
}

#: Seconds a ``validate.py`` may run before its answer is judged wrong.
VALIDATE_TIMEOUT_S = 30.0
#: Address-space limit of a ``validate.py`` process (MiB).
VALIDATE_MEMORY_MB = 2048


class DabImportError(ValueError):
    """A DAB directory cannot be imported. ``str(err)`` is ``"<path>: <problem>"``."""

    def __init__(self, path: str | Path, problem: str):
        self.path, self.problem = str(path), problem
        super().__init__(f"{path}: {problem}")


# -- layout ------------------------------------------------------------------------------------


def find_dab_datasets(path: str | Path) -> list[Path]:
    """The DAB dataset directories under ``path``: ``path`` itself when it holds a
    ``db_config.yaml``, else its ``query_*`` subdirectories that do (sorted). Raises
    DabImportError when there is none."""
    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        raise DabImportError(path, "not a directory")
    if (path / "db_config.yaml").is_file():
        return [path]
    found = sorted(
        p for p in path.iterdir()
        if p.is_dir() and p.name.startswith("query_") and (p / "db_config.yaml").is_file()
    )
    if not found:
        raise DabImportError(
            path, "no DAB dataset here: expected db_config.yaml, or query_<name>/db_config.yaml"
        )
    return found


def dataset_name(dab_dir: str | Path) -> str:
    """``query_agnews`` → ``dab_agnews`` (lower case; other characters become ``_``)."""
    stem = Path(dab_dir).name.removeprefix("query_")
    return "dab_" + (re.sub(r"[^a-z0-9_]+", "_", stem.lower()).strip("_") or "dataset")


def read_db_config(dab_dir: str | Path) -> dict[str, dict]:
    """``db_clients`` of ``db_config.yaml``: logical database name → its settings, with
    ``engine`` (querylab's name) added. Raises DabImportError naming the file and field."""
    path = Path(dab_dir) / "db_config.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise DabImportError(path, f"cannot read: {exc}") from exc
    clients = raw.get("db_clients") if isinstance(raw, dict) else None
    if not isinstance(clients, dict) or not clients:
        raise DabImportError(path, "db_clients: expected a mapping of databases")
    out = {}
    for name, cfg in clients.items():
        if not isinstance(cfg, dict):
            raise DabImportError(path, f"db_clients.{name}: expected a mapping")
        kind = str(cfg.get("db_type", "")).lower()
        if kind not in DAB_ENGINES:
            raise DabImportError(
                path, f"db_clients.{name}.db_type: unknown {kind!r}; known: {sorted(DAB_ENGINES)}"
            )
        out[str(name)] = {**cfg, "engine": DAB_ENGINES[kind]}
    return out


def _inside(root: Path, path: Path, what: str, where: Path) -> Path:
    """``path`` resolved (symlinks followed); DabImportError naming ``what`` when it lies
    outside ``root``."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise DabImportError(where, f"{what}: {path} resolves to {resolved}, outside {root}")
    return resolved


def _dataset_file(dab_dir: Path, cfg: dict, key: str, db: str) -> Path:
    rel = cfg.get(key)
    if not rel:
        raise DabImportError(dab_dir / "db_config.yaml", f"db_clients.{db}.{key}: missing")
    config = dab_dir / "db_config.yaml"
    path = _inside(dab_dir, dab_dir / str(rel), f"db_clients.{db}.{key}", config)
    if not path.exists():
        raise DabImportError(config, f"db_clients.{db}.{key}: {path} does not exist")
    return path


# -- reading databases -------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A value Arrow can hold: ObjectId → str, Decimal/Decimal128 → float, nested recursively."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Decimal):
        return float(value)
    name = type(value).__name__
    if name == "ObjectId":
        return str(value)
    if name == "Decimal128":
        return float(value.to_decimal())
    if isinstance(value, bytes):
        return value.hex()
    return value


def _column(values: list) -> pa.Array:
    """One column; a column Arrow cannot type (mixed kinds) becomes JSON text."""
    values = [_plain(v) for v in values]
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return pa.array(
            [None if v is None else v if isinstance(v, str) else json.dumps(v, default=str)
             for v in values],
            pa.string(),
        )


def rows_to_table(columns: list[str], rows: list[tuple]) -> pa.Table:
    """Row tuples → Arrow table, typed per column (see :func:`_column`)."""
    if not rows:
        return pa.table({c: pa.array([], pa.string()) for c in columns})
    return pa.table({c: _column([r[i] for r in rows]) for i, c in enumerate(columns)})


def docs_to_table(docs: list[dict]) -> pa.Table:
    """MongoDB documents → Arrow table (one column per top-level field seen in any document;
    nested documents become structs and arrays lists where Arrow can type them, else JSON
    text). An ObjectId ``_id`` is dropped (the loader assigns new ones); other ``_id`` values
    are kept."""
    clean = []
    for d in docs:
        d = dict(d)
        if type(d.get("_id")).__name__ == "ObjectId":
            d.pop("_id")
        clean.append(d)
    keys: list[str] = []
    for d in clean:
        keys += [k for k in d if k not in keys]
    if not keys:
        return pa.table({})
    return pa.table({k: _column([d.get(k) for d in clean]) for k in keys})


def read_sqlite_tables(path: str | Path) -> dict[str, pa.Table]:
    """Every table of a SQLite file, read-only."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        names = [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name"
        )]
        out = {}
        for name in names:
            cur = con.execute(f'SELECT * FROM "{name}"')
            out[name] = rows_to_table([d[0] for d in cur.description], cur.fetchall())
    return out


def read_duckdb_tables(path: str | Path) -> dict[str, pa.Table]:
    """Every base table of a DuckDB file (schema ``main``; others as ``<schema>.<table>``),
    opened read-only."""
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        con.execute("SET enable_external_access = false")  # a view cannot read other files
        names = con.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_type = 'BASE TABLE' ORDER BY 1, 2"
        ).fetchall()
        return {
            (t if s == "main" else f"{s}.{t}"): con.sql(f'SELECT * FROM "{s}"."{t}"').to_arrow_table()
            for s, t in names
        }
    finally:
        con.close()


def read_mongo_dump(path: str | Path) -> dict[str, pa.Table]:
    """Collections of a MongoDB dump: every ``<collection>.bson`` (``mongodump``) or
    ``<collection>.json`` (JSON array, or extended JSON one document per line) under ``path``
    (searched recursively; ``*.metadata.json`` skipped), or ``path`` itself when it is one
    such file."""
    import bson
    from bson import json_util

    path = Path(path)
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*")
        if p.suffix in (".bson", ".json") and not p.name.endswith(".metadata.json")
    )
    root = path if path.is_dir() else path.parent
    files = [_inside(root, f, "MongoDB dump file", f) for f in files]
    out: dict[str, pa.Table] = {}
    for f in files:
        if f.suffix == ".bson":
            with f.open("rb") as fh:
                docs = list(bson.decode_file_iter(fh))
        else:
            text = f.read_text().strip()
            if text.startswith("["):
                docs = json_util.loads(text)
            else:
                docs = [json_util.loads(line) for line in text.splitlines() if line.strip()]
        if not all(isinstance(d, dict) for d in docs):
            raise DabImportError(f, "expected MongoDB documents (JSON objects)")
        out[f.stem] = docs_to_table(docs)
    if not out:
        raise DabImportError(path, "no .bson or .json collection files")
    return out


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
#: Seconds one statement of a dump may run.
DUMP_STATEMENT_TIMEOUT_S = 600


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
    with psycopg.connect(dsn, autocommit=False) as conn:
        conn.execute(f"SET statement_timeout = '{DUMP_STATEMENT_TIMEOUT_S}s'")
        for line, stmt, data in split_sql_dump(text, sql_file):
            skippable = bool(_SKIPPABLE.match(_strip_sql_comments(stmt)))
            try:
                with conn.transaction():
                    with conn.cursor() as cur:
                        if data is None:
                            cur.execute(stmt)
                        else:
                            with cur.copy(stmt) as copy:
                                copy.write(data.encode())
            except psycopg.Error as exc:
                if skippable:
                    skipped += 1
                    continue
                msg = exc.diag.message_primary if exc.diag and exc.diag.message_primary else str(exc)
                raise DabImportError(sql_file, f"line {line}: {msg} (in: {stmt[:120]!r})") from None
        conn.commit()
    return skipped


def read_postgres_dump(sql_file: str | Path, settings: Settings) -> dict[str, pa.Table]:
    """Restore a SQL dump (``pg_dump`` plain format or plain SQL) into a scratch database on
    querylab's PostgreSQL server (``QUERYLAB_POSTGRES_URL`` or the embedded one), read every
    user table back, and drop the scratch database. Tables outside schema ``public`` are named
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

    from tasks.databases import postgres_server_url
    from tasks.pg_roles import scram_verifier

    sql_file = Path(sql_file)
    server = postgres_server_url(settings.postgres_url, Path(settings.home))
    digest = hashlib.sha256(sql_file.read_bytes()).hexdigest()[:10]
    scratch = f"ql_dabimport_{digest}_{os.getpid()}"
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
        out = {}
        with psycopg.connect(dsn, autocommit=True) as conn:
            names = conn.execute(
                "SELECT table_schema, table_name FROM information_schema.tables "
                "WHERE table_type = 'BASE TABLE' AND table_schema NOT IN "
                "('pg_catalog', 'information_schema') ORDER BY 1, 2"
            ).fetchall()
            for schema, table in names:
                cur = conn.execute(
                    sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(table))
                )
                key = table if schema == "public" else f"{schema}.{table}"
                out[key] = rows_to_table([d.name for d in cur.description], cur.fetchall())
        return out
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(scratch)))
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def read_database(dab_dir: Path, db: str, cfg: dict, settings: Settings) -> dict[str, pa.Table]:
    """The tables (or collections) of one ``db_clients`` entry."""
    engine = cfg["engine"]
    if engine == "sqlite":
        return read_sqlite_tables(_dataset_file(dab_dir, cfg, "db_path", db))
    if engine == "duckdb":
        return read_duckdb_tables(_dataset_file(dab_dir, cfg, "db_path", db))
    if engine == "postgres":
        return read_postgres_dump(_dataset_file(dab_dir, cfg, "sql_file", db), settings)
    key = "dump_folder" if cfg.get("dump_folder") else "db_path"
    return read_mongo_dump(_dataset_file(dab_dir, cfg, key, db))


# -- queries -----------------------------------------------------------------------------------


#: Largest file of a query folder or of the checkout's helpers copied for ``validate.py``.
MAX_VALIDATOR_FILE_BYTES = 16 << 20


def _folder_files(folder: Path, root: Path) -> dict[str, Path]:
    """Regular files under ``folder`` by relative path (``__pycache__`` skipped); each must
    resolve inside ``root`` (DabImportError) and be at most :data:`MAX_VALIDATOR_FILE_BYTES`."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if "__pycache__" in p.parts or p.is_dir():
            continue
        real = _inside(root, p, "file", p)
        if not real.is_file():
            continue
        if real.stat().st_size > MAX_VALIDATOR_FILE_BYTES:
            raise DabImportError(p, f"larger than {MAX_VALIDATOR_FILE_BYTES >> 20} MiB")
        out[p.relative_to(folder).as_posix()] = real
    return out


def read_queries(dab_dir: str | Path) -> list[dict]:
    """The ``query<N>/`` folders in numeric order: ``{"id", "question", "ground_truth",
    "validate_py", "files"}`` (``ground_truth`` is the stripped text of ``ground_truth.csv`` or
    None; ``validate_py`` a Path; ``files`` the folder's files by relative path, what its
    ``validate.py`` may read). Raises DabImportError for a folder without ``query.json`` or
    ``validate.py``, or with a file that resolves outside it."""
    dab_dir = Path(dab_dir)
    folders = [p for p in dab_dir.iterdir() if p.is_dir() and re.fullmatch(r"query\d+", p.name)]
    out = []
    for folder in sorted(folders, key=lambda p: int(p.name[5:])):
        folder = _inside(dab_dir, folder, "query folder", folder)
        files = _folder_files(folder, folder)
        if "query.json" not in files:
            raise DabImportError(folder, "query.json missing")
        if "validate.py" not in files:
            raise DabImportError(folder, "validate.py missing")
        qfile = files["query.json"]
        try:
            raw = json.loads(qfile.read_text())
        except json.JSONDecodeError as exc:
            raise DabImportError(qfile, f"not JSON: {exc}") from exc
        question = raw if isinstance(raw, str) else (
            raw.get("query") or raw.get("question") if isinstance(raw, dict) else None
        )
        if not isinstance(question, str) or not question.strip():
            raise DabImportError(qfile, "expected a question string (or {\"query\": ...})")
        gt = files.get("ground_truth.csv")
        out.append({
            "id": folder.name,
            "question": question.strip(),
            "ground_truth": gt.read_text().strip() if gt else None,
            "validate_py": files["validate.py"],
            "files": files,
        })
    if not out:
        raise DabImportError(dab_dir, "no query<N>/ folders")
    return out


def support_files(dab_dir: str | Path) -> dict[str, Path]:
    """The DAB checkout's ``common_scaffold`` Python helpers (``validate.py`` files import
    them) by path relative to the checkout root, e.g. ``common_scaffold/validate/x.py``;
    empty when the checkout has none. Each must resolve inside the checkout."""
    return _scaffold_files(Path(dab_dir).resolve().parent)


def _scaffold_files(root: Path) -> dict[str, Path]:
    """:func:`support_files` of the checkout at ``root``."""
    pkg = root / "common_scaffold"
    if not pkg.is_dir():
        return {}
    return {f"common_scaffold/{rel}": p for rel, p in _folder_files(pkg, root).items()
            if rel.endswith(".py")}


# -- validate.py in its own sandbox ------------------------------------------------------------

#: The sandbox cell that imports a DAB ``validate.py`` and calls ``validate(answer)``; the
#: search path and the answer come from files next to it (the cell sees no querylab state).
_CELL = r"""
import importlib.util, json, os, sys
sys.path[:0] = [os.getcwd()] + json.load(open("search_path.json"))
spec = importlib.util.spec_from_file_location("dab_validate", "validate.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
result = module.validate(open("answer.txt", encoding="utf-8").read())
ok, reason = (tuple(result) + ("",))[:2] if isinstance(result, (tuple, list)) else (result, "")
sys.stdout.write("\n@@querylab-validate@@" + json.dumps({"ok": bool(ok), "reason": str(reason)}))
"""

def _run_in_validate_sandbox(cell: str, workdir: Path, timeout_s: float, memory_mb: int):
    """THE call site of the sandbox that runs DAB ``validate.py`` files: a sealed session of
    its own (:func:`tasks.sandbox.run_in_folder`), separate from every agent's, that sees a
    read-only copy of ``workdir`` (only the query's own folder, the checkout's helpers and the
    answer) as its working directory and nothing else of the host."""
    from tasks.sandbox import run_in_folder

    res, _ = run_in_folder(workdir, cell, timeout_s=timeout_s, memory_mb=memory_mb,
                           name="validate")
    return res


def _artifact_files(source: str | Path) -> dict[str, bytes]:
    """Files under a local folder or an artifact URI prefix, by relative path."""
    local = Path(str(source))
    if "://" not in str(source) and local.is_dir():
        return {rel: p.read_bytes() for rel, p in _folder_files(local, local).items()}
    prefix = str(source).rstrip("/") + "/"
    return {uri[len(prefix):]: storage.read_bytes(uri) for uri in storage.list_uris(prefix)}


def run_validate_script(
    script: str | Path,
    answer: str | None,
    search_path: list[str] | tuple[str, ...] = (),
    timeout_s: float = VALIDATE_TIMEOUT_S,
    memory_mb: int = VALIDATE_MEMORY_MB,
    folder: str | Path | None = None,
    support: str | Path | None = None,
) -> tuple[bool, str]:
    """Judge ``answer`` with a DAB ``validate.py`` (a path or an artifact URI).

    The script runs in a sealed sandbox session of its own (:func:`_run_in_validate_sandbox`),
    never in querylab's process: an unprivileged process whose environment holds no API keys
    or database URLs, with no network and no view of the host's files, within ``memory_mb`` MiB
    and ``timeout_s`` seconds of wall-clock and CPU time, whose working directory is a
    read-only copy of a fresh directory holding only: the files of ``folder`` (the query's own folder, a local
    directory or an artifact prefix; without it, ``validate.py`` alone), the files of
    ``support`` (the checkout's ``common_scaffold`` helpers, importable) and the answer.
    ``search_path`` entries (older manifests point at the DAB checkout this way) have their
    ``common_scaffold`` helpers copied in too. Returns ``(ok, reason)``; a script that fails, hangs or returns nothing
    gives ``(False, <why>)``. A None answer is wrong.
    """
    if answer is None:
        return False, "no answer"
    local = Path(str(script))
    source = local.read_bytes() if local.is_file() else storage.read_bytes(str(script))
    with tempfile.TemporaryDirectory(prefix="querylab-validate-") as tmp:
        work = Path(tmp)
        # older manifests name the checkout in search_path: its helpers are copied in, since
        # the sandbox sees no host path
        legacy = {rel: p.read_bytes() for entry in search_path if Path(entry).is_dir()
                  for rel, p in _scaffold_files(Path(entry).resolve()).items()}
        for files in (legacy, _artifact_files(support) if support else {},
                      _artifact_files(folder) if folder else {}):
            for rel, data in files.items():
                target = work / rel
                if not target.resolve().is_relative_to(work.resolve()):
                    continue  # an artifact name with '..' never leaves the directory
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        (work / "validate.py").write_bytes(source)
        (work / "answer.txt").write_text(answer, encoding="utf-8")
        (work / "search_path.json").write_text(json.dumps([str(x) for x in search_path]))
        res = _run_in_validate_sandbox(_CELL, work, timeout_s, memory_mb)
    marker = "@@querylab-validate@@"
    if res.timed_out:
        return False, f"validate.py timed out after {timeout_s:g} s"
    if not res.ok or marker not in res.stdout:
        tail = "\n".join(res.stderr.strip().splitlines()[-5:])
        return False, f"validate.py failed ({res.error or 'no verdict printed'}): {tail}"
    result = json.loads(res.stdout.rsplit(marker, 1)[1])
    return bool(result["ok"]), result["reason"]


# -- the import --------------------------------------------------------------------------------


def dab_version(dab_dir: str | Path) -> str:
    """``dab-<10 hex>``: a hash over every file's relative path and size, and the bytes of the
    configuration, descriptions and query files (edited questions give a new version)."""
    dab_dir = Path(dab_dir)
    h = hashlib.sha256()
    for p in sorted(dab_dir.rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts:
            continue
        if not p.resolve().is_relative_to(dab_dir.resolve()):
            continue  # a link out of the folder is never read (an import refuses it if used)
        rel = p.relative_to(dab_dir).as_posix()
        h.update(f"{rel}:{p.stat().st_size}\n".encode())
        if p.suffix in (".yaml", ".txt", ".json", ".py", ".csv") and p.stat().st_size < 1 << 20:
            h.update(p.read_bytes())
    return f"dab-{h.hexdigest()[:10]}"


def _text(path: Path) -> str:
    if not path.is_file():
        return ""
    return _inside(path.parent, path, "description", path).read_text()


@task(name="import-dab-dataset", persist_result=False)
def import_dab_dataset(
    dab_dir: str, artifacts_root: str, force: bool = False, settings: Settings | None = None
) -> str:
    """Import one DAB dataset directory (see the module docstring); returns the URI of its
    ``manifest.json``. Idempotent per version (skips work when the manifest exists, unless
    ``force``). Raises DabImportError naming the file and what is wrong; nothing is written
    before every database and query has been read."""
    settings = settings or Settings.from_env()
    dab = Path(dab_dir).expanduser().resolve()
    name, version = dataset_name(dab), dab_version(dab)
    prefix = storage.join(artifacts_root, "datasets", name, version)
    manifest_uri = storage.join(prefix, "manifest.json")
    if not force and is_current_dataset(manifest_uri):
        return manifest_uri
    config = read_db_config(dab)
    tables = {db: read_database(dab, db, cfg, settings) for db, cfg in config.items()}
    queries = read_queries(dab)
    databases: dict[str, dict] = {}
    for db, cfg in config.items():
        placed = {}
        for table_name, tbl in tables[db].items():
            uri = storage.write_parquet(
                storage.join(prefix, "placed", db, f"{table_name}.parquet"), tbl
            )
            placed[table_name] = {
                "uri": uri, "rows": tbl.num_rows,
                "columns": {f.name: str(f.type) for f in tbl.schema},
            }
        databases[db] = {
            "engine": cfg["engine"], "description": str(cfg.get("description", "")),
            "tables": placed,
        }
    support = support_files(dab)
    support_uri = storage.join(prefix, "validate_support") if support else None
    for rel, path in support.items():
        storage.write_bytes(storage.join(prefix, "validate_support", rel), path.read_bytes())
    entries = []
    for q in queries:
        folder = storage.join(prefix, "queries", q["id"])
        for rel, path in q["files"].items():
            storage.write_bytes(storage.join(folder, rel), path.read_bytes())
        script = storage.join(folder, "validate.py")
        reference = (
            [{"tool": "execute_python", "args": {"code": f"print({q['ground_truth']!r})"}}]
            if q["ground_truth"] is not None else []
        )
        entries.append({
            "id": q["id"],
            "question": q["question"],
            "validator": {"kind": "dab_script", "script": script, "folder": folder,
                          "support": support_uri},
            "reference": reference,
            "requires": {"sources": [], "operations": []},
            "ground_truth": q["ground_truth"],
        })
    description = _text(dab / "db_description.txt").strip()
    with_hints = _text(dab / "db_description_withhint.txt").strip()
    manifest = {
        "name": name,
        "version": version,
        "spec_file": "db_config.yaml",
        "source": str(dab),
        "format": "dab",
        "description": description.splitlines()[0] if description else f"DAB dataset {dab.name}",
        "hints": with_hints.replace(description, "").strip() if description else with_hints,
        "schema_description": description,
        "databases": databases,
        "canonical": {},
        "queries": entries,
    }
    # public manifest (questions, databases) + private scoring file (validators, ground truth,
    # the oracle's reference): the trial side never reads the latter
    return split_manifest(manifest_uri, manifest)
