"""Query pairs of the equivalence stage: reading and validating a pairs JSONL file, resolving a
pair's database reference (a ``postgresql://`` URL, a file, or a name under ``--db-root``) and
its relational schema (from its DDL/mapping or its SQLite/DuckDB database), and the schema as
DDL text for a judge's prompt."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import ValidationError

from schemas.equivalence import QueryPair
from tasks.core.jsonl import parse_jsonl
from tasks.equivalence.instances import RelSchema, SchemaError, load_schema

class PairsError(ValueError):
    """A pairs file cannot be read; the message names the file and line."""


# --------------------------------------------------------------------------------------------
# Input
# --------------------------------------------------------------------------------------------


def load_pairs(path: str | Path) -> list[QueryPair]:
    """Read and validate a pairs JSONL file (one :class:`QueryPair` per non-blank line).

    Raises PairsError naming ``file:line`` for invalid JSON, a missing/extra field, a bad
    label, or a duplicate ``id``; FileNotFoundError-style PairsError for a missing file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PairsError(f"{p}: cannot read pairs file ({exc.strerror or exc})") from None
    pairs: list[QueryPair] = []
    seen: dict[str, int] = {}

    def bad_line(n: int, exc: Exception) -> PairsError:
        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            loc = ".".join(str(x) for x in first["loc"]) or "-"
            return PairsError(f"{p}:{n}: {loc}: {first['msg']}")
        return PairsError(f"{p}:{n}: not valid JSON ({exc.msg})")

    for n, pair in parse_jsonl(text, QueryPair.model_validate, bad_line,
                               (json.JSONDecodeError, ValidationError)):
        if pair.id in seen:
            raise PairsError(f"{p}:{n}: duplicate id {pair.id!r} (first on line {seen[pair.id]})")
        seen[pair.id] = n
        pairs.append(pair)
    if not pairs:
        raise PairsError(f"{p}: no pairs")
    return pairs


def resolve_db(db: str, db_root: str | Path | None = None) -> str:
    """A database reference as something :func:`execution_match` can open: a
    ``postgresql://`` URL unchanged, an existing file path, or a name looked up under
    ``db_root`` as ``<name>.sqlite|.sqlite3|.db|.duckdb`` or ``<name>/<name>.<same>`` (the
    Spider layout). Raises FileNotFoundError listing where it looked."""
    if re.match(r"^postgres(?:ql)?://", db):
        return db
    p = Path(db).expanduser()
    if p.is_file():
        return str(p)
    looked = [str(p)]
    if db_root is not None:
        root = Path(db_root).expanduser()
        if (root / db).is_file():
            return str(root / db)
        for base in (root / db, root / db / db):
            for suffix in (".sqlite", ".sqlite3", ".db", ".duckdb"):
                cand = base.with_name(base.name + suffix)
                looked.append(str(cand))
                if cand.is_file():
                    return str(cand)
    raise FileNotFoundError(f"database {db!r} not found (looked at {', '.join(looked[:4])}...)")


def pair_schema(pair: QueryPair, db_root: str | None = None) -> RelSchema:
    """The pair's :class:`RelSchema` (from its DDL/mapping, else from its SQLite/DuckDB
    database). Raises SchemaError."""
    db_path = None
    if pair.schema_ is None and pair.db:
        try:
            ref = resolve_db(pair.db, db_root)
        except FileNotFoundError as exc:
            raise SchemaError(str(exc)) from None
        if "://" in ref:
            raise SchemaError("a schema is needed for a PostgreSQL database (give 'schema')")
        db_path = ref
    return load_schema(pair.schema_, pair.schema_dialect, db_path, query_dialect=pair.dialect)


def schema_text(pair: QueryPair, db_root: str | None = None) -> str:
    """The schema as DDL text for a prompt: the pair's own DDL verbatim, else rendered (in the
    pair's dialect) from the mapping or the database."""
    if isinstance(pair.schema_, str):
        return pair.schema_
    return pair_schema(pair, db_root).ddl(pair.dialect)



__all__ = ["PairsError", "load_pairs", "pair_schema", "resolve_db", "schema_text"]
