"""Run records: what a run was configured with and how far each of its stages got.

Two kinds of JSON artifact, both under ``<artifacts>/runs/<run_id>/``:

- ``run.json`` (:class:`RunRecord`): the run's configuration — the end-to-end benchmark's
  datasets, agents, trials and batch size (:class:`BenchmarkConfig`), the dataset manifests the
  datasets stage produced, and the parameters of the stand-alone stages (generation,
  equivalence, lifecycle). Any stage can be re-run from the run id alone.
- ``stages/<stage>.json`` (:class:`StageStatus`): one stage's latest attempt — ``running``,
  ``completed`` or ``failed`` — with its error, outputs (URIs) and the earlier attempts. A stage
  left ``running`` by a killed process is re-run like a failed one.

Neither ever holds a credential: parameters are names, paths and options, never keys.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: Bump when a field changes meaning; readers reject other major versions.
RUN_RECORD_VERSION = "1"

#: Every stage, in the order the DAG runs them (the benchmark runs datasets → trials → score →
#: report; generation, equivalence and lifecycle are stand-alone suites keyed by the same run
#: id).
STAGES: tuple[str, ...] = (
    "datasets", "trials", "score", "generation", "equivalence", "lifecycle", "report"
)

#: Stages the end-to-end benchmark runs.
BENCHMARK_STAGES: tuple[str, ...] = ("datasets", "trials", "score", "report")

#: Stand-alone stages and their required parameters (the others are optional).
STANDALONE_REQUIRED: dict[str, tuple[str, ...]] = {
    "generation": ("generators", "descriptions_path"),
    "equivalence": ("pairs_path",),
    "lifecycle": ("models", "spider_dir", "questions_path"),
}

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` when it is a safe artifact path component (letters, digits, ``_``, ``.``
    and ``-``, starting with a letter or digit, at most 128 characters); else ValueError naming
    it."""
    if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id) or ".." in run_id:
        raise ValueError(
            f"bad run id {run_id!r}: use letters, digits, '_', '.' and '-' (at most 128, "
            "starting with a letter or digit)"
        )
    return run_id


class AgentPlan(BaseModel):
    """What one agent of a run runs when it differs from the run's defaults: ``datasets`` (a
    subset of the run's; None: all) and ``n_trials`` (trials per query; None: the run's)."""

    model_config = ConfigDict(extra="forbid")

    datasets: list[str] | None = Field(default=None, min_length=1)
    n_trials: int | None = Field(default=None, ge=1)


class BenchmarkConfig(BaseModel):
    """The end-to-end run's configuration (what ``querylab run`` was given, datasets resolved).

    ``datasets``: dataset names in build order; ``agents``: ``oracle``, ``openai:<model>``
    (``openai:<model>@<base url>``), ``local:<model>``, ``replay:<file>``; ``n_trials``: trials per (agent,
    query); ``batch_size``: trials per mapped task; ``agent_options``:
    :class:`schemas.models.AgentOptions` fields; ``hints``: the hint conditions (``off``:
    question and database description only, DAB's default; ``on``: the dataset's hints too,
    DAB's ``--use_hints``), each run for every agent that reads a prompt — two conditions
    compare both in one run; ``query_ids`` (``<id>`` or ``<dataset>/<id>``; empty: all) and
    ``limit`` (the first N queries of each dataset; None: all) select a subset;
    ``max_error_share``: the share of errored trials each agent may have and the run still succeed
    (default 0: any errored trial fails the run); ``agent_plans``: per-agent datasets and
    trial counts (:class:`AgentPlan`) for agents of ``agents``; ``score_no_tool_call``: on
    datasets imported in DAB's format, score the text of a ``no_tool_call`` ending instead
    of DAB's rule (invalid); ``max_concurrency``: trials in flight at once across the trials
    stage (batches run their trials concurrently; batch size only sets checkpoint and Parquet
    granularity); ``agent_defaults``: agent → its model's own default options from the models
    table when the run was recorded (``agent_defaults`` of the entry; the explicit
    ``agent_options`` override them), so a rerun plans the same trials."""

    datasets: list[str] = Field(min_length=1)
    agents: list[str] = Field(default_factory=lambda: ["oracle"], min_length=1)
    n_trials: int = Field(default=5, ge=1)
    batch_size: int = Field(default=25, ge=1)
    agent_options: dict[str, Any] = Field(default_factory=dict)
    hints: list[Literal["on", "off"]] = Field(default_factory=lambda: ["off"], min_length=1)
    query_ids: list[str] = Field(default_factory=list)
    limit: int | None = Field(default=None, ge=1)
    max_error_share: float = Field(default=0.0, ge=0.0, le=1.0)
    agent_plans: dict[str, AgentPlan] = Field(default_factory=dict)
    score_no_tool_call: bool = False
    max_concurrency: int = Field(default=32, ge=1)
    agent_defaults: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("hints")
    @classmethod
    def _distinct_hints(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _plans_match(self) -> BenchmarkConfig:
        for agent, plan in self.agent_plans.items():
            if agent not in self.agents:
                raise ValueError(f"agent_plans names {agent!r}, which is not one of the agents")
            unknown = [d for d in plan.datasets or [] if d not in self.datasets]
            if unknown:
                raise ValueError(f"agent_plans[{agent!r}] names datasets {unknown} that the run "
                                 f"does not build (it builds {self.datasets})")
        return self


class RunRecord(BaseModel):
    """``runs/<run_id>/run.json``. Times are ISO 8601 UTC strings."""

    schema_version: str = RUN_RECORD_VERSION
    run_id: str
    created_at: str
    updated_at: str
    benchmark: BenchmarkConfig | None = None
    manifests: list[str] = Field(default_factory=list)
    #: dataset name → the condition its trials ran under (hints, effective agent options,
    #: scoring rules; :func:`tasks.scoring.dab_rules.dataset_condition`), recorded by the datasets stage
    conditions: dict[str, dict[str, Any]] = Field(default_factory=dict)
    stages: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, v: str) -> str:
        return check_run_id(v)

    @field_validator("stages")
    @classmethod
    def _stage_names(cls, v: dict) -> dict:
        unknown = sorted(set(v) - set(STANDALONE_REQUIRED))
        if unknown:
            raise ValueError(f"parameters recorded for unknown stand-alone stages {unknown}")
        return v


class StageAttempt(BaseModel):
    """One earlier attempt of a stage."""

    attempt: int
    status: Literal["running", "completed", "failed"]
    started_at: str
    finished_at: str | None = None
    error: str | None = None


class StageStatus(BaseModel):
    """``runs/<run_id>/stages/<stage>.json``: the latest attempt of one stage, plus history.

    ``outputs``: what the stage returned (artifact URIs and small summaries);
    ``flow_run_id``: the Prefect flow run of the attempt when there was one."""

    schema_version: str = RUN_RECORD_VERSION
    run_id: str
    stage: str
    status: Literal["running", "completed", "failed"]
    attempt: int = Field(ge=1)
    started_at: str
    finished_at: str | None = None
    error: str | None = None
    outputs: dict[str, Any] = Field(default_factory=dict)
    flow_run_id: str | None = None
    history: list[StageAttempt] = Field(default_factory=list)

    @field_validator("stage")
    @classmethod
    def _stage(cls, v: str) -> str:
        if v not in STAGES:
            raise ValueError(f"unknown stage {v!r}; stages are {list(STAGES)}")
        return v
