"""SQL-equivalence judging: pairs × methods as mapped batches → equivalence.parquet → tables."""

from __future__ import annotations

from prefect import flow, unmapped

from schemas.equivalence import EquivalenceOptions
from schemas.settings import Settings
from tasks.equivalence.stage import (
    combine_equivalence,
    plan_equivalence_batches,
    prepare_pairs,
    run_equivalence_batch,
)
from tasks.equivalence.tables import equivalence_tables
from tasks.core.runs import gather
from tasks.core.task_runners import EnvTaskRunner

DEFAULT_METHODS = ["exec_match", "finder"]


@flow(name="equivalence", task_runner=EnvTaskRunner())
def equivalence(
    run_id: str,
    pairs_path: str,
    methods: list[str] | None = None,
    options: dict | None = None,
    batch_size: int = 20,
    artifacts_root: str | None = None,
) -> dict:
    """Judge every pair of ``pairs_path`` (JSONL) with every method (default: execution match
    and the counterexample finder; judges as ``judge:<technique>:<notion>:<model>``).

    ``options``: an :class:`EquivalenceOptions` as a dict (match semantics, finder budget,
    judge settings, ``db_root``). Finished batches of the same run are skipped on re-run (a
    changed pair, method or option runs again); every batch runs to its end even when another
    fails, then :class:`tasks.core.runs.StageFailed` names each failed one.
    Returns ``{"pairs", "equivalence", "tables"}`` (URIs; ``tables`` also holds the Markdown).
    """
    root = artifacts_root or Settings.from_env().artifacts
    opts = EquivalenceOptions.model_validate(options or {})
    prepared = prepare_pairs(pairs_path, run_id, root)
    batches = plan_equivalence_batches(prepared["ids"], methods or DEFAULT_METHODS, batch_size,
                                       opts, pairs_uri=prepared["pairs_uri"])
    futures = run_equivalence_batch.map(
        unmapped(run_id), unmapped(root), unmapped(prepared["pairs_uri"]), batches,
        unmapped(opts.model_dump(mode="json")),
    )
    gather(futures, [b["key"] for b in batches], run_id, "equivalence")
    uri = combine_equivalence(run_id, root, [b["key"] for b in batches])
    return {"pairs": prepared["pairs_uri"], "equivalence": uri,
            "tables": equivalence_tables(run_id, root)}
