"""Artifact storage: the system of record under ``QUERYLAB_ARTIFACTS``.

URIs are plain strings: a local path (``./artifacts/runs/r1/trials/trials.parquet``) or
``s3://bucket/prefix/...`` (boto3; the endpoint comes from ``AWS_ENDPOINT_URL`` for MinIO or a test
server, credentials from the usual AWS chain — never from artifacts). Writes are atomic: a local
write goes to a temporary file in the same directory and is renamed over the target; an S3 write
is a single PUT, or a multipart upload above :data:`MULTIPART_THRESHOLD` bytes, and S3 makes the
object visible only once complete. Readers never see half a file.
"""

from __future__ import annotations

import errno
import io
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.artifacts import check_schema
from tasks.core.settings import env_get

#: Objects larger than this (bytes) are uploaded to S3 in parts of this size.
MULTIPART_THRESHOLD = 64 * 1024 * 1024


class StorageError(OSError):
    """An artifact could not be read or written; the message names the URI."""


def is_s3(uri: str) -> bool:
    """True for ``s3://bucket/key`` URIs."""
    return uri.startswith("s3://")


def _local(uri: str) -> Path:
    if "://" in uri and not uri.startswith("file://"):
        raise StorageError(f"{uri}: unsupported artifact URI scheme (use a path or s3://)")
    return Path(uri.removeprefix("file://"))


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: Mode of written files: what ``open()`` would give (0666 minus the umask), not mkstemp's 0600.
_FILE_MODE = 0o666 & ~_current_umask()

#: A local write's temporary file, ``.<name>.<pid>-<random>-<thread id>.tmp`` beside the
#: target: unique to the writing thread (of this process, on this host), so it is opened
#: directly, already with the mode above, and written without a buffered file object: one
#: syscall each for open, write, close and rename (``tempfile.mkstemp`` + ``os.fdopen`` +
#: ``chmod`` took ~2.5x the CPU, ~0.5 ms a write with 64 trials writing their journal and
#: response-cache entry at every model call). The pid is read per write (a forked child
#: differs).
_TMP_TOKEN = os.urandom(4).hex()
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)

_S3_LOCK = threading.Lock()
_S3_CLIENT = None


def _s3():
    """One boto3 S3 client per process (boto3 clients are thread-safe)."""
    global _S3_CLIENT
    with _S3_LOCK:
        if _S3_CLIENT is None:
            import boto3

            _S3_CLIENT = boto3.client("s3", endpoint_url=env_get("AWS_ENDPOINT_URL") or None)
        return _S3_CLIENT


def reset_s3_client() -> None:
    """Forget the cached S3 client (after changing ``AWS_*`` environment variables)."""
    global _S3_CLIENT
    with _S3_LOCK:
        _S3_CLIENT = None


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise StorageError(f"{uri}: no bucket in S3 URI")
    return bucket, key


def _is_missing(exc: Exception) -> bool:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
    return code in ("404", "NoSuchKey", "NotFound")


def join(root: str, *parts: str) -> str:
    """Join URI parts with ``/`` (no normalisation of ``..``)."""
    out = root.rstrip("/")
    for part in parts:
        out += "/" + str(part).strip("/")
    return out


def exists(uri: str) -> bool:
    """True when an artifact exists at ``uri``."""
    if is_s3(uri):
        from botocore.exceptions import ClientError

        bucket, key = _split(uri)
        try:
            _s3().head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as exc:
            if _is_missing(exc):
                return False
            raise StorageError(f"{uri}: {exc}") from exc
    return _local(uri).exists()


def write_bytes(uri: str, data: bytes) -> str:
    """Write ``data`` atomically to ``uri`` (temp file + rename, or one S3 PUT / multipart
    upload above :data:`MULTIPART_THRESHOLD`); returns ``uri``."""
    if is_s3(uri):
        from boto3.s3.transfer import TransferConfig

        bucket, key = _split(uri)
        config = TransferConfig(
            multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_THRESHOLD
        )
        try:
            _s3().upload_fileobj(io.BytesIO(data), bucket, key, Config=config)
        except Exception as exc:
            raise StorageError(f"{uri}: write failed: {exc}") from exc
        return uri
    path = _local(uri)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{_TMP_TOKEN}-{threading.get_ident()}.tmp")
    try:
        try:  # the directory usually exists (a trial writes its journal there at every call)
            fd = os.open(tmp, _TMP_FLAGS, _FILE_MODE)
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, _TMP_FLAGS, _FILE_MODE)
    except OSError as exc:
        # left by a killed writer of the same name, or a name too long with the suffix (a
        # name near the 255-byte limit): a fresh random one, with the name's first 150 bytes
        if exc.errno not in (errno.EEXIST, errno.ENAMETOOLONG):
            raise
        short = path.name.encode()[:150].decode(errors="ignore")
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{short}.", suffix=".tmp")
        tmp = Path(name)
        os.fchmod(fd, _FILE_MODE)
    try:
        try:
            view, done = memoryview(data), 0
            while done < len(view):
                done += os.write(fd, view[done:])
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return uri


def read_bytes(uri: str) -> bytes:
    """Read a whole artifact; raises StorageError naming ``uri`` when it is missing."""
    if is_s3(uri):
        from botocore.exceptions import ClientError

        bucket, key = _split(uri)
        try:
            return _s3().get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as exc:
            reason = "artifact not found" if _is_missing(exc) else str(exc)
            raise StorageError(f"{uri}: {reason}") from exc
    try:
        return _local(uri).read_bytes()
    except FileNotFoundError as exc:
        raise StorageError(f"{uri}: artifact not found") from exc


def list_dirs(prefix: str) -> list[str]:
    """Names of the immediate "directories" under ``prefix`` (local sub-directories, or S3
    common prefixes with delimiter ``/``), sorted; [] when there is none."""
    if is_s3(prefix):
        bucket, key = _split(prefix)
        key = key.rstrip("/") + "/" if key else ""
        pages = _s3().get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=key, Delimiter="/"
        )
        return sorted(
            cp["Prefix"][len(key):].rstrip("/")
            for page in pages for cp in page.get("CommonPrefixes", [])
        )
    root = _local(prefix)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def list_uris(prefix: str, suffix: str = "") -> list[str]:
    """All artifact URIs under ``prefix`` ending in ``suffix``, sorted. Local URIs are spelled
    as ``prefix`` is (``./artifacts/...``, ``file:///...`` and absolute paths keep their
    form), so ``uri[len(prefix):]`` is always the path below the prefix."""
    if is_s3(prefix):
        bucket, key = _split(prefix)
        key = key.rstrip("/") + "/" if key else ""
        pages = _s3().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key)
        return sorted(
            f"s3://{bucket}/{o['Key']}"
            for page in pages
            for o in page.get("Contents", [])
            if o["Key"].endswith(suffix) and not o["Key"].rsplit("/", 1)[-1].startswith(".")
        )
    root = _local(prefix)
    if not root.exists():
        return []
    base = prefix.rstrip("/")
    return sorted(
        f"{base}/{p.relative_to(root).as_posix()}"
        for p in root.rglob(f"*{suffix}") if p.is_file() and not p.name.startswith(".")
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


def polars_storage_options() -> dict[str, str] | None:
    """Polars / object_store options for ``s3://`` URIs: the endpoint of ``AWS_ENDPOINT_URL``
    (MinIO, a test server; plain HTTP allowed for an ``http://`` one) and the region of
    ``AWS_DEFAULT_REGION``; credentials come from the usual ``AWS_*`` variables. None when
    neither is set."""
    opts = {}
    endpoint = env_get("AWS_ENDPOINT_URL")
    if endpoint:
        opts["aws_endpoint_url"] = endpoint
        if endpoint.startswith("http://"):
            opts["aws_allow_http"] = "true"
    region = env_get("AWS_DEFAULT_REGION") or env_get("AWS_REGION")
    if region:
        opts["aws_region"] = region
    return opts or None


def scan_parquet(uri: str, schema: pa.Schema | None = None):
    """A Parquet artifact as a Polars ``LazyFrame`` scanning the file / S3 object itself (no
    bytes copy, nothing read until collected; projections and filters are pushed into the
    scan, so a streaming collect holds row groups, not the artifact).

    With ``schema``: the frame has exactly its columns, in its order and types, like
    :func:`read_parquet` with the same check (``schema_version`` from the file's footer; a
    column declared ``added_later`` that the file lacks reads as nulls); ArtifactSchemaError
    naming ``uri`` otherwise. StorageError when the artifact does not exist."""
    import polars as pl

    from schemas.artifacts import ArtifactSchemaError

    if not exists(uri):
        raise StorageError(f"{uri}: artifact not found")
    source = uri if is_s3(uri) else str(_local(uri))
    opts = polars_storage_options() if is_s3(uri) else None
    lf = pl.scan_parquet(source, storage_options=opts)
    if schema is None:
        return lf
    meta = pl.read_parquet_metadata(source, storage_options=opts)
    want = schema.metadata[b"schema_version"].decode()
    got = meta.get("schema_version")
    if got is not None and got != want:
        raise ArtifactSchemaError(f"{uri}: schema_version {got} but querylab reads {want}")
    present = set(lf.collect_schema().names())
    dtypes = pl.from_arrow(schema.empty_table()).schema
    cols, missing = [], []
    for f in schema:
        if f.name in present:
            cols.append(pl.col(f.name).cast(dtypes[f.name]))
        elif (f.metadata or {}).get(b"added_later"):
            cols.append(pl.lit(None, dtypes[f.name]).alias(f.name))
        else:
            missing.append(f.name)
    if missing:
        raise ArtifactSchemaError(f"{uri}: missing columns {missing}")
    return lf.select(cols)


def read_parquet(uri: str, schema: pa.Schema | None = None) -> pa.Table:
    """Read a Parquet artifact as a pyarrow Table (checked against ``schema`` when given)."""
    # ParquetFile, not read_table: one file needs no pyarrow.dataset (whose import pulls in
    # pandas, ~0.5 s that read-only commands would pay)
    table = pq.ParquetFile(io.BytesIO(read_bytes(uri))).read()
    if schema is not None:
        table = check_schema(table, schema, uri)
    return table


def write_parquet_batches(uri: str, schema: pa.Schema, batches) -> int:
    """Stream record ``batches`` (of ``schema``) into one zstd Parquet artifact at ``uri``
    without holding them together: each batch is a row group written as it comes, to a
    temporary file that is renamed over ``uri`` (or uploaded to S3) once complete; no rows at
    all: one empty row group, as :func:`write_parquet` writes an empty table. Returns the
    number of rows written. An exception raised by ``batches`` propagates and leaves ``uri``
    as it was."""
    rows = 0
    if is_s3(uri):
        fd, tmp = tempfile.mkstemp(prefix="querylab-", suffix=".parquet")
        os.close(fd)
        target = None
    else:
        target = _local(uri)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for batch in batches:
                if batch.num_rows:
                    writer.write_batch(batch)
                    rows += batch.num_rows
                del batch  # not held while the producer makes the next one
            if not rows:  # one empty row group, as writing the empty table in one go gives
                writer.write_table(schema.empty_table())
        if target is None:
            from boto3.s3.transfer import TransferConfig

            bucket, key = _split(uri)
            config = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD,
                                    multipart_chunksize=MULTIPART_THRESHOLD)
            try:
                _s3().upload_file(tmp, bucket, key, Config=config)
            except Exception as exc:
                raise StorageError(f"{uri}: write failed: {exc}") from exc
        else:
            os.chmod(tmp, _FILE_MODE)
            os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return rows


class ParquetStream:
    """A Parquet artifact read batch by batch: ``schema``, ``num_rows``, :meth:`batches` (a
    fresh pass each call, at most ``batch_rows`` rows per batch; iterating the object is the
    same) and ``parquet_path``, the local file. A local file is read in place; an S3 object
    is downloaded (streamed) to a temporary file first, removed by :meth:`close`. The
    loaders of :mod:`tasks.db.databases` take it in place of a table and never hold it whole."""

    def __init__(self, uri: str, batch_rows: int = 10_000):
        self.uri, self.batch_rows, self._tmp = uri, batch_rows, None
        if is_s3(uri):
            fd, tmp = tempfile.mkstemp(prefix="querylab-", suffix=".parquet")
            os.close(fd)
            bucket, key = _split(uri)
            try:
                _s3().download_file(bucket, key, tmp)
            except Exception as exc:
                Path(tmp).unlink(missing_ok=True)
                raise StorageError(f"{uri}: read failed: {exc}") from exc
            self._tmp = tmp
            path = tmp
        else:
            path = _local(uri)
            if not path.exists():
                raise StorageError(f"{uri}: artifact not found")
        #: the local file read (a download of an S3 object): engines can scan it directly
        self.parquet_path = str(path)
        self._file = pq.ParquetFile(path)
        self.schema = self._file.schema_arrow
        self.num_rows = self._file.metadata.num_rows

    def batches(self):
        """The record batches, in order."""
        return self._file.iter_batches(batch_size=self.batch_rows)

    def __iter__(self):
        return iter(self.batches())

    def reader(self) -> pa.RecordBatchReader:
        """The batches as a ``pyarrow.RecordBatchReader`` (read once)."""
        return pa.RecordBatchReader.from_batches(self.schema, self.batches())

    def close(self) -> None:
        """Release the file (and remove a downloaded copy)."""
        self._file.close()
        if self._tmp is not None:
            Path(self._tmp).unlink(missing_ok=True)
            self._tmp = None
