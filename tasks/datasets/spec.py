"""Load and check dataset specs (``data/<name>.yaml``) before any data is touched."""

from __future__ import annotations

import importlib.util
import string
from pathlib import Path

import yaml
from pydantic import ValidationError

from schemas.spec import (
    OPERATIONS,
    ComposeOp,
    DatasetSpec,
    FormatOp,
    FuzzOp,
    SourceSpec,
    SplitOp,
    TextOp,
)

DATA_DIR = Path(__file__).resolve().parents[2] / "data"


class SpecError(ValueError):
    """A dataset spec is broken. ``str(err)`` is ``"<file>: <field>: <problem>"``; the problem
    text ends with what to do about it (``fix: ...``) where querylab can tell."""

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
    if not isinstance(raw, dict):
        raise SpecError(path, "-", "a spec is a YAML mapping; fix: start from `querylab datasets new`")
    try:
        spec = DatasetSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = _field_path(first["loc"])
        raise SpecError(path, field, _problem(first, field)) from exc
    _cross_check(spec, path)
    return spec


_TRANSFORM_TAGS = {"format", "text", "compose", "split", "fuzz"}

#: What to write when a required field is missing (by the field's last name).
_REQUIRED_FIX = {
    "ground_truth": "add `ground_truth: {sql: ...}`, DuckDB SQL over the canonical tables that "
    "computes the answer before any perturbation",
    "validator": "add `validator: {kind: number, decimals: N}` or `validator: {kind: items}`",
    "reference": "add the reference solution: a list of tool calls the oracle runs",
    "requires": "add `requires: {sources: [<database>.<table>, ...], operations: [...]}`",
}


def _field_path(loc: tuple) -> str:
    """``("placements", 0, "transforms", 1, "fuzz", "kinds")`` → ``placements[0].transforms[1].kinds``
    (the discriminator tag pydantic inserts for tagged unions is left out)."""
    out = ""
    prev: list = []
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _TRANSFORM_TAGS and len(prev) >= 2 and prev[-2] == "transforms":
            pass
        else:
            out += ("." if out else "") + str(part)
        prev.append(part)
    return out or "-"


def _problem(error: dict, field: str) -> str:
    """A pydantic error as a problem text with the fix."""
    kind, msg, last = error["type"], error["msg"], field.rsplit(".", 1)[-1]
    if kind == "missing":
        if last == "engine":
            from schemas.spec import engine_choices

            choices = ", ".join(engine_choices())
            return f"required field missing; fix: add `engine:` one of {choices}"
        fix = _REQUIRED_FIX.get(last, f"add `{last}`")
        return f"required field missing; fix: {fix}"
    if kind == "extra_forbidden":
        return f"unknown field {last!r}; fix: remove it or correct its spelling"
    if kind == "literal_error":
        return f"{error.get('input')!r} is not allowed: {msg}"
    if kind == "value_error":  # a field validator's ValueError: its text, without pydantic's prefix
        return msg.removeprefix("Value error, ")
    if kind == "union_tag_invalid":
        return f"{msg}; fix: `op` is one of format, text, compose, split, fuzz"
    return msg


def _cross_check(spec: DatasetSpec, path: Path) -> None:
    seen_places: set[tuple[str, str]] = set()
    for i, pl in enumerate(spec.placements):
        where = f"placements[{i}]"
        if pl.database not in spec.databases:
            raise SpecError(
                path, f"{where}.database",
                f"unknown database {pl.database!r}; fix: use one of {sorted(spec.databases)} or "
                "declare it under `databases`",
            )
        if pl.source not in spec.tables:
            raise SpecError(
                path, f"{where}.source",
                f"unknown table {pl.source!r}; fix: use one of {sorted(spec.tables)} or declare "
                "it under `tables`",
            )
        if (pl.database, pl.name) in seen_places:
            first = next(
                k for k, other in enumerate(spec.placements)
                if (other.database, other.name) == (pl.database, pl.name)
            )
            raise SpecError(
                path, f"{where}.name",
                f"{pl.name!r} is placed twice in database {pl.database!r} (also "
                f"placements[{first}]); fix: give one of them another `name`, or merge them",
            )
        seen_places.add((pl.database, pl.name))
        declared = spec.tables[pl.source].columns
        for j, col in enumerate(pl.columns):
            if col not in declared:
                raise SpecError(
                    path, f"{where}.columns[{j}]",
                    f"unknown column {col!r} of table {pl.source!r}; fix: use one of "
                    f"{list(declared)} or add it to tables.{pl.source}.columns",
                )
        for name in pl.derive:
            if name in pl.columns:
                raise SpecError(
                    path, f"{where}.derive.{name}",
                    f"derived column {name!r} is also in {where}.columns; fix: give it another "
                    "name",
                )
        cols = list(pl.columns) + list(pl.derive)
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
            elif isinstance(op, ComposeOp):
                refs = [
                    (f"{tw}.clauses[{k}][{m}]", c)
                    for k, clause in enumerate(op.clauses)
                    for m, t in enumerate(clause)
                    for c in template_fields(t)
                ]
                for k, clause in enumerate(op.clauses):
                    if not clause:
                        raise SpecError(
                            path, f"{tw}.clauses[{k}]",
                            "a clause needs at least one phrasing; fix: add one or remove it",
                        )
                if op.keep_first > len(op.clauses):
                    raise SpecError(
                        path, f"{tw}.keep_first",
                        f"{op.keep_first} clauses kept first but only {len(op.clauses)} given",
                    )
            elif isinstance(op, (SplitOp, FuzzOp)):
                refs = [(f"{tw}.column", op.column)]
            refs += [(f"{tw}.drop[{k}]", c) for k, c in enumerate(getattr(op, "drop", []))]
            for field, col in refs:
                if col not in cols:
                    raise SpecError(
                        path, field,
                        f"perturbs column {col!r}, which this placement does not have at this "
                        f"step (have {cols}); fix: add it to {where}.columns or correct the name",
                    )
            if isinstance(op, FuzzOp):
                if "truncate" in op.kinds and op.length is None:
                    raise SpecError(path, f"{tw}.length", "fix: `truncate` needs `length`")
                if "abbreviate" in op.kinds and not op.abbreviations:
                    raise SpecError(
                        path, f"{tw}.abbreviations",
                        "fix: `abbreviate` needs `abbreviations: {word: abbreviation}`",
                    )
                target = op.into or op.column
            else:
                target = op.column
            if not isinstance(op, SplitOp) and target not in cols:
                cols.append(target)
            cols = [c for c in cols if c not in getattr(op, "drop", [])]
        for k, col in enumerate(pl.order_by):
            if col not in declared and col not in pl.derive:
                raise SpecError(
                    path, f"{where}.order_by[{k}]",
                    f"unknown column {col!r}; fix: use one of {list(declared)}",
                )
        if pl.shard is not None:
            if pl.shard.by not in cols:
                raise SpecError(
                    path, f"{where}.shard.by",
                    f"unknown column {pl.shard.by!r}; fix: shard by one of the placed columns "
                    f"{cols}",
                )
            others = [c for c in template_fields(pl.shard.table or "") if c != pl.shard.by]
            if others:
                raise SpecError(
                    path, f"{where}.shard.table",
                    f"names fields {others}; fix: a shard's table name may only use "
                    f"{{{pl.shard.by}}}",
                )
            cols = [c for c in cols if c != pl.shard.by]
        for old in pl.rename:
            if old not in cols:
                raise SpecError(
                    path, f"{where}.rename.{old}",
                    f"unknown column {old!r}; fix: rename one of the placed columns {cols}",
                )
        final = [pl.rename.get(c, c) for c in cols]
        for note in pl.column_notes:
            if note not in final:
                raise SpecError(
                    path, f"{where}.column_notes.{note}",
                    f"unknown column {note!r}; fix: note one of the placed columns {final}",
                )
    ids: set[str] = set()
    for i, q in enumerate(spec.queries):
        if q.id in ids:
            raise SpecError(
                path, f"queries[{i}].id", f"duplicate query id {q.id!r}; fix: rename one"
            )
        ids.add(q.id)
        placed = {f"{pl.database}.{pl.name}" for pl in spec.placements if pl.shard is None}
        sharded = {pl.database for pl in spec.placements if pl.shard is not None}
        for j, source in enumerate(q.requires.sources):
            # a shard's table names come from the data: checked when the dataset is built
            if source.partition(".")[0] in sharded and source.partition(".")[2]:
                continue
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
                    path, f"queries[{i}].reference[{j}].args.db",
                    f"unknown database {db!r}; fix: use one of {sorted(spec.databases)}",
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
                spec_file, f"sources.{name}.package",
                f"package {source.package!r} not installed; fix: pip install it (and list it in "
                "pyproject.toml)",
            )
        base = Path(next(iter(found.submodule_search_locations)))
    else:
        base = Path(source_dir) if source_dir else Path(spec_file).parent
    path = (base / source.path).resolve()
    if not path.is_file():
        hint = (
            f"check `path` inside package {source.package!r}" if source.package else
            "pass the directory holding it as source_dir (`--source-dir`; shared datasets read "
            "QUERYLAB_SHARED_DATA) or correct `path`"
        )
        raise SpecError(
            spec_file, f"sources.{name}.path", f"source file not found: {path}; fix: {hint}"
        )
    return path


def check_sources(
    spec_file: str | Path, spec: DatasetSpec, source_dir: str | Path | None = None
) -> dict[str, Path]:
    """Resolve every source of ``spec`` (see :func:`resolve_source`) before anything is read;
    returns name → absolute path. Raises SpecError for the first missing one."""
    return {
        name: resolve_source(spec_file, name, src, source_dir) for name, src in spec.sources.items()
    }
