"""Database-lifecycle suite (DBLifeBench): pydantic models of its options and scenario catalogue,
and the pyarrow schemas of the artifacts it writes (each with ``schema_version`` metadata,
checked on read by :func:`schemas.artifacts.check_schema`).

Artifacts (run-scoped, under ``<root>/runs/<run_id>/lifecycle/``):

- ``databases.json`` — where the SQLite databases and schema variants were built;
- ``items/<phase>.parquet`` — :data:`ITEMS`, the generated items of one phase;
  ``items/manifest.json`` — per phase: items generated, items dropped and why;
- ``batches/<key>.results.parquet`` / ``batches/<key>.calls.parquet`` — one (model × phase ×
  items) batch (a finished batch is skipped on re-run);
- ``results/<phase>.parquet`` — :data:`RESULTS`, one row per (model, item);
- ``calls/<phase>.parquet`` — :data:`CALLS`, one row per model call;
- ``tables/*.parquet`` — the paper's tables (:data:`MAIN_TABLE`, :data:`ROBUSTNESS`,
  :data:`VARIANT_CV`, :data:`EX_VS_GEX`, :data:`DESIGN_BY_K`, :data:`DEBUG_BY_KIND`) and
  ``report.md``.
"""

from __future__ import annotations

from typing import Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.artifacts import artifact_schema
from schemas.models import AgentOptions

SCHEMA_VERSION = "1"

#: The suite's phases in report order, and the paper's phase each belongs to.
PHASES = (
    "design",
    "implementation",
    "text2sql",
    "progressive",
    "dml",
    "debug",
    "assigner",
    "expert",
)
PAPER_PHASE = {
    "design": "P1 Design",
    "implementation": "P2 Implementation",
    "text2sql": "P3 Operation",
    "progressive": "P3 Operation",
    "dml": "P3 Operation",
    "debug": "P4 Debugging",
    "assigner": "P5 Maintenance",
    "expert": "P5 Maintenance",
}
#: Schema variants of the Text2SQL databases (see :mod:`tasks.lifecycle.variants`).
SCHEMA_VARIANTS = ("original", "snake_case", "camel_case", "prefixed")
#: Per-item metric columns of :data:`RESULTS` (null when the metric does not apply).
RESULT_METRICS = (
    "acc_entity",
    "acc_data",
    "acc_key",
    "t_level",
    "f_level",
    "ddl_executes",
    "ex",
    "g_ex",
    "final_ex",
    "state_match",
    "ex_single",
    "ex_multi",
    "assigner_accuracy",
    "assigner_jaccard",
    "tool_call_correctness",
    "tool_precision",
    "tool_recall",
)
#: The metrics of each phase, in table order (the first is the phase's headline metric).
PHASE_METRICS = {
    "design": ("acc_entity", "acc_data", "acc_key"),
    "implementation": ("t_level", "f_level", "ddl_executes"),
    "text2sql": ("ex",),
    "progressive": ("g_ex", "final_ex"),
    "dml": ("state_match",),
    "debug": ("ex_single", "ex_multi"),
    "assigner": ("assigner_accuracy", "assigner_jaccard"),
    "expert": ("tool_call_correctness", "tool_precision", "tool_recall"),
}


def _schema(name: str, fields: list[pa.Field]) -> pa.Schema:
    return artifact_schema(name, fields, SCHEMA_VERSION)


#: One generated item. ``base_id`` groups the items of one question/graph/scenario (across
#: schema variants and perturbation levels); ``variant`` the schema variant (``original`` unless
#: text2sql); ``level`` the perturbation level (progressive; 0 otherwise); ``seed`` the seed the
#: item was generated with; ``prompt`` the main user turn; ``reference`` the ground truth and
#: ``context`` what the run needs besides the prompt (both JSON text). The rewrite columns
#: (:data:`ITEM_REWRITE_COLUMNS`, :mod:`tasks.lifecycle.rewrite`) are null unless the optional
#: LLM rewrite stage ran on a design/implementation item: ``requirements_template`` the templated
#: requirements text, ``rewritten_by`` the model whose paraphrase the prompt holds (null when the
#: template was kept), ``rewrite_error`` why the template was kept, the call's tokens and
#: ``rewrite_cost_usd`` (USD; null when the model has no price).
ITEMS = _schema(
    "lifecycle_items",
    [
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("phase", pa.string(), nullable=False),
        pa.field("base_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("db_id", pa.string(), nullable=False),
        pa.field("variant", pa.string(), nullable=False),
        pa.field("level", pa.int32(), nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("reference", pa.string(), nullable=False),
        pa.field("context", pa.string(), nullable=False),
        pa.field("requirements_template", pa.string()),
        pa.field("rewritten_by", pa.string()),
        pa.field("rewrite_error", pa.string()),
        pa.field("rewrite_prompt_tokens", pa.int64()),
        pa.field("rewrite_completion_tokens", pa.int64()),
        pa.field("rewrite_cost_usd", pa.float64()),
    ],
)
#: The optional columns of :data:`ITEMS` (absent from items written before the rewrite stage
#: existed; read as nulls).
ITEM_REWRITE_COLUMNS = (
    "requirements_template",
    "rewritten_by",
    "rewrite_error",
    "rewrite_prompt_tokens",
    "rewrite_completion_tokens",
    "rewrite_cost_usd",
)

#: One row per (model, item): the final ``answer`` (SQL, JSON or text), ``error`` (why the item
#: failed: unreadable answer, SQL error, API error...), ``n_calls`` model calls, ``rounds``
#: (debugging rounds, graph nodes, expert turns; 1 otherwise), token totals, ``cost_usd`` (null
#: when a call had no price; 0 offline), ``latency_s`` summed over calls, one column per
#: :data:`RESULT_METRICS` (null when not applicable) and ``details`` (JSON: per-node EX,
#: per-round errors, tool calls...).
RESULTS = _schema(
    "lifecycle_results",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("phase", pa.string(), nullable=False),
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("base_id", pa.string(), nullable=False),
        pa.field("db_id", pa.string(), nullable=False),
        pa.field("variant", pa.string(), nullable=False),
        pa.field("level", pa.int32(), nullable=False),
        pa.field("answer", pa.string()),
        pa.field("error", pa.string()),
        pa.field("n_calls", pa.int32(), nullable=False),
        pa.field("rounds", pa.int32(), nullable=False),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("completion_tokens", pa.int64(), nullable=False),
        pa.field("cost_usd", pa.float64()),
        pa.field("latency_s", pa.float64(), nullable=False),
        *[pa.field(m, pa.float64()) for m in RESULT_METRICS],
        pa.field("details", pa.string()),
    ],
)

#: One row per model call: ``step`` is the call's index within its item (debugging round,
#: graph node, expert turn); ``response`` the reply text, ``tool_calls`` the calls it asked for
#: and ``tool_results`` what the tools answered (JSON lists); ``error`` an API error.
CALLS = _schema(
    "lifecycle_calls",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("phase", pa.string(), nullable=False),
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("response", pa.string()),
        pa.field("tool_calls", pa.string()),
        pa.field("tool_results", pa.string()),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("completion_tokens", pa.int64(), nullable=False),
        pa.field("cost_usd", pa.float64()),
        pa.field("latency_s", pa.float64(), nullable=False),
        pa.field("error", pa.string()),
    ],
)

#: The main results table, long form: mean of each phase metric per model over ``n`` items
#: (P3 text2sql on the original schemas only, progressive at perturbation level 0 only);
#: ``cost_usd`` of all the phase's items (every variant and level; null when unpriced).
MAIN_TABLE = _schema(
    "lifecycle_main",
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("paper_phase", pa.string(), nullable=False),
        pa.field("phase", pa.string(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("n", pa.int32(), nullable=False),
        pa.field("value", pa.float64()),
        pa.field("cost_usd", pa.float64()),
    ],
)

#: Robustness by perturbation level, over the graphs that have every level: G-EX and the EX of
#: the graph's final node.
ROBUSTNESS = _schema(
    "lifecycle_robustness",
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("level", pa.int32(), nullable=False),
        pa.field("n_graphs", pa.int32(), nullable=False),
        pa.field("g_ex", pa.float64()),
        pa.field("final_ex", pa.float64()),
    ],
)

#: EX per schema variant over the questions every variant has, and per model the mean, the
#: population standard deviation and the coefficient of variation (std / mean) across variants.
VARIANT_CV = _schema(
    "lifecycle_variant_cv",
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("variant", pa.string(), nullable=False),
        pa.field("n", pa.int32(), nullable=False),
        pa.field("ex", pa.float64()),
        pa.field("mean_ex", pa.float64()),
        pa.field("std_ex", pa.float64()),
        pa.field("cv", pa.float64()),
    ],
)

#: EX of plain Text2SQL vs Progressive-Text2SQL on the same questions (original schema, level 0).
EX_VS_GEX = _schema(
    "lifecycle_ex_vs_gex",
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("n", pa.int32(), nullable=False),
        pa.field("ex", pa.float64()),
        pa.field("final_ex", pa.float64()),
        pa.field("g_ex", pa.float64()),
    ],
)

#: Design accuracy by the number of tables asked for.
DESIGN_BY_K = _schema(
    "lifecycle_design_by_k",
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("k", pa.int32(), nullable=False),
        pa.field("n", pa.int32(), nullable=False),
        pa.field("acc_entity", pa.float64()),
        pa.field("acc_data", pa.float64()),
        pa.field("acc_key", pa.float64()),
    ],
)

#: Debugging EX by mutation kind.
DEBUG_BY_KIND = _schema(
    "lifecycle_debug_by_kind",
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("n", pa.int32(), nullable=False),
        pa.field("ex_single", pa.float64()),
        pa.field("ex_multi", pa.float64()),
    ],
)

ALL = {
    s.metadata[b"artifact"].decode(): s
    for s in (
        ITEMS,
        RESULTS,
        CALLS,
        MAIN_TABLE,
        ROBUSTNESS,
        VARIANT_CV,
        EX_VS_GEX,
        DESIGN_BY_K,
        DEBUG_BY_KIND,
    )
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LifecycleConfig(_Strict):
    """Options of a lifecycle run (every field has a default; JSON-able).

    Items: ``seed`` (every draw of item generation and perturbation), ``max_items`` per phase
    (counted in base items — a question with all its schema variants, a graph with all its
    levels; None: all), ``spider_db_ids`` (None: every Spider dev database given),
    ``include_chinook``, ``design_table_counts`` (tables per design item, 1–5; the paper's
    default is 2), ``design_groups_per_db`` (table groups per database and count),
    ``dml_per_db``, ``variants`` (schema variants; must include ``original``),
    ``graph_levels`` (perturbation levels 0–5), ``maintenance_scenarios``.

    Running: ``debug_rounds`` (attempts in multi-round debugging; round 1 is the single-round
    score), ``expert_max_turns`` (model calls of an Expert), ``batch_size`` (items per mapped
    task), ``timeout_ms`` (per SQL execution), ``temperature``/``max_tokens`` (sent as
    ``max_completion_tokens``), ``request_timeout_s`` (per HTTP attempt), ``api_retries`` (extra
    attempts of a model call after HTTP 408/429/5xx, timeouts or connection errors, backoff
    honouring ``Retry-After``) and ``cache`` (the shared response cache: ``on``, ``refresh``,
    ``off``) — the model-call options of :class:`tasks.core.llm.ChatModel`. Prices come from the
    models table (``data/models.yaml`` / ``QUERYLAB_MODELS``); a model in no file gets a null
    cost.
    """

    seed: int = 0
    max_items: int | None = Field(default=50, ge=1)
    spider_db_ids: list[str] | None = None
    include_chinook: bool = True
    design_table_counts: list[int] = Field(default_factory=lambda: [1, 2, 3, 4, 5])
    design_groups_per_db: int = Field(default=1, ge=1, le=20)
    dml_per_db: int = Field(default=2, ge=1, le=20)
    variants: list[str] = Field(
        default_factory=lambda: ["original", "snake_case", "camel_case", "prefixed"]
    )
    graph_levels: list[int] = Field(default_factory=lambda: [0, 1, 2, 3, 4, 5])
    maintenance_scenarios: int = Field(default=14, ge=1, le=1000)
    debug_rounds: int = Field(default=3, ge=1, le=10)
    expert_max_turns: int = Field(default=6, ge=1, le=30)
    batch_size: int = Field(default=20, ge=1)
    timeout_ms: int = Field(default=10_000, gt=0)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, gt=0)
    request_timeout_s: float = Field(default=120.0, gt=0)
    api_retries: int = Field(default=2, ge=0, le=10)
    cache: Literal["on", "off", "refresh"] = "on"

    @model_validator(mode="before")
    @classmethod
    def _no_prices(cls, data):
        if isinstance(data, dict) and "prices" in data:
            raise ValueError(
                "prices are no longer a lifecycle option: a model's USD prices come from the "
                "models table (data/models.yaml, or your own file in QUERYLAB_MODELS; see "
                "`querylab models`); a model in no file gets a null cost"
            )
        return data

    def agent_options(self) -> AgentOptions:
        """The model-call options of :class:`tasks.core.llm.ChatModel` for ``openai:`` agents."""
        return AgentOptions(
            max_retries=self.api_retries,
            request_timeout_s=self.request_timeout_s,
            temperature=self.temperature,
            max_completion_tokens=self.max_tokens,
            cache=self.cache,
        )

    @field_validator("design_table_counts")
    @classmethod
    def _counts(cls, v: list[int]) -> list[int]:
        if not v or any(k < 1 or k > 5 for k in v):
            raise ValueError("design_table_counts must be numbers from 1 to 5")
        return sorted(set(v))

    @field_validator("graph_levels")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if not v or any(k < 0 or k > 5 for k in v):
            raise ValueError("graph_levels must be numbers from 0 to 5")
        return sorted(set(v))

    @model_validator(mode="after")
    def _variants(self) -> LifecycleConfig:
        unknown = [v for v in self.variants if v not in SCHEMA_VARIANTS]
        if unknown:
            raise ValueError(f"unknown schema variants {unknown}; known: {list(SCHEMA_VARIANTS)}")
        if "original" not in self.variants:
            raise ValueError("variants must include 'original'")
        self.variants = [v for v in SCHEMA_VARIANTS if v in self.variants]
        return self


class MetricSpec(_Strict):
    """A monitored metric: ``unit``, normal ``baseline`` and standard deviation ``sd``."""

    unit: str
    baseline: float
    sd: float = Field(gt=0)
    description: str


class ExpertSpec(_Strict):
    """A diagnosis expert: what the Assigner is told and its expected diagnostic checks."""

    description: str
    checks: list[str] = Field(min_length=1)


class RootCauseSpec(_Strict):
    """An injectable root cause: the right ``experts``, metric ``effects`` (shift in standard
    deviations), configuration change ``events`` and the ``alert`` symptoms."""

    description: str
    experts: list[str] = Field(min_length=1)
    effects: dict[str, float] = Field(min_length=1)
    events: list[dict[str, str]] = Field(default_factory=list)
    alert: list[str] = Field(min_length=1)


class MaintenanceCatalogue(_Strict):
    """``data/lifecycle/maintenance.yaml``: metrics, experts and root causes (cross-checked)."""

    series_minutes: int = Field(ge=90, le=1440)
    start_time: str
    abnormal_z: float = Field(gt=0)
    metrics: dict[str, MetricSpec]
    experts: dict[str, ExpertSpec]
    root_causes: dict[str, RootCauseSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _cross(self) -> MaintenanceCatalogue:
        tools = {"get_slow_queries", "get_configuration_changes"}
        for name, e in self.experts.items():
            for c in e.checks:
                kind, _, target = c.partition(":")
                if kind == "metric" and target not in self.metrics:
                    raise ValueError(f"expert {name}: unknown metric in check {c!r}")
                if kind == "tool" and target not in tools:
                    raise ValueError(f"expert {name}: unknown tool in check {c!r}")
                if kind not in ("metric", "tool"):
                    raise ValueError(
                        f"expert {name}: check {c!r} must be metric:<name> or tool:<name>"
                    )
        for name, rc in self.root_causes.items():
            bad = [e for e in rc.experts if e not in self.experts]
            if bad:
                raise ValueError(f"root cause {name}: unknown experts {bad}")
            bad = [m for m in rc.effects if m not in self.metrics]
            if bad:
                raise ValueError(f"root cause {name}: unknown metrics {bad}")
        return self
