"""What each tool call of a trajectory (``tool_calls.parquet``) did: the per-call features the
tool-use table and the failure-mode rules read, computed once when the tool calls are written
(:func:`with_call_features`) or, for an older artifact, at report time.

A trajectory is the ordered tool calls of one trial (``schemas.artifacts.TOOL_CALLS``):
``tool``, ``arguments`` (the raw JSON text the agent sent: ``db`` and ``query`` for
``query_db``, ``db`` for ``list_db``, ``code`` for ``execute_python``), ``success``, ``turn``
(the model response that asked for the call; several calls share a turn when issued in
parallel).

Per-call detection rules (regular expressions over the call's query or code, SQL keywords
case-insensitive; a ``query`` whose text starts with ``{`` is a MongoDB query; string literals
are not parsed out, so a keyword written inside a SQL string literal also counts):

Exploratory call (``explore``) — DAB's "exploration" calls:
  - ``list_db`` (any arguments);
  - SQL ``SELECT * ... LIMIT`` (row sampling);
  - SQL on the catalog: ``information_schema``, ``sqlite_master`` / ``sqlite_schema``,
    ``PRAGMA`` / ``pragma_*()``, ``pg_catalog`` / ``pg_tables``, ``duckdb_tables()`` and
    friends, ``SHOW`` / ``DESCRIBE``;
  - MongoDB ``find`` without a filter (no ``find`` key or ``"find": {}``), or an ``aggregate``
    whose only stage is ``$limit`` / ``$sample``.
Extraction method (how a trajectory read values out of free text):
  - ``sql_pattern``: a pattern match inside the query — SQL ``LIKE`` / ``ILIKE`` /
    ``SIMILAR TO`` / ``GLOB`` / ``regexp_*`` / ``RLIKE`` / PostgreSQL ``~``; MongoDB
    ``$regex`` / ``$regexMatch`` / ``$regexFind`` / ``$text`` / ``$indexOfCP``;
  - ``python_regex``: ``re.search/match/fullmatch/findall/finditer/sub/split/compile(`` or
    pandas/Polars ``.str.extract/contains/match/findall/count_matches(`` in Python code;
  - ``python_string``: a string literal tested with ``in`` (``"Horror" in r["synopsis"]``) or
    ``.find/.rfind/.index/.startswith/.endswith/.partition(`` in Python code;
  - ``model_call``: Python code that calls a model (``openai``, ``chat.completions``,
    ``anthropic``, ``ollama``, ``litellm``, ``transformers``, ``/v1/chat/completions``).
Key reformatting (``key_reformat``, evidence for joining keys written differently per
database): Python string surgery (``.split/.replace/.strip/.removeprefix/.zfill/.format(``,
slicing ``[2:]``, ``int(`` / ``str(``, ``re.sub(``, f-strings, ``.str.replace/slice/...(``),
SQL string functions (``split_part``, ``substr``/``substring``, ``replace``,
``regexp_replace``/``regexp_extract``, ``lpad``, ``trim``, ``left``/``right``, ``concat``,
``||``, ``CAST``/``::int``, ``lower``/``upper``, ``format``/``printf``) and MongoDB
``$substr*`` / ``$split`` / ``$toInt`` / ``$toString`` / ``$concat`` / ``$replaceAll`` /
``$convert`` / ``$trim`` / ``$toLower`` / ``$toUpper``.
Adjusted prices (``adj_close``): ``adj_close``, ``adjclose``, ``adjusted close``,
``adj close`` anywhere in the call's query or code.

Everything is vectorised Polars string expressions; no Python loop runs over calls.
"""

from __future__ import annotations

import logging

import polars as pl

DB_TOOLS = ("list_db", "query_db")
DATA_TOOLS = ("list_db", "query_db", "execute_python")
EXTRACTION_METHODS = ("sql_pattern", "python_regex", "python_string", "model_call")


def ascii_regex(pattern: str) -> str:
    """``pattern`` with ASCII word boundaries: Unicode ``\\b`` makes Polars' regex engine fall
    back to a slow path (about 60× slower on millions of rows); SQL and code are ASCII where
    it matters."""
    return pattern.replace(r"\b", r"(?-u:\b)")


EXPLORE_SQL = (
    r"(?is)\bselect\s+\*\s+from\b.*\blimit\b"
    r"|\binformation_schema\b|\bsqlite_(?:master|schema|temp_master)\b|\bpragma\b|\bpragma_\w+"
    r"|\bpg_catalog\b|\bpg_(?:tables|class|attribute|namespace)\b"
    r"|\bduckdb_(?:tables|columns|views|schemas|databases|constraints)\b"
    r"|^\s*(?:show|describe|desc)\b"
)
EXPLORE_MONGO_EMPTY_FIND = r'"find"\s*:\s*\{\s*\}'
EXPLORE_MONGO_SAMPLE_ONLY = (
    r'"aggregate"\s*:\s*\[\s*\{\s*"\$(?:limit|sample)"\s*:\s*(?:\d+|\{[^{}]*\})\s*\}\s*\]'
)
SQL_PATTERN_SQL = r"(?i)\b(?:i?like|similar\s+to|glob|rlike|regexp\w*)\b|\s!?~\*?\s"
SQL_PATTERN_MONGO = r"\$(?:regex|regexMatch|regexFind|regexFindAll|text|indexOfCP)\b"
PYTHON_REGEX = (
    r"\bre\.(?:search|match|fullmatch|findall|finditer|sub|subn|split|compile)\s*\("
    r"|\.str\.(?:extract|extractall|extract_all|contains|match|findall|count_matches)\s*\("
    r"|\bregex\.\w+\s*\("
)
PYTHON_STRING = (
    r"""["'][^"'\n]+["']\s+(?:not\s+)?in\s+[\w\[]"""
    r"|\.(?:find|rfind|index|startswith|endswith|partition|rpartition)\s*\("
)
MODEL_CALL = (
    r"\bopenai\b|\bOpenAI\(|chat\.completions|\banthropic\b|\bAnthropic\(|\bollama\b"
    r"|\blitellm\b|\btransformers\b|/v1/chat/completions"
)
KEY_REFORMAT_PYTHON = (
    r"\.(?:split|rsplit|replace|removeprefix|removesuffix|lstrip|rstrip|strip|zfill|rjust|ljust"
    r"|format)\s*\(|\[\s*-?\d*\s*:\s*-?\d*\s*\]|\bint\s*\(|\bstr\s*\(|\bre\.sub\s*\("
    r"|\bf[\"'][^\"'\n]*\{"
    r"|\.str\.(?:replace|replace_all|slice|split|extract|strip_chars|strip|zfill|pad_start"
    r"|to_integer)\s*\("
)
KEY_REFORMAT_SQL = (
    r"(?i)\b(?:split_part|substr|substring|replace|regexp_replace|regexp_extract|regexp_substr"
    r"|lpad|rpad|ltrim|rtrim|trim|right|left|concat|concat_ws|printf|format|string_split"
    r"|str_split|split|lower|upper)\s*\(|\|\||::\s*(?:int|integer|bigint|text|varchar)\b"
    r"|\bcast\s*\("
)
KEY_REFORMAT_MONGO = (
    r"\$(?:substr|substrCP|substrBytes|split|toInt|toLong|toString|concat|replaceAll"
    r"|replaceOne|convert|trim|toLower|toUpper)\b"
)
ADJ_CLOSE = r"(?i)adj(?:usted)?[_ ]?close"


_DB_FIRST = r'^\{\s*"db"\s*:\s*"([^"\\]*)"'

#: One SQL ``FROM`` / ``JOIN`` clause with its comma-separated items (see
#: :mod:`tasks.report.failure_modes` for what counts as touching a source).
SQL_FROM = (
    r"(?i)\b(?:from|join)\s+[^\s,()]+(?:\s+(?:as\s+)?\w+)?"
    r"(?:\s*,\s*[^\s,()]+(?:\s+(?:as\s+)?\w+)?)*"
)
#: The table name of one ``FROM``/``JOIN`` item: keyword, schema qualifiers and quotes dropped.
SQL_NAME = r'^\s*(?:(?i:from|join)\s+)?(?:[^\s.]+\.)*["`]?([^\s."`]+)'
MONGO_SOURCE = r'"(?:collection|from)"\s*:\s*"[^"]+"'


def _split(lf: pl.LazyFrame) -> list[pl.LazyFrame]:
    """``lf`` in as many row-interleaved parts as Polars has threads, so that the per-row
    string work (JSON, regexes) of one tool's calls runs on every core (``collect_all``)."""
    n = max(1, min(8, pl.thread_pool_size()))
    if n == 1:
        return [lf]
    return [lf.filter(pl.int_range(pl.len()) % n == i) for i in range(n)]


def _fill_db(df: pl.DataFrame) -> pl.DataFrame:
    """Complete ``db`` = ``$.db`` of the arguments JSON. ``db`` was read with a regex where it
    is the object's first key and its value has no escapes (what agents and the oracle send;
    exact, and several times faster than parsing JSON); the other rows of ``list_db`` /
    ``query_db`` calls that mention ``"db"`` are parsed here."""
    args, db = df["arguments"], df["db"]
    missing = (db.is_null() & df["tool"].is_in(DB_TOOLS)).arg_true()
    if not missing.len():
        return df
    slow = missing.filter(args.gather(missing).str.contains('"db"', literal=True))
    if slow.len():
        db = db.scatter(slow, args.gather(slow).str.json_path_match("$.db"))
    return df.with_columns(db.alias("db"))


def _has(expr: pl.Expr, pattern: str) -> pl.Expr:
    return expr.str.contains(ascii_regex(pattern)).fill_null(False)


FEATURES = ("explore", *EXTRACTION_METHODS, "key_reformat", "adj_close")
#: Features the tool-use table needs (the failure-mode classifier needs the others).
TOOL_USE_FEATURES = ("explore", *EXTRACTION_METHODS)


def call_features(
    tool_calls: pl.DataFrame | pl.LazyFrame,
    features: tuple[str, ...] = FEATURES,
    with_db: bool = True,
    lazy: bool = False,
) -> pl.DataFrame | pl.LazyFrame:
    """Per-call parsed arguments and boolean features (see the module docstring for the rules).

    Input: ``TOOL_CALLS`` columns (at least trial_key, turn, tool, arguments, success). Output:
    those plus

    - ``db`` (only ``with_db``): ``$.db`` of ``list_db`` / ``query_db`` calls;
    - ``query``: ``$.query`` of ``query_db`` calls (a JSON object passed instead of a query
      string becomes its JSON text); ``code``: ``$.code`` of ``execute_python`` calls;
    - ``is_mongo``: the query text starts with ``{``; ``sql``: the query when it is SQL (null
      for Mongo queries);
    - one boolean column (never null) per name in ``features``, a subset of :data:`FEATURES`:
      ``explore``, ``sql_pattern``, ``python_regex``, ``python_string``, ``model_call``,
      ``key_reformat``, ``adj_close``.

    Malformed argument JSON gives nulls and false features, never an error. Each tool's rows are
    parsed and matched on their own (only the keys and patterns that apply to that tool; the
    branches run in parallel), so output rows are grouped by tool, not in input order. Raises
    ValueError for an unknown feature name.

    ``lazy``: return the plan as a LazyFrame instead (for a streaming collect over a scanned
    artifact: nothing is materialised but what the caller keeps; ``with_db`` must be False,
    since completing ``db`` needs the rows).
    """
    unknown = set(features) - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown features {sorted(unknown)}; known: {FEATURES}")
    if lazy and with_db:
        raise ValueError("call_features(lazy=True) needs with_db=False")
    split = (lambda lf: [lf]) if lazy else _split
    lf = tool_calls.lazy()
    args, tool = pl.col("arguments"), pl.col("tool")
    null, false = pl.lit(None, pl.String), pl.lit(False)
    query, sql, code, mongo = pl.col("query"), pl.col("sql"), pl.col("code"), pl.col("is_mongo")
    is_mongo = query.str.contains(r"^\s*\{").fill_null(False)
    db = [args.str.extract(_DB_FIRST, 1).alias("db")] if with_db else []
    unfiltered_find = (
        ~_has(query, r'"aggregate"\s*:')
        & (~_has(query, r'"find"\s*:') | _has(query, EXPLORE_MONGO_EMPTY_FIND))
    ) | _has(query, EXPLORE_MONGO_SAMPLE_ONLY)
    query_rules = {
        "explore": pl.when(mongo).then(unfiltered_find).otherwise(_has(sql, EXPLORE_SQL)),
        "sql_pattern": _has(sql, SQL_PATTERN_SQL) | _has(query, SQL_PATTERN_MONGO),
        "key_reformat": pl.when(mongo)
        .then(_has(query, KEY_REFORMAT_MONGO))
        .otherwise(_has(sql, KEY_REFORMAT_SQL)),
        "adj_close": _has(query, ADJ_CLOSE),
    }
    python_rules = {
        "python_regex": _has(code, PYTHON_REGEX),
        "python_string": _has(code, PYTHON_STRING),
        "model_call": _has(code, MODEL_CALL),
        "key_reformat": _has(code, KEY_REFORMAT_PYTHON),
        "adj_close": _has(code, ADJ_CLOSE),
    }
    other_rules = {"explore": tool == "list_db"}

    def flags(rules: dict[str, pl.Expr]) -> list[pl.Expr]:
        return [rules.get(f, false).alias(f) for f in features]

    queries = [
        part.with_columns(
            *db, args.str.json_path_match("$.query").alias("query"), null.alias("code")
        )
        .with_columns(is_mongo.alias("is_mongo"), pl.when(~is_mongo).then(query).alias("sql"))
        .with_columns(flags(query_rules))
        for part in split(lf.filter(tool == "query_db"))
    ]
    python = [
        part.with_columns(
            *([null.alias("db")] if with_db else []),
            null.alias("query"),
            args.str.json_path_match("$.code").alias("code"),
            false.alias("is_mongo"),
            null.alias("sql"),
        ).with_columns(flags(python_rules))
        for part in split(lf.filter(tool == "execute_python"))
    ]
    others = lf.filter(~tool.is_in(["query_db", "execute_python"])).with_columns(
        *([pl.when(tool == "list_db").then(db[0]).alias("db")] if with_db else []),
        null.alias("query"),
        null.alias("code"),
        false.alias("is_mongo"),
        null.alias("sql"),
        *flags(other_rules),
    )
    if lazy:
        cols = others.collect_schema().names()
        return pl.concat([p.select(cols) for p in (*queries, *python, others)],
                         how="vertical_relaxed")
    *parts, rest = pl.collect_all([*queries, *python, others])
    cols = rest.columns
    out = pl.concat([*(p.select(cols) for p in parts), rest], how="vertical_relaxed")
    return _fill_db(out) if with_db else out


def source_refs() -> pl.Expr:
    """Per call, the tables / collections a ``query_db`` call references (``List[String]``:
    SQL table names lower-cased, schema qualifiers and quotes dropped; MongoDB ``"collection"``
    and ``$lookup`` ``"from"``), empty for every other call and for a call without ``db``.
    Needs :func:`call_features` columns (tool, db, is_mongo, sql, query)."""
    sql = (
        pl.col("sql").str.extract_all(ascii_regex(SQL_FROM))
        .list.eval(pl.element().str.split(",").explode())
        .list.eval(pl.element().str.extract(SQL_NAME, 1).str.to_lowercase())
    )
    mongo = pl.col("query").str.extract_all(MONGO_SOURCE).list.eval(
        pl.element().str.extract(r'"([^"]+)"\s*$', 1)
    )
    refs = pl.when(pl.col("is_mongo")).then(mongo).otherwise(sql).list.drop_nulls()
    empty = pl.lit([], dtype=pl.List(pl.String))
    touched = (pl.col("tool") == "query_db") & pl.col("db").is_not_null()
    return pl.when(touched).then(refs.fill_null(empty)).otherwise(empty).alias("source_refs")


#: The typed per-call columns stored in ``tool_calls.parquet`` beside the raw ones
#: (``schemas.artifacts.TOOL_CALLS``), computed once when the tool calls are written
#: (:func:`with_call_features`): ``db``, ``is_mongo``, the :data:`FEATURES` booleans and
#: ``source_refs``. The report reads them instead of parsing arguments JSON and running regexes.
STORED_FEATURES = ("db", "is_mongo", *FEATURES, "source_refs")
STORED_FEATURE_TYPES = {"db": pl.String, "is_mongo": pl.Boolean,
                        **{f: pl.Boolean for f in FEATURES}, "source_refs": pl.List(pl.String)}

log = logging.getLogger(__name__)
#: Below this many calls :func:`with_call_features` runs one lazy plan (a trials batch), above
#: it the parallel eager parse of :func:`call_features` (a large artifact).
SMALL_WRITE = 50_000


def with_call_features(tool_calls: pl.DataFrame) -> pl.DataFrame:
    """``tool_calls`` (``TOOL_CALLS`` rows, at least tool and arguments) with the
    :data:`STORED_FEATURES` columns added (replaced when present), same rows in the same order.

    The trials stage calls this when it writes a batch's tool calls, the report's fallback
    (:func:`features_for_report`) computes the same columns for artifacts written before, so
    both give identical tables. Malformed argument JSON gives null db, false features and no
    source references, never an error."""
    base = tool_calls.drop([c for c in STORED_FEATURES if c in tool_calls.columns])
    if base.height == 0:
        return base.with_columns(
            *[pl.lit(None, t).alias(c) for c, t in STORED_FEATURE_TYPES.items()])
    calls = base.select("tool", "arguments").with_row_index("_row")
    if base.height < SMALL_WRITE:  # one plan: a batch's calls are parsed in a few ms
        args = pl.col("arguments")
        db = pl.when(pl.col("tool").is_in(DB_TOOLS)).then(pl.coalesce(
            args.str.extract(_DB_FIRST, 1),
            pl.when(args.str.contains('"db"', literal=True)).then(args.str.json_path_match("$.db")),
        ))  # what call_features(with_db=True) gives, as one expression
        parsed = calls.lazy().with_columns(db.alias("db"))
        parsed = call_features(parsed, FEATURES, with_db=False, lazy=True)
    else:
        parsed = call_features(calls, FEATURES, with_db=True).lazy()
    feats = (
        parsed.with_columns(source_refs())
        .sort("_row")
        .select([pl.col(c).cast(t) for c, t in STORED_FEATURE_TYPES.items()])
        .collect()
    )
    return base.hstack(feats)


def tool_calls_with_features(table):
    """A ``TOOL_CALLS`` pyarrow Table with its stored feature columns filled
    (:func:`with_call_features`), cast to ``schemas.artifacts.TOOL_CALLS``: what the trials
    stage writes. The raw columns and their values are unchanged."""
    from schemas.artifacts import TOOL_CALLS, check_schema

    df = with_call_features(pl.from_arrow(table.select(
        [c for c in table.column_names if c not in STORED_FEATURES])))
    return check_schema(df.to_arrow(), TOOL_CALLS, "tool_calls").replace_schema_metadata(
        TOOL_CALLS.metadata)


def has_stored_features(tool_calls: pl.LazyFrame) -> bool:
    """Whether every row of ``tool_calls`` carries the stored per-call columns (an artifact
    written by a querylab that computes them at write time: :func:`with_call_features`). One
    streaming pass over one column."""
    names = tool_calls.collect_schema().names()
    if any(c not in names for c in STORED_FEATURES):
        return False
    return tool_calls.select(pl.col("explore").null_count() == 0).collect(
        engine="streaming").item()


def features_for_report(tool_calls: pl.DataFrame | pl.LazyFrame, table: str
                        ) -> tuple[pl.LazyFrame, bool]:
    """``(calls, stored)``: ``tool_calls`` as a LazyFrame and whether it carries the stored
    per-call columns. When it does not (an artifact written before they existed, or rows of
    another writer), the report computes them the slower way (:func:`call_features`) and logs
    it once per table (``table`` names it)."""
    lf = tool_calls.lazy()
    stored = has_stored_features(lf)
    if not stored:
        log.warning("%s: tool_calls without stored per-call features (an older artifact): "
                    "parsing arguments JSON and matching patterns at report time", table)
    return lf, stored
