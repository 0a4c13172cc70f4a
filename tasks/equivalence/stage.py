"""SQL equivalence stage: read query pairs, judge each (pair × method) in mapped batches, write
``equivalence.parquet``; the study is "LLM-SQL-Solver: Can LLMs Determine SQL Equivalence?"
(Zhao et al.).

The pieces live in sibling modules: :mod:`tasks.equivalence.pairs` (pairs files, databases and
schemas of pairs), :mod:`tasks.equivalence.methods` (the methods ``exec_match``, ``finder``,
``judge:...`` and one row per pair × method) and :mod:`tasks.equivalence.tables` (the tables and
``equivalence.md``).

Layout under the artifact root: ``runs/<run_id>/equivalence/pairs.jsonl`` (the validated input),
``batches/<key>.parquet`` (one per mapped batch; a finished batch is skipped on re-run),
``equivalence.parquet`` (all rows), ``tables/*.parquet`` (accuracy, agreement with execution
match, agreement with the labels, counterexamples, finder instance sizes, time) and
``equivalence.md``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import ExitStack

from schemas import equivalence as eqs
from schemas.equivalence import EquivalenceOptions, QueryPair
from schemas.settings import Settings
from tasks.core import storage
from tasks.core.batching import BatchedStage, combine, label_slug, plan
from tasks.core.prefect_task import task
from tasks.core.layout import RunLayout
from tasks.equivalence.methods import FINDER_REVISION, evaluate, parse_method
from tasks.equivalence.pairs import load_pairs

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Batches (the unit Prefect maps over)
# --------------------------------------------------------------------------------------------


def stage_prefix(artifacts_root: str, run_id: str) -> str:
    """``<root>/runs/<run_id>/equivalence``."""
    return RunLayout(artifacts_root, run_id).path("equivalence")


@task(name="prepare-equivalence-pairs", persist_result=False)
def prepare_pairs(pairs_path: str, run_id: str, artifacts_root: str) -> dict:
    """Validate a pairs file and store it as ``pairs.jsonl`` of the run.

    Returns ``{"pairs_uri", "ids", "n_pairs"}``. Raises PairsError for a bad file (nothing is
    written then)."""
    pairs = load_pairs(pairs_path)
    text = "".join(json.dumps(p.model_dump(by_alias=True), ensure_ascii=False, sort_keys=True) + "\n"
                   for p in pairs)
    uri = storage.write_bytes(storage.join(stage_prefix(artifacts_root, run_id), "pairs.jsonl"),
                              text.encode())
    return {"pairs_uri": uri, "ids": [p.id for p in pairs], "n_pairs": len(pairs)}


def plan_equivalence_batches(pair_ids: list[str], methods: list[str], batch_size: int,
                             options: EquivalenceOptions | None = None,
                             pairs_uri: str | None = None) -> list[dict]:
    """Expand methods × pairs into batches of at most ``batch_size`` pairs of one method.

    Returns JSON-able ``{"key", "method", "pair_ids"}``; keys are stable for the same inputs
    and options (so a re-run finds finished batches, and changed options start new ones).
    ``pairs_uri`` (the run's ``pairs.jsonl``): keys also digest each pair's content, so a pair
    whose SQL, schema or label changed under the same id is judged again. Raises ValueError
    for an unknown method or a bad batch size, KeyError for an id not in ``pairs_uri``."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    parsed = [parse_method(m) for m in methods]
    if not parsed:
        raise ValueError("no methods given")
    # the artifact schema version is part of the key: batches written by an older version are
    # never combined with new ones
    # ... and so is the version of the methods' semantics (FINDER_REVISION: tie groups,
    # arbitrary choices, real PostgreSQL), so a resumed run never mixes two of them
    opts = (options or EquivalenceOptions()).model_dump_json() + f"|v{eqs.SCHEMA_VERSION}|r{FINDER_REVISION}"
    pairs = _read_pairs(pairs_uri) if pairs_uri is not None else None

    def material(name: str, chunk: list[str]) -> list:
        if pairs is None:
            return [name, chunk, opts]
        return [name, chunk, opts, [pairs[p].model_dump(mode="json", by_alias=True)
                                    for p in chunk]]

    batches = []
    for m in parsed:
        # these keys predate tasks.core.batching: the slug is the whole method name, unstripped
        for key, chunk in plan(m.name, pair_ids, batch_size, lambda c: material(m.name, c),
                               slug=label_slug(m.name, limit=None, strip=False)):
            batches.append({"key": key, "method": m.name, "pair_ids": chunk})
    return batches


#: The judging stage's batches: ``equivalence/batches/<key>.parquet`` of
#: :data:`schemas.equivalence.EQUIVALENCE` rows, per-pair checkpoints ``<key>.parts/``.
EQUIVALENCE_BATCHES = BatchedStage("equivalence", (("", eqs.EQUIVALENCE),))


def _read_pairs(uri: str) -> dict[str, QueryPair]:
    lines = storage.read_bytes(uri).decode().splitlines()
    pairs = [QueryPair.model_validate(json.loads(x)) for x in lines if x.strip()]
    return {p.id: p for p in pairs}


def _logger():
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # noqa: BLE001 - outside a Prefect run
        return log


@task(name="run-equivalence-batch", persist_result=False, retries=0)
def run_equivalence_batch(run_id: str, artifacts_root: str, pairs_uri: str, batch: dict,
                          options: dict | None = None) -> str:
    """Judge every pair of one batch with its method; write the batch's rows.

    Returns the batch URI; skips all work when it already exists, and the pairs an interrupted
    attempt judged (checkpointed one by one). The judge model of judge
    methods is resolved from the models table / the environment (``QUERYLAB_MODELS``,
    ``QUERYLAB_OPENAI_*``), never from parameters; its responses are cached under
    ``<artifacts_root>/cache/llm``."""

    def start(stack: ExitStack) -> tuple[list[str], Callable[[str], dict[str, list[dict]]]]:
        opts = EquivalenceOptions.model_validate(options or {})
        method = parse_method(batch["method"])
        pairs = _read_pairs(pairs_uri)
        client, client_error = None, None
        if method.kind == "judge":
            from tasks.equivalence.judges import judge_model

            try:
                client = judge_model(method.model, Settings.from_env(), opts.judge,
                                     artifacts_root)
            except ValueError as exc:
                client_error = str(exc)
        if client is not None:
            stack.callback(client.close)
        return batch["pair_ids"], lambda pid: {"": [
            {"run_id": run_id, **evaluate(pairs[pid], method, opts, client, client_error)}]}

    return EQUIVALENCE_BATCHES.run_batch(artifacts_root, run_id, batch["key"], start,
                                         lambda rows: _log_batch(batch["key"], rows[""]))


def _log_batch(key: str, rows: list[dict]) -> None:
    """Log a judged batch: its verdict counts, then one warning per errored pair."""
    logger = _logger()
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    logger.info("equivalence batch %s: %d pairs, %s", key, len(rows), counts)
    for r in rows:
        if r["verdict"] == "error":
            logger.warning("equivalence %s on %s: error: %s", r["method"], r["pair_id"],
                           (r["error"] or "").splitlines()[0][:200] if r["error"] else "?")


@task(name="combine-equivalence", persist_result=False)
def combine_equivalence(run_id: str, artifacts_root: str, batch_keys: list[str]) -> str:
    """Concatenate the batches into ``equivalence.parquet`` (sorted by pair, method; written
    row group by row group, :func:`tasks.core.batching.combine`)."""
    return combine([EQUIVALENCE_BATCHES.uri(artifacts_root, run_id, k) for k in batch_keys],
                   eqs.EQUIVALENCE,
                   ["pair_id", "method"],
                   storage.join(stage_prefix(artifacts_root, run_id), "equivalence.parquet"),
                   nulls_last=True)


__all__ = [
    "EQUIVALENCE_BATCHES",
    "combine_equivalence",
    "plan_equivalence_batches",
    "prepare_pairs",
    "run_equivalence_batch",
    "stage_prefix",
]
