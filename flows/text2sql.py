"""Text-to-SQL on complex workloads: SQL complexity of corpora, TPC-DS generation with
validation and retries, and Spider execution accuracy. Flows compose tasks of
:mod:`tasks.text2sql.stage`, :mod:`~tasks.text2sql.analysis`, :mod:`~tasks.text2sql.validation`
and :mod:`~tasks.text2sql.spider_ex`; every path is a parameter (nothing is copied into the repository)."""

from __future__ import annotations

from prefect import flow, unmapped

from schemas.settings import Settings
from schemas.text2sql import CorpusSpec, GenerationConfig
from tasks.text2sql.corpora import tpcds_gold_queries
from tasks.core.runs import gather
from tasks.core.task_runners import EnvTaskRunner
from tasks.text2sql.analysis import analyse_generations, complexity_report, corpus_features
from tasks.text2sql.spider_ex import spider_execution_accuracy
from tasks.text2sql.stage import (
    combine_generations,
    plan_generation_batches,
    run_generation_batch,
)
from tasks.text2sql.validation import prepare_tpcds_postgres


@flow(name="sql-complexity")
def sql_complexity(
    run_id: str,
    corpora: list[dict],
    artifacts_root: str | None = None,
) -> dict:
    """Features of every query of every corpus (one mapped task per corpus), then the complexity
    table and the six histograms. ``corpora``: :class:`schemas.text2sql.CorpusSpec` dicts, e.g.
    ``[{"name": "tpcds"}, {"name": "spider", "path": ".../spider_dev_gold.sql"}]``.
    Returns the URIs of :func:`tasks.text2sql.analysis.complexity_report` plus ``"features"``.
    Every corpus runs to its end even when another fails, then
    :class:`tasks.core.runs.StageFailed` names each failed one (by corpus name)."""
    root = artifacts_root or Settings.from_env().artifacts
    specs = [CorpusSpec.model_validate(c).model_dump() for c in corpora]
    if not specs:
        raise ValueError("no corpora given")
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate corpus names {names}")
    futures = corpus_features.map(unmapped(run_id), unmapped(root), specs)
    uris = gather(futures, names, run_id, "sql-complexity")
    return {**complexity_report(run_id, root, uris), "features": uris}


@flow(name="text2sql-generation", task_runner=EnvTaskRunner())
def text2sql_generation(
    run_id: str,
    generators: list[str],
    descriptions_path: str,
    query_ids: list[str] | None = None,
    config: dict | None = None,
    batch_size: int = 10,
    artifacts_root: str | None = None,
) -> dict:
    """Generate SQL for TPC-DS queries with every generator (``oracle``, ``openai:<model>``,
    ``replay:<path>``), mapped over (generator × query) batches; validate by ``EXPLAIN`` on the
    TPC-DS schema in PostgreSQL with up to ``config.max_retries`` retries; write
    ``generations.parquet`` and the paper's tables. ``query_ids`` default: all 99. A re-run with
    the same ``run_id`` and inputs skips finished batches (a changed ``config``, description or
    replay source generates again); every batch runs to its end even when another fails, then
    :class:`tasks.core.runs.StageFailed` names each failed one. Returns ``{"generations": uri,
    ...}`` (see :func:`tasks.text2sql.analysis.analyse_generations`)."""
    root = artifacts_root or Settings.from_env().artifacts
    cfg = GenerationConfig.model_validate(config or {}).model_dump(mode="json")
    gold_ids = list(tpcds_gold_queries())
    batches = plan_generation_batches(
        generators, query_ids or gold_ids, batch_size, gold_ids, cfg, descriptions_path
    )
    prepare_tpcds_postgres()  # the schema exists before the batches run concurrently
    futures = run_generation_batch.map(
        unmapped(run_id), unmapped(root), batches, unmapped(descriptions_path), unmapped(cfg)
    )
    uris = gather(futures, [b["key"] for b in batches], run_id, "generation")
    generations = combine_generations(run_id, root, uris)
    return {"generations": generations, **analyse_generations(run_id, root, generations)}


@flow(name="spider-execution-accuracy")
def spider_ex(
    run_id: str,
    predictions_path: str,
    gold_path: str,
    spider_dir: str,
    db_dir: str | None = None,
    artifacts_root: str | None = None,
) -> dict:
    """Execution accuracy of a Spider predictions file (see
    :func:`tasks.text2sql.spider_ex.spider_execution_accuracy`)."""
    root = artifacts_root or Settings.from_env().artifacts
    return spider_execution_accuracy(run_id, root, predictions_path, gold_path, spider_dir, db_dir)
