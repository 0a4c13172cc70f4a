"""Pydantic models of a dataset spec (``data/<name>.yaml``).

A spec says where the real data comes from (``sources``), which canonical, unperturbed tables are
extracted from it (``tables``, DuckDB SQL over the sources), how those tables are perturbed and
placed into databases (``databases``, ``placements``), and the questions asked of the result
(``queries``: question, ground truth as DuckDB SQL over the *canonical* tables, a validator and a
reference solution). See ``docs/datasets.md`` for a walk-through.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Engine = Literal["postgres", "mongodb", "sqlite", "duckdb"]
ColumnType = Literal["int64", "float64", "string", "bool", "date", "list[string]"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceSpec(_Strict):
    """One input file. ``path`` is relative to the installed ``package`` when given, else to the
    flow's ``source_dir`` (default: the spec's directory). ``sqlite`` sources need ``table``."""

    path: str
    package: str | None = None
    format: Literal["csv", "sqlite", "parquet", "json"]
    table: str | None = None


class TableSpec(_Strict):
    """A canonical (unperturbed) table: DuckDB SQL over the sources, with its declared columns."""

    sql: str
    columns: dict[str, ColumnType]


class DatabaseSpec(_Strict):
    """A logical database an agent sees (``list_db``), placed on one engine."""

    engine: Engine
    description: str = ""


class FormatOp(_Strict):
    """Write ``template`` (a Python format string over the row's columns) into ``column``, then
    drop ``drop``. Used to reformat join keys per database (``123`` → ``bid_123``)."""

    op: Literal["format"]
    column: str
    template: str
    drop: list[str] = Field(default_factory=list)


class TextOp(_Strict):
    """Write one of ``templates`` (picked per row by the seeded RNG) into the text ``column``, then
    drop ``drop``: the dropped values now live only inside free text."""

    op: Literal["text"]
    column: str
    templates: list[str] = Field(min_length=1)
    drop: list[str] = Field(default_factory=list)


class SplitOp(_Strict):
    """Split ``column`` on ``sep`` into a list column (e.g. a cast string into a cast array)."""

    op: Literal["split"]
    column: str
    sep: str = ", "


class PlacementSpec(_Strict):
    """One perturbed table (or Mongo collection) placed into ``database`` as ``name``."""

    database: str
    name: str
    source: str
    columns: list[str]
    where: str | None = None
    order_by: list[str] = Field(default_factory=list)
    transforms: list[FormatOp | TextOp | SplitOp] = Field(default_factory=list)
    rename: dict[str, str] = Field(default_factory=dict)


class GroundTruthSpec(_Strict):
    """DuckDB SQL over the canonical tables. ``number`` validators read row 0, column 0;
    ``items`` validators read every value of column 0."""

    sql: str


class ValidatorSpec(_Strict):
    """DAB-style answer check.

    - ``number``: some number in the answer is within ``tolerance`` (default half a unit of the
      ``decimals``-th place) of the ground truth.
    - ``items``: every expected item appears in the answer (case- and whitespace-insensitive).
    """

    kind: Literal["number", "items"]
    decimals: int = 2
    tolerance: float | None = None


class StepSpec(_Strict):
    """One tool call of a reference solution (``query_db`` / ``list_db`` / ``execute_python``).

    The oracle numbers its calls ``call_1``, ``call_2``, ...; ``execute_python`` code reads earlier
    results as ``var_call_<i>`` (DAB's ``var_<call_id>`` convention) and prints the answer; the
    oracle returns the stdout of its last step."""

    tool: Literal["list_db", "query_db", "execute_python"]
    args: dict[str, Any]


#: Operations a query can require of a trajectory (``requires.operations``):
#: ``join_reformatted_key`` — join on keys written differently per database;
#: ``extract_from_text`` — read a structured value out of free text;
#: ``use_adjusted_close`` — use split/dividend-adjusted prices, not raw closes;
#: ``domain_knowledge`` — apply a domain definition not stated in the data (e.g. "Fresh" ≥ 60).
OPERATIONS = ("join_reformatted_key", "extract_from_text", "use_adjusted_close", "domain_knowledge")


class RequiresSpec(_Strict):
    """What a correct trajectory needs: ``sources`` as ``"<database>.<table>"`` (tables or
    collections, at least one) and ``operations`` from :data:`OPERATIONS`. Used by the
    failure-mode classifier (FM3 wrong data source, FM4 wrong implementation)."""

    sources: list[str] = Field(min_length=1)
    operations: list[str] = Field(default_factory=list)


class QuerySpec(_Strict):
    """A benchmark question with its ground truth, validator, reference solution and the
    sources/operations it requires."""

    id: str
    question: str
    requires: RequiresSpec
    ground_truth: GroundTruthSpec
    validator: ValidatorSpec
    reference: list[StepSpec] = Field(min_length=1)


class DatasetSpec(_Strict):
    """A whole dataset spec; ``version`` is bumped when the built data changes meaning."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    version: str
    description: str
    hints: str = ""
    seed: int = 0
    sources: dict[str, SourceSpec]
    tables: dict[str, TableSpec]
    databases: dict[str, DatabaseSpec]
    placements: list[PlacementSpec] = Field(min_length=1)
    queries: list[QuerySpec] = Field(min_length=1)
