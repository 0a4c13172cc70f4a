"""Import datasets in the Data Agent Benchmark (DAB) layout so they run through querylab's trials,
score and report stages like any built dataset, under DAB's own names and rules.

A DAB dataset is a directory ``query_<name>/`` holding:

- ``db_config.yaml``: ``db_clients: {<db>: {db_type, ...}}`` with ``db_type`` ``sqlite`` /
  ``duckdb`` (``db_path``), ``postgres`` (``sql_file``: a SQL dump, see
  :mod:`tasks.datasets.dab_pgdump`) or ``mongo`` / ``mongodb`` (``dump_folder``: ``<collection>.bson``
  files as written by ``mongodump`` or ``<collection>.json`` files — a JSON array or one
  extended-JSON document per line; a single ``.json``/``.bson`` file in ``db_path`` works too);
- ``db_description.txt`` (the schema description agents see) and optionally
  ``db_description_withhint.txt`` (DAB's hints, appended with ``--hints on``);
- ``query<N>/`` folders with ``query.json`` (the question: a JSON string, or an object with
  ``query`` / ``question``), ``validate.py`` (``validate(llm_output: str) -> (bool, reason)``)
  and ``ground_truth.csv`` (the expected answer, as text).

**Names.** A dataset keeps DAB's name, case as in the folder: ``query_agnews`` → ``agnews``,
``query_PATENTS`` → ``PATENTS`` (:func:`dataset_name`), so ``querylab run --dataset PATENTS``,
``--query PATENTS/query2``, leaderboard answer files (``"dataset": "PATENTS"``) and reports
all use it. Each import is registered under ``<root>/datasets/_dab/<name>.json``
(:func:`register_import`, :func:`imported_datasets`), which is how ``querylab run`` finds it.
A query is its folder name: ``query3`` is DAB's query 3 even when ``query2`` is missing.

**Import.** :func:`import_dab_dataset` streams every table into the dataset's *placed*
Parquet artifacts (``<root>/datasets/<name>/<version>/placed/...``; :mod:`tasks.datasets.dab_stream`:
chunks, bounded memory for multi-GB files) and writes a public ``manifest.json`` and a private
``scoring.json`` of the shapes :mod:`tasks.datasets.build` writes (:func:`tasks.scoring.scoring_file.split_manifest`).
``scoring_only=True`` reads no database at all (``db_config.yaml`` and the data files may be
missing): queries, validators and ground truth only, so published answer files can be
rescored where the data cannot be had; such a dataset runs only ``replay:`` agents.

Differences from a built dataset, because DAB ships neither canonical tables nor reference
solutions:

- a query's validator is ``{"kind": "dab_script", "script": <uri of its validate.py>,
  "folder": <uri of a copy of its query folder>, "support": <uri of a copy of the checkout's
  common_scaffold helpers, or null>}``; answers are judged by :func:`run_validate_script`,
  which runs ``validate.py`` in the validators' own sandbox (not the one agents' cells use)
  with its query folder as its working directory — never in querylab's process. A validator
  that crashes, hangs or prints no verdict gives an *errored* verdict (with its traceback),
  not a wrong answer;
- the oracle's reference solution answers with ``ground_truth.csv`` verbatim (one
  ``execute_python`` step): it checks that the import, the engines, the trial machinery and the
  dataset's own ``validate.py`` agree, not that the question is solvable;
- DAB's run conditions apply (:mod:`tasks.scoring.dab_rules`): its limits are the agents' defaults
  and its scoring rules the score stage's.

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
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import yaml

from schemas.settings import Settings
from tasks.core import storage
from tasks.datasets.dab_pgdump import (  # noqa: F401 - re-exported (tests, bench/security.py)
    DabImportError,
    postgres_dump_tables,
    read_postgres_dump,
    split_sql_dump,
)
from tasks.datasets.dab_stream import (
    LazyTables,
    StreamError,
    Table,
    duckdb_tables,
    mongo_collection,
    sqlite_tables,
    write_table,
)
from tasks.core.prefect_task import task
from tasks.scoring.dab_validator import (  # noqa: F401 - re-exported (tests, older callers)
    MAX_VALIDATOR_FILE_BYTES,
    VALIDATE_MEMORY_MB,
    VALIDATE_TIMEOUT_S,
    ValidatorFileError,
    folder_files,
    run_validate_script,
    scaffold_files,
)
from tasks.scoring.scoring_file import is_current_dataset, split_manifest
from tasks.core.layout import DatasetLayout, dab_import_root

#: DAB ``db_type`` → querylab engine.
DAB_ENGINES = {
    "sqlite": "sqlite",
    "duckdb": "duckdb",
    "postgres": "postgres",
    "postgresql": "postgres",
    "mongo": "mongodb",
    "mongodb": "mongodb",
}

#: A DAB dataset name as querylab uses it (a folder ``query_<name>``): letters, digits, ``_``,
#: ``.`` and ``-`` (it becomes part of artifact paths, trial keys and Prefect tags).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


# -- layout ------------------------------------------------------------------------------------


def find_dab_datasets(path: str | Path) -> list[Path]:
    """The DAB dataset directories under ``path``: ``path`` itself when it holds a
    ``db_config.yaml`` or ``query<N>/`` folders, else its ``query_*`` subdirectories that do
    (sorted; ``query_dataset`` folders are data, never datasets). Raises DabImportError when
    there is none."""
    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        raise DabImportError(path, "not a directory")
    if _is_dataset_dir(path):
        return [path]
    found = sorted(
        p for p in path.iterdir()
        if p.is_dir() and p.name.startswith("query_") and p.name != "query_dataset"
        and _is_dataset_dir(p)
    )
    if not found:
        raise DabImportError(
            path, "no DAB dataset here: expected db_config.yaml or query<N>/ folders, or "
            "query_<name>/ directories holding them"
        )
    return found


def _is_dataset_dir(path: Path) -> bool:
    return path.name.startswith("query_") and (
        (path / "db_config.yaml").is_file()
        or any(p.is_dir() and re.fullmatch(r"query\d+", p.name) for p in path.iterdir()))


def dataset_name(dab_dir: str | Path) -> str:
    """DAB's name of a dataset folder: ``query_agnews`` → ``agnews``, ``query_PATENTS`` →
    ``PATENTS`` (case kept, as DAB's answer files and scripts spell it). Raises
    DabImportError for a folder name that is not ``query_<letters, digits, _ . ->``."""
    folder = Path(dab_dir).name
    stem = folder.removeprefix("query_")
    if stem == folder or not NAME_RE.match(stem) or ".." in stem:
        raise DabImportError(dab_dir, f"folder name {folder!r}: expected query_<name> with a "
                                      "name of letters, digits, '_', '.' and '-'")
    return stem


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
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}", str(name)):
            raise DabImportError(path, f"db_clients.{str(name)[:80]!r}: use letters, digits, "
                                       "'_', '.' and '-' in database names")
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


# -- reading databases (streamed: tasks.datasets.dab_stream) ---------------------------------------------


@contextmanager
def mongo_dump_tables(path: str | Path) -> Iterator[dict[str, Table]]:
    """Collections of a MongoDB dump as ``name → (schema, batches)``: every
    ``<collection>.bson`` (``mongodump``) or ``<collection>.json`` (JSON array, or extended
    JSON one document per line) under ``path`` (searched recursively; ``*.metadata.json``
    skipped), or ``path`` itself when it is one such file. Each file is read in chunks."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*")
        if p.suffix in (".bson", ".json") and not p.name.endswith(".metadata.json")
    )
    root = path if path.is_dir() else path.parent
    files = [_inside(root, f, "MongoDB dump file", f) for f in files]
    if not files:
        raise DabImportError(path, "no .bson or .json collection files")
    names: dict[str, Path] = {}
    for f in files:
        if f.stem in names:
            raise DabImportError(f, f"collection {f.stem!r} also dumped in {names[f.stem]}")
        names[f.stem] = f
    yield LazyTables({n: (lambda f=f: _mongo_file(f)) for n, f in names.items()})


def _mongo_file(f: Path) -> Table:
    try:
        return mongo_collection(f)
    except StreamError as exc:
        raise DabImportError(f, str(exc)) from None


@contextmanager
def database_tables(dab_dir: Path, db: str, cfg: dict,
                    settings: Settings) -> Iterator[dict[str, Table]]:
    """The tables (or collections) of one ``db_clients`` entry as ``name → (schema,
    batches)``, each streamed in chunks, inside a ``with`` block."""
    engine = cfg["engine"]
    if engine in ("sqlite", "duckdb"):
        path = _dataset_file(dab_dir, cfg, "db_path", db)
        opener = sqlite_tables if engine == "sqlite" else duckdb_tables
        opened = False
        try:
            with opener(path) as tables:
                opened = True
                yield tables
        except Exception as exc:  # noqa: BLE001 - a file that is no database names itself
            if opened:
                raise
            raise DabImportError(path, f"cannot open as {engine}: {exc}") from None
        return
    if engine == "postgres":
        with postgres_dump_tables(_dataset_file(dab_dir, cfg, "sql_file", db), settings) as t:
            yield t
        return
    key = "dump_folder" if cfg.get("dump_folder") else "db_path"
    with mongo_dump_tables(_dataset_file(dab_dir, cfg, key, db)) as t:
        yield t


# -- queries -----------------------------------------------------------------------------------


def _folder_files(folder: Path, root: Path) -> dict[str, Path]:
    """:func:`tasks.scoring.dab_validator.folder_files`, its errors as DabImportError."""
    try:
        return folder_files(folder, root)
    except ValidatorFileError as exc:
        raise DabImportError(exc.path, exc.problem) from None


#: The question of a scoring-only query whose folder has no ``query.json``.
NO_QUESTION = "(question not imported: this query folder has no query.json)"


def read_queries(dab_dir: str | Path, scoring_only: bool = False) -> list[dict]:
    """The ``query<N>/`` folders in numeric order: ``{"id", "question", "ground_truth",
    "validate_py", "files"}`` (``id`` is the folder name, ``query<N>``; ``ground_truth`` the
    stripped text of ``ground_truth.csv`` or None; ``validate_py`` a Path; ``files`` the
    folder's files by relative path, what its ``validate.py`` may read). Raises
    DabImportError for a folder without ``validate.py`` or (unless ``scoring_only``, which
    needs only validators) without ``query.json``, for an unreadable question, or a file that
    resolves outside the folder."""
    dab_dir = Path(dab_dir)
    folders = [p for p in dab_dir.iterdir() if p.is_dir() and re.fullmatch(r"query\d+", p.name)]
    out = []
    for folder in sorted(folders, key=lambda p: int(p.name[5:])):
        folder = _inside(dab_dir, folder, "query folder", folder)
        files = _folder_files(folder, folder)
        if "validate.py" not in files:
            raise DabImportError(folder, "validate.py missing")
        if "query.json" in files:
            question = _question(files["query.json"])
        elif scoring_only:
            question = NO_QUESTION
        else:
            raise DabImportError(folder, "query.json missing")
        gt = files.get("ground_truth.csv")
        out.append({
            "id": folder.name,
            "question": question,
            "ground_truth": (gt.read_text(encoding="utf-8", errors="replace").strip()
                             if gt else None),
            "validate_py": files["validate.py"],
            "files": files,
        })
    if not out:
        raise DabImportError(dab_dir, "no query<N>/ folders")
    return out


def _question(qfile: Path) -> str:
    """The question of a ``query.json``: a JSON string, or ``{"query": ...}`` (DAB) /
    ``{"question": ...}``."""
    try:
        raw = json.loads(qfile.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DabImportError(qfile, f"not JSON: {exc}") from exc
    question = raw if isinstance(raw, str) else (
        raw.get("query") or raw.get("question") if isinstance(raw, dict) else None
    )
    if not isinstance(question, str) or not question.strip():
        raise DabImportError(qfile, "expected a question string (or {\"query\": ...})")
    return question.strip()


def support_files(dab_dir: str | Path) -> dict[str, Path]:
    """The DAB checkout's ``common_scaffold`` Python helpers (``validate.py`` files import
    them) by path relative to the checkout root, e.g. ``common_scaffold/validate/x.py``;
    empty when the checkout has none. Each must resolve inside the checkout."""
    return _scaffold_files(Path(dab_dir).resolve().parent)


def _scaffold_files(root: Path) -> dict[str, Path]:
    """:func:`support_files` of the checkout at ``root``."""
    try:
        return scaffold_files(root)
    except ValidatorFileError as exc:
        raise DabImportError(exc.path, exc.problem) from None


# -- the import --------------------------------------------------------------------------------


def dab_version(dab_dir: str | Path, scoring_only: bool = False) -> str:
    """``dab-<10 hex>``: a hash over every file's relative path and size, and the bytes of the
    configuration, descriptions and query files (edited questions give a new version); a
    scoring-only import has a version of its own."""
    dab_dir = Path(dab_dir)
    h = hashlib.sha256(b"scoring-only\n" if scoring_only else b"")
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
    return _inside(path.parent, path, "description", path).read_text(encoding="utf-8",
                                                                     errors="replace")


def _check_files(dab: Path, config: dict[str, dict]) -> None:
    """Every data file ``db_config.yaml`` names exists inside the folder (DabImportError
    naming the first that does not), before anything is written."""
    for db, cfg in config.items():
        if cfg["engine"] in ("sqlite", "duckdb"):
            _dataset_file(dab, cfg, "db_path", db)
        elif cfg["engine"] == "postgres":
            _dataset_file(dab, cfg, "sql_file", db)
        else:
            _dataset_file(dab, cfg, "dump_folder" if cfg.get("dump_folder") else "db_path", db)


def _place_databases(dab: Path, config: dict[str, dict], prefix: str, settings: Settings,
                     written: list[str]) -> dict[str, dict]:
    """Stream every table of every database into ``<prefix>/placed/<db>/<table>.parquet``;
    returns the manifest's ``databases``. ``written`` collects the URIs (for clean-up)."""
    databases: dict[str, dict] = {}
    for db, cfg in config.items():
        placed = {}
        with database_tables(dab, db, cfg, settings) as tables:
            for table_name in list(tables.keys()):
                uri = storage.join(prefix, "placed", db, f"{_file_stem(table_name)}.parquet")
                try:
                    schema, batches = tables[table_name]
                    written.append(uri)
                    placed[table_name] = write_table(uri, schema, batches())
                except DabImportError:
                    raise
                except Exception as exc:  # noqa: BLE001 - named: the file and table
                    where = cfg.get("db_path") or cfg.get("sql_file") or cfg.get("dump_folder")
                    raise DabImportError(dab / str(where), f"{db}.{table_name}: "
                                         f"{type(exc).__name__}: {exc}") from None
        databases[db] = {
            "engine": cfg["engine"], "description": str(cfg.get("description", "")),
            "tables": placed,
        }
    return databases


def _file_stem(table: str) -> str:
    """A file name for a table name (any character but letters, digits, ``_ . -`` becomes
    ``_``, plus a hash when that changed it)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", table).lstrip(".") or "_"
    if stem != table:
        stem += "-" + hashlib.sha256(table.encode()).hexdigest()[:8]
    return stem


def _remove(uris: list[str]) -> None:
    for uri in uris:
        if not storage.is_s3(uri):
            Path(uri.removeprefix("file://")).unlink(missing_ok=True)


@task(name="import-dab-dataset", persist_result=False)
def import_dab_dataset(
    dab_dir: str, artifacts_root: str, force: bool = False, settings: Settings | None = None,
    scoring_only: bool = False,
) -> str:
    """Import one DAB dataset directory (see the module docstring) and register it under its
    DAB name (:func:`register_import`); returns the URI of its ``manifest.json``.

    Idempotent per version (skips work when the manifest exists, unless ``force``). Every
    table is streamed into Parquet in chunks (:mod:`tasks.datasets.dab_stream`). ``scoring_only``:
    no database is read (``db_config.yaml`` and the data files may be missing) and a query
    folder needs only its ``validate.py``; the manifest has no databases and
    ``scoring_only: true``. Raises DabImportError naming the file and what is wrong: the
    configuration, every data file's presence and every query are checked before anything is
    written, and the Parquet files of a failed import are removed."""
    settings = settings or Settings.from_env()
    dab = Path(dab_dir).expanduser().resolve()
    name, version = dataset_name(dab), dab_version(dab, scoring_only)
    check_name_free(name)
    prefix = DatasetLayout(artifacts_root, name, version).root
    manifest_uri = storage.join(prefix, "manifest.json")
    if not force and is_current_dataset(manifest_uri):
        register_import(artifacts_root, name, manifest_uri, dab, version, scoring_only)
        return manifest_uri
    config = {} if scoring_only else read_db_config(dab)
    _check_files(dab, config)
    description = _text(dab / "db_description.txt").strip()
    if not description and not scoring_only:
        raise DabImportError(dab / "db_description.txt", "missing or empty: DAB's first user "
                             "message carries it (--scoring-only imports without it)")
    with_hints = _text(dab / "db_description_withhint.txt").strip()
    queries = read_queries(dab, scoring_only)
    support = support_files(dab)
    written: list[str] = []
    try:
        databases = _place_databases(dab, config, prefix, settings, written)
        support_uri = storage.join(prefix, "validate_support") if support else None
        for rel, path in support.items():
            written.append(storage.write_bytes(storage.join(prefix, "validate_support", rel),
                                               path.read_bytes()))
        entries = []
        for q in queries:
            folder = storage.join(prefix, "queries", q["id"])
            for rel, path in q["files"].items():
                written.append(storage.write_bytes(storage.join(folder, rel), path.read_bytes()))
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
        manifest = {
            "name": name,
            "version": version,
            "spec_file": "db_config.yaml",
            "source": str(dab),
            "format": "dab",
            "scoring_only": scoring_only,
            "description": (description.splitlines()[0] if description
                            else f"DAB dataset {dab.name}"),
            # DAB's --use_hints appends db_description_withhint.txt as it is (run_agent.py)
            "hints": with_hints,
            "schema_description": description,
            "databases": databases,
            "canonical": {},
            "queries": entries,
        }
        # public manifest (questions, databases) + private scoring file (validators, ground
        # truth, the oracle's reference): the trial side never reads the latter
        uri = split_manifest(manifest_uri, manifest)
    except BaseException:
        _remove(written)
        raise
    register_import(artifacts_root, name, uri, dab, version, scoring_only)
    return uri


# -- the registry of imported datasets -------------------------------------------------------


def registry_uri(artifacts_root: str, name: str | None = None) -> str:
    """``<root>/datasets/_dab`` (or one dataset's entry, ``<root>/datasets/_dab/<name>.json``)."""
    base = dab_import_root(artifacts_root)
    return base if name is None else storage.join(base, f"{name}.json")


def register_import(artifacts_root: str, name: str, manifest_uri: str, source: Path,
                    version: str, scoring_only: bool) -> str:
    """Record that DAB dataset ``name`` was imported (its manifest, source folder, version,
    whether scoring-only, when); the latest import of a name wins. Returns the entry's URI."""
    return storage.write_json(registry_uri(artifacts_root, name), {
        "name": name, "manifest": manifest_uri, "source": str(source), "version": version,
        "scoring_only": scoring_only,
        "imported_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    })


def imported_datasets(artifacts_root: str) -> dict[str, dict]:
    """Every registered DAB import under ``artifacts_root`` by name (see
    :func:`register_import`); entries whose manifest is gone are left out."""
    out = {}
    for uri in storage.list_uris(registry_uri(artifacts_root), ".json"):
        try:
            entry = storage.read_json(uri)
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and entry.get("name") and storage.exists(
                str(entry.get("manifest", ""))):
            out[entry["name"]] = entry
    return out


def resolve_imported(artifacts_root: str, name: str) -> dict | None:
    """The registered import called ``name`` — exactly, else the one name equal to it ignoring
    case (``patents`` finds ``PATENTS``) — or None."""
    found = imported_datasets(artifacts_root)
    if name in found:
        return found[name]
    folded = [e for n, e in found.items() if n.casefold() == name.casefold()]
    return folded[0] if len(folded) == 1 else None


def imported_name(artifacts_root: str, name: str) -> str | None:
    """The registered name of the DAB import ``name`` refers to (:func:`resolve_imported`),
    or None."""
    entry = resolve_imported(artifacts_root, name)
    return entry["name"] if entry else None


def check_name_free(name: str) -> None:
    """DabImportError when ``name`` is (ignoring case) the name of one of querylab's own
    datasets, which would be ambiguous in ``--dataset`` and answer files."""
    from tasks.datasets.catalogue import dataset_names

    clash = [n for n in dataset_names() if n.casefold() == name.casefold()]
    if clash:
        raise DabImportError(name, f"DAB dataset name {name!r} is the name of querylab's own "
                             f"dataset {clash[0]!r}; rename the folder query_{name}")
