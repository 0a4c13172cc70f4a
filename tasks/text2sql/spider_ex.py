"""Spider execution accuracy (EX) as a Prefect task: build the Spider databases, score a
predictions file against the gold file with :mod:`tasks.text2sql.spider` and write
``runs/<run_id>/spider/execution_accuracy.parquet``."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from schemas import text2sql as schema
from schemas.settings import Settings
from tasks.core import storage
from tasks.text2sql.corpora import load_corpus
from tasks.text2sql.stage import stage_prefix


# --------------------------------------------------------------------------------------------
# Spider execution accuracy as a task
# --------------------------------------------------------------------------------------------


@task(name="spider-execution-accuracy", persist_result=False)
def spider_execution_accuracy(
    run_id: str,
    artifacts_root: str,
    predictions_path: str,
    gold_path: str,
    spider_dir: str,
    db_dir: str | None = None,
    timeout_ms: int = 30_000,
) -> dict:
    """Build the Spider databases (``db_dir``, default ``<QUERYLAB_HOME>/spider``; up-to-date
    files reused), score ``predictions_path`` against ``gold_path`` (``SQL<TAB>db_id``) and write
    ``spider/execution_accuracy.parquet``. Returns the summary of
    :func:`tasks.text2sql.spider.execution_accuracy_summary` plus ``"scores"`` (URI)."""
    from tasks.text2sql.spider import (
        build_spider_databases,
        execution_accuracy_summary,
        load_predictions,
        score_execution_accuracy,
    )

    out_dir = Path(db_dir) if db_dir else Settings.from_env().home / "spider"
    paths = build_spider_databases(spider_dir, out_dir)
    gold = load_corpus(gold_path)
    scores = score_execution_accuracy(load_predictions(predictions_path), gold, paths, timeout_ms)
    uri = storage.write_parquet(
        storage.join(stage_prefix(artifacts_root, run_id, "spider"), "execution_accuracy.parquet"),
        scores.to_arrow(),
        schema.SPIDER_EX,
    )
    return {**execution_accuracy_summary(scores), "scores": uri}


__all__ = ["spider_execution_accuracy"]
