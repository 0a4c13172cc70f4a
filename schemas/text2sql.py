"""Text-to-SQL on complex workloads: pydantic models of the flows' options and the pyarrow schemas
of the artifacts they write (each with ``schema_version`` metadata, checked on read by
:func:`schemas.artifacts.check_schema`).

Artifacts (run-scoped, under ``<root>/runs/<run_id>/``):

- ``complexity/features/<corpus>.parquet`` — :data:`SQL_FEATURES`, one row per gold query;
- ``complexity/complexity.parquet`` — :data:`COMPLEXITY`, per corpus × numeric feature;
- ``text2sql/generations.parquet`` — :data:`GENERATIONS`, one row per generation attempt;
- ``text2sql/features.parquet`` — :data:`SQL_FEATURES` of the TPC-DS gold queries
  (``corpus = "gold"``) and of each model's final valid query (``corpus = <model>``);
- ``text2sql/success.parquet`` — :data:`TEXT2SQL_SUCCESS`, per model;
- ``text2sql/normalised_means.parquet`` — :data:`TEXT2SQL_MEANS`, per model × numeric feature;
- ``text2sql/jaccard.parquet`` — :data:`TEXT2SQL_JACCARD`, per model × bag feature;
- ``spider/execution_accuracy.parquet`` — :data:`SPIDER_EX`, one row per Spider query.

Feature definitions: :mod:`tasks.text2sql.sql_features`.
"""

from __future__ import annotations

from typing import Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.artifacts import artifact_schema
from schemas.models import AgentOptions

SCHEMA_VERSION = "1"

#: Bag-valued features, in the order the tables show them.
BAG_FEATURES = (
    "relations",
    "columns",
    "where_predicates",
    "constants",
    "functions",
    "aggregations",
    "join_pairs",
    "window_functions",
)
#: Numeric features (counts per query).
NUMERIC_FEATURES = (
    "cte_count",
    "subquery_count",
    "join_count",
    "predicate_count",
    "column_count",
    "relation_count",
    "function_count",
    "aggregation_count",
    "window_function_count",
    "join_pair_count",
    "constant_count",
)


def _schema(name: str, fields: list[pa.Field]) -> pa.Schema:
    return artifact_schema(name, fields, SCHEMA_VERSION)


#: Features of one query. ``corpus``: corpus name (``tpcds``, ``spider``, ``bird``...) or, in a
#: generation run, ``gold`` / the model label; ``error``: why features are missing (the SQL does
#: not parse, is not one query...), null otherwise; counts null when ``error`` is set.
SQL_FEATURES = _schema(
    "sql_features",
    [
        pa.field("corpus", pa.string(), nullable=False),
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("db_id", pa.string()),
        pa.field("dialect", pa.string(), nullable=False),
        pa.field("sql", pa.string()),
        pa.field("error", pa.string()),
        *[pa.field(n, pa.int32()) for n in NUMERIC_FEATURES],
        *[pa.field(n, pa.list_(pa.string())) for n in BAG_FEATURES],
    ],
)

#: Complexity per corpus × numeric feature over the corpus's parsed queries (``n``):
#: ``mean``, ``median``, ``p90``, ``max``; ``tpcds_mean`` the TPC-DS gold mean of the feature
#: and ``normalised`` = mean / tpcds_mean (null without TPC-DS or when its mean is 0).
COMPLEXITY = _schema(
    "complexity",
    [
        pa.field("corpus", pa.string(), nullable=False),
        pa.field("feature", pa.string(), nullable=False),
        pa.field("n", pa.int32(), nullable=False),
        pa.field("mean", pa.float64()),
        pa.field("median", pa.float64()),
        pa.field("p90", pa.float64()),
        pa.field("max", pa.float64()),
        pa.field("tpcds_mean", pa.float64()),
        pa.field("normalised", pa.float64()),
    ],
)

#: One row per generation attempt. ``model``: the generator label (``openai:<model>``,
#: ``replay:<name>``, ``oracle``); ``attempt`` 0 is the first try, attempt k > 0 the k-th retry
#: (after PostgreSQL's error was sent back); ``valid``: the SQL passed ``EXPLAIN`` on the TPC-DS
#: schema; ``error``: PostgreSQL's message (or why no SQL was produced; ``api_error: ...`` for an
#: API failure after the shared retries of :mod:`tasks.core.llm`); ``final``: the last attempt of its
#: (model, query); tokens as reported by the API (0 offline; on a response-cache hit as first
#: reported); ``cost_usd`` what the call cost, from the models-table prices (0 on a cache hit or
#: a failed call; null when the model is not in the models table, i.e. unpriced; 0 for offline
#: generators); ``latency_s`` the model call in seconds, retry waits included.
GENERATIONS = _schema(
    "generations",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("attempt", pa.int32(), nullable=False),
        pa.field("sql", pa.string()),
        pa.field("valid", pa.bool_(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("final", pa.bool_(), nullable=False),
        pa.field("response", pa.string()),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("completion_tokens", pa.int64(), nullable=False),
        pa.field("cost_usd", pa.float64()),
        pa.field("latency_s", pa.float64(), nullable=False),
    ],
)

#: Successful queries per model (the paper's first table): ``n_queries`` attempted,
#: ``n_success`` whose final SQL is valid (out of ``n_queries``), of which ``n_first_attempt``
#: valid at once and ``n_after_retry`` after at least one retry; ``mean_attempts`` per query;
#: token totals and ``cost_usd`` total (null when any attempt has no price).
TEXT2SQL_SUCCESS = _schema(
    "text2sql_success",
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("n_queries", pa.int32(), nullable=False),
        pa.field("n_success", pa.int32(), nullable=False),
        pa.field("n_first_attempt", pa.int32(), nullable=False),
        pa.field("n_after_retry", pa.int32(), nullable=False),
        pa.field("mean_attempts", pa.float64(), nullable=False),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("completion_tokens", pa.int64(), nullable=False),
        pa.field("cost_usd", pa.float64()),
    ],
)

#: Mean feature count per model over its ``n`` valid queries whose features could be read,
#: the TPC-DS gold mean over the 99 gold queries, and ``normalised`` = mean / gold_mean (the
#: paper's normalised means; model ``gold`` has 1.0).
TEXT2SQL_MEANS = _schema(
    "text2sql_normalised_means",
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("feature", pa.string(), nullable=False),
        pa.field("n", pa.int32(), nullable=False),
        pa.field("mean", pa.float64()),
        pa.field("gold_mean", pa.float64()),
        pa.field("normalised", pa.float64()),
    ],
)

#: Mean Jaccard similarity per model × bag feature between each valid generated query and the
#: gold query of the same TPC-DS number, over ``n`` queries; ``feature = "average"`` is the mean
#: of the model's per-feature means.
TEXT2SQL_JACCARD = _schema(
    "text2sql_jaccard",
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("feature", pa.string(), nullable=False),
        pa.field("n", pa.int32(), nullable=False),
        pa.field("jaccard", pa.float64()),
    ],
)

#: Spider execution accuracy per query (see :func:`tasks.text2sql.spider.score_execution_accuracy`).
SPIDER_EX = _schema(
    "spider_execution_accuracy",
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("db_id", pa.string(), nullable=False),
        pa.field("gold_sql", pa.string(), nullable=False),
        pa.field("pred_sql", pa.string()),
        pa.field("ordered", pa.bool_(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("ex", pa.bool_()),
        pa.field("error", pa.string()),
    ],
)

ALL = {
    s.metadata[b"artifact"].decode(): s
    for s in (
        SQL_FEATURES,
        COMPLEXITY,
        GENERATIONS,
        TEXT2SQL_SUCCESS,
        TEXT2SQL_MEANS,
        TEXT2SQL_JACCARD,
        SPIDER_EX,
    )
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CorpusSpec(_Strict):
    """A corpus for the complexity flow.

    ``name``: label in tables and plots (``tpcds`` without ``path`` means the 99 TPC-DS gold
    queries from ``duckdb-ext-tpcds``); ``path``: a ``SQL<TAB>db_id`` file; ``dialect``: sqlglot
    dialect (default by name: spider → mysql, bird → sqlite, else sqlite); ``tables_json``:
    optional Spider-format schemas for column attribution.
    """

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    path: str | None = None
    dialect: str | None = None
    tables_json: str | None = None

    @model_validator(mode="after")
    def _path_needed(self) -> CorpusSpec:
        if self.path is None and self.name != "tpcds":
            raise ValueError(
                f"corpus {self.name!r} needs a path to a SQL<TAB>db_id file (only 'tpcds' is built in)"
            )
        return self


#: Where per-stage prices went (raised for a config that still carries ``prices``).
PRICES_MOVED = (
    "prices are no longer a per-stage option: a model's USD prices come from the models table "
    "(data/models.yaml, or your own file in QUERYLAB_MODELS; see `querylab models`); a model "
    "in no file runs with cost recorded as unknown"
)


class GenerationConfig(_Strict):
    """Options of the TPC-DS generation flow.

    - ``max_retries``: regenerations after an invalid query (the paper: 3), so at most
      ``1 + max_retries`` attempts per (model, query);
    - ``temperature``, ``max_tokens``: sampling parameters of ``openai:`` models
      (``max_tokens`` is sent as ``max_completion_tokens``);
    - ``request_timeout_s``: per HTTP attempt; ``api_retries``: extra attempts of one model call
      after an infrastructure error (HTTP 408/429/5xx, timeouts, connection errors) with
      exponential backoff honouring ``Retry-After`` (the shared loop of :mod:`tasks.core.llm`);
    - ``cache``: the shared response cache under ``<artifacts>/cache/llm`` — ``on`` (read and
      write), ``refresh`` (write only), ``off``; each attempt's conversation differs (it carries
      the previous errors), so a retry never gets a cached answer of an earlier attempt;
    - ``statement_timeout_ms``: limit of one ``EXPLAIN`` on PostgreSQL.

    Prices come from the models table (:func:`tasks.core.llm.resolve_model`), not from here.
    """

    max_retries: int = Field(default=3, ge=0, le=10)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, gt=0)
    request_timeout_s: float = Field(default=120.0, gt=0)
    api_retries: int = Field(default=2, ge=0, le=10)
    cache: Literal["on", "off", "refresh"] = "on"
    statement_timeout_ms: int = Field(default=10_000, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _no_prices(cls, data):
        if isinstance(data, dict) and "prices" in data:
            raise ValueError(PRICES_MOVED)
        return data

    def agent_options(self) -> AgentOptions:
        """These options as the shared model-call options of :class:`tasks.core.llm.ChatModel`."""
        return AgentOptions(
            max_retries=self.api_retries,
            request_timeout_s=self.request_timeout_s,
            temperature=self.temperature,
            max_completion_tokens=self.max_tokens,
            cache=self.cache,
        )

