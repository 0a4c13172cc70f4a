"""The batched stage every suite shares: plan, run if missing (per-item checkpoints), gather,
combine.

A suite's mapped stage (trials, text-to-SQL generation, equivalence judging, lifecycle) is:

1. **plan** (:func:`check_specs`, then :func:`plan`): the agent specs checked and
   fingerprinted, then the items in consecutive chunks of at most ``batch_size``, each with a
   key (:func:`batch_key`) digesting everything the batch's rows depend on — the items (their
   content, not only ids), the agent's fingerprint (:func:`spec_fingerprint`) and the full
   stage configuration — so an unchanged re-run finds its finished batches and a changed one
   runs again;
2. **run if missing** (:meth:`BatchedStage.run_batch`): a batch whose artifact exists is
   finished (it is written last) and skipped; otherwise each item's rows are checkpointed as
   the item finishes (``<key>.parts/<index:05d>.json``), so a batch killed midway resumes with
   its unfinished items only; then the batch's Parquet artifacts are written, the one that
   marks it finished last;
3. **gather** (:func:`gather`): wait for every mapped batch, then fail naming each failed one;
4. **combine** (:func:`combine`): the batch artifacts into one sorted artifact, streamed out row
   group by row group.

A suite supplies its per-item function and its schemas; anything else it needs (the trials'
concurrency, journals and ``retry_errors``) stays in the suite, built on the same pieces.

Layout: ``runs/<run_id>/<stage>/batches/<key>.<part>.parquet`` (``<key>.parquet`` for a stage
with one unnamed part) and the checkpoints ``<key>.parts/``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pydantic import BaseModel

from tasks.core import storage
from tasks.core.layout import RunLayout
from tasks.core.run_ids import StageFailed

__all__ = [
    "BatchedStage",
    "Checkpoints",
    "batch_key",
    "check_specs",
    "combine",
    "gather",
    "label_slug",
    "plan",
    "remove_local",
    "spec_fingerprint",
    "stage_config",
]

log = logging.getLogger("querylab.runs")

#: Rows of one item or one batch, by part name (``""``: a stage's only, unnamed part).
Rows = dict[str, list[dict]]


# --------------------------------------------------------------------------------- plan


def label_slug(label: str, *, limit: int | None = 60, strip: bool = True) -> str:
    """``label`` as a file-name part: runs of characters other than ``[A-Za-z0-9_.-]`` become
    ``_``; with ``strip`` leading/trailing ``_`` are removed; then the first ``limit``
    characters (None: all). ``"x"`` when nothing is left."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", label)
    if strip:
        slug = slug.strip("_")
    return (slug if limit is None else slug[:limit]) or "x"


def batch_key(label: str, index: int, material: Any, *, slug: str | None = None) -> str:
    """Key of one batch of a mapped stage: ``<slug>-<index:04d>-<digest>``.

    ``material``: everything the batch's output depends on, JSON-able — the items (their
    content, not only their ids), the agent's fingerprint (:func:`spec_fingerprint`) and the
    full stage configuration — so a re-run with any of them changed gets a new key and runs
    again, while an unchanged one finds its finished batch. ``digest``: the first 10 hex digits
    of SHA-256 over ``material`` as canonical JSON (sorted keys; other values via ``str``).
    ``slug``: the key's first part as given (a suite whose keys predate this function keeps
    its own); None: :func:`label_slug` of ``label``."""
    text = json.dumps(material, sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return f"{label_slug(label) if slug is None else slug}-{index:04d}-{digest}"


def plan(label: str, items: Sequence, batch_size: int, material: Callable[[list], Any], *,
         slug: str | None = None) -> list[tuple[str, list]]:
    """``items`` in consecutive chunks of at most ``batch_size``, each with its key:
    ``[(key, chunk)]`` in order, ``key = batch_key(label, i, material(chunk), slug=slug)`` for
    the ``i``-th chunk. ValueError for ``batch_size`` < 1."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    out = []
    for index, start in enumerate(range(0, len(items), batch_size)):
        chunk = list(items[start : start + batch_size])
        out.append((batch_key(label, index, material(chunk), slug=slug), chunk))
    return out


def spec_fingerprint(spec: str) -> str | None:
    """What identifies an agent / generator spec beyond its name: its kind's
    :meth:`tasks.agents.registry.AgentKind.fingerprint` of the argument — for ``replay:<path>``
    the SHA-256 (hex) of the file's bytes, or of every file of a directory — and None for a
    spec with no argument, of no registered kind, or of a kind without one (``oracle``, models
    by name). Raises OSError when the kind's source cannot be read."""
    from tasks.agents.registry import agent_kind, kind_names  # (the registry imports the LLM layer)

    kind, _, arg = spec.partition(":")
    if not arg or kind not in kind_names():
        return None
    return agent_kind(kind).fingerprint(arg)


def check_specs(specs: Sequence[str], check: Callable[[str], Any], label: Callable[[str], str],
                noun: str, error: Callable[[str], Exception], unreadable: str,
                config_model: type[BaseModel],
                config: BaseModel | Mapping | None) -> tuple[dict, dict[str, str | None]]:
    """What a suite's plan checks before its batches: ``(stage config, {spec: fingerprint})``.

    In this order: ``check(spec)`` for each agent spec (raising the suite's own error for a
    bad one); their labels (``label(spec)``, what the rows record) unique, else ValueError
    ``"duplicate <noun> [labels]"`` (``noun`` plural: ``"models"``); ``config`` normalised by
    :func:`stage_config` (pydantic's ValidationError for a bad field); each spec's
    :func:`spec_fingerprint` (in the order given), ``error("<spec>: <unreadable>: <OSError>")``
    when a replay source cannot be read."""
    for spec in specs:
        check(spec)
    labels = [label(s) for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate {noun} {labels}")
    cfg = stage_config(config_model, config)
    fingerprints = {}
    for spec in specs:
        try:
            fingerprints[spec] = spec_fingerprint(spec)
        except OSError as exc:
            raise error(f"{spec}: {unreadable}: {exc}") from None
    return cfg, fingerprints


def stage_config(model: type[BaseModel], config: BaseModel | Mapping | None) -> dict:
    """A stage's full configuration as a batch key digests it: ``config`` (an instance of
    ``model``, a dict of its fields, or None for the defaults) validated as ``model`` and dumped
    as JSON-able values (every field, defaults included). Raises pydantic's ValidationError
    for a bad field."""
    data = config.model_dump() if isinstance(config, model) else config or {}
    return model.model_validate(data).model_dump(mode="json")


# --------------------------------------------------------------------------------- run


@dataclass(frozen=True)
class Checkpoints:
    """The per-item checkpoints of one batch: ``<prefix>/<index:05d>.json``, each the JSON of
    one finished item's rows (whatever the suite stores: any JSON-able value)."""

    prefix: str

    def uri(self, index: int) -> str:
        """Checkpoint URI of item ``index`` (0-based, in the batch's item order)."""
        return storage.join(self.prefix, f"{index:05d}.json")

    def read(self, index: int) -> Any | None:
        """Item ``index``'s checkpointed rows; None when it has none."""
        uri = self.uri(index)
        return storage.read_json(uri) if storage.exists(uri) else None

    def write(self, index: int, rows: Any) -> None:
        """Checkpoint item ``index``'s ``rows`` (JSON; values it cannot encode via ``str``)."""
        storage.write_bytes(self.uri(index), json.dumps(rows, default=str).encode())

    def remove(self) -> None:
        """Remove every checkpoint of the batch (local artifact roots; on S3 they are left)."""
        remove_local(self.prefix)


def remove_local(uri: str) -> None:
    """Remove the directory ``uri`` and what it holds when it is local (``file://`` or a path);
    nothing for an object-store URI or a directory that is not there."""
    if "://" not in uri or uri.startswith("file://"):
        shutil.rmtree(uri.removeprefix("file://"), ignore_errors=True)


@dataclass(frozen=True)
class BatchedStage:
    """Where one suite's batches live and what they hold.

    ``stage``: the stage directory under ``runs/<run_id>/`` (``trials``, ``text2sql``, ...);
    ``parts``: ``(name, schema)`` of each Parquet artifact of a batch, in writing order — the
    last one marks the batch finished (name ``""``: the file is ``<key>.parquet``)."""

    stage: str
    parts: tuple[tuple[str, pa.Schema], ...]

    @property
    def marker(self) -> str:
        """Name of the part written last (its presence means the batch is finished)."""
        return self.parts[-1][0]

    def prefix(self, artifacts_root: str, run_id: str, *parts: str) -> str:
        """``runs/<run_id>/<stage>/batches/<parts...>``."""
        return RunLayout(artifacts_root, run_id).path(self.stage, "batches", *parts)

    def uri(self, artifacts_root: str, run_id: str, key: str, part: str | None = None) -> str:
        """URI of batch ``key``'s artifact ``part`` (None: the marker)."""
        part = self.marker if part is None else part
        return self.prefix(artifacts_root, run_id, f"{key}.{part}.parquet" if part
                           else f"{key}.parquet")

    def finished(self, artifacts_root: str, run_id: str, key: str) -> bool:
        """Whether batch ``key`` is finished (its marker artifact exists)."""
        return storage.exists(self.uri(artifacts_root, run_id, key))

    def checkpoints(self, artifacts_root: str, run_id: str, key: str) -> Checkpoints:
        """The per-item checkpoints of batch ``key`` (``batches/<key>.parts/``)."""
        return Checkpoints(self.prefix(artifacts_root, run_id, f"{key}.parts"))

    def run_items(self, artifacts_root: str, run_id: str, key: str, items: Sequence,
                  run_item: Callable[[Any], Rows]) -> Rows:
        """The rows of every item of batch ``key``, by part, in item order.

        ``run_item(item)`` → the item's rows by part name; an item checkpointed by an earlier,
        interrupted attempt is read back instead of run, and each item run now is checkpointed
        as soon as it returns. An exception from ``run_item`` propagates (the items finished
        before it keep their checkpoints)."""
        checkpoints = self.checkpoints(artifacts_root, run_id, key)
        out: Rows = {name: [] for name, _ in self.parts}
        for index, item in enumerate(items):
            rows = checkpoints.read(index)
            if rows is None:
                rows = run_item(item)
                checkpoints.write(index, rows)
            for name, part_rows in rows.items():
                out[name].extend(part_rows)
        return out

    def run_batch(self, artifacts_root: str, run_id: str, key: str,
                  start: Callable[[ExitStack], tuple[Sequence, Callable[[Any], Rows]]],
                  report: Callable[[Rows], None] | None = None) -> str:
        """Run batch ``key`` unless it is finished; returns its marker's URI either way.

        A finished batch is skipped (``start`` is not called). Otherwise ``start(stack)``
        opens what the batch needs — registering on ``stack`` whatever must be closed (a model
        client, a validator), closed once the items are done or one has failed — and returns
        ``(items, run_item)``; :meth:`run_items` runs them (checkpointed item by item),
        ``report(rows)`` (when given) sees the batch's rows by part, e.g. to log a summary, and
        :meth:`write` writes them. An exception from ``start``, ``run_item`` or ``report``
        propagates (the items finished before it keep their checkpoints)."""
        if self.finished(artifacts_root, run_id, key):
            return self.uri(artifacts_root, run_id, key)
        with ExitStack() as stack:
            items, run_item = start(stack)
            rows = self.run_items(artifacts_root, run_id, key, items, run_item)
        if report is not None:
            report(rows)
        return self.write(artifacts_root, run_id, key, rows)

    def write(self, artifacts_root: str, run_id: str, key: str, rows: Mapping[str, list[dict]],
              transform: Callable[[str, pa.Table], pa.Table] | None = None) -> str:
        """Write batch ``key``'s artifacts from ``rows`` (part name → rows; a part missing is
        empty), each as a table of its schema — ``transform(name, table)`` first when given —
        the marker last; then remove the batch's checkpoints. Returns the marker's URI."""
        uri = ""
        for name, schema in self.parts:
            table = pa.Table.from_pylist(list(rows.get(name, [])), schema=schema)
            if transform is not None:
                table = transform(name, table)
            uri = storage.write_parquet(self.uri(artifacts_root, run_id, key, name), table,
                                        schema)
        self.checkpoints(artifacts_root, run_id, key).remove()
        return uri


# --------------------------------------------------------------------------------- gather


def gather(futures: Sequence, keys: Sequence[str], run_id: str, stage: str) -> list:
    """Wait for every Prefect future of a mapped stage, then return their results in order.

    Unlike calling ``result()`` in a loop, no failure stops the wait: every item runs to its
    end (so finished items are kept for the re-run), then :class:`StageFailed` names each
    failed key with its error. ``keys``: one item key per future."""
    from prefect.futures import wait

    if len(futures) != len(keys):
        raise ValueError(f"{len(futures)} futures but {len(keys)} keys")
    wait(list(futures))
    results, failed = [], []
    for key, future in zip(keys, futures):
        try:
            results.append(future.result())
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            failed.append((key, f"{type(exc).__name__}: {exc}"))
    if failed:
        for key, err in failed:
            log.error("%s of run %s: item %s failed: %s", stage, run_id, key, err)
        raise StageFailed(run_id, stage, failed, len(keys))
    return results


# --------------------------------------------------------------------------------- combine

#: Rows per row group of a combined artifact (fixed, so equal tables give equal bytes).
COMBINE_ROW_GROUP = 65_536


def combine(uris: Sequence[str], schema: pa.Schema, order: Sequence, out_uri: str, *,
            nulls_last: bool = False) -> str:
    """Concatenate the batch artifacts ``uris`` (each checked against ``schema``) into one
    Parquet artifact at ``out_uri``, sorted by ``order`` (column names or Polars
    expressions over the columns; a stable sort, nulls first unless ``nulls_last``); returns
    ``out_uri``.

    The rows are held once (the batches' tables, concatenated without a copy) plus their
    sorted copy: the sort order is computed over the key columns alone, and the sorted rows
    are streamed out row group by row group (:data:`COMBINE_ROW_GROUP` rows each, so equal
    inputs give equal bytes; :func:`tasks.core.storage.write_parquet_batches`), never built
    as one in-memory file. No ``uris``: an empty artifact. Raises StorageError naming a batch
    artifact that is missing, ArtifactSchemaError for one of another schema."""
    tables = [storage.read_parquet(u, schema) for u in uris]
    if not tables:
        return storage.write_parquet(out_uri, schema.empty_table(), schema)
    table = pa.concat_tables(tables)
    del tables
    table = table.take(_sort_indices(table, order, nulls_last)).combine_chunks()
    storage.write_parquet_batches(out_uri, schema,
                                  table.to_batches(max_chunksize=COMBINE_ROW_GROUP))
    return out_uri


def _sort_indices(table: pa.Table, order: Sequence, nulls_last: bool) -> pa.Array:
    """Row indices of ``table`` in ``order`` (stable): by pyarrow for column names, else by
    Polars over the columns the expressions read."""
    if all(isinstance(o, str) for o in order):
        import pyarrow.compute as pc

        nulls = "at_end" if nulls_last else "at_start"
        return pc.sort_indices(table, sort_keys=[(o, "ascending", nulls) for o in order])
    import polars as pl

    exprs = [pl.col(o) if isinstance(o, str) else o for o in order]
    names = sorted({n for e in exprs for n in e.meta.root_names()})
    keys = pl.from_arrow(table.select(names)).with_row_index("__row")
    return keys.sort(exprs, nulls_last=nulls_last, maintain_order=True)["__row"].to_arrow()
