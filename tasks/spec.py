"""Load and check dataset specs (``data/<name>.yaml``) before any data is touched."""

from __future__ import annotations

import importlib.util
import string
from pathlib import Path

import yaml
from pydantic import ValidationError

from schemas.spec import OPERATIONS, DatasetSpec, FormatOp, SourceSpec, SplitOp, TextOp

DATA_DIR = Path(__file__).resolve().parents[1] / "data"


class SpecError(ValueError):
    """A dataset spec is broken. ``str(err)`` is ``"<file>: <field>: <problem>"``."""

    def __init__(self, file: str | Path, field: str, problem: str):
        self.file, self.field, self.problem = str(file), field, problem
        super().__init__(f"{file}: {field}: {problem}")


def spec_path(name: str) -> Path:
    """Path of the shipped spec ``data/<name>.yaml``; raises SpecError when absent."""
    path = DATA_DIR / f"{name}.yaml"
    if not path.exists():
        raise SpecError(path, "name", f"no dataset spec named {name!r} in {DATA_DIR}")
    return path


def template_fields(template: str) -> list[str]:
    """Column names a Python format string refers to (``"bid_{id:05d}"`` → ``["id"]``)."""
    names = []
    for _, field, _, _ in string.Formatter().parse(template):
        if field:
            names.append(field.split(".")[0].split("[")[0])
    return names


def load_spec(path: str | Path) -> DatasetSpec:
    """Parse and cross-check a spec file.

    Returns the validated :class:`DatasetSpec`. Raises :class:`SpecError` naming the file and the
    field (``placements[0].columns[3]``) for YAML errors, schema errors, unknown databases, tables
    or columns, template fields that are not columns, and duplicate query ids.
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise SpecError(path, "-", "spec file not found") from exc
    except yaml.YAMLError as exc:
        raise SpecError(path, "-", f"not valid YAML: {exc}") from exc
    try:
        spec = DatasetSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "-"
        raise SpecError(path, field, first["msg"]) from exc
    _cross_check(spec, path)
    return spec


def _cross_check(spec: DatasetSpec, path: Path) -> None:
    seen_places: set[tuple[str, str]] = set()
    for i, pl in enumerate(spec.placements):
        where = f"placements[{i}]"
        if pl.database not in spec.databases:
            raise SpecError(path, f"{where}.database", f"unknown database {pl.database!r}")
        if pl.source not in spec.tables:
            raise SpecError(path, f"{where}.source", f"unknown table {pl.source!r}")
        if (pl.database, pl.name) in seen_places:
            raise SpecError(path, f"{where}.name", f"{pl.name!r} placed twice in {pl.database}")
        seen_places.add((pl.database, pl.name))
        declared = spec.tables[pl.source].columns
        for j, col in enumerate(pl.columns):
            if col not in declared:
                raise SpecError(
                    path, f"{where}.columns[{j}]", f"unknown column {col!r} of table {pl.source!r}"
                )
        cols = list(pl.columns)
        for j, op in enumerate(pl.transforms):
            tw = f"{where}.transforms[{j}]"
            refs: list[tuple[str, str]] = []
            if isinstance(op, FormatOp):
                refs = [(f"{tw}.template", c) for c in template_fields(op.template)]
            elif isinstance(op, TextOp):
                refs = [
                    (f"{tw}.templates[{k}]", c)
                    for k, t in enumerate(op.templates)
                    for c in template_fields(t)
                ]
            elif isinstance(op, SplitOp):
                refs = [(f"{tw}.column", op.column)]
            refs += [(f"{tw}.drop[{k}]", c) for k, c in enumerate(getattr(op, "drop", []))]
            for field, col in refs:
                if col not in cols:
                    raise SpecError(path, field, f"unknown column {col!r} (have {cols})")
            if not isinstance(op, SplitOp) and op.column not in cols:
                cols.append(op.column)
            cols = [c for c in cols if c not in getattr(op, "drop", [])]
        for k, col in enumerate(pl.order_by):
            if col not in declared:
                raise SpecError(path, f"{where}.order_by[{k}]", f"unknown column {col!r}")
        for old in pl.rename:
            if old not in cols:
                raise SpecError(path, f"{where}.rename.{old}", f"unknown column {old!r}")
    ids: set[str] = set()
    for i, q in enumerate(spec.queries):
        if q.id in ids:
            raise SpecError(path, f"queries[{i}].id", f"duplicate query id {q.id!r}")
        ids.add(q.id)
        placed = {f"{pl.database}.{pl.name}" for pl in spec.placements}
        for j, source in enumerate(q.requires.sources):
            if source not in placed:
                raise SpecError(
                    path, f"queries[{i}].requires.sources[{j}]",
                    f"unknown source {source!r}; placed tables are {sorted(placed)}",
                )
        for j, op in enumerate(q.requires.operations):
            if op not in OPERATIONS:
                raise SpecError(
                    path, f"queries[{i}].requires.operations[{j}]",
                    f"unknown operation {op!r}; known: {list(OPERATIONS)}",
                )
        for j, step in enumerate(q.reference):
            db = step.args.get("db")
            if step.tool == "query_db" and db not in spec.databases:
                raise SpecError(
                    path, f"queries[{i}].reference[{j}].args.db", f"unknown database {db!r}"
                )


def resolve_source(
    spec_file: str | Path, name: str, source: SourceSpec, source_dir: str | Path | None = None
) -> Path:
    """Absolute path of one source file.

    ``package`` sources resolve inside the installed package; others inside ``source_dir`` (or the
    spec file's directory). Raises SpecError naming ``sources.<name>.path`` (or ``.package``) when
    the package is not installed or the file does not exist.
    """
    if source.package:
        found = importlib.util.find_spec(source.package)
        if found is None or not found.submodule_search_locations:
            raise SpecError(
                spec_file, f"sources.{name}.package", f"package {source.package!r} not installed"
            )
        base = Path(list(found.submodule_search_locations)[0])
    else:
        base = Path(source_dir) if source_dir else Path(spec_file).parent
    path = (base / source.path).resolve()
    if not path.is_file():
        raise SpecError(spec_file, f"sources.{name}.path", f"source file not found: {path}")
    return path
