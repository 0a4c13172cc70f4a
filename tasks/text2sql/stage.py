"""Text-to-SQL on a complex workload (TPC-DS): generation with database validation and retries,
feature analysis against the gold queries, and the TPC-DS vs Spider vs BIRD complexity study.

Source: Ma, Pu & Zhu (2024), "Evaluating LLMs for Text-to-SQL Generation With Complex SQL
Workload" (arXiv:2407.19517).

Generation (one (model, TPC-DS query) at a time, see :func:`generate_with_validation`): the model
gets the query's business question, its substitution parameters and the TPC-DS schema DDL; its
SQL is validated with ``EXPLAIN`` on the TPC-DS schema held (without data) in PostgreSQL; an
invalid query is sent back with PostgreSQL's error message in a new user turn, at most
``max_retries`` (3) times. Every attempt is a row of ``generations.parquet``. Generators:

- ``openai:<model>`` — a model of the models table (``data/models.yaml`` + ``QUERYLAB_MODELS``:
  endpoint, key, prices) or any model at ``QUERYLAB_OPENAI_BASE_URL`` /
  ``QUERYLAB_OPENAI_API_KEY`` (unpriced), called through the shared model layer
  :mod:`tasks.core.llm` (``openai`` client, infra-only retries, response cache, per-model limits);
- ``replay:<path>`` — SQL generated elsewhere: a directory with one file per query (the query
  number is the first integer in the file name: ``1.sql``, ``q01.sql``, ``query1.sql``) or a
  JSONL file of ``{"query_id": 1, "sql": "...", "attempt": 0}`` (``attempt`` optional: several
  lines of one query are its successive attempts, replayed on retries);
- ``oracle`` — the gold query itself (the pipeline's self-check: 99/99 valid, Jaccard 1.0).

Flows pass artifact URIs and small manifests; the PostgreSQL DSN is never a task parameter (it
may hold a password): tasks rebuild it from :class:`schemas.settings.Settings`.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import polars as pl
import pyarrow as pa
from prefect import task

from schemas import text2sql as schema
from schemas.settings import Settings
from schemas.text2sql import CorpusSpec, GenerationConfig
from tasks.core import storage
from tasks.text2sql.corpora import (
    Corpus,
    CorpusQuery,
    load_corpus,
    load_tpcds_corpus,
    tpcds_ddl,
    tpcds_gold_queries,
    tpcds_schema,
)
from tasks.core.llm import (
    AgentConfigError,
    ChatModel,
    LLMCallError,
    ResponseCache,
    model_label,
    model_spec_name,
    resolve_model,
    settings_env,
)
from tasks.core.runs import batch_key, spec_fingerprint
from tasks.agents.registry import parse_agent_spec
from tasks.text2sql.sql_features import (
    BAG_FEATURES,
    HISTOGRAM_FEATURES,
    JACCARD_FEATURES,
    NUMERIC_FEATURES,
    PAPER_NUMERIC_FEATURES,
    SQLFeatureError,
    extract_features,
    jaccard,
    prepare_schema,
)
from tasks.core.layout import RunLayout

TPCDS_PG_DATABASE = "querylab_tpcds"


class GeneratorConfigError(AgentConfigError):
    """A generator spec cannot be used (unknown kind, missing replay source, no API settings)."""


# --------------------------------------------------------------------------------------------
# TPC-DS schema in PostgreSQL, validation by EXPLAIN
# --------------------------------------------------------------------------------------------


def tpcds_postgres_dsn(settings: Settings | None = None, dbname: str = TPCDS_PG_DATABASE) -> str:
    """DSN of the PostgreSQL database holding the TPC-DS schema (24 empty tables), creating the
    database and the tables when missing (idempotent; safe to call from concurrent tasks).

    The server is ``QUERYLAB_POSTGRES_URL`` or the embedded one under ``QUERYLAB_HOME``.
    Raises ``psycopg.Error`` when the server cannot be reached."""
    import psycopg

    from tasks.db.databases import postgres_database_dsn, postgres_server_url

    settings = settings or Settings.from_env()
    dsn = postgres_database_dsn(
        postgres_server_url(settings.postgres_url, settings.home), dbname, create=True
    )
    tables = tpcds_schema()
    with psycopg.connect(dsn, autocommit=True) as conn:
        present = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        }
        if not set(tables) <= present:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('querylab_tpcds_schema'))")
                present = {
                    r[0]
                    for r in conn.execute(
                        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
                    )
                }
                for table, cols in tables.items():
                    if table in present:
                        continue
                    body = ", ".join(f"{c} {t}" for c, t in cols)
                    conn.execute(f"CREATE TABLE {table} ({body})")
    return dsn


def tpcds_validator_dsn(settings: Settings | None = None, dbname: str = TPCDS_PG_DATABASE) -> str:
    """DSN of the TPC-DS schema database as its least-privilege agent role ``<db>_ro``
    (:func:`tasks.db.pg_roles.ensure_agent_role`: SELECT on its tables, read-only transactions,
    no server-file or signalling functions): what model-written SQL is validated as, never the
    administrator that created the schema. Creates the schema first (:func:`tpcds_postgres_dsn`).
    Raises ``psycopg.Error`` when the server cannot be reached or refuses the role."""
    from tasks.db.databases import postgres_server_url
    from tasks.db.pg_roles import agent_dsn, ensure_agent_role

    settings = settings or Settings.from_env()
    tpcds_postgres_dsn(settings, dbname)
    server = postgres_server_url(settings.postgres_url, settings.home)
    home = Path(settings.home)
    ensure_agent_role(server, dbname, home, embedded=not settings.postgres_url)
    return agent_dsn(server, dbname, home)


@task(name="tpcds-postgres-schema", persist_result=False)
def prepare_tpcds_postgres() -> str:
    """Create (if missing) the PostgreSQL database holding the empty TPC-DS schema; returns the
    database name (the DSN, which may hold a password, stays out of task parameters)."""
    tpcds_postgres_dsn()
    return TPCDS_PG_DATABASE


def _pg_error_text(e: Exception, sql: str, offset: int) -> str:
    """PostgreSQL's message with the error position mapped back into ``sql`` (line/column and
    the text there), plus DETAIL/HINT."""
    diag = getattr(e, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    if not primary:
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    parts = [primary]
    pos = getattr(diag, "statement_position", None)
    if pos:
        i = int(pos) - 1 - offset
        if 0 <= i < len(sql):
            line = sql.count("\n", 0, i) + 1
            col = i - (sql.rfind("\n", 0, i) + 1) + 1
            near = sql[i:].splitlines()[0][:60] if sql[i:].strip() else ""
            parts.append(f"at line {line}, column {col}" + (f": {near!r}" if near else ""))
    for label, attr in (("DETAIL", "message_detail"), ("HINT", "message_hint")):
        value = getattr(diag, attr, None)
        if value:
            parts.append(f"{label}: {value}")
    return "\n".join(parts)


def clean_sql(sql: str) -> str:
    """``sql`` without surrounding whitespace and trailing semicolons."""
    return re.sub(r"[\s;]+$", "", sql.strip())


#: How a query the validator plans may begin (comments and parentheses first): it is prefixed
#: with ``EXPLAIN``, so anything else, e.g. ``ANALYZE`` or an option list, would turn the plan
#: into an execution.
_QUERY_START = re.compile(
    r"(?is)(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/|\()*(?:select|with|values|table)\b")


class PostgresValidator:
    """Validates SQL with ``EXPLAIN`` (the query is planned, never run) on one PostgreSQL
    connection opened read-only with a ``statement_timeout``; ``dsn`` should log in as the
    database's agent role (:func:`tpcds_validator_dsn`). Text that does not begin as a query
    (``ANALYZE ...``, which ``EXPLAIN`` would execute) is refused. Use as a context manager or
    call :meth:`close`. ``validate(sql)`` returns None when PostgreSQL accepts the query, else the
    error message shown to the model."""

    def __init__(self, dsn: str, statement_timeout_ms: int = 10_000):
        import psycopg

        self._conn = psycopg.connect(
            dsn,
            autocommit=True,
            options=f"-c default_transaction_read_only=on -c statement_timeout={int(statement_timeout_ms)}",
        )

    def validate(self, sql: str) -> str | None:
        import psycopg
        import sqlglot
        from sqlglot import exp

        sql = clean_sql(sql)
        if not sql:
            return "empty query"
        try:
            trees = [t for t in sqlglot.parse(sql, read="postgres") if t is not None]
        except Exception:
            trees = []  # PostgreSQL is the judge of syntax
        if len(trees) > 1:
            return f"{len(trees)} statements found; write exactly one SELECT query"
        if trees and not isinstance(trees[0], exp.Query):
            return f"not a query: a {type(trees[0]).__name__.upper()} statement; write one SELECT query"
        if not _QUERY_START.match(sql):  # e.g. "ANALYZE SELECT ...": EXPLAIN would run it
            first = sql.split(None, 1)[0][:40]
            return f"not a query: it starts with {first!r}; write one SELECT query"
        prefix = "EXPLAIN "
        try:
            self._conn.execute(prefix + sql, prepare=False)
        except psycopg.Error as e:
            return _pg_error_text(e, sql, len(prefix))
        return None

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# Prompt and SQL extraction
# --------------------------------------------------------------------------------------------

SYSTEM_PROMPT = (
    "You are an expert data analyst who writes PostgreSQL queries for a TPC-DS decision-support "
    "database. Answer with exactly one SQL query in a ```sql code block."
)

RETRY_PROMPT = (
    "PostgreSQL rejected this query:\n{error}\n\n"
    "Fix the query. Answer with the corrected SQL query only, in a ```sql code block."
)


def build_prompt(query: CorpusQuery, ddl: str) -> str:
    """The user turn for one TPC-DS query: the schema DDL, the business question and its
    substitution parameters. Raises ValueError when the query has no description."""
    if not query.description:
        raise ValueError(f"TPC-DS query {query.query_id} has no description (business question)")
    params = "\n".join(f"- {p}" for p in query.params)
    text = (
        f"Database schema (PostgreSQL):\n\n{ddl}\n\n"
        f"Write one PostgreSQL query that answers this business question (TPC-DS query "
        f"{query.query_id}):\n{query.description}\n"
    )
    if params:
        text += f"\nUse these substitution parameters:\n{params}\n"
    return text


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_sql(text: str | None) -> str:
    """The SQL in a model reply: the last ```sql fenced block, else the last fenced block, else
    the whole reply; trailing semicolons removed. Empty string when there is nothing."""
    if not text:
        return ""
    blocks = _FENCE.findall(text)
    if blocks:
        sql_blocks = [
            b for lang, b in blocks if lang.lower() in ("sql", "postgresql", "postgres", "psql")
        ]
        return clean_sql((sql_blocks or [b for _, b in blocks])[-1])
    return clean_sql(text)


# --------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------


@dataclass
class Reply:
    """One model reply: raw ``content``, token counts, ``latency_s``, ``cost_usd`` (None when
    unknown) and ``error`` for an API failure (then ``content`` is None)."""

    content: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cost_usd: float | None = 0.0
    error: str | None = None


class Generator:
    """Produces SQL for a conversation. ``reply(query_id, messages, attempt)`` returns a
    :class:`Reply`, or None when the generator has nothing more to offer (a replay without
    another attempt)."""

    label: str = "generator"

    def reply(self, query_id: str, messages: list[dict], attempt: int) -> Reply | None:
        raise NotImplementedError

    def close(self) -> None:
        """Release resources (HTTP connections); a no-op offline."""


class OracleGenerator(Generator):
    """Answers with the TPC-DS gold query (self-check of the pipeline)."""

    label = "oracle"

    def __init__(self, gold: dict[str, str] | None = None):
        self.gold = gold or tpcds_gold_queries()

    def reply(self, query_id: str, messages: list[dict], attempt: int) -> Reply | None:
        sql = self.gold.get(query_id)
        return None if sql is None else Reply(f"```sql\n{sql}\n```")


class ReplayGenerator(Generator):
    """Replays SQL generated elsewhere (see module docstring for the two layouts).

    ``label`` is ``replay:<file or directory name without extension>``. Raises
    :class:`GeneratorConfigError` when the source is missing, empty or malformed (naming the
    file and line)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.label = f"replay:{self.path.stem if self.path.is_file() else self.path.name}"
        self.attempts: dict[str, list[str]] = self._load()

    @staticmethod
    def _qid(value: Any) -> str:
        m = re.search(r"\d+", str(value))
        if not m:
            raise ValueError(f"no query number in {value!r}")
        return str(int(m.group()))

    def _load(self) -> dict[str, list[str]]:
        p = self.path
        out: dict[str, list[tuple[int, int, str]]] = {}
        if p.is_dir():
            for f in sorted(p.iterdir()):
                if f.is_file() and f.suffix.lower() == ".sql":
                    try:
                        qid = self._qid(f.stem)
                    except ValueError:
                        raise GeneratorConfigError(
                            f"{f}: file name holds no query number"
                        ) from None
                    out.setdefault(qid, []).append((0, 0, f.read_text(encoding="utf-8")))
        elif p.is_file():
            for lineno, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                    qid = self._qid(obj["query_id"])
                    sql = obj["sql"]
                    attempt = int(obj.get("attempt", len(out.get(qid, []))))
                except (ValueError, KeyError, TypeError):
                    raise GeneratorConfigError(
                        f"{p}:{lineno}: expected a JSON object with query_id and sql"
                    ) from None
                out.setdefault(qid, []).append((attempt, lineno, "" if sql is None else str(sql)))
        else:
            raise GeneratorConfigError(
                f"{p}: replay source not found (a directory or a .jsonl file)"
            )
        if not out:
            raise GeneratorConfigError(f"{p}: no replayed SQL found")
        return {q: [s for _, _, s in sorted(v)] for q, v in out.items()}

    def reply(self, query_id: str, messages: list[dict], attempt: int) -> Reply | None:
        sqls = self.attempts.get(query_id, [])
        return Reply(sqls[attempt]) if attempt < len(sqls) else None


class OpenAIGenerator(Generator):
    """A chat model called through the shared model layer (:mod:`tasks.core.llm`): ``model`` is
    resolved in the models table (endpoint, key, prices; ``data/models.yaml`` +
    ``QUERYLAB_MODELS``), a model in no file falls back to the endpoint of ``settings``
    (``QUERYLAB_OPENAI_BASE_URL`` / ``QUERYLAB_OPENAI_API_KEY``) and is unpriced (cost null).
    Infrastructure errors (408/429/5xx, timeouts, connection) are retried by
    :class:`tasks.core.llm.ChatModel` (``config.api_retries``, backoff honouring ``Retry-After``);
    a call that still fails comes back as a :class:`Reply` with ``error`` set. ``cache``: the
    shared :class:`tasks.core.llm.ResponseCache` (None: no cache). Raises
    :class:`GeneratorConfigError` when the model cannot be resolved (no endpoint, missing key).
    """

    def __init__(
        self,
        model: str,
        settings: Settings,
        config: GenerationConfig,
        cache: ResponseCache | None = None,
    ):
        try:
            resolved = resolve_model(model, env=settings_env(settings))
        except AgentConfigError as exc:
            raise GeneratorConfigError(str(exc)) from None
        self.model = model
        self.label = model_label(model)
        self.config = config
        self.resolved = resolved
        self.chat = ChatModel(resolved, config.agent_options(), cache)

    def reply(self, query_id: str, messages: list[dict], attempt: int) -> Reply | None:
        # trial 0: one generation per (model, query); every attempt's conversation is longer
        # than the previous one's, so attempts never share a cache entry
        try:
            resp, rec = self.chat.complete(list(messages), None, trial=0, call_index=attempt)
        except LLMCallError as exc:
            rec = exc.record
            return Reply(
                None, rec.prompt_tokens, rec.completion_tokens, rec.latency_s,
                cost_usd=0.0 if rec.priced else None, error=f"api_error: {exc}"[:500],
            )
        content = resp.choices[0].message.content
        cost = rec.cost_usd if rec.priced else None
        return Reply(content, rec.prompt_tokens, rec.completion_tokens, rec.latency_s, cost)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.chat.close()


def make_generator(
    spec: str,
    settings: Settings | None = None,
    config: GenerationConfig | None = None,
    artifacts_root: str | None = None,
) -> Generator:
    """A generator from its spec: ``oracle``, ``openai:<model>``, ``local:<model>`` or
    ``replay:<path>``.
    ``artifacts_root``: where ``openai:`` generators keep the shared response cache
    (``<root>/cache/llm``, mode ``config.cache``); None: no cache. Raises
    :class:`GeneratorConfigError` for anything else."""
    config = config or GenerationConfig()
    kind, arg = parse_agent_spec(spec, "text2sql", "generator", GeneratorConfigError)
    if kind == "oracle":
        return OracleGenerator()
    if kind == "replay":
        return ReplayGenerator(arg)
    if model_spec_name(spec) is None:  # a plugin kind that lists text2sql but has no generator here
        raise GeneratorConfigError(f"generator {spec!r}: kind {kind!r} has no text2sql generator")
    cache = ResponseCache(artifacts_root, config.cache) if artifacts_root else None
    return OpenAIGenerator(model_spec_name(spec), settings or Settings.from_env(), config, cache)


def check_generator_spec(spec: str) -> None:
    """Raise :class:`GeneratorConfigError` unless ``spec`` is ``oracle``, ``openai:<model>`` or
    ``replay:<path>`` with an existing path (checked before any work is mapped)."""
    parse_agent_spec(spec, "text2sql", "generator", GeneratorConfigError, check=True)


def generator_label(spec: str) -> str:
    """The model label a generator spec records (``replay:<path>`` → ``replay:<name>``)."""
    kind, _, arg = spec.partition(":")
    if kind == "replay" and arg:
        p = Path(arg)
        return f"replay:{p.stem if p.suffix else p.name}"
    return spec


def generate_with_validation(
    generator: Generator,
    query_id: str,
    prompt: str,
    validate: Callable[[str], str | None],
    max_retries: int = 3,
) -> list[dict]:
    """Generate SQL for one query, validating each attempt and regenerating after an invalid one.

    Conversation: system prompt, ``prompt`` as the user turn; after an invalid attempt the
    model's reply and a user turn holding ``validate``'s error (:data:`RETRY_PROMPT`) are
    appended. Stops at the first valid SQL, after ``1 + max_retries`` attempts, at an API error,
    or when the generator has nothing more (replay).

    Returns one dict per attempt: ``attempt`` (0 = first try), ``sql`` (None when the reply held
    none), ``valid``, ``error``, ``final``, ``response``, ``prompt_tokens``,
    ``completion_tokens``, ``cost_usd``, ``latency_s``. At least one row: a query the generator
    has no answer for is one invalid attempt with an explaining ``error``.
    """
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
    rows: list[dict] = []
    for attempt in range(1 + max_retries):
        reply = generator.reply(query_id, messages, attempt)
        if reply is None:
            if not rows:
                rows.append(
                    {
                        "attempt": 0,
                        "sql": None,
                        "valid": False,
                        "response": None,
                        "error": f"{generator.label} has no SQL for query {query_id}",
                        "prompt_tokens": 0,
                        "completion_tokens": 0,
                        "cost_usd": 0.0,
                        "latency_s": 0.0,
                    }
                )
            break
        row = {
            "attempt": attempt,
            "response": reply.content,
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "cost_usd": reply.cost_usd,
            "latency_s": reply.latency_s,
        }
        if reply.error is not None:
            rows.append({**row, "sql": None, "valid": False, "error": reply.error})
            break
        sql = extract_sql(reply.content)
        error = validate(sql) if sql else "the reply contains no SQL query"
        rows.append({**row, "sql": sql or None, "valid": error is None, "error": error})
        if error is None:
            break
        messages.append({"role": "assistant", "content": reply.content or ""})
        messages.append({"role": "user", "content": RETRY_PROMPT.format(error=error)})
    for i, row in enumerate(rows):
        row["final"] = i == len(rows) - 1
    return rows


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
    for gen in generators:
        check_generator_spec(gen)
    labels = [generator_label(g) for g in generators]
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate generators {labels}")
    cfg = GenerationConfig.model_validate(
        config.model_dump() if isinstance(config, GenerationConfig) else config or {}
    ).model_dump(mode="json")
    corpus = load_tpcds_corpus(descriptions_path).by_id()

    def item(qid: str) -> list:  # what the prompt is built from, and the oracle's answer
        q = corpus.get(qid)
        return [qid] if q is None else [qid, q.description, list(q.params), q.sql]

    from tasks.core.batching import plan

    batches = []
    for gen in generators:
        try:
            fingerprint = spec_fingerprint(gen)
        except OSError as exc:
            raise GeneratorConfigError(f"{gen}: cannot read the replay source: {exc}") from None
        for key, chunk in plan(generator_label(gen), query_ids, batch_size,
                               lambda c: [gen, fingerprint, [item(q) for q in c], cfg]):
            batches.append({"key": key, "generator": gen, "query_ids": chunk})
    return batches


def generation_batches():
    """The generation stage's batches (:class:`tasks.core.batching.BatchedStage`):
    ``text2sql/batches/<key>.parquet`` of :data:`schemas.text2sql.GENERATIONS` rows, with
    per-query checkpoints ``<key>.parts/``."""
    from tasks.core.batching import BatchedStage

    return BatchedStage("text2sql", (("", schema.GENERATIONS),))


def batch_uri(artifacts_root: str, run_id: str, key: str) -> str:
    """Where a generation batch's attempts are written."""
    return generation_batches().uri(artifacts_root, run_id, key)


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
    stage = generation_batches()
    if stage.finished(artifacts_root, run_id, batch["key"]):
        return stage.uri(artifacts_root, run_id, batch["key"])
    cfg = GenerationConfig.model_validate(config or {})
    settings = Settings.from_env()
    corpus = load_tpcds_corpus(descriptions_path).by_id()
    unknown = [q for q in batch["query_ids"] if q not in corpus]
    if unknown:
        raise ValueError(f"unknown TPC-DS query ids {unknown}; expected 1..99")
    ddl = tpcds_ddl()
    generator = make_generator(batch["generator"], settings, cfg, artifacts_root)
    try:
        with PostgresValidator(  # as the read-only agent role: the SQL is the model's
            tpcds_validator_dsn(settings), cfg.statement_timeout_ms
        ) as validator:

            def generate(qid: str) -> dict[str, list[dict]]:
                prompt = build_prompt(corpus[qid], ddl)
                return {"": [
                    {"run_id": run_id, "model": generator.label, "query_id": qid, **r}
                    for r in generate_with_validation(
                        generator, qid, prompt, validator.validate, cfg.max_retries)
                ]}

            rows = stage.run_items(artifacts_root, run_id, batch["key"], batch["query_ids"],
                                   generate)
    finally:
        generator.close()
    return stage.write(artifacts_root, run_id, batch["key"], rows)


@task(name="text2sql-combine", persist_result=False)
def combine_generations(run_id: str, artifacts_root: str, batch_uris: list[str]) -> str:
    """Concatenate batch files into ``text2sql/generations.parquet`` (sorted by model, query
    number, attempt; streamed, :func:`tasks.core.batching.combine`); returns its URI."""
    from tasks.core.batching import combine

    uri = storage.join(stage_prefix(artifacts_root, run_id, "text2sql"), "generations.parquet")
    order = ["model", pl.col("query_id").cast(pl.Int64, strict=False), "attempt"]
    return combine(batch_uris, schema.GENERATIONS, order, uri)


# --------------------------------------------------------------------------------------------
# Features of a set of queries
# --------------------------------------------------------------------------------------------


def feature_rows(
    corpus_name: str,
    items: Iterable[tuple[str, str | None, str | None]],
    dialect: str,
    schemas: dict[str, Any] | None = None,
) -> list[dict]:
    """Rows of :data:`schemas.text2sql.SQL_FEATURES` for ``(query_id, db_id, sql)`` items.

    ``schemas``: ``{db_id: {table: columns}}`` for column attribution. A query whose features
    cannot be read gets ``error`` set and null features (nothing is dropped)."""
    prepared = {k: prepare_schema(v) for k, v in (schemas or {}).items()}
    rows = []
    for query_id, db_id, sql in items:
        row: dict[str, Any] = {
            "corpus": corpus_name,
            "query_id": str(query_id),
            "db_id": db_id,
            "dialect": dialect,
            "sql": sql,
            "error": None,
        }
        if sql is None:
            row["error"] = "no SQL"
        else:
            try:
                row.update(extract_features(sql, dialect, prepared.get(db_id)).as_row())
            except SQLFeatureError as e:
                row["error"] = str(e)
        rows.append(row)
    return rows


def _load_corpus_spec(spec: CorpusSpec) -> Corpus:
    if spec.name == "tpcds" and spec.path is None:
        return load_tpcds_corpus()
    corpus = load_corpus(
        spec.path, name=spec.name, dialect=spec.dialect, tables_json=spec.tables_json
    )
    return corpus


@task(name="corpus-features", persist_result=False)
def corpus_features(run_id: str, artifacts_root: str, spec: dict) -> str:
    """Features of every query of one corpus (``spec``: :class:`CorpusSpec` fields) →
    ``complexity/features/<name>.parquet``; returns its URI. Raises CorpusError for a bad
    corpus file, pydantic ValidationError for a bad spec."""
    cs = CorpusSpec.model_validate(spec)
    corpus = _load_corpus_spec(cs)
    rows = feature_rows(
        corpus.name, ((q.query_id, q.db_id, q.sql) for q in corpus), corpus.dialect, corpus.schemas
    )
    uri = storage.join(
        stage_prefix(artifacts_root, run_id, "complexity"), "features", f"{cs.name}.parquet"
    )
    return storage.write_parquet(
        uri, pa.Table.from_pylist(rows, schema=schema.SQL_FEATURES), schema.SQL_FEATURES
    )


# --------------------------------------------------------------------------------------------
# Plots (matplotlib Figure API with the Agg canvas, no pyplot; PNG bytes)
# --------------------------------------------------------------------------------------------


def _figure(**kwargs):
    """A matplotlib Figure without pyplot (thread-safe in mapped tasks; Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


_LABELS = {
    "cte_count": "CTEs",
    "subquery_count": "subqueries (nested selects)",
    "join_count": "joins",
    "function_count": "functions",
    "predicate_count": "WHERE predicates",
    "column_count": "selected columns",
    "aggregation_count": "aggregations",
    "join_pair_count": "join pairs",
    "relation_count": "relations",
    "constant_count": "constants",
    "window_function_count": "window functions",
    "relations": "tables",
    "columns": "columns",
    "where_predicates": "WHERE predicates",
    "constants": "constants",
    "functions": "functions",
    "aggregations": "aggregation",
    "join_pairs": "joins",
    "window_functions": "window functions",
}


def histogram_png(values: dict[str, list[int]], feature: str, cap: int = 30) -> bytes:
    """Per-query distribution of one numeric feature for several corpora: grouped bars of the
    share of each corpus's queries (%) per count; counts above ``cap`` are pooled in the last
    bar ("≥cap"). Returns PNG bytes."""
    top = min(cap, max((max(v) for v in values.values() if v), default=0))
    xs = list(range(top + 1))
    fig = _figure(figsize=(9, 4))
    ax = fig.add_subplot()
    width = 0.8 / max(len(values), 1)
    for i, (name, vals) in enumerate(values.items()):
        n = len(vals) or 1
        shares = [100 * sum(1 for v in vals if (min(v, top) == x)) / n for x in xs]
        ax.bar(
            [x + (i - (len(values) - 1) / 2) * width for x in xs],
            shares,
            width=width,
            label=f"{name} (n={len(vals)})",
        )
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) if x < top or top < cap else f"≥{x}" for x in xs], fontsize=7)
    ax.set_xlabel(f"{_LABELS.get(feature, feature)} per query")
    ax.set_ylabel("share of queries (%)")
    ax.set_title(f"{_LABELS.get(feature, feature)} per query")
    ax.legend()
    return _png(fig)


def radar_png(
    scores: dict[str, dict[str, float]], features: list[str], title: str, rmax: float | None = None
) -> bytes:
    """A radar chart: one polygon per model over ``features`` (axes), e.g. Jaccard similarity
    per bag feature; the radial axis runs from 0 to ``rmax`` (default: fitted to the data).
    Missing values are drawn as 0. Returns PNG bytes."""
    import math

    angles = [2 * math.pi * i / len(features) for i in range(len(features))]
    fig = _figure(figsize=(6.5, 6.5))
    ax = fig.add_subplot(projection="polar")
    for model, vals in scores.items():
        ys = [vals.get(f) or 0.0 for f in features]
        ax.plot(angles + angles[:1], ys + ys[:1], label=model, linewidth=1.5)
        ax.fill(angles + angles[:1], ys + ys[:1], alpha=0.08)
    ax.set_xticks(angles)
    ax.set_xticklabels([_LABELS.get(f, f) for f in features], fontsize=8)
    if rmax is not None:
        ax.set_ylim(0, rmax)
    ax.set_title(title)
    ax.legend(loc="upper right", bbox_to_anchor=(1.35, 1.1), fontsize=8)
    return _png(fig)


# --------------------------------------------------------------------------------------------
# Complexity comparison
# --------------------------------------------------------------------------------------------


def _markdown(df: pl.DataFrame) -> str:
    from tasks.report.stage import markdown_table

    return markdown_table(df)


def complexity_table(features: pl.DataFrame, reference: str = "tpcds") -> pl.DataFrame:
    """Per corpus × numeric feature statistics (:data:`schemas.text2sql.COMPLEXITY`) of a frame
    of :data:`SQL_FEATURES` rows; queries with an ``error`` are left out. ``normalised`` divides
    by the ``reference`` corpus's mean (null when it is absent or its mean is 0)."""
    ok = features.filter(pl.col("error").is_null())
    long = ok.unpivot(
        index="corpus", on=list(NUMERIC_FEATURES), variable_name="feature", value_name="value"
    ).with_columns(pl.col("value").cast(pl.Float64))
    stats = long.group_by("corpus", "feature", maintain_order=True).agg(
        pl.len().cast(pl.Int32).alias("n"),
        pl.col("value").mean().alias("mean"),
        pl.col("value").median().alias("median"),
        pl.col("value").quantile(0.9, "linear").alias("p90"),
        pl.col("value").max().alias("max"),
    )
    ref = stats.filter(pl.col("corpus") == reference).select(
        "feature", pl.col("mean").alias("tpcds_mean")
    )
    out = stats.join(ref, on="feature", how="left").with_columns(
        pl.when(pl.col("tpcds_mean") > 0)
        .then(pl.col("mean") / pl.col("tpcds_mean"))
        .otherwise(None)
        .alias("normalised")
    )
    return out.select(schema.COMPLEXITY.names)


@task(name="complexity-report", persist_result=False)
def complexity_report(run_id: str, artifacts_root: str, feature_uris: list[str]) -> dict:
    """The complexity comparison of the corpora whose feature files are given.

    Writes under ``complexity/``: ``complexity.parquet`` (:data:`COMPLEXITY`),
    ``hist_<feature>.png`` for the six :data:`HISTOGRAM_FEATURES`, and ``complexity.md``.
    Returns ``{"complexity": uri, "markdown": uri, "histograms": {feature: uri},
    "table": markdown of the mean table, "parse_errors": {corpus: count}}``."""
    frames = [pl.from_arrow(storage.read_parquet(u, schema.SQL_FEATURES)) for u in feature_uris]
    features = pl.concat(frames)
    table = complexity_table(features)
    prefix = stage_prefix(artifacts_root, run_id, "complexity")
    uri = storage.write_parquet(
        storage.join(prefix, "complexity.parquet"), table.to_arrow(), schema.COMPLEXITY
    )
    corpora = [f["corpus"][0] for f in frames if f.height]
    ok = features.filter(pl.col("error").is_null())
    hists = {}
    for feat in HISTOGRAM_FEATURES:
        values = {c: ok.filter(pl.col("corpus") == c)[feat].to_list() for c in corpora}
        hists[feat] = storage.write_bytes(
            storage.join(prefix, f"hist_{feat}.png"), histogram_png(values, feat)
        )
    means = table.pivot(on="feature", index="corpus", values="mean").select(
        "corpus", *PAPER_NUMERIC_FEATURES, "relation_count", "constant_count"
    )
    normalised = table.pivot(on="feature", index="corpus", values="normalised").select(
        "corpus", *PAPER_NUMERIC_FEATURES, "relation_count", "constant_count"
    )
    errors = dict(features.group_by("corpus").agg(pl.col("error").is_not_null().sum()).iter_rows())
    sizes = dict(features.group_by("corpus").len().iter_rows())
    md = "\n\n".join(
        [
            f"# SQL complexity: {', '.join(corpora)} (run `{run_id}`)",
            "Feature definitions: `tasks/text2sql/sql_features.py`. Queries per corpus: "
            + ", ".join(f"{c} {sizes[c]} ({errors.get(c, 0)} not parsed)" for c in corpora)
            + ".",
            "## Mean per query",
            _markdown(means),
            "## Means normalised by the TPC-DS gold means",
            _markdown(normalised),
            "## Histograms",
            "\n".join(f"- {_LABELS[f]}: `hist_{f}.png`" for f in HISTOGRAM_FEATURES),
        ]
    )
    md_uri = storage.write_bytes(storage.join(prefix, "complexity.md"), (md + "\n").encode())
    return {
        "complexity": uri,
        "markdown": md_uri,
        "histograms": hists,
        "table": _markdown(means),
        "parse_errors": errors,
    }


# --------------------------------------------------------------------------------------------
# Analysis of a generation run: the paper's tables
# --------------------------------------------------------------------------------------------


def success_table(gens: pl.DataFrame) -> pl.DataFrame:
    """Per model: queries attempted, successful (final attempt valid), valid at the first attempt
    / after a retry, mean attempts per query, tokens and cost (:data:`TEXT2SQL_SUCCESS`)."""
    final = gens.filter(pl.col("final"))
    per_query = gens.group_by("model", "query_id").agg(pl.len().alias("attempts"))
    a = final.group_by("model").agg(
        pl.len().cast(pl.Int32).alias("n_queries"),
        pl.col("valid").sum().cast(pl.Int32).alias("n_success"),
        (pl.col("valid") & (pl.col("attempt") == 0)).sum().cast(pl.Int32).alias("n_first_attempt"),
        (pl.col("valid") & (pl.col("attempt") > 0)).sum().cast(pl.Int32).alias("n_after_retry"),
    )
    b = per_query.group_by("model").agg(pl.col("attempts").mean().alias("mean_attempts"))
    c = gens.group_by("model").agg(
        pl.col("prompt_tokens").sum().alias("prompt_tokens"),
        pl.col("completion_tokens").sum().alias("completion_tokens"),
        pl.when(pl.col("cost_usd").is_null().any())
        .then(None)
        .otherwise(pl.col("cost_usd").sum())
        .alias("cost_usd"),
    )
    return (
        a.join(b, on="model")
        .join(c, on="model")
        .sort("model")
        .select(schema.TEXT2SQL_SUCCESS.names)
    )


def normalised_means_table(features: pl.DataFrame) -> pl.DataFrame:
    """Mean of each :data:`PAPER_NUMERIC_FEATURES` per model (rows of ``features`` with
    ``corpus`` = model, ``gold`` for the gold queries; rows with an error left out), normalised
    by the gold mean (:data:`TEXT2SQL_MEANS`)."""
    ok = features.filter(pl.col("error").is_null())
    long = ok.unpivot(
        index="corpus", on=list(PAPER_NUMERIC_FEATURES), variable_name="feature", value_name="value"
    )
    stats = long.group_by("corpus", "feature").agg(
        pl.len().cast(pl.Int32).alias("n"), pl.col("value").cast(pl.Float64).mean().alias("mean")
    )
    gold = stats.filter(pl.col("corpus") == "gold").select(
        "feature", pl.col("mean").alias("gold_mean")
    )
    out = (
        stats.join(gold, on="feature", how="left")
        .with_columns(
            pl.when(pl.col("gold_mean") > 0)
            .then(pl.col("mean") / pl.col("gold_mean"))
            .otherwise(None)
            .alias("normalised")
        )
        .rename({"corpus": "model"})
    )
    order = {f: i for i, f in enumerate(PAPER_NUMERIC_FEATURES)}
    return (
        out.with_columns(
            pl.col("feature").replace_strict(order, return_dtype=pl.Int32).alias("_o"),
            (pl.col("model") != "gold").alias("_g"),
        )
        .sort("_g", "model", "_o")
        .select(schema.TEXT2SQL_MEANS.names)
    )


def jaccard_table(features: pl.DataFrame) -> pl.DataFrame:
    """Mean Jaccard similarity per model × :data:`JACCARD_FEATURES` between each model query and
    the gold query with the same ``query_id``, plus ``average`` = mean of the feature means
    (:data:`TEXT2SQL_JACCARD`). Only queries whose features both sides have are compared."""
    ok = features.filter(pl.col("error").is_null())
    gold = {r["query_id"]: r for r in ok.filter(pl.col("corpus") == "gold").iter_rows(named=True)}
    rows = []
    for model in sorted(set(ok["corpus"]) - {"gold"}):
        sims: dict[str, list[float]] = {f: [] for f in JACCARD_FEATURES}
        for r in ok.filter(pl.col("corpus") == model).iter_rows(named=True):
            g = gold.get(r["query_id"])
            if g is None:
                continue
            for f in JACCARD_FEATURES:
                sims[f].append(jaccard(r[f] or [], g[f] or []))
        means = {f: (sum(v) / len(v) if v else None) for f, v in sims.items()}
        n = len(sims[JACCARD_FEATURES[0]])
        rows += [
            {"model": model, "feature": f, "n": n, "jaccard": means[f]} for f in JACCARD_FEATURES
        ]
        vals = [v for v in means.values() if v is not None]
        rows.append(
            {
                "model": model,
                "feature": "average",
                "n": n,
                "jaccard": sum(vals) / len(vals) if vals else None,
            }
        )
    return pl.DataFrame(
        rows,
        schema={"model": pl.String, "feature": pl.String, "n": pl.Int32, "jaccard": pl.Float64},
    )


@task(name="text2sql-analyse", persist_result=False)
def analyse_generations(run_id: str, artifacts_root: str, generations_uri: str) -> dict:
    """The paper's tables for a generation run, from ``generations.parquet`` alone.

    Features of the 99 gold queries (``corpus = "gold"``) and of each model's final valid SQL
    (``corpus = <model>``) → ``text2sql/features.parquet``; then ``success.parquet``,
    ``normalised_means.parquet``, ``jaccard.parquet``, ``radar_jaccard.png``,
    ``radar_normalised_means.png`` and ``report.md``. Returns their URIs plus ``"tables"``:
    the three tables as Markdown."""
    gens = pl.from_arrow(storage.read_parquet(generations_uri, schema.GENERATIONS))
    gold = tpcds_gold_queries()
    tpcds = {"tpcds": {t: [c for c, _ in cols] for t, cols in tpcds_schema().items()}}
    rows = feature_rows("gold", ((q, "tpcds", s) for q, s in gold.items()), "postgres", tpcds)
    final_valid = gens.filter(pl.col("final") & pl.col("valid"))
    for model in sorted(set(final_valid["model"])):
        sub = final_valid.filter(pl.col("model") == model)
        rows += feature_rows(
            model,
            ((r["query_id"], "tpcds", r["sql"]) for r in sub.iter_rows(named=True)),
            "postgres",
            tpcds,
        )
    features = pl.from_arrow(pa.Table.from_pylist(rows, schema=schema.SQL_FEATURES))
    prefix = stage_prefix(artifacts_root, run_id, "text2sql")
    out = {
        "features": storage.write_parquet(
            storage.join(prefix, "features.parquet"), features.to_arrow(), schema.SQL_FEATURES
        )
    }
    success = success_table(gens)
    means = normalised_means_table(features)
    jac = jaccard_table(features)
    out["success"] = storage.write_parquet(
        storage.join(prefix, "success.parquet"), success.to_arrow(), schema.TEXT2SQL_SUCCESS
    )
    out["normalised_means"] = storage.write_parquet(
        storage.join(prefix, "normalised_means.parquet"), means.to_arrow(), schema.TEXT2SQL_MEANS
    )
    out["jaccard"] = storage.write_parquet(
        storage.join(prefix, "jaccard.parquet"), jac.to_arrow(), schema.TEXT2SQL_JACCARD
    )
    jac_scores = {
        m: dict(zip(g["feature"], g["jaccard"]))
        for (m,), g in jac.group_by("model", maintain_order=True)
    }
    norm_scores = {
        m: dict(zip(g["feature"], g["normalised"]))
        for (m,), g in means.group_by("model", maintain_order=True)
    }
    out["radar_jaccard"] = storage.write_bytes(
        storage.join(prefix, "radar_jaccard.png"),
        radar_png(
            jac_scores,
            list(JACCARD_FEATURES),
            "Jaccard similarity to the TPC-DS gold queries",
            rmax=1.0,
        ),
    )
    out["radar_normalised_means"] = storage.write_bytes(
        storage.join(prefix, "radar_normalised_means.png"),
        radar_png(
            norm_scores, list(PAPER_NUMERIC_FEATURES), "Mean feature counts / TPC-DS gold means"
        ),
    )
    means_wide = means.pivot(on="feature", index="model", values="normalised")
    jac_wide = jac.pivot(on="feature", index="model", values="jaccard") if jac.height else jac
    unreadable = features.filter(pl.col("error").is_not_null() & (pl.col("corpus") != "gold"))
    tables = {
        "success": _markdown(success),
        "normalised_means": _markdown(means_wide),
        "jaccard": _markdown(jac_wide),
    }
    n_queries = gens["query_id"].n_unique()
    md = "\n\n".join(
        [
            f"# Text-to-SQL on TPC-DS (run `{run_id}`)",
            (
                f"{gens['model'].n_unique()} model(s), {n_queries} queries, {gens.height} "
                "attempts. A query succeeds when its final SQL passes `EXPLAIN` on PostgreSQL "
                "(an invalid query is regenerated with PostgreSQL's error in a new user turn)."
            ),
            f"## Successful queries (out of {n_queries})",
            tables["success"],
            "## Mean feature counts normalised by the TPC-DS gold means (valid queries)",
            tables["normalised_means"],
            "## Jaccard similarity to the gold query (valid queries)",
            tables["jaccard"],
            "Radar charts: `radar_jaccard.png`, `radar_normalised_means.png`. Features: "
            "`tasks/text2sql/sql_features.py`."
            + (
                f"\n\n{unreadable.height} valid queries could not be read by sqlglot and are left out "
                "of the feature tables."
                if unreadable.height
                else ""
            ),
        ]
    )
    out["markdown"] = storage.write_bytes(storage.join(prefix, "report.md"), (md + "\n").encode())
    out["tables"] = tables
    return out


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


__all__ = [
    "BAG_FEATURES",
    "RETRY_PROMPT",
    "SYSTEM_PROMPT",
    "TPCDS_PG_DATABASE",
    "Generator",
    "GeneratorConfigError",
    "OpenAIGenerator",
    "OracleGenerator",
    "PostgresValidator",
    "ReplayGenerator",
    "Reply",
    "analyse_generations",
    "batch_uri",
    "build_prompt",
    "check_generator_spec",
    "clean_sql",
    "combine_generations",
    "complexity_report",
    "complexity_table",
    "corpus_features",
    "extract_sql",
    "feature_rows",
    "generate_with_validation",
    "generator_label",
    "histogram_png",
    "jaccard_table",
    "make_generator",
    "normalised_means_table",
    "plan_generation_batches",
    "prepare_tpcds_postgres",
    "radar_png",
    "run_generation_batch",
    "spider_execution_accuracy",
    "success_table",
    "tpcds_postgres_dsn",
]
