"""Generating SQL for TPC-DS queries: the prompt, SQL extraction from a reply, the generators
and the validate-and-retry loop.

Generation (one (model, TPC-DS query) at a time, see :func:`generate_with_validation`): the model
gets the query's business question, its substitution parameters and the TPC-DS schema DDL; its
SQL is validated with ``EXPLAIN`` on the TPC-DS schema held (without data) in PostgreSQL
(:mod:`tasks.text2sql.validation`); an invalid query is sent back with PostgreSQL's error message
in a new user turn, at most ``max_retries`` (3) times. Generators:

- ``openai:<model>`` — a model of the models table (``data/models.yaml`` + ``QUERYLAB_MODELS``:
  endpoint, key, prices) or any model at ``QUERYLAB_OPENAI_BASE_URL`` /
  ``QUERYLAB_OPENAI_API_KEY`` (unpriced), called through the shared model layer
  :mod:`tasks.core.llm` (``openai`` client, infra-only retries, response cache, per-model limits);
- ``replay:<path>`` — SQL generated elsewhere: a directory with one file per query (the query
  number is the first integer in the file name: ``1.sql``, ``q01.sql``, ``query1.sql``) or a
  JSONL file of ``{"query_id": 1, "sql": "...", "attempt": 0}`` (``attempt`` optional: several
  lines of one query are its successive attempts, replayed on retries);
- ``oracle`` — the gold query itself (the pipeline's self-check: 99/99 valid, Jaccard 1.0).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schemas.settings import Settings
from schemas.text2sql import GenerationConfig
from tasks.agents.chat import AgentReply, ChatAgent
from tasks.agents.registry import parse_agent_spec, suite_agent
from tasks.core.jsonl import parse_jsonl
from tasks.core.llm import AgentConfigError, ResponseCache
from tasks.text2sql.corpora import CorpusQuery, tpcds_gold_queries
from tasks.text2sql.validation import clean_sql

class GeneratorConfigError(AgentConfigError):
    """A generator spec cannot be used (unknown kind, missing replay source, no API settings)."""


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


class Generator:
    """Produces SQL for a conversation. ``reply(query_id, messages, attempt)`` returns a
    :class:`tasks.agents.chat.AgentReply`, or None when the generator has nothing more to offer
    (a replay without another attempt)."""

    label: str = "generator"

    def reply(self, query_id: str, messages: list[dict], attempt: int) -> AgentReply | None:
        raise NotImplementedError

    def close(self) -> None:
        """Release resources (HTTP connections); a no-op offline."""


class OracleGenerator(Generator):
    """Answers with the TPC-DS gold query (self-check of the pipeline)."""

    label = "oracle"

    def __init__(self, gold: dict[str, str] | None = None):
        self.gold = gold or tpcds_gold_queries()

    def reply(self, query_id: str, messages: list[dict], attempt: int) -> AgentReply | None:
        sql = self.gold.get(query_id)
        return None if sql is None else AgentReply(f"```sql\n{sql}\n```")


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

            def parse(obj) -> tuple[str, Any, int]:
                qid = self._qid(obj["query_id"])
                return qid, obj["sql"], int(obj.get("attempt", len(out.get(qid, []))))

            def bad_line(lineno: int, _exc: Exception) -> GeneratorConfigError:
                return GeneratorConfigError(
                    f"{p}:{lineno}: expected a JSON object with query_id and sql")

            for lineno, (qid, sql, attempt) in parse_jsonl(
                p.read_text(encoding="utf-8"), parse, bad_line
            ):
                out.setdefault(qid, []).append((attempt, lineno, "" if sql is None else str(sql)))
        else:
            raise GeneratorConfigError(
                f"{p}: replay source not found (a directory or a .jsonl file)"
            )
        if not out:
            raise GeneratorConfigError(f"{p}: no replayed SQL found")
        return {q: [s for _, _, s in sorted(v)] for q, v in out.items()}

    def reply(self, query_id: str, messages: list[dict], attempt: int) -> AgentReply | None:
        sqls = self.attempts.get(query_id, [])
        return AgentReply(sqls[attempt]) if attempt < len(sqls) else None


class OpenAIGenerator(ChatAgent, Generator):
    """A chat model through :class:`tasks.agents.chat.ChatAgent` with the options of
    ``config``: ``model`` is resolved in the models table (endpoint, key, prices;
    ``data/models.yaml`` + ``QUERYLAB_MODELS``), a model in no file falls back to the endpoint
    of ``settings`` (``QUERYLAB_OPENAI_BASE_URL`` / ``QUERYLAB_OPENAI_API_KEY``) and is unpriced
    (cost null). Infrastructure errors (408/429/5xx, timeouts, connection) are retried by
    :class:`tasks.core.llm.ChatModel` (``config.api_retries``, backoff honouring
    ``Retry-After``); a call that still fails comes back as an :class:`AgentReply` with
    ``error`` set. ``cache``: the shared :class:`tasks.core.llm.ResponseCache` (None: no cache).
    Raises :class:`GeneratorConfigError` when the model cannot be resolved (no endpoint,
    missing key).
    """

    def __init__(
        self,
        model: str,
        settings: Settings,
        config: GenerationConfig,
        cache: ResponseCache | None = None,
    ):
        super().__init__(model, settings, config.agent_options(), cache, GeneratorConfigError)
        self.config = config

    def reply(self, query_id: str, messages: list[dict], attempt: int) -> AgentReply | None:
        # trial 0: one generation per (model, query); every attempt's conversation is longer
        # than the previous one's, so attempts never share a cache entry
        return self.ask(messages, None, 0, attempt)


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

    def model(name: str) -> OpenAIGenerator:
        cache = ResponseCache(artifacts_root, config.cache) if artifacts_root else None
        return OpenAIGenerator(name, settings or Settings.from_env(), config, cache)

    return suite_agent(spec, "text2sql", oracle=OracleGenerator, replay=ReplayGenerator,
                       model=model, noun="generator", error=GeneratorConfigError)


def check_generator_spec(spec: str) -> None:
    """Raise :class:`GeneratorConfigError` unless ``spec`` is ``oracle``, ``openai:<model>`` or
    ``replay:<path>`` with an existing path (checked before any work is mapped)."""
    parse_agent_spec(spec, "text2sql", "generator", GeneratorConfigError, check=True)


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


__all__ = [
    "RETRY_PROMPT",
    "SYSTEM_PROMPT",
    "Generator",
    "GeneratorConfigError",
    "OpenAIGenerator",
    "OracleGenerator",
    "ReplayGenerator",
    "build_prompt",
    "check_generator_spec",
    "extract_sql",
    "generate_with_validation",
    "make_generator",
]
