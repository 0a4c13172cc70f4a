"""Helpers shared by the bulk loaders of :mod:`tasks.db.sqlite`, :mod:`tasks.db.duckdb`
and :mod:`tasks.db.postgres`: record batches and rows of an Arrow table or a streamed
``RecordBatchReader`` (a loader given a reader never holds the whole table), and temporary
sibling paths for write-then-rename.
"""

from __future__ import annotations

import os
import pathlib
import uuid
from typing import Iterable


def _tmp_sibling(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _batches(tbl: "pa.Table | pa.RecordBatchReader") -> Iterable["pa.RecordBatch"]:
    """The record batches of a table, or of a ``RecordBatchReader`` (streamed: a loader given
    a reader never holds the whole table; :class:`tasks.core.storage.ParquetStream` makes one)."""
    if hasattr(tbl, "to_batches"):
        return tbl.to_batches(max_chunksize=10_000)
    return tbl


def _iter_rows(tbl: "pa.Table | pa.RecordBatchReader") -> Iterable[tuple]:
    for batch in _batches(tbl):
        cols = [c.to_pylist() for c in batch.columns]
        yield from zip(*cols)
