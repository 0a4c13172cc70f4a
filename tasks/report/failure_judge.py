"""Optional LLM-judge stage for failure modes: a model labels each incorrect trial with the same
taxonomy (FM1–FM5) as the deterministic classifier, and its labels are written beside the
deterministic ones (``report/failure_judge.parquet``), never replacing them.

The judge is called through the shared model layer :mod:`tasks.core.llm` (a
:class:`tasks.core.llm.ChatModel`: models table, ``openai`` client at a configurable ``base_url``,
infra-only retries of 408/429/5xx/timeouts with backoff honouring ``Retry-After``, response
cache, optional per-model limits). Each judged trial gets one chat completion; a reply that
names no mode, or a call that failed after those retries, is recorded with
``failure_mode = null`` and the reason in ``error``. The stage is idempotent per (run, judge
model): trials already judged by that model without error are skipped; trials judged before
with an error (``rejudge``) are asked again past the response cache, so a cached unreadable
reply is not served twice.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re

import polars as pl

from schemas.report import FAILURE_JUDGE, FAILURE_MODES
from tasks.core.llm import ChatModel, LLMCallError

JUDGE_SYSTEM = """You are auditing a data agent that answered a question over several databases
with the tools list_db, query_db, execute_python and return_answer. Its final answer was WRONG.
Label the main cause with exactly one failure mode of this taxonomy (Data Agent Benchmark):
FM1 other: anything else, including answering without using any tool.
FM2 wrong plan: the agent used the right data but its plan misses a required step (e.g. it did
    not reconcile differently formatted join keys, did not extract values written in free text,
    used raw instead of adjusted prices, or misread the question).
FM3 wrong data source: it never used a table or collection that the question needs.
FM4 wrong implementation: right sources and right plan, but a bug in the query or code.
FM5 runtime: API error, timeout, or an iteration, call or token limit stopped the agent.
Reply with a JSON object only: {"failure_mode": "FM<n>", "rationale": "<one sentence>"}."""

_MODE = re.compile(r"\bFM\s*([1-5])\b")

#: Characters kept per tool-call argument text and per prompt.
MAX_ARG_CHARS = 600
MAX_PROMPT_CHARS = 24_000


def parse_judge_reply(text: str | None) -> tuple[str | None, str | None, str | None]:
    """(failure_mode, rationale, error) from a judge reply.

    Accepts the requested JSON object (also inside a Markdown code fence) or, failing that, the
    first ``FM<n>`` in free text. Returns error ``"no failure mode in reply"`` when none is found.
    """
    if not text or not text.strip():
        return None, None, "empty reply"
    body = text.strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", body, re.DOTALL)
    if fence:
        body = fence.group(1).strip()
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        m = _MODE.search(str(obj.get("failure_mode", "")))
        if m:
            rationale = obj.get("rationale")
            return f"FM{m.group(1)}", (str(rationale) if rationale is not None else None), None
    m = _MODE.search(text)
    if m:
        return f"FM{m.group(1)}", text.strip()[:500], None
    return None, None, "no failure mode in reply"


def judge_prompt(
    question: str,
    ground_truth,
    answer: str | None,
    terminate_reason: str,
    error: str | None,
    calls: list[dict],
    requires: dict | None,
) -> str:
    """The user message for one incorrect trial: question, expected answer, the agent's answer
    and stop reason, the spec's required sources/operations, and the trajectory (each call's
    turn, tool, arguments cut to :data:`MAX_ARG_CHARS` and outcome)."""
    lines = [
        f"Question: {question}",
        f"Expected answer (ground truth): {json.dumps(ground_truth, default=str)}",
        f"Agent's answer: {answer if answer is not None else '(none)'}",
        f"Stop reason: {terminate_reason}" + (f" (error: {error})" if error else ""),
    ]
    if requires:
        lines.append(
            "Spec annotation — required sources: "
            f"{', '.join(requires.get('sources', [])) or '-'}; required operations: "
            f"{', '.join(requires.get('operations', [])) or '-'}"
        )
    lines.append(f"Trajectory ({len(calls)} tool calls):")
    if not calls:
        lines.append("(no tool calls)")
    for c in calls:
        args = c["arguments"]
        if len(args) > MAX_ARG_CHARS:
            args = args[:MAX_ARG_CHARS] + f"... [{len(c['arguments'])} chars]"
        status = "ok" if c["success"] else f"ERROR: {(c.get('error') or '')[:300]}"
        lines.append(f"- turn {c['turn']}: {c['tool']} {args} -> {status}")
    text = "\n".join(lines)
    if len(text) > MAX_PROMPT_CHARS:
        text = text[:MAX_PROMPT_CHARS] + "\n... [trajectory truncated]"
    return text


def judge_failures(
    labels: pl.DataFrame,
    trials: pl.DataFrame,
    tool_calls: pl.DataFrame,
    manifests: list[dict],
    chat: ChatModel,
    model: str | None = None,
    limit: int | None = None,
    skip: set[str] | None = None,
    rejudge: set[str] | None = None,
) -> pl.DataFrame:
    """Ask the judge model ``chat`` for the failure mode of each labelled (incorrect) trial.

    ``labels``: :func:`tasks.report.failure_modes.classify_failures` output (defines which trials and
    their order); ``trials`` / ``tool_calls``: the run's artifacts; ``manifests``: dataset
    manifests (question, ground truth, requirements); ``limit``: at most this many trials
    (in trial-key order); ``skip``: trial keys already judged; ``rejudge``: trial keys whose
    earlier judgement failed (asked with the response cache in ``refresh`` mode); ``model``:
    the ``model`` column (default ``chat.resolved.name``). Returns
    ``schemas.report.FAILURE_JUDGE`` columns, one row per judged trial. At most one model call
    per trial (a loop over the judged trials, not over rows of the run); the response-cache
    trial index is a stable number from the trial key.
    """
    model = model or chat.resolved.name
    queries = {(m["name"], q["id"]): q for m in manifests for q in m.get("queries", [])}
    todo = labels.filter(~pl.col("trial_key").is_in(list(skip or ())))
    if limit is not None:
        todo = todo.head(limit)
    keys = todo["trial_key"].to_list()
    info = {
        r["trial_key"]: r
        for r in trials.filter(pl.col("trial_key").is_in(keys))
        .select("trial_key", "answer", "error", "terminate_reason", "run_id")
        .iter_rows(named=True)
    }
    by_trial: dict[str, list[dict]] = {}
    if keys and tool_calls.height:
        calls = tool_calls.filter(pl.col("trial_key").is_in(keys)).sort("trial_key", "call_index")
        for (key,), part in calls.group_by("trial_key", maintain_order=True):
            by_trial[key] = part.select("turn", "tool", "arguments", "success", "error").to_dicts()
    rows = []
    for r in todo.iter_rows(named=True):
        t = info[r["trial_key"]]
        q = queries.get((r["dataset"], r["query_id"]), {})
        prompt = judge_prompt(
            q.get("question", f"(question {r['dataset']}/{r['query_id']} not found)"),
            q.get("ground_truth"),
            t["answer"],
            t["terminate_reason"],
            t["error"],
            by_trial.get(r["trial_key"], []),
            q.get("requires"),
        )
        row = {
            "run_id": t["run_id"],
            "trial_key": r["trial_key"],
            "model": model,
            "failure_mode": None,
            "rationale": None,
            "error": None,
            "prompt_tokens": 0,
            "completion_tokens": 0,
        }
        messages = [
            {"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": prompt},
        ]
        try:
            resp, rec = _ask(chat, messages, r["trial_key"], r["trial_key"] in (rejudge or ()))
        except LLMCallError as exc:
            row["error"] = str(exc)[:500]
        else:
            row["prompt_tokens"], row["completion_tokens"] = rec.prompt_tokens, rec.completion_tokens
            mode, rationale, err = parse_judge_reply(resp.choices[0].message.content)
            row.update(failure_mode=mode, rationale=rationale, error=err)
        rows.append(row)
    return pl.DataFrame(rows, schema=pl.from_arrow(FAILURE_JUDGE.empty_table()).schema)


def _ask(chat: ChatModel, messages: list[dict], trial_key: str, refresh: bool):
    """One judge call for ``trial_key``; ``refresh``: skip a cached response (and store the
    new one)."""
    trial = int.from_bytes(hashlib.sha256(trial_key.encode()).digest()[:6], "big")
    cache = chat.cache
    if refresh and cache is not None and cache.mode == "on":
        chat.cache = copy.copy(cache)
        chat.cache.mode = "refresh"
    try:
        return chat.complete(messages, None, trial=trial, call_index=0)
    finally:
        chat.cache = cache


def judge_agreement(labels: pl.DataFrame, judged: pl.DataFrame) -> pl.DataFrame:
    """Cross-tab of deterministic modes (rows) against the judge's (columns ``judge_FM1`` ...
    ``judge_FM5``, ``judge_none`` for unparsed replies) over the judged trials, plus the
    agreement share per deterministic mode."""
    j = labels.select("trial_key", "failure_mode").join(
        judged.select("trial_key", pl.col("failure_mode").alias("judge")), on="trial_key"
    )
    cols = [
        *[(pl.col("judge") == m).sum().cast(pl.Int64).alias(f"judge_{m}") for m in FAILURE_MODES],
        pl.col("judge").is_null().sum().cast(pl.Int64).alias("judge_none"),
        pl.len().cast(pl.Int64).alias("judged"),
        (pl.col("judge") == pl.col("failure_mode")).fill_null(False).mean().alias("agreement"),
    ]
    return j.group_by("failure_mode").agg(cols).sort("failure_mode")
