"""Build a dataset from its spec: extract canonical tables, compute ground truth, perturb, place.

Everything here is deterministic: the same spec and sources give byte-identical Parquet.
Artifacts of one built dataset live under ``<root>/datasets/<name>/<version>/``:

- ``canonical/<table>.parquet`` — unperturbed tables (ground truth is computed from these);
- ``placed/<database>/<table>.parquet`` — perturbed tables as placed into each database;
- ``ground_truth.json`` and ``manifest.json`` (what the trials stage reads).
"""

from __future__ import annotations

import hashlib
import random
import sqlite3
import string
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from prefect import task

from schemas.spec import DatasetSpec, FormatOp, SplitOp, TextOp
from tasks import storage
from tasks.spec import SpecError, load_spec, resolve_source

ARROW_TYPES: dict[str, pa.DataType] = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "bool": pa.bool_(),
    "date": pa.date32(),
    "list[string]": pa.list_(pa.string()),
}


def dataset_version(spec_file: str | Path, spec: DatasetSpec, source_paths: list[Path]) -> str:
    """``<spec.version>-<10 hex>``: the hash covers the spec file's bytes and the sources' sizes,
    so an edited spec or a different source file never reuses stale artifacts."""
    h = hashlib.sha256(Path(spec_file).read_bytes())
    for p in source_paths:
        h.update(f"{p.name}:{p.stat().st_size}".encode())
    return f"{spec.version}-{h.hexdigest()[:10]}"


def dataset_prefix(root: str, name: str, version: str) -> str:
    """Artifact prefix of one built dataset version."""
    return storage.join(root, "datasets", name, version)


def _register_sources(
    con: duckdb.DuckDBPyConnection, spec_file: Path, spec: DatasetSpec, source_dir
) -> list[Path]:
    paths = []
    for name, src in spec.sources.items():
        path = resolve_source(spec_file, name, src, source_dir)
        paths.append(path)
        try:
            if src.format == "csv":
                rel = con.read_csv(str(path))
            elif src.format == "parquet":
                rel = con.read_parquet(str(path))
            elif src.format == "json":
                rel = con.read_json(str(path))
            else:  # sqlite: read through Python's sqlite3 (no DuckDB extension download)
                if not src.table:
                    raise SpecError(spec_file, f"sources.{name}.table", "sqlite sources need table")
                with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as sc:
                    cur = sc.execute(f'SELECT * FROM "{src.table}"')
                    cols = [d[0] for d in cur.description]
                    rel = pa.Table.from_pylist([dict(zip(cols, r)) for r in cur.fetchall()])
                    if rel.num_rows == 0:
                        rel = pa.table({c: pa.array([], pa.null()) for c in cols})
        except SpecError:
            raise
        except Exception as exc:  # unreadable file, missing sqlite table, ...
            raise SpecError(spec_file, f"sources.{name}", f"cannot read {path}: {exc}") from exc
        con.register(name, rel)
    return paths


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


class _Formatter(string.Formatter):
    """``str.format`` that renders NULL as ``unknown`` and ignores format specs on NULL."""

    def format_field(self, value, format_spec):
        if value is None:
            return "unknown"
        return super().format_field(value, format_spec)


_FMT = _Formatter()


def perturb_placement(spec: DatasetSpec, index: int, canonical: dict[str, pa.Table]) -> pa.Table:
    """Apply placement ``index``'s row filter, column selection and transforms.

    Seeded and deterministic: template choices come from ``random.Random`` seeded with
    ``"<spec.seed>:<database>:<name>"``. Returns the placed pyarrow Table.
    """
    pl = spec.placements[index]
    con = duckdb.connect()
    con.register("t", canonical[pl.source])
    cols = ", ".join(f'"{c}"' for c in pl.columns)
    sql = f"SELECT {cols} FROM t"
    if pl.where:
        sql += f" WHERE {pl.where}"
    if pl.order_by:
        sql += " ORDER BY " + ", ".join(f'"{c}"' for c in pl.order_by)
    base = con.sql(sql).to_arrow_table()
    types = {f.name: f.type for f in base.schema}
    rows = base.to_pylist()
    order = list(base.column_names)
    rng = random.Random(f"{spec.seed}:{pl.database}:{pl.name}")
    for op in pl.transforms:
        if isinstance(op, SplitOp):
            for r in rows:
                v = r[op.column]
                r[op.column] = [s.strip() for s in v.split(op.sep) if s.strip()] if v else []
            types[op.column] = pa.list_(pa.string())
            continue
        for r in rows:
            tmpl = op.template if isinstance(op, FormatOp) else rng.choice(op.templates)
            r[op.column] = _FMT.format(tmpl, **r)
        types[op.column] = pa.string()
        if op.column not in order:
            order.append(op.column)
        for c in op.drop:
            order.remove(c)
            for r in rows:
                r.pop(c, None)
    schema = pa.schema([(pl.rename.get(c, c), types[c]) for c in order])
    data = {pl.rename.get(c, c): [r[c] for r in rows] for c in order}
    return pa.table(data, schema=schema)


@task(name="build-dataset-artifacts", persist_result=False)
def build_dataset_artifacts(
    spec_file: str, artifacts_root: str, source_dir: str | None = None, force: bool = False
) -> str:
    """Extract, compute ground truth, perturb, and write a dataset's artifacts.

    Returns the URI of ``manifest.json``. Idempotent: when the manifest of this exact version
    exists (and not ``force``) nothing is rebuilt. Raises SpecError naming file and field for a
    broken spec or a missing source file.
    """
    spec, version, canonical = extract_canonical(spec_file, source_dir)
    prefix = dataset_prefix(artifacts_root, spec.name, version)
    manifest_uri = storage.join(prefix, "manifest.json")
    if storage.exists(manifest_uri) and not force:
        return manifest_uri
    truth = compute_ground_truth(spec, canonical, spec_file)
    canonical_uris = {
        name: storage.write_parquet(storage.join(prefix, "canonical", f"{name}.parquet"), tbl)
        for name, tbl in canonical.items()
    }
    databases: dict[str, dict] = {
        db: {"engine": d.engine, "description": d.description, "tables": {}}
        for db, d in spec.databases.items()
    }
    for i, pl in enumerate(spec.placements):
        tbl = perturb_placement(spec, i, canonical)
        uri = storage.write_parquet(
            storage.join(prefix, "placed", pl.database, f"{pl.name}.parquet"), tbl
        )
        databases[pl.database]["tables"][pl.name] = {
            "uri": uri,
            "rows": tbl.num_rows,
            "columns": {f.name: str(f.type) for f in tbl.schema},
        }
    storage.write_json(storage.join(prefix, "ground_truth.json"), truth)
    manifest = {
        "name": spec.name,
        "version": version,
        "spec_file": Path(spec_file).name,
        "description": spec.description,
        "hints": spec.hints,
        "databases": databases,
        "canonical": canonical_uris,
        "queries": [
            {
                "id": q.id,
                "question": q.question,
                "validator": q.validator.model_dump(),
                "reference": [s.model_dump() for s in q.reference],
                "requires": q.requires.model_dump(),
                "ground_truth": truth[q.id],
            }
            for q in spec.queries
        ],
    }
    return storage.write_json(manifest_uri, manifest)
