"""Mapped items of a stage: batch keys, agent-spec fingerprints, and :func:`gather`, which waits
for every item before failing so one failed batch never throws away the work of the others."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from tasks.core.run_ids import StageFailed

log = logging.getLogger("querylab.runs")


def batch_key(label: str, index: int, material: Any) -> str:
    """Key of one batch of a mapped stage: ``<label slug>-<index:04d>-<digest>``.

    ``material``: everything the batch's output depends on, JSON-able — the items (their
    content, not only their ids), the agent's fingerprint (:func:`spec_fingerprint`) and the
    full stage configuration — so a re-run with any of them changed gets a new key and runs
    again, while an unchanged one finds its finished batch. ``digest``: the first 10 hex digits
    of SHA-256 over ``material`` as canonical JSON (sorted keys; other values via ``str``)."""
    import hashlib
    import re

    text = json.dumps(material, sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_")[:60] or "x"
    return f"{slug}-{index:04d}-{digest}"


def spec_fingerprint(spec: str) -> str | None:
    """What identifies an agent / generator spec beyond its name: for ``replay:<path>`` the
    SHA-256 (hex) of the file's bytes, or of every file of a directory (relative path and
    bytes, in path order); None for every other spec (``oracle``, models by name). Raises
    OSError when the replay source cannot be read."""
    import hashlib
    from pathlib import Path

    kind, _, arg = spec.partition(":")
    if kind != "replay" or not arg:
        return None
    path, h = Path(arg), hashlib.sha256()
    if path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(path)).encode() + b"\0")
            h.update(hashlib.sha256(f.read_bytes()).digest())
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


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
