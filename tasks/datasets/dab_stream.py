"""Read a DAB dataset's databases in bounded memory and write them as Parquet, chunk by chunk.

DAB ships SQLite and DuckDB files of up to 5.4 GB, PostgreSQL dumps and MongoDB dumps; none of
them is ever held whole. Every reader here yields chunks of at most :data:`CHUNK_ROWS` rows
(fewer when rows are wide: about :data:`CHUNK_BYTES` bytes), and :func:`write_table` writes
them to one Parquet artifact as they come (:func:`tasks.core.storage.write_parquet_batches`), so
peak memory is a few chunks whatever the size of the source (``bench/dab_import_memory.py``
measures it).

Types. DuckDB tables stream as Arrow record batches with DuckDB's own types. The other sources
give Python values (SQLite is dynamically typed; a MongoDB collection has no schema), so a
table is read **twice**: the first pass only infers each column's Arrow type chunk by chunk and
unifies them (:func:`unify`: int + float → float, struct fields merged, list items unified, a
column whose kinds conflict — text and numbers, say — becomes text holding JSON), the second
builds the batches with that one schema. Values Arrow has no type for become text: ObjectId,
UUID, BSON regexes and the like as ``str(value)``, bytes as hex, Decimal / Decimal128 as float
(as before). A MongoDB ``_id`` that is an ObjectId is dropped (the loader assigns new ones);
other ``_id`` values are kept.

Errors are :class:`tasks.datasets.dab_import.DabImportError` naming the file (and the table).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from tasks.core import storage

#: Most rows in one chunk.
CHUNK_ROWS = 10_000
#: Target size of one chunk (bytes, as Arrow measures it): wide rows give smaller chunks.
CHUNK_BYTES = 16 << 20
#: Fewest rows in one chunk.
MIN_CHUNK_ROWS = 64
#: DuckDB's memory limit while a DuckDB file is read (its buffer pool would otherwise cache
#: the file's blocks up to 80 % of RAM).
DUCKDB_READ_MEMORY = "256MB"

#: A source of chunks: called once per pass, each call iterates the whole table again.
ChunkSource = Callable[[], Iterator[list]]


class StreamError(ValueError):
    """A table cannot be read; the importer turns it into a DabImportError naming the file."""


# -- values and types --------------------------------------------------------------------------

_SCALARS = (bool, int, float, str, datetime, date, time, timedelta)


def plain(value: Any) -> Any:
    """A value Arrow can hold: dicts and lists recursively, Decimal / Decimal128 → float,
    bytes → hex text, an int beyond 64 bits → text, any other non-standard type (ObjectId,
    UUID, BSON types) → ``str(value)``."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value) if -(1 << 63) <= value < (1 << 63) else str(value)
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if type(value).__name__ == "Decimal128":
        return float(value.to_decimal())
    return str(value)


def _infer(values: list) -> pa.DataType | None:
    """The Arrow type of one chunk of a column (None: only nulls), or ``pa.string()`` when
    Arrow cannot type it (mixed kinds)."""
    try:
        t = pa.array(values).type
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, ValueError):
        return pa.string()
    return None if pa.types.is_null(t) else t


def unify(a: pa.DataType | None, b: pa.DataType | None) -> pa.DataType | None:
    """One type that holds values of ``a`` and of ``b`` (None: no values seen yet): integers →
    int64, integers and floats → float64, timestamps of one time zone → microseconds, structs
    → the union of their fields (each unified), lists → a list of the unified item type;
    anything else that differs → ``pa.string()`` (the values become JSON text)."""
    if a is None:
        return b
    if b is None or a.equals(b):
        return a
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return pa.int64()
    if (pa.types.is_integer(a) or pa.types.is_floating(a)) and (
            pa.types.is_integer(b) or pa.types.is_floating(b)):
        return pa.float64()
    if _is_text(a) and _is_text(b):
        return pa.string()
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b) and a.tz == b.tz:
        return pa.timestamp("us", a.tz)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        fields: dict[str, pa.DataType | None] = {}
        for t in (a, b):
            for f in t:
                fields[f.name] = unify(fields.get(f.name), None if pa.types.is_null(f.type)
                                       else f.type)
        return pa.struct([pa.field(n, t if t is not None else pa.string())
                          for n, t in fields.items()])
    if _is_list(a) and _is_list(b):
        item = unify(_item(a), _item(b))
        return pa.list_(item if item is not None else pa.string())
    return pa.string()


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _item(t: pa.DataType) -> pa.DataType | None:
    v = t.value_type
    return None if pa.types.is_null(v) else v


def _final(t: pa.DataType | None) -> pa.DataType:
    """A column type for the schema: text when only nulls were seen; null items and fields
    become text too (so a later chunk's values fit)."""
    if t is None or pa.types.is_null(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _final(f.type)) for f in t])
    if _is_list(t):
        return pa.list_(_final(t.value_type))
    if pa.types.is_integer(t):
        return pa.int64()
    if pa.types.is_large_string(t):
        return pa.string()
    return t


def _coerce(value: Any, t: pa.DataType) -> Any:
    """``value`` shaped for type ``t``: non-text values of a text column become JSON text
    (recursively inside structs and lists)."""
    if value is None:
        return None
    if _is_text(t):
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                              default=str)
    if pa.types.is_struct(t):
        if not isinstance(value, dict):
            raise StreamError(f"expected a document, got {type(value).__name__}")
        return {f.name: _coerce(value.get(f.name), f.type) for f in t}
    if _is_list(t):
        if not isinstance(value, list):
            raise StreamError(f"expected an array, got {type(value).__name__}")
        return [_coerce(v, t.value_type) for v in value]
    return value


def _needs_coerce(t: pa.DataType) -> bool:
    return _is_text(t) or pa.types.is_struct(t) or _is_list(t)


def _array(values: list, t: pa.DataType, column: str) -> pa.Array:
    if _needs_coerce(t):
        values = [_coerce(v, t) for v in values]
    try:
        return pa.array(values, type=t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, ValueError) as exc:
        raise StreamError(f"column {column!r}: values do not fit type {t}: {exc}") from None


# -- chunked two-pass tables -------------------------------------------------------------------


def _columns_of(chunk: list, columns: list[str] | None) -> dict[str, list]:
    """Column name → values of one chunk: tuples with ``columns`` given, or documents (dicts;
    a missing field is null)."""
    if columns is not None:
        if not chunk:
            return {c: [] for c in columns}
        cols = list(zip(*chunk))
        return {c: [plain(v) for v in cols[i]] for i, c in enumerate(columns)}
    keys: dict[str, None] = {}
    for d in chunk:
        keys.update(dict.fromkeys(d))
    return {k: [plain(d.get(k)) for d in chunk] for k in keys}


def infer_schema(source: ChunkSource, columns: list[str] | None = None) -> pa.Schema:
    """First pass: the unified schema of every chunk of ``source`` (tuples of ``columns``, or
    documents when ``columns`` is None: fields in first-seen order). Holds one chunk at a
    time."""
    types: dict[str, pa.DataType | None] = {c: None for c in columns or []}
    for chunk in source():
        for name, values in _columns_of(chunk, columns).items():
            types[name] = unify(types.get(name), _infer(values))
    return pa.schema([pa.field(n, _final(t)) for n, t in types.items()])


def chunk_batches(source: ChunkSource, schema: pa.Schema,
                  columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Second pass: each chunk of ``source`` as a record batch of ``schema``."""
    for chunk in source():
        cols = _columns_of(chunk, columns)
        n = len(chunk)
        yield pa.RecordBatch.from_arrays(
            [_array(cols.get(f.name, [None] * n), f.type, f.name) for f in schema],
            schema=schema,
        )


def two_pass_batches(
    source: ChunkSource, columns: list[str] | None = None
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """``(schema, batches)`` of a re-readable chunk source (:func:`infer_schema` then
    :func:`chunk_batches`)."""
    schema = infer_schema(source, columns)
    return schema, chunk_batches(source, schema, columns)


class _Sizer:
    """Adapts the rows per chunk to the row width (about :data:`CHUNK_BYTES` per chunk)."""

    def __init__(self) -> None:
        self.rows = min(1_000, CHUNK_ROWS)

    def seen(self, chunk: list) -> None:
        if not chunk:
            return
        sample = chunk[: min(len(chunk), 200)]
        width = max(1, sum(len(repr(r)) for r in sample) // len(sample))
        self.rows = max(MIN_CHUNK_ROWS, min(CHUNK_ROWS, CHUNK_BYTES // width))


def cursor_chunks(execute: Callable[[], Any]) -> ChunkSource:
    """A chunk source over a DB-API cursor: ``execute()`` runs the query and returns the cursor
    (called once per pass); rows come with ``fetchmany``, the chunk size adapted to the row
    width."""

    def source() -> Iterator[list]:
        cur = execute()
        sizer = _Sizer()
        try:
            while True:
                rows = cur.fetchmany(sizer.rows)
                if not rows:
                    return
                sizer.seen(rows)
                yield rows
        finally:
            close = getattr(cur, "close", None)
            if close is not None:
                close()

    return source


def document_chunks(docs: Callable[[], Iterable[dict]]) -> ChunkSource:
    """A chunk source over documents (``docs()`` iterates them once per pass)."""

    def source() -> Iterator[list]:
        sizer = _Sizer()
        chunk: list = []
        for d in docs():
            chunk.append(d)
            if len(chunk) >= sizer.rows:
                sizer.seen(chunk)
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    return source


# -- the engines --------------------------------------------------------------------------------


#: A table being read: its schema and a function streaming its record batches (once).
Table = tuple[pa.Schema, Callable[[], Iterator[pa.RecordBatch]]]


@contextmanager
def sqlite_tables(path: str | Path) -> Iterator[dict[str, Table]]:
    """Every table of a SQLite file (opened read-only), as ``name → (schema, batches)`` where
    ``batches()`` streams the table; a table's schema is inferred (first pass) when it is
    first asked for. The file stays open inside the ``with`` block."""
    uri = f"file:{Path(path)}?mode=ro"
    con = sqlite3.connect(uri, uri=True)
    try:
        names = [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name")]
        yield LazyTables({n: (lambda n=n: _sqlite_table(con, n)) for n in names})
    finally:
        con.close()


def _sqlite_table(con: sqlite3.Connection, name: str) -> Table:
    quoted = '"' + name.replace('"', '""') + '"'
    columns = [d[0] for d in con.execute(f"SELECT * FROM {quoted} LIMIT 0").description]
    source = cursor_chunks(lambda: con.execute(f"SELECT * FROM {quoted}"))
    schema = infer_schema(source, columns)
    return schema, lambda: chunk_batches(source, schema, columns)


class LazyTables(dict):
    """``name → Table`` whose values are built on first access (so only one table's schema
    pass runs at a time and a failing table names itself)."""

    def __init__(self, makers: dict[str, Callable[[], Table]]):
        super().__init__(makers)

    def __getitem__(self, name: str) -> Table:
        return super().__getitem__(name)()

    def items(self):  # type: ignore[override]
        return ((n, self[n]) for n in self.keys())


@contextmanager
def duckdb_tables(path: str | Path) -> Iterator[dict[str, Table]]:
    """Every base table of a DuckDB file (schema ``main``; others as ``<schema>.<table>``),
    opened read-only without file access, as ``name → (schema, batches)`` streaming DuckDB's
    own Arrow record batches. The file stays open inside the ``with`` block."""
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        con.execute("SET enable_external_access = false")  # a view cannot read other files
        con.execute(f"SET memory_limit = '{DUCKDB_READ_MEMORY}'")  # its block cache, bounded
        names = con.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_type = 'BASE TABLE' ORDER BY 1, 2"
        ).fetchall()
        makers = {}
        for s, t in names:
            sql = 'SELECT * FROM "{}"."{}"'.format(s.replace('"', '""'), t.replace('"', '""'))

            def make(sql: str = sql) -> Table:
                schema = con.execute(sql + " LIMIT 0").fetch_arrow_table().schema
                return schema, lambda: iter(con.execute(sql).fetch_record_batch(CHUNK_ROWS))

            makers[t if s == "main" else f"{s}.{t}"] = make
        yield LazyTables(makers)
    finally:
        con.close()


def postgres_table(conn, schema_name: str, table: str):
    """``(schema, batches)`` of one table over an open psycopg connection, read with a
    server-side cursor in chunks (two passes: types, then batches)."""
    from psycopg import sql

    query = sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(schema_name),
                                                  sql.Identifier(table))
    with conn.cursor() as cur:
        cur.execute(sql.SQL("{} LIMIT 0").format(query))
        columns = [d.name for d in cur.description]
    counter = iter(range(1 << 30))

    def execute():
        cur = conn.cursor(name=f"ql_dab_read_{next(counter)}")
        cur.itersize = CHUNK_ROWS
        cur.execute(query)
        return cur

    source = cursor_chunks(execute)
    schema = infer_schema(source, columns)
    return schema, lambda: chunk_batches(source, schema, columns)


# -- MongoDB dumps --------------------------------------------------------------------------------


def iter_json_array(fh, read_size: int = 1 << 20) -> Iterator[str]:
    """The text of each element of a JSON array read from a text file handle, without loading
    the whole file (elements may span reads). StreamError for text that is not an array."""
    decoder = json.JSONDecoder()
    buf = fh.read(read_size)
    pos = 0
    started = False
    while True:
        while True:  # skip whitespace and commas (and the opening bracket once)
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf):
                break
            more = fh.read(read_size)
            if not more:
                raise StreamError("unterminated JSON array")
            buf, pos = buf[pos:] + more, 0
        if not started:
            if buf[pos] != "[":
                raise StreamError("expected a JSON array")
            started, pos = True, pos + 1
            continue
        if buf[pos] == "]":
            return
        while True:
            try:
                _, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                more = fh.read(read_size)
                if not more:
                    raise StreamError(f"not valid JSON: {exc.msg} at character {exc.pos}") from None
                buf, pos = buf[pos:] + more, 0
                continue
            yield buf[pos:end]
            buf, pos = buf[end:], 0
            break


def mongo_documents(path: Path) -> Callable[[], Iterator[dict]]:
    """A re-readable iterator factory over the documents of one dump file: ``.bson``
    (``mongodump``), or ``.json`` holding a JSON array or one extended-JSON document per
    line. StreamError for something that is not a document."""
    import bson
    from bson import json_util

    def docs() -> Iterator[dict]:
        if path.suffix == ".bson":
            with path.open("rb") as fh:
                try:
                    for d in bson.decode_file_iter(fh):
                        yield _without_object_id(d)
                except bson.errors.BSONError as exc:
                    raise StreamError(f"not a BSON dump: {exc}") from None
            return
        with path.open(encoding="utf-8", errors="replace") as fh:
            head = ""
            while True:
                ch = fh.read(1)
                if not ch or not ch.isspace():
                    head = ch
                    break
            if not head:
                return
            if head == "[":
                texts = iter_json_array(_Prefixed(head, fh))
            else:
                texts = (line for line in _Prefixed(head, fh).lines() if line.strip())
            for i, text in enumerate(texts):
                try:
                    d = json_util.loads(text)
                except (ValueError, TypeError) as exc:
                    raise StreamError(f"document {i}: not valid JSON: {exc}") from None
                if not isinstance(d, dict):
                    raise StreamError(f"document {i}: expected a JSON object, got "
                                      f"{type(d).__name__}")
                yield _without_object_id(d)

    return docs


class _Prefixed:
    """A text file handle with ``prefix`` put back in front (what was read to sniff it)."""

    def __init__(self, prefix: str, fh) -> None:
        self.prefix, self.fh = prefix, fh

    def read(self, n: int = -1) -> str:
        head, self.prefix = self.prefix, ""
        return head + self.fh.read(n if n < 0 else max(n - len(head), 1))

    def lines(self) -> Iterator[str]:
        head, self.prefix = self.prefix, ""
        first = self.fh.readline()
        yield head + first
        yield from self.fh


def _without_object_id(d: dict) -> dict:
    if type(d.get("_id")).__name__ == "ObjectId":
        d = dict(d)
        d.pop("_id")
    return d


def mongo_collection(path: Path):
    """``(schema, batches)`` of one collection dump file (two passes)."""
    source = document_chunks(mongo_documents(path))
    schema = infer_schema(source)
    return schema, lambda: chunk_batches(source, schema)


# -- writing ----------------------------------------------------------------------------------


def write_table(uri: str, schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> dict:
    """Stream ``batches`` into the Parquet artifact ``uri``; returns the manifest entry
    ``{"uri", "rows", "columns"}`` (column name → Arrow type text)."""
    rows = storage.write_parquet_batches(uri, schema, batches)
    return {"uri": uri, "rows": rows, "columns": {f.name: str(f.type) for f in schema}}
