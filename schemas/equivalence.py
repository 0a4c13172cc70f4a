"""SQL equivalence: pydantic models of the pairs input and run options, and the pyarrow schemas
of the artifacts the equivalence flow writes.

Input (one JSON object per line of a pairs file, see ``data/equivalence/*.jsonl``)::

    {"id": "count_bug", "sql1": "...", "sql2": "...", "dialect": "duckdb",
     "schema": "CREATE TABLE ...; CREATE TABLE ...",            # DDL, or the mapping form:
     "schema": {"emp": {"columns": {"id": "INTEGER", "dept_id": "INTEGER NOT NULL"},
                        "primary_key": ["id"],
                        "foreign_keys": [{"columns": ["dept_id"], "references": "dept",
                                          "ref_columns": ["id"]}],
                        "unique": [["name"]], "not_null": ["name"]}},
     "schema_dialect": "mysql",                                   # optional: the DDL's own dialect
     "db": "path/to/db.sqlite",                                   # optional, or a name under db_root
     "label": "not_equivalent",                                   # optional, or {"semantic": .., "relaxed": ..}
     "hardness": "hard"}                                          # optional (e.g. Spider's levels)

Notions: **semantic** equivalence (no database instance allowed by the schema makes the two
queries return different results) and **relaxed** equivalence (the queries express the same logic
up to trivial edits a user would not care about). Source: Zhao et al., "LLM-SQL-Solver: Can LLMs
Determine SQL Equivalence?" (2023/2024).
"""

from __future__ import annotations

from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.artifacts import artifact_schema
from schemas.models import AgentOptions

SCHEMA_VERSION = "2"

Notion = Literal["semantic", "relaxed"]
Technique = Literal["counter_example", "miniature_mull", "explain_compare"]
TECHNIQUES: tuple[str, ...] = ("counter_example", "miniature_mull", "explain_compare")
NOTIONS: tuple[str, ...] = ("semantic", "relaxed")

#: Every verdict a method can return.
#: - ``equivalent`` / ``not_equivalent``: a decision (execution match, or an LLM judge);
#: - ``no_counterexample_within_budget``: the counterexample finder searched its whole budget
#:   without separating the queries (never read as "equivalent");
#: - ``nondeterministic``: the counterexample finder found no counterexample, but on some
#:   databases the two queries' results differed only as an arbitrary choice their SQL leaves
#:   to the engine explains (ties under ORDER BY, LIMIT over ties, STRING_AGG without ORDER
#:   BY, ...; the reason is in ``explanation`` / ``details.choices``). Never a counterexample,
#:   never read as "equivalent";
#: - ``error_on_instance``: on some database exactly one of the two queries raised a runtime
#:   error (a conversion error, a scalar subquery with two rows, ...) and no database separated
#:   their results. An error is not a result, so this is never a counterexample;
#: - ``unparsed``: a judge's reply held no recognisable verdict;
#: - ``skipped``: the method cannot run on this pair (e.g. execution match without a database);
#: - ``error``: a query failed to parse/run, or the model API failed (message in ``error``).
VERDICTS: tuple[str, ...] = (
    "equivalent", "not_equivalent", "no_counterexample_within_budget", "nondeterministic",
    "error_on_instance", "unparsed", "skipped", "error",
)
DECIDED: tuple[str, ...] = ("equivalent", "not_equivalent")

_LABEL_WORDS = {
    "equivalent": True, "eq": True, "true": True, "yes": True, "1": True, "same": True,
    "not_equivalent": False, "not equivalent": False, "non_equivalent": False,
    "nonequivalent": False, "neq": False, "false": False, "no": False, "0": False,
    "different": False, "inequivalent": False, "unequivalent": False, "not_eq": False,
}


def parse_label(value: Any) -> bool | None:
    """``True`` (equivalent) / ``False`` (not equivalent) / ``None`` (no label) from a label
    written as a bool, 0/1, or a word (``equivalent``, ``not_equivalent``, ``inequivalent``,
    ``yes``, ``no``, ...).

    Raises ValueError for anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        if key in _LABEL_WORDS:
            return _LABEL_WORDS[key]
        if key.replace("_", " ") in _LABEL_WORDS:
            return _LABEL_WORDS[key.replace("_", " ")]
    raise ValueError(
        f"label {value!r}: use equivalent / not_equivalent (or true/false), optionally as "
        '{"semantic": ..., "relaxed": ...}'
    )


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ForeignKeySpec(_Strict):
    """``columns`` of this table reference ``ref_columns`` of table ``references`` (default:
    that table's primary key)."""

    columns: list[str]
    references: str
    ref_columns: list[str] | None = None


class TableSpec(_Strict):
    """The mapping form of one table: ``columns`` maps a column name to its SQL type, which may
    carry column constraints (``"INTEGER NOT NULL"``, ``"TEXT UNIQUE"``, ``"INT PRIMARY KEY"``,
    ``"INT REFERENCES dept(id)"``); a list of names means untyped (TEXT) columns.
    ``primary_key`` / ``unique`` / ``not_null`` / ``foreign_keys`` add table constraints."""

    columns: dict[str, str] | list[str]
    primary_key: list[str] = Field(default_factory=list)
    unique: list[list[str]] = Field(default_factory=list)
    not_null: list[str] = Field(default_factory=list)
    foreign_keys: list[ForeignKeySpec] = Field(default_factory=list)


class QueryPair(_Strict):
    """One pair of queries to judge (one line of a pairs JSONL file).

    - ``schema``: DDL text (one or more ``CREATE TABLE``; PRIMARY KEY, UNIQUE, NOT NULL and
      FOREIGN KEY honoured) or the mapping form ``{table: TableSpec}``; optional when ``db``
      names a SQLite/DuckDB file (the schema is then read from it).
    - ``dialect``: sqlglot dialect of both queries and of the DDL (``duckdb``, ``sqlite``,
      ``postgres``, ``mysql``, ..., or ``ansi`` / ``calcite`` for rewrite-engine SQL); default
      ``duckdb``.
    - ``schema_dialect``: the DDL's dialect when it differs (default: ``dialect``, then what
      the DDL's text points to, e.g. backticks → MySQL; such a reading is noted in the row).
    - ``db``: a database for execution match: a SQLite/DuckDB file path, a
      ``postgresql://`` URL, or a name resolved under the run's ``db_root``.
    - ``label``: ground truth, one value for both notions or ``{"semantic", "relaxed"}``.
    - ``hardness``: a difficulty level (e.g. Spider's easy/medium/hard/extra) for the tables.
    """

    id: str
    sql1: str
    sql2: str
    schema_: str | dict[str, TableSpec] | None = Field(default=None, alias="schema")
    dialect: str = "duckdb"
    schema_dialect: str | None = None
    db: str | None = None
    label: bool | str | int | dict[str, Any] | None = None
    hardness: str | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("id", "sql1", "sql2")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v or not v.strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("dialect", "schema_dialect")
    @classmethod
    def _known_dialect(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from tasks.equivalence.sql_dialects import SQLReadError, sqlglot_dialect

        try:
            sqlglot_dialect(v)
        except SQLReadError as exc:
            raise ValueError(str(exc)) from None
        return v.lower()

    @field_validator("label")
    @classmethod
    def _check_label(cls, v: Any) -> Any:
        if isinstance(v, dict):
            unknown = set(v) - set(NOTIONS)
            if unknown:
                raise ValueError(f"label keys {sorted(unknown)}; allowed: {list(NOTIONS)}")
            for x in v.values():
                parse_label(x)
        else:
            parse_label(v)
        return v

    def label_for(self, notion: str) -> bool | None:
        """The label for ``notion`` (``semantic``/``relaxed``): True = equivalent, None = none.

        A single label is a semantic label; it also stands for relaxed equivalence when it says
        *equivalent* (semantically equivalent queries are relaxed-equivalent too), but not when
        it says *not equivalent* (the difference may be trivial)."""
        if isinstance(self.label, dict):
            return parse_label(self.label.get(notion))
        value = parse_label(self.label)
        if notion == "relaxed" and value is False:
            return None
        return value


class MatchOptions(_Strict):
    """How two results are compared (test-suite semantics, see :mod:`tasks.scoring.result_match`):
    ``bag`` (duplicates count) or set; ``order``: ``auto`` = row order matters only when both
    queries have a top-level ORDER BY (for a given database: when either has one), ``always``,
    ``never``; ``permute_columns``: a column order that makes the results equal is searched."""

    bag: bool = True
    order: Literal["auto", "always", "never"] = "auto"
    permute_columns: bool = True


class FinderBudget(_Strict):
    """Budget of the counterexample finder: at most ``max_instances`` database instances
    executed, at most ``time_limit_s`` seconds of search (each query gets at most the time
    left, and ``query_timeout_s`` seconds; shrinking a candidate found late may take a quarter
    of the limit more; a run that hit the limit says so), random instances of at most ``max_rows`` rows
    per table, and at most ``row_budget`` rows in one table for the instances the queries'
    predicates ask for (a ``HAVING COUNT(*) > 10`` wants a group of 11 rows, a ``LIMIT 5
    OFFSET 2`` eight rows; a wish above the budget is noted, not met); random choices seeded
    with ``seed`` (same inputs + seed → same instances in the same order)."""

    max_instances: int = Field(default=1000, ge=1)
    time_limit_s: float = Field(default=10.0, gt=0)
    max_rows: int = Field(default=4, ge=1, le=50)
    row_budget: int = Field(default=64, ge=1, le=10_000)
    seed: int = 0
    query_timeout_s: float = Field(default=5.0, gt=0)


class JudgeOptions(_Strict):
    """LLM judge call settings: temperature 0 (zero-shot, deterministic decoding),
    ``max_tokens`` for the reply (sent as ``max_completion_tokens``), HTTP ``timeout_s`` per
    attempt, ``api_retries`` extra attempts after an infrastructure error (408/429/5xx,
    timeouts, connection errors; backoff honouring ``Retry-After``), ``cache`` the shared
    response cache (``on`` / ``refresh`` / ``off``). Prices come from the models table
    (``data/models.yaml`` / ``QUERYLAB_MODELS``), not from here."""

    temperature: float = Field(default=0.0, ge=0, le=2)
    max_tokens: int = Field(default=2048, ge=1)
    timeout_s: float = Field(default=120.0, gt=0)
    api_retries: int = Field(default=2, ge=0, le=10)
    cache: Literal["on", "off", "refresh"] = "on"

    @model_validator(mode="before")
    @classmethod
    def _no_prices(cls, data):
        if isinstance(data, dict) and "prices" in data:
            raise ValueError(
                "judge prices are no longer an option: a model's USD prices come from the "
                "models table (data/models.yaml, or your own file in QUERYLAB_MODELS; see "
                "`querylab models`); a model in no file is recorded with cost 0, unpriced"
            )
        return data

    def agent_options(self) -> AgentOptions:
        """These options as the shared model-call options of :class:`tasks.core.llm.ChatModel`."""
        return AgentOptions(
            max_retries=self.api_retries, request_timeout_s=self.timeout_s,
            temperature=self.temperature, max_completion_tokens=self.max_tokens,
            cache=self.cache,
        )


class EquivalenceOptions(_Strict):
    """Options of one equivalence run (passed to every batch)."""

    match: MatchOptions = Field(default_factory=MatchOptions)
    budget: FinderBudget = Field(default_factory=FinderBudget)
    judge: JudgeOptions = Field(default_factory=JudgeOptions)
    db_root: str | None = None
    exec_timeout_s: float = Field(default=30.0, gt=0)


# --------------------------------------------------------------------------------------------
# Artifacts
# --------------------------------------------------------------------------------------------


def _schema(name: str, fields: list[pa.Field]) -> pa.Schema:
    return artifact_schema(name, fields, SCHEMA_VERSION)


#: One row per (pair, method) of a run: ``runs/<run_id>/equivalence/equivalence.parquet``.
#:
#: - ``method``: ``exec_match``, ``finder`` or ``judge:<technique>:<notion>:<model>``;
#:   ``technique``/``model`` null for the first two; ``notion``: the notion the method decides
#:   (``semantic`` for execution match and the finder).
#: - ``verdict``: one of :data:`VERDICTS`; ``label``: ground truth for ``notion`` (null when
#:   unknown); ``correct``: verdict == label, null when undecided or unlabelled;
#:   ``label_semantic`` / ``label_relaxed``: the pair's labels under both notions (so that a
#:   pair labelled only under the other notion still counts in the label-agreement table).
#: - ``counterexample``: a database as CREATE TABLE + INSERT statements (the finder's minimal
#:   instance, or what the judge proposed); ``counterexample_rows``: its number of rows;
#:   ``verified``: the counterexample was executed and separates the two queries (True), was
#:   executed and does not (False), or there was none to check (null). For execution match,
#:   ``verified`` is True when the given database itself separates the queries.
#: - ``explanation``: the judge's reasoning, or a one-line account of what separated the
#:   queries; ``response``: the judge's raw reply; ``details``: JSON with method-specific facts
#:   (results previews, the engine, budget spent, shrink steps).
#: - ``instances_tried``: database instances the finder executed (its budget spent);
#:   tokens as reported by the API; ``cost_usd`` from the models-table prices (0 for a model in
#:   no models file, a response-cache hit or a failed call; judge ``details`` carry ``priced``,
#:   ``cache_hit`` and HTTP ``attempts``); ``seconds`` wall time of the method on the pair.
EQUIVALENCE = _schema(
    "equivalence",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
        pa.field("technique", pa.string()),
        pa.field("notion", pa.string(), nullable=False),
        pa.field("model", pa.string()),
        pa.field("verdict", pa.string(), nullable=False),
        pa.field("label", pa.bool_()),
        pa.field("label_semantic", pa.bool_()),
        pa.field("label_relaxed", pa.bool_()),
        pa.field("correct", pa.bool_()),
        pa.field("hardness", pa.string()),
        pa.field("counterexample", pa.string()),
        pa.field("counterexample_rows", pa.int32()),
        pa.field("verified", pa.bool_()),
        pa.field("verify_error", pa.string()),
        pa.field("explanation", pa.string()),
        pa.field("response", pa.string()),
        pa.field("details", pa.string()),
        pa.field("instances_tried", pa.int64()),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("completion_tokens", pa.int64(), nullable=False),
        pa.field("cost_usd", pa.float64(), nullable=False),
        pa.field("seconds", pa.float64(), nullable=False),
        pa.field("error", pa.string()),
    ],
)

#: Accuracy per (method, hardness): ``n`` labelled pairs, ``correct``, ``decided`` (verdict
#: equivalent/not_equivalent), ``accuracy`` = correct / n (undecided verdicts count as wrong).
#: ``hardness`` is ``all`` for the row over every level.
EQUIVALENCE_ACCURACY = _schema(
    "equivalence_accuracy",
    [
        pa.field("method", pa.string(), nullable=False),
        pa.field("notion", pa.string(), nullable=False),
        pa.field("hardness", pa.string(), nullable=False),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("correct", pa.int64(), nullable=False),
        pa.field("decided", pa.int64(), nullable=False),
        pa.field("accuracy", pa.float64()),
    ],
)

#: Agreement of each method with execution match, over pairs both decided: ``n``, ``agree``,
#: ``agreement`` (rate), and the four cells of the 2×2 table (``exec_eq_method_eq``, ...).
EQUIVALENCE_AGREEMENT = _schema(
    "equivalence_agreement",
    [
        pa.field("method", pa.string(), nullable=False),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("agree", pa.int64(), nullable=False),
        pa.field("agreement", pa.float64()),
        pa.field("exec_eq_method_eq", pa.int64(), nullable=False),
        pa.field("exec_eq_method_neq", pa.int64(), nullable=False),
        pa.field("exec_neq_method_eq", pa.int64(), nullable=False),
        pa.field("exec_neq_method_neq", pa.int64(), nullable=False),
    ],
)

#: Agreement of each method's decisions with the labels of each notion (``label_notion``),
#: over the pairs the method decided (equivalent / not_equivalent) that carry a label of that
#: notion: ``n``, ``agree``, ``agreement`` and the 2×2 cells. Unlike the accuracy table it
#: also compares a method with labels of the *other* notion (a semantic method against
#: relaxed-only labels), which is all some published pair sets provide.
EQUIVALENCE_LABEL_AGREEMENT = _schema(
    "equivalence_label_agreement",
    [
        pa.field("method", pa.string(), nullable=False),
        pa.field("notion", pa.string(), nullable=False),
        pa.field("label_notion", pa.string(), nullable=False),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("agree", pa.int64(), nullable=False),
        pa.field("agreement", pa.float64()),
        pa.field("label_eq_method_eq", pa.int64(), nullable=False),
        pa.field("label_eq_method_neq", pa.int64(), nullable=False),
        pa.field("label_neq_method_eq", pa.int64(), nullable=False),
        pa.field("label_neq_method_neq", pa.int64(), nullable=False),
    ],
)

#: Counterexamples on the non-equivalent set (pairs labelled not semantically equivalent, or
#: every pair when none is labelled): ``n_pairs``, ``flagged`` (verdict not_equivalent),
#: ``with_counterexample`` (a counterexample database was given), ``verified`` (it was executed
#: and separates the queries), ``found_rate`` = verified / n_pairs.
EQUIVALENCE_COUNTEREXAMPLES = _schema(
    "equivalence_counterexamples",
    [
        pa.field("method", pa.string(), nullable=False),
        pa.field("pair_set", pa.string(), nullable=False),
        pa.field("n_pairs", pa.int64(), nullable=False),
        pa.field("flagged", pa.int64(), nullable=False),
        pa.field("with_counterexample", pa.int64(), nullable=False),
        pa.field("verified", pa.int64(), nullable=False),
        pa.field("found_rate", pa.float64()),
    ],
)

#: Per pair the finder separated: the size of the instance that separated it
#: (``found_rows``, rows over all tables before shrinking), how that instance was made
#: (``found_by``: ``random``, ``large`` or ``guided: <predicate> → <n> rows in <table>``),
#: ``rows`` of the minimal counterexample and ``found_at`` (instances tried before it).
EQUIVALENCE_FINDER_SIZES = _schema(
    "equivalence_finder_sizes",
    [
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
        pa.field("found_rows", pa.int64()),
        pa.field("found_by", pa.string()),
        pa.field("rows", pa.int64()),
        pa.field("found_at", pa.int64()),
    ],
)

#: Time and cost per pair for each method (seconds of wall time; tokens; USD).
EQUIVALENCE_TIME = _schema(
    "equivalence_time",
    [
        pa.field("method", pa.string(), nullable=False),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("mean_s", pa.float64()),
        pa.field("median_s", pa.float64()),
        pa.field("max_s", pa.float64()),
        pa.field("total_s", pa.float64()),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("completion_tokens", pa.int64(), nullable=False),
        pa.field("cost_usd", pa.float64(), nullable=False),
    ],
)

ALL = {
    s.metadata[b"artifact"].decode(): s
    for s in (EQUIVALENCE, EQUIVALENCE_ACCURACY, EQUIVALENCE_AGREEMENT,
              EQUIVALENCE_LABEL_AGREEMENT, EQUIVALENCE_COUNTEREXAMPLES,
              EQUIVALENCE_FINDER_SIZES, EQUIVALENCE_TIME)
}
