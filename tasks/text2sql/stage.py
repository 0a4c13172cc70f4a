"""Text-to-SQL generation on TPC-DS as mapped Prefect batches: plan (generator × query) batches,
generate and validate one batch, combine the batches into ``generations.parquet``.

Source: Ma, Pu & Zhu (2024), "Evaluating LLMs for Text-to-SQL Generation With Complex SQL
Workload" (arXiv:2407.19517). The rest of the suite lives in sibling modules:
:mod:`tasks.text2sql.validation` (the TPC-DS schema in PostgreSQL, ``EXPLAIN`` validation),
:mod:`tasks.text2sql.generators` (prompt, SQL extraction, generators, the retry loop),
:mod:`tasks.text2sql.analysis` (corpus features, the complexity study, the paper's tables),
:mod:`tasks.text2sql.plots` (histograms, radar charts) and :mod:`tasks.text2sql.spider_ex`
(Spider execution accuracy as a task).

Flows pass artifact URIs and small manifests; the PostgreSQL DSN is never a task parameter (it
may hold a password): tasks rebuild it from :class:`schemas.settings.Settings`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import ExitStack

import polars as pl
from prefect import task

from schemas import text2sql as schema
from schemas.settings import Settings
from schemas.text2sql import GenerationConfig
from tasks.agents.registry import spec_label
from tasks.core import storage
from tasks.core.batching import BatchedStage, check_specs, combine, plan
from tasks.text2sql.corpora import load_tpcds_corpus, tpcds_ddl
from tasks.core.layout import RunLayout
from tasks.text2sql.generators import (
    GeneratorConfigError,
    build_prompt,
    check_generator_spec,
    generate_with_validation,
    make_generator,
)
from tasks.text2sql.validation import PostgresValidator, tpcds_validator_dsn


# --------------------------------------------------------------------------------------------
# Generation tasks (mapped by the flow)
# --------------------------------------------------------------------------------------------


def stage_prefix(artifacts_root: str, run_id: str, stage: str) -> str:
    """``<root>/runs/<run_id>/<stage>``."""
    return RunLayout(artifacts_root, run_id).path(stage)


def plan_generation_batches(
    generators: list[str],
    query_ids: list[str],
    batch_size: int = 10,
    known_query_ids: Iterable[str] | None = None,
    config: GenerationConfig | dict | None = None,
    descriptions_path: str | None = None,
) -> list[dict]:
    """(generator × query) work in batches of at most ``batch_size`` queries.

    Returns JSON-able dicts ``{"key", "generator", "query_ids"}``. A key digests the
    generator (and a replay source's content), the batch's queries (business question and
    parameters from ``descriptions_path`` — none when None — and gold SQL) and the full
    ``config`` (:class:`GenerationConfig`; the default when None): a re-run with the same
    inputs finds its finished batches, one with any of them changed generates again
    (:func:`tasks.core.runs.batch_key`). Raises ValueError for no generators/queries, a duplicate
    generator or query, a query id not in ``known_query_ids`` (when given), or
    ``batch_size < 1``; :class:`GeneratorConfigError` for a bad generator spec, CorpusError
    for a bad descriptions file."""
    if not generators:
        raise ValueError("no generators given")
    if not query_ids:
        raise ValueError("no queries given")
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    query_ids = [str(q) for q in query_ids]
    if len(set(query_ids)) != len(query_ids):
        raise ValueError(f"duplicate query ids in {query_ids}")
    if known_query_ids is not None:
        known = {str(q) for q in known_query_ids}
        unknown = [q for q in query_ids if q not in known]
        if unknown:
            raise ValueError(f"unknown query ids {unknown}")
    cfg, fingerprints = check_specs(generators, check_generator_spec, spec_label,
                                    "generators", GeneratorConfigError,
                                    "cannot read the replay source", GenerationConfig, config)
    corpus = load_tpcds_corpus(descriptions_path).by_id()

    def item(qid: str) -> list:  # what the prompt is built from, and the oracle's answer
        q = corpus.get(qid)
        return [qid] if q is None else [qid, q.description, list(q.params), q.sql]

    batches = []
    for gen in generators:
        for key, chunk in plan(spec_label(gen), query_ids, batch_size,
                               lambda c: [gen, fingerprints[gen], [item(q) for q in c], cfg]):
            batches.append({"key": key, "generator": gen, "query_ids": chunk})
    return batches


#: The generation stage's batches: ``text2sql/batches/<key>.parquet`` of
#: :data:`schemas.text2sql.GENERATIONS` rows, per-query checkpoints ``<key>.parts/``.
GENERATION_BATCHES = BatchedStage("text2sql", (("", schema.GENERATIONS),))


@task(name="text2sql-generate-batch", persist_result=False)
def run_generation_batch(
    run_id: str,
    artifacts_root: str,
    batch: dict,
    descriptions_path: str,
    config: dict | None = None,
) -> str:
    """Generate and validate SQL for one batch (one generator × some TPC-DS queries).

    Writes ``text2sql/batches/<key>.parquet`` (:data:`schemas.text2sql.GENERATIONS` rows) and
    returns its URI; a batch already written is skipped, and the queries an interrupted
    attempt finished (checkpointed one by one) are not generated again. Raises
    :class:`GeneratorConfigError` for a bad generator, CorpusError for a bad descriptions file,
    ``psycopg.Error`` when PostgreSQL is unreachable."""

    def start(stack: ExitStack) -> tuple[list[str], Callable[[str], dict[str, list[dict]]]]:
        cfg = GenerationConfig.model_validate(config or {})
        settings = Settings.from_env()
        corpus = load_tpcds_corpus(descriptions_path).by_id()
        unknown = [q for q in batch["query_ids"] if q not in corpus]
        if unknown:
            raise ValueError(f"unknown TPC-DS query ids {unknown}; expected 1..99")
        ddl = tpcds_ddl()
        generator = make_generator(batch["generator"], settings, cfg, artifacts_root)
        stack.callback(generator.close)
        validator = stack.enter_context(PostgresValidator(  # as the read-only agent role
            tpcds_validator_dsn(settings), cfg.statement_timeout_ms))  # (the SQL is the model's)

        def generate(qid: str) -> dict[str, list[dict]]:
            prompt = build_prompt(corpus[qid], ddl)
            return {"": [
                {"run_id": run_id, "model": generator.label, "query_id": qid, **r}
                for r in generate_with_validation(
                    generator, qid, prompt, validator.validate, cfg.max_retries)
            ]}

        return batch["query_ids"], generate

    return GENERATION_BATCHES.run_batch(artifacts_root, run_id, batch["key"], start)


@task(name="text2sql-combine", persist_result=False)
def combine_generations(run_id: str, artifacts_root: str, batch_uris: list[str]) -> str:
    """Concatenate batch files into ``text2sql/generations.parquet`` (sorted by model, query
    number, attempt; written row group by row group, :func:`tasks.core.batching.combine`);
    returns its URI."""
    uri = storage.join(stage_prefix(artifacts_root, run_id, "text2sql"), "generations.parquet")
    order = ["model", pl.col("query_id").cast(pl.Int64, strict=False), "attempt"]
    return combine(batch_uris, schema.GENERATIONS, order, uri)


__all__ = [
    "GENERATION_BATCHES",
    "combine_generations",
    "plan_generation_batches",
    "run_generation_batch",
    "stage_prefix",
]
