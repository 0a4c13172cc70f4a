"""Artifact storage: the system of record under ``QUERYLAB_ARTIFACTS``.

URIs are plain strings: a local path (``./artifacts/runs/r1/trials/trials.parquet``) or, later,
``s3://bucket/prefix/...``. Writes are atomic: a local write goes to a temporary file in the same
directory and is renamed over the target, so readers never see half a file.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.artifacts import check_schema


class StorageError(OSError):
    """An artifact could not be read or written; the message names the URI."""


def _is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def _local(uri: str) -> Path:
    if _is_remote(uri):
        raise StorageError(f"{uri}: only local artifact roots are supported in this version")
    return Path(uri.removeprefix("file://"))


def join(root: str, *parts: str) -> str:
    """Join URI parts with ``/`` (no normalisation of ``..``)."""
    out = root.rstrip("/")
    for part in parts:
        out += "/" + str(part).strip("/")
    return out


def exists(uri: str) -> bool:
    """True when an artifact exists at ``uri``."""
    return _local(uri).exists()


def write_bytes(uri: str, data: bytes) -> str:
    """Write ``data`` atomically to ``uri`` (temp file + rename); returns ``uri``."""
    path = _local(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return uri


def read_bytes(uri: str) -> bytes:
    """Read a whole artifact; raises StorageError naming ``uri`` when it is missing."""
    try:
        return _local(uri).read_bytes()
    except FileNotFoundError as exc:
        raise StorageError(f"{uri}: artifact not found") from exc


def list_uris(prefix: str, suffix: str = "") -> list[str]:
    """All artifact URIs under ``prefix`` ending in ``suffix``, sorted."""
    root = _local(prefix)
    if not root.exists():
        return []
    return sorted(
        str(p) for p in root.rglob(f"*{suffix}") if p.is_file() and not p.name.startswith(".")
    )


def write_json(uri: str, obj: Any) -> str:
    """Write ``obj`` as pretty, key-sorted JSON (deterministic bytes); returns ``uri``."""
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n"
    return write_bytes(uri, text.encode())


def read_json(uri: str) -> Any:
    """Read a JSON artifact."""
    return json.loads(read_bytes(uri))


def write_parquet(uri: str, table: pa.Table, schema: pa.Schema | None = None) -> str:
    """Write ``table`` as zstd Parquet, atomically; deterministic bytes for equal tables.

    When ``schema`` is given the table is cast to it first and its metadata (``schema_version``)
    is stored; raises ArtifactSchemaError when columns are missing.
    """
    if schema is not None:
        table = check_schema(table, schema, uri).replace_schema_metadata(schema.metadata)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return write_bytes(uri, sink.getvalue())


def read_parquet(uri: str, schema: pa.Schema | None = None) -> pa.Table:
    """Read a Parquet artifact as a pyarrow Table (checked against ``schema`` when given)."""
    table = pq.read_table(io.BytesIO(read_bytes(uri)))
    if schema is not None:
        table = check_schema(table, schema, uri)
    return table
