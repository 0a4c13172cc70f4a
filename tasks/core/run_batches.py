"""Mapped items of a stage: batch keys, agent-spec fingerprints, and :func:`gather`, which waits
for every item before failing so one failed batch never throws away the work of the others.

They live in :mod:`tasks.core.batching` (the batched stage every suite shares); this module
keeps the import path of :mod:`tasks.core.runs`."""

from __future__ import annotations

from tasks.core.batching import batch_key, gather, spec_fingerprint

__all__ = ["batch_key", "gather", "spec_fingerprint"]
