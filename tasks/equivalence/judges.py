"""LLM judges of SQL equivalence: three zero-shot prompt techniques for two notions, one model
call each (temperature 0), robust verdict parsing, and execution of any counterexample database
the model proposes (a claimed counterexample is checked, never believed).

Techniques (described in Zhao et al., "LLM-SQL-Solver: Can LLMs Determine SQL Equivalence?";
the prompts below are our own wording):

- ``counter_example``: try to build a database on which the two queries disagree, then decide;
- ``miniature_mull``: invent a tiny database, run both queries on it by hand, then mull over
  edits to it that could make the results differ, then decide;
- ``explain_compare``: explain what each query computes, list their logical differences, judge
  which ones matter, then decide.

Notions: ``semantic`` (same result on every database allowed by the schema) and ``relaxed``
(same logic up to trivial edits). The paper pairs Miniature & Mull with semantic and Explain &
Compare with relaxed equivalence; here every technique can be asked about either notion.

Model calls go through the shared model layer :mod:`tasks.core.llm` (:func:`judge_model`): the
judge model is resolved in the models table (``data/models.yaml`` + ``QUERYLAB_MODELS``:
endpoint, key, USD prices), a model in no file runs at ``QUERYLAB_OPENAI_BASE_URL`` /
``QUERYLAB_OPENAI_API_KEY`` unpriced (cost 0, ``priced=False``); the ``openai`` client with
querylab's infra-only retries (408/429/5xx, timeouts, connection errors; ``Retry-After``
honoured), the response cache under ``<artifacts>/cache/judge`` and the optional per-model
Prefect limits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from schemas.equivalence import NOTIONS, TECHNIQUES, JudgeOptions
from schemas.settings import Settings
from tasks.core.llm import (
    JUDGE_CACHE,
    ChatModel,
    LLMCallError,
    ResponseCache,
    resolve_model,
    settings_env,
)

SYSTEM_PROMPT = (
    "You are an expert in SQL semantics. You decide whether two SQL queries written against "
    "the same schema are equivalent. Reason carefully and concretely, and follow the answer "
    "format you are given exactly."
)

NOTION_TEXT = {
    "semantic": (
        "Two queries are SEMANTICALLY EQUIVALENT when, for every database that satisfies the "
        "schema below (its column types, primary keys, unique keys, NOT NULL columns and "
        "foreign keys), they return the same result: the same rows with the same number of "
        "duplicates. Row order counts only when both queries sort their output with ORDER BY; "
        "column names and aliases do not count. One database on which the results differ is "
        "enough to make them NOT EQUIVALENT, even if that database is unusual (empty tables, "
        "NULL values, duplicate values, ties). A database on which one query raises an error "
        "(a failed type conversion, a scalar subquery returning two rows) does not count: an "
        "error is not a result."
    ),
    "relaxed": (
        "Two queries are RELAXED EQUIVALENT when they express the same logic, so that a person "
        "who asked the question behind the first query would accept the second query's answer. "
        "Differences that only touch trivial parts do not matter: output column names and "
        "aliases, the order of output columns, row order when the task does not ask for one, "
        "how a condition is spelled, or a redundant clause. They are NOT EQUIVALENT when the "
        "second query answers a different question: other rows, other groups, other "
        "aggregates, or a different handling of the cases the question is about."
    ),
}

TECHNIQUE_TEXT = {
    "counter_example": (
        "Method: look for a counterexample.\n"
        "1. Name the places where the two queries could behave differently (joins, filters, "
        "NULL handling, duplicates, grouping, aggregates, sorting and LIMIT, empty tables).\n"
        "2. For the most promising place, build a small database that satisfies the schema and "
        "compute the result of each query on it, row by row.\n"
        "3. If the results differ, you have a counterexample. If every attempt fails, explain "
        "why no counterexample can exist.\n"
        "4. Decide."
    ),
    "miniature_mull": (
        "Method: run the queries on a miniature database, then mull it over.\n"
        "1. Invent a tiny database for the schema: two or three rows per table the queries "
        "read, respecting its keys.\n"
        "2. Execute both queries on it by hand and write down both results.\n"
        "3. Mull over it: change the tiny database step by step (add or remove a row, put a "
        "NULL, repeat a value, create a tie, empty a table) and re-run both queries each time, "
        "trying to make the results differ.\n"
        "4. Decide. If some version of the tiny database gives different results, it is your "
        "counterexample."
    ),
    "explain_compare": (
        "Method: explain, then compare.\n"
        "1. Explain in plain words what Query 1 returns.\n"
        "2. Explain in plain words what Query 2 returns.\n"
        "3. List every logical difference between the two explanations and the two queries.\n"
        "4. For each difference, say whether it changes the answer or is trivial under the "
        "definition above.\n"
        "5. Decide."
    ),
}

ANSWER_FORMAT = (
    "Answer format:\n"
    "- Write your reasoning first.\n"
    "- If you decide the queries are not equivalent and you have a database on which their "
    "results differ, give it as ONE ```sql code block holding only INSERT INTO statements "
    "for tables of the schema (the tables already exist, with the schema's keys).\n"
    "- End with one line that is exactly `VERDICT: EQUIVALENT` or `VERDICT: NOT EQUIVALENT`."
)

USER_TEMPLATE = """{notion}

{technique}

Schema ({dialect} dialect):
```sql
{schema}
```

Query 1:
```sql
{sql1}
```

Query 2:
```sql
{sql2}
```

{answer_format}"""


def build_messages(technique: str, notion: str, sql1: str, sql2: str, schema_ddl: str,
                   dialect: str = "duckdb") -> list[dict]:
    """The chat messages (system + user) for one judge call.

    Raises ValueError for an unknown technique or notion."""
    if technique not in TECHNIQUES:
        raise ValueError(f"unknown technique {technique!r}; use one of {list(TECHNIQUES)}")
    if notion not in NOTIONS:
        raise ValueError(f"unknown notion {notion!r}; use one of {list(NOTIONS)}")
    user = USER_TEMPLATE.format(
        notion=NOTION_TEXT[notion], technique=TECHNIQUE_TEXT[technique], dialect=dialect,
        schema=schema_ddl.strip(), sql1=sql1.strip(), sql2=sql2.strip(),
        answer_format=ANSWER_FORMAT,
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


# --------------------------------------------------------------------------------------------
# Parsing replies
# --------------------------------------------------------------------------------------------

_ADVERB = r"(?:(?:semantically|logically|relaxed|strictly|fully|truly|really)[\s_-]+)?"
_NEG = rf"(?:not[\s_-]+{_ADVERB}equivalent|non[\s_-]?equivalent|inequivalent|nonequivalent|different)"
_POS = rf"(?:{_ADVERB}equivalent|same|identical)"
_WORD = rf"({_NEG}|{_POS}|yes|no|true|false)"
_VERDICT_LINE = re.compile(
    rf"(?:final\s+)?(?:verdict|answer|decision|conclusion)\s*[*_`]*\s*(?:is\s*)?[:=\-–]?\s*[*_`\"']*\s*{_WORD}\b",
    re.IGNORECASE,
)
_EQUIVALENT_FLAG = re.compile(r'"?(?:is_)?equivalent"?\s*[:=]\s*"?(true|false|yes|no)\b', re.IGNORECASE)
_PHRASE = re.compile(
    rf"\b(?:are|is|be)\s+({_NEG.replace('|different', '')}|{_ADVERB}equivalent)\b|\b({_NEG.replace('|different', '')})\b",
    re.IGNORECASE,
)


def _word_verdict(word: str) -> str:
    w = re.sub(r"[\s_-]+", " ", word.strip().lower())
    if w in ("yes", "true", "same", "identical"):
        return "equivalent"
    if w in ("no", "false", "different"):
        return "not_equivalent"
    if w.startswith(("not ", "non", "inequivalent")):
        return "not_equivalent"
    return "equivalent"


def parse_verdict(text: str | None) -> str:
    """``equivalent``, ``not_equivalent`` or ``unparsed`` from a judge's reply.

    Robust to formatting: takes the LAST verdict-like statement — a ``VERDICT:`` / ``Answer:``
    / ``Final decision:`` line in any case, with markdown emphasis or quotes, words such as
    ``NOT_EQUIVALENT``, ``non-equivalent``, ``not semantically equivalent``, ``Yes``/``No``;
    else a JSON-ish ``"equivalent": true``; else the last phrase "are (not) equivalent" /
    "not equivalent" in the text."""
    if not text:
        return "unparsed"
    matches = list(_VERDICT_LINE.finditer(text))
    if matches:
        return _word_verdict(matches[-1].group(1))
    flags = list(_EQUIVALENT_FLAG.finditer(text))
    if flags:
        return "equivalent" if flags[-1].group(1).lower() in ("true", "yes") else "not_equivalent"
    phrases = list(_PHRASE.finditer(text))
    if phrases:
        last = phrases[-1]
        return _word_verdict(last.group(1) or last.group(2))
    return "unparsed"


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_INSERT_LINE = re.compile(r"^\s*INSERT\s+INTO\b.*?;\s*$", re.IGNORECASE | re.MULTILINE | re.DOTALL)


def extract_counterexample(text: str | None) -> str | None:
    """The counterexample database a reply proposes: the last fenced code block holding an
    INSERT statement (CREATE TABLE statements in it are kept), else the INSERT statements
    written outside code blocks; None when there is none."""
    if not text:
        return None
    blocks = [m.group(2).strip() for m in _FENCE.finditer(text)]
    with_insert = [b for b in blocks if re.search(r"\bINSERT\s+INTO\b", b, re.IGNORECASE)]
    if with_insert:
        return with_insert[-1] + ("\n" if not with_insert[-1].endswith("\n") else "")
    outside = _FENCE.sub("", text)
    lines = [m.group(0).strip() for m in re.finditer(r"(?im)^\s*INSERT\s+INTO\b[^;]*;", outside)]
    return "\n".join(lines) + "\n" if lines else None


def explanation_of(text: str | None) -> str | None:
    """The reasoning part of a reply: the text without the counterexample code block and the
    final verdict line."""
    if not text:
        return None
    body = _FENCE.sub(lambda m: "" if re.search(r"\bINSERT\s+INTO\b", m.group(2), re.IGNORECASE) else m.group(0), text)
    body = re.sub(r"(?im)^[*_`\s]*verdict\s*[*_`]*\s*[:=].*$", "", body)
    return re.sub(r"\n{3,}", "\n\n", body).strip() or None


# --------------------------------------------------------------------------------------------
# Calling the model
# --------------------------------------------------------------------------------------------


@dataclass
class JudgeOutcome:
    """One judge call: ``verdict`` (``equivalent``/``not_equivalent``/``unparsed``/``error``),
    ``response`` the raw reply, ``explanation`` its reasoning, ``counterexample`` the proposed
    database (SQL) or None, tokens as reported by the API, ``cost_usd`` from the models-table
    prices (0 for an unpriced model, a cache hit or a failed call), ``seconds`` wall time
    (retry waits included), ``error`` the API error message, ``finish_reason``, ``priced``
    (False: the model is in no models file), ``cache_hit`` and HTTP ``attempts``."""

    verdict: str
    response: str | None = None
    explanation: str | None = None
    counterexample: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    error: str | None = None
    finish_reason: str | None = None
    priced: bool = True
    cache_hit: bool = False
    attempts: int = 0


def judge_model(
    model: str,
    settings: Settings | None = None,
    options: JudgeOptions | None = None,
    artifacts_root: str | None = None,
) -> ChatModel:
    """The judge ``model`` (as in ``judge:<technique>:<notion>:<model>``) ready to call:
    resolved with :func:`tasks.core.llm.resolve_model` (models table, else the endpoint of
    ``settings``, default :meth:`Settings.from_env`), with ``options`` (temperature,
    ``max_tokens`` sent as ``max_completion_tokens``, HTTP ``timeout_s`` per attempt,
    ``api_retries``, ``cache`` mode) and the response cache under ``artifacts_root`` (None: no
    cache). Raises ValueError (:class:`tasks.core.llm.AgentConfigError`) when the model has no
    endpoint or its key is missing."""
    options = options or JudgeOptions()
    settings = settings or Settings.from_env()
    resolved = resolve_model(model, env=settings_env(settings))
    cache = (ResponseCache(artifacts_root, options.cache, namespace=JUDGE_CACHE)
             if artifacts_root else None)
    return ChatModel(resolved, options.agent_options(), cache)


def run_judge(
    chat: ChatModel, technique: str, notion: str, *, sql1: str, sql2: str,
    schema_ddl: str, dialect: str = "duckdb", trial: int = 0,
) -> JudgeOutcome:
    """Ask the judge model ``chat`` (:func:`judge_model`; zero-shot, its options' temperature,
    default 0) whether two queries are equivalent under ``notion`` with ``technique``; parse
    the verdict and any counterexample. One model call; ``trial`` is its response-cache trial
    index (with the messages it keys the cache; :mod:`tasks.equivalence.methods` passes a stable number
    per pair id so that two pairs with the same queries are still two samples).

    API errors (after the shared retries) are returned as ``verdict="error"`` (never raised);
    ValueError for an unknown technique or notion."""
    messages = build_messages(technique, notion, sql1, sql2, schema_ddl, dialect)
    priced = chat.resolved.priced
    try:
        resp, rec = chat.complete(messages, None, trial=trial, call_index=0)
    except LLMCallError as exc:
        rec = exc.record
        return JudgeOutcome("error", error=str(exc), seconds=rec.latency_s, priced=priced,
                            attempts=rec.attempts)
    choice = resp.choices[0]
    text = choice.message.content
    return JudgeOutcome(
        verdict=parse_verdict(text),
        response=text,
        explanation=explanation_of(text),
        counterexample=extract_counterexample(text),
        prompt_tokens=rec.prompt_tokens,
        completion_tokens=rec.completion_tokens,
        cost_usd=rec.cost_usd,
        seconds=rec.latency_s,
        finish_reason=choice.finish_reason,
        priced=priced,
        cache_hit=rec.cache_hit,
        attempts=rec.attempts,
    )
