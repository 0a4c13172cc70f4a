"""Database-lifecycle suite (DBLifeBench): databases → items per phase → (model × phase × items)
batches → per-phase results → the paper's tables. Flows compose tasks of
:mod:`tasks.lifecycle.pipeline`; every source path is a parameter (nothing is copied into the
repository)."""

from __future__ import annotations

from prefect import flow, unmapped

from schemas.lifecycle import LifecycleConfig
from schemas.settings import Settings
from tasks.lifecycle.agents import check_agent_spec
from tasks.lifecycle.pipeline import (
    check_phases,
    combine_lifecycle_results,
    generate_lifecycle_items,
    lifecycle_report,
    plan_lifecycle_batches,
    prepare_lifecycle_databases,
    resolve_path,
    run_lifecycle_batch,
)
from tasks.lifecycle.rewrite import check_rewrite_spec
from tasks.core.runs import gather
from tasks.core.task_runners import EnvTaskRunner


@flow(name="lifecycle", task_runner=EnvTaskRunner())
def lifecycle(
    run_id: str,
    models: list[str],
    spider_dir: str,
    questions_path: str,
    chinook_path: str | None = None,
    phases: list[str] | None = None,
    config: dict | None = None,
    artifacts_root: str | None = None,
    rewrite_model: str | None = None,
) -> dict:
    """Run the lifecycle suite for ``models`` (``oracle``, ``openai:<model>``,
    ``replay:<file.jsonl>``) on ``phases`` (default all eight).

    ``spider_dir``: Spider databases (``<db_id>/schema.sql`` + ``data/*.csv``);
    ``questions_path``: Spider ``dev.json``; ``chinook_path``: ``Chinook_Sqlite.sqlite``
    (required unless ``config.include_chinook`` is false); ``config``:
    :class:`schemas.lifecycle.LifecycleConfig` fields; ``rewrite_model`` (``openai:<model>``,
    optional): paraphrase the templated requirements of design/implementation items with that
    model (:mod:`tasks.lifecycle.rewrite`; the template is kept beside it). Items are generated once per run id
    (one mapped task per phase), then every (model × phase × batch of items) is a mapped task; a
    re-run with the same ``run_id``, items, models and config skips finished batches (a changed
    config or replay file runs them again); every batch runs to its end even when another
    fails, then :class:`tasks.core.runs.StageFailed` names each failed one. Returns the URIs of
    :func:`tasks.lifecycle.pipeline.lifecycle_report` plus ``"items"`` (manifests per phase),
    ``"results"`` (per phase) and ``"databases"``."""
    root = artifacts_root or Settings.from_env().artifacts
    cfg = LifecycleConfig.model_validate(config or {}).model_dump(mode="json")
    selected = check_phases(phases)
    if not models:
        raise ValueError("no models given")
    for model in models:  # a bad spec fails before any work
        check_agent_spec(model)
    if rewrite_model is not None:
        check_rewrite_spec(rewrite_model)
    databases = prepare_lifecycle_databases(
        run_id,
        root,
        resolve_path(spider_dir),
        resolve_path(questions_path),
        resolve_path(chinook_path),
        cfg,
    )
    futures = generate_lifecycle_items.map(
        unmapped(run_id),
        unmapped(root),
        selected,
        unmapped(databases),
        unmapped(cfg),
        unmapped(rewrite_model),
    )
    manifests = gather(futures, [f"items/{p}" for p in selected], run_id, "lifecycle")
    batches = plan_lifecycle_batches(models, manifests, cfg["batch_size"], cfg)
    futures = run_lifecycle_batch.map(
        unmapped(run_id), unmapped(root), batches, unmapped(databases), unmapped(cfg)
    )
    gather(futures, [b["key"] for b in batches], run_id, "lifecycle")
    results = combine_lifecycle_results(run_id, root, batches)
    return {
        **lifecycle_report(run_id, root),
        "items": manifests,
        "results": results,
        "databases": databases,
    }
