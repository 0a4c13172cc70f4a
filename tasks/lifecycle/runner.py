"""Running and scoring lifecycle items, one (agent, item) at a time.

:func:`run_item` asks the agent (one call, or one per graph node / debugging round / expert
turn), scores the answer with :mod:`tasks.lifecycle.metrics` and returns one
:data:`schemas.lifecycle.RESULTS` row plus one :data:`schemas.lifecycle.CALLS` row per call.
How each phase is asked and scored:

- **design** — one call; the answer is read by :func:`tasks.lifecycle.schema.parse_design`
  (JSON or DDL); ACC-Entity/Data/Key against the reference group (0 when unreadable).
- **implementation** — one call; the SQL is executed in a sandboxed in-memory SQLite database
  and the created schema scored: T-Level, F-Level, ``ddl_executes``.
- **text2sql** — one call; EX on the item's database (its schema variant), rows compared with
  test-suite semantics (order only when the gold query has a top-level ORDER BY).
- **progressive** — one call per node of the (possibly perturbed) graph, in order; each call
  shows the question, the graph outline and the SQL fragments of the earlier nodes *as the
  graph gives them* (teacher forcing: the model's own earlier answers are not fed back, so a
  perturbation is a controlled change of the context and errors do not cascade); node EX
  against the node's gold SQL; ``g_ex`` = mean node EX, ``final_ex`` = EX of the last node.
- **dml** — one call; the statement runs on a private copy of the database and every table is
  compared with the expected post-state (``state_match``).
- **debug** — up to ``debug_rounds`` calls: after an attempt that fails with an SQLite error the
  model gets the error in a new user turn; ``ex_single`` = EX of the first attempt,
  ``ex_multi`` = EX of the last attempt (an attempt that executes ends the item).
- **assigner** — one call; the expert set is read by
  :func:`tasks.lifecycle.maintenance.parse_experts`; accuracy and Jaccard.
- **expert** — a tool-calling loop over :class:`tasks.lifecycle.maintenance.MetricsAPI` (at
  most ``expert_max_turns`` calls; a reply without tool calls ends it); tool-call correctness.

API errors and unreadable answers score 0 (never retried here: the ``openai`` client already
retried infrastructure errors); a replay without an answer for an item scores 0 with
``error`` saying so.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.lifecycle import RESULT_METRICS, LifecycleConfig
from tasks.lifecycle.agents import Agent, AgentReply
from tasks.lifecycle.maintenance import TOOLS, MetricsAPI, call_key, parse_experts
from tasks.lifecycle.metrics import (
    assigner_scores,
    design_scores,
    implementation_scores,
    state_difference,
    tool_call_scores,
)
from tasks.lifecycle.schema import (
    DDLError,
    Schema,
    SchemaParseError,
    execute_ddl,
    parse_design,
    run_readonly,
)
from tasks.scoring.result_match import results_match
from tasks.text2sql.spider import run_sqlite

__all__ = [
    "SYSTEM_PROMPTS",
    "RunContext",
    "db_path",
    "execution_accuracy",
    "oracle_answer",
    "progressive_prompt",
    "run_item",
]

SYSTEM_PROMPTS = {
    "design": "You are a database designer. You turn requirements into relational schemas.",
    "implementation": "You are a database engineer who writes SQLite DDL.",
    "text2sql": "You are an expert data analyst who writes SQLite queries. Answer with exactly "
    "one SQL query in a ```sql code block.",
    "progressive": "You are an expert data analyst who writes SQLite queries step by step. "
    "Answer with exactly one SQL query in a ```sql code block.",
    "dml": "You are a database administrator who writes SQLite data-modification statements.",
    "debug": "You are an SQL expert who repairs broken SQLite queries. Answer with the corrected "
    "query in a ```sql code block.",
    "assigner": "You coordinate a team of database diagnosis experts and decide who "
    "investigates an alert.",
}
DEBUG_RETRY_PROMPT = (
    "SQLite rejected the corrected query:\n{error}\n\n"
    "Fix it. Answer with the corrected SQL query only, in a ```sql code block."
)


@dataclass
class RunContext:
    """What running items needs besides the agent: ``databases`` (the manifest written by
    :func:`tasks.lifecycle.items.prepare_databases`), ``config`` and the maintenance
    ``catalogue`` (loaded on first use)."""

    databases: dict
    config: LifecycleConfig
    catalogue: dict | None = None

    def maintenance(self) -> dict:
        if self.catalogue is None:
            from tasks.lifecycle.maintenance import load_catalogue

            self.catalogue = load_catalogue()
        return self.catalogue


def db_path(databases: dict, db_id: str, variant: str = "original") -> Path:
    """The SQLite file of ``db_id`` (``chinook`` or a Spider id) in ``variant``. Raises
    KeyError naming what is missing from the databases manifest."""
    if variant != "original":
        try:
            return Path(databases["variants"][db_id][variant])
        except KeyError:
            raise KeyError(f"no {variant} variant of database {db_id!r} was built") from None
    if db_id == "chinook" and databases.get("chinook"):
        return Path(databases["chinook"])
    try:
        return Path(databases["spider"][db_id])
    except KeyError:
        raise KeyError(f"database {db_id!r} was not built") from None


def _extract_sql(text: str | None) -> str:
    from tasks.text2sql.generators import extract_sql

    return extract_sql(text)


def execution_accuracy(
    path: str | Path, gold_sql: str, pred_sql: str | None, ordered: bool, timeout_ms: int
) -> tuple[bool, str | None]:
    """``(EX, error)`` of ``pred_sql`` against ``gold_sql`` on ``path``: the prediction runs
    through :func:`tasks.lifecycle.schema.run_readonly` (read-only, no ATTACH); False with the
    SQLite message when it fails, ``"no SQL in the answer"`` when it is empty. Raises
    ``sqlite3.Error`` when the gold query fails (a dataset bug).

    This is a *score* of one prediction against the gold query (execution accuracy, as in
    :func:`tasks.text2sql.spider.score_execution_accuracy`), not the equivalence method
    :func:`tasks.equivalence.methods.execution_match`, which gives a *verdict* on two queries of
    a pair (symmetric; any engine; an arbitrary choice the SQL leaves to the engine is
    ``nondeterministic``, one failing query is ``error_on_instance``, not a mismatch). Here
    a failing prediction scores False, a failing gold query raises, and differing results are
    a miss whatever the reason."""
    gold = run_sqlite(path, gold_sql, timeout_ms)
    if not pred_sql or not pred_sql.strip():
        return False, "no SQL in the answer"
    try:
        pred = run_readonly(path, pred_sql, timeout_ms)
    except (sqlite3.Error, sqlite3.Warning, ValueError) as e:
        return False, str(e) or type(e).__name__
    return results_match(gold, pred, ordered=ordered), None


def progressive_prompt(item: dict, index: int) -> str:
    """The user turn asking for node ``index`` of a progressive item's (shown) graph."""
    nodes = item["context"]["nodes"]
    node = nodes[index]
    outline = "\n".join(
        f"- {n['id']} (depends on: {', '.join(n['depends_on']) or 'nothing'}): {n['description']}"
        for n in nodes
    )
    earlier = "\n\n".join(f"{n['id']}:\n```sql\n{n['sql']}\n```" for n in nodes[:index])
    last = index == len(nodes) - 1
    text = (
        f"{item['prompt']}\n\nThe question is solved step by step along this reasoning graph:\n"
        f"{outline}\n\n"
    )
    if earlier:
        text += f"SQL written for the earlier steps:\n\n{earlier}\n\n"
    text += (
        f"Write the SQL for step {node['id']} ({node['description']}): one complete SQLite "
        "query whose result is the result of that step"
        + (" - it is the final step, so its result answers the question" if last else "")
        + ". Answer with the SQL in a ```sql code block."
    )
    return text


def oracle_answer(item: dict, step: int) -> str | list[dict] | None:
    """The reference answer to call ``step`` of ``item``: text, or for an Expert's first turn
    the list of expected tool calls; None when the reference has nothing more to say."""
    phase, ref, ctx = item["phase"], item["reference"], item["context"]
    if phase == "design":
        return None if step else "```json\n" + json.dumps(ref["schema"], indent=1) + "\n```"
    if phase == "implementation":
        return None if step else f"```sql\n{ref['ddl']}\n```"
    if phase in ("text2sql", "dml"):
        return None if step else f"```sql\n{ref['sql']}\n```"
    if phase == "debug":
        return f"```sql\n{ref['sql']}\n```"
    if phase == "progressive":
        nodes = ctx["nodes"]
        return f"```sql\n{ref['nodes'][nodes[step]['id']]}\n```" if step < len(nodes) else None
    if phase == "assigner":
        return None if step else "```json\n" + json.dumps({"experts": ref["experts"]}) + "\n```"
    if phase == "expert":
        if step == 0:
            return ref["calls"]
        if step == 1:
            return "Diagnosis: " + "; ".join(
                f"{c['name']}({', '.join(f'{k}={v}' for k, v in c['arguments'].items())})"
                for c in ref["calls"]
            )
        return None
    raise ValueError(f"unknown phase {phase!r}")


class _Recorder:
    def __init__(self, agent: Agent, item: dict, run_id: str):
        self.agent, self.item, self.run_id = agent, item, run_id
        self.calls: list[dict] = []

    def ask(
        self, step: int, messages: list[dict], tools: list[dict] | None = None
    ) -> AgentReply | None:
        reply = self.agent.respond(self.item, step, messages, tools)
        if reply is None:
            return None
        self.calls.append(
            {
                "run_id": self.run_id,
                "model": self.agent.label,
                "phase": self.item["phase"],
                "item_id": self.item["item_id"],
                "step": step,
                "response": reply.content,
                "tool_calls": json.dumps(
                    [{"name": c["name"], "arguments": c["arguments"]} for c in reply.tool_calls]
                )
                if reply.tool_calls
                else None,
                "tool_results": None,
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "cost_usd": reply.cost_usd,
                "latency_s": reply.latency_s,
                "error": reply.error,
            }
        )
        return reply


def _no_answer(agent: Agent, item: dict) -> str:
    return f"{agent.label} has no answer for {item['item_id']}"


def _messages(phase: str, prompt: str) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEM_PROMPTS[phase]},
        {"role": "user", "content": prompt},
    ]


def run_item(agent: Agent, item: dict, ctx: RunContext, run_id: str) -> tuple[dict, list[dict]]:
    """Ask ``agent`` to solve ``item`` (reference/context already decoded from JSON) and score
    it (module docstring). Returns ``(result row, call rows)``. Raises ValueError for an
    unknown phase, KeyError when the item's database is not in ``ctx.databases``."""
    phase = item["phase"]
    rec = _Recorder(agent, item, run_id)
    row: dict[str, Any] = {
        "run_id": run_id,
        "model": agent.label,
        "phase": phase,
        "item_id": item["item_id"],
        "base_id": item["base_id"],
        "db_id": item["db_id"],
        "variant": item["variant"],
        "level": int(item["level"]),
        "answer": None,
        "error": None,
        "rounds": 1,
        **{m: None for m in RESULT_METRICS},
    }
    details: dict[str, Any] = {}
    handler = _HANDLERS.get(phase)
    if handler is None:
        raise ValueError(f"unknown phase {phase!r}")
    handler(rec, item, ctx, row, details)
    calls = rec.calls
    row["n_calls"] = len(calls)
    row["prompt_tokens"] = sum(c["prompt_tokens"] for c in calls)
    row["completion_tokens"] = sum(c["completion_tokens"] for c in calls)
    costs = [c["cost_usd"] for c in calls]
    row["cost_usd"] = None if any(c is None for c in costs) else float(sum(costs))
    row["latency_s"] = float(sum(c["latency_s"] for c in calls))
    row["details"] = json.dumps(details, default=str) if details else None
    return row, calls


def _single(rec: _Recorder, item: dict, row: dict) -> str | None:
    """One call with the phase's system prompt; returns the reply text or None (``row``'s
    error set)."""
    reply = rec.ask(0, _messages(item["phase"], item["prompt"]))
    if reply is None:
        row["error"] = _no_answer(rec.agent, item)
        return None
    if reply.error:
        row["error"] = reply.error
        return None
    row["answer"] = reply.content
    return reply.content


def _design(rec, item, ctx, row, details):
    ref = Schema.from_dict(item["reference"]["schema"])
    has_keys = any(t.primary_key or t.foreign_keys for t in ref.tables)
    zero = {"acc_entity": 0.0, "acc_data": 0.0, "acc_key": 0.0 if has_keys else None}
    text = _single(rec, item, row)
    if text is None:
        row.update(zero)
        return
    try:
        designed = parse_design(text)
    except SchemaParseError as e:
        row.update(zero, error=f"unreadable design: {e}")
        return
    s = design_scores(ref, designed)
    row.update(acc_entity=s["acc_entity"], acc_data=s["acc_data"], acc_key=s["acc_key"])
    details.update({k: v for k, v in s.items() if not k.startswith("acc_")})


def _implementation(rec, item, ctx, row, details):
    ref = Schema.from_dict(item["reference"]["schema"])
    text = _single(rec, item, row)
    created = None
    if text is not None:
        sql = _extract_sql(text)
        row["answer"] = sql or text
        try:
            created = execute_ddl(sql, ctx.config.timeout_ms) if sql else None
            if created is None:
                row["error"] = "no SQL in the answer"
        except DDLError as e:
            row["error"] = f"DDL failed: {e}"
    s = implementation_scores(ref, created)
    row.update(t_level=s["t_level"], f_level=s["f_level"], ddl_executes=float(created is not None))
    details.update({k: v for k, v in s.items() if k not in ("t_level", "f_level")})


def _text2sql(rec, item, ctx, row, details):
    ref = item["reference"]
    text = _single(rec, item, row)
    if text is None:
        row["ex"] = 0.0
        return
    sql = _extract_sql(text)
    row["answer"] = sql
    path = db_path(ctx.databases, item["db_id"], item["variant"])
    ok, err = execution_accuracy(path, ref["sql"], sql, ref["ordered"], ctx.config.timeout_ms)
    row.update(ex=float(ok), error=err)


def _progressive(rec, item, ctx, row, details):
    ref = item["reference"]
    nodes = item["context"]["nodes"]
    path = db_path(ctx.databases, item["db_id"], item["variant"])
    results = []
    sqls = []
    for i, node in enumerate(nodes):
        msgs = _messages("progressive", progressive_prompt(item, i))
        reply = rec.ask(i, msgs)
        if reply is None or reply.error:
            err = _no_answer(rec.agent, item) if reply is None else reply.error
            results.append({"node": node["id"], "ex": False, "error": err})
            sqls.append(None)
            continue
        sql = _extract_sql(reply.content)
        sqls.append(sql)
        ok, err = execution_accuracy(
            path, ref["nodes"][node["id"]], sql, ref["ordered"][node["id"]], ctx.config.timeout_ms
        )
        results.append({"node": node["id"], "ex": ok, "error": err})
    ex = [r["ex"] for r in results]
    row.update(
        g_ex=sum(ex) / len(ex) if ex else 0.0,
        final_ex=float(ex[-1]) if ex else 0.0,
        rounds=len(nodes),
        answer=sqls[-1] if sqls else None,
        error=next((r["error"] for r in results if r["error"]), None),
    )
    details["nodes"] = results


def _dml(rec, item, ctx, row, details):
    from tasks.lifecycle.dml import dml_state

    ref = item["reference"]
    text = _single(rec, item, row)
    row["state_match"] = 0.0
    if text is None:
        return
    sql = _extract_sql(text)
    row["answer"] = sql
    if not sql:
        row["error"] = "no SQL in the answer"
        return
    try:
        state = dml_state(db_path(ctx.databases, item["db_id"]), sql, ctx.config.timeout_ms)
    except (sqlite3.Error, sqlite3.Warning, ValueError) as e:
        row["error"] = str(e) or type(e).__name__
        return
    diff = state_difference(ref["expected_state"], state)
    row["state_match"] = float(not diff)
    if diff:
        details["tables_differing"] = diff
        row["error"] = f"database state differs in {', '.join(diff)}"


def _debug(rec, item, ctx, row, details):
    ref = item["reference"]
    path = db_path(ctx.databases, item["db_id"])
    msgs = _messages("debug", item["prompt"])
    attempts = []
    for rnd in range(ctx.config.debug_rounds):
        reply = rec.ask(rnd, msgs)
        if reply is None or reply.error:
            err = _no_answer(rec.agent, item) if reply is None else reply.error
            if not attempts:
                attempts.append({"round": rnd, "sql": None, "ex": False, "error": err})
            break
        sql = _extract_sql(reply.content)
        ok, err = execution_accuracy(path, ref["sql"], sql, ref["ordered"], ctx.config.timeout_ms)
        attempts.append({"round": rnd, "sql": sql, "ex": ok, "error": err})
        executed = err is None
        if ok or executed or not sql:
            break
        msgs = msgs + [
            {"role": "assistant", "content": reply.content or ""},
            {"role": "user", "content": DEBUG_RETRY_PROMPT.format(error=err)},
        ]
    row.update(
        ex_single=float(attempts[0]["ex"]),
        ex_multi=float(attempts[-1]["ex"]),
        rounds=len(attempts),
        answer=attempts[-1]["sql"],
        error=attempts[-1]["error"],
    )
    details["attempts"] = attempts
    details["kind"] = ref["kind"]


def _assigner(rec, item, ctx, row, details):
    expected = item["reference"]["experts"]
    text = _single(rec, item, row)
    chosen = parse_experts(text, item["context"]["expert_names"]) if text is not None else []
    s = assigner_scores(expected, chosen)
    row.update(assigner_accuracy=s["accuracy"], assigner_jaccard=s["jaccard"])
    details["chosen"] = chosen


def _expert(rec, item, ctx, row, details):
    catalogue = ctx.maintenance()
    api = MetricsAPI(item["context"]["scenario"], catalogue)
    msgs: list[dict] = [
        {"role": "system", "content": item["context"]["system"]},
        {"role": "user", "content": item["prompt"]},
    ]
    made: list[dict] = []
    final = None
    turns = 0
    for turn in range(ctx.config.expert_max_turns):
        reply = rec.ask(turn, msgs, TOOLS)
        if reply is None or reply.error:
            if not made and final is None:
                row["error"] = _no_answer(rec.agent, item) if reply is None else reply.error
            break
        turns += 1
        if not reply.tool_calls:
            final = reply.content
            break
        msgs = msgs + [
            {
                "role": "assistant",
                "content": reply.content,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in reply.tool_calls
                ],
            }
        ]
        outputs = []
        for c in reply.tool_calls:
            result, ok = api.call(c["name"], c["arguments"])
            made.append({"name": c["name"], "arguments": c["arguments"], "success": ok})
            outputs.append(json.loads(result))
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": result})
        rec.calls[-1]["tool_results"] = json.dumps(outputs)
    else:
        if row["error"] is None:
            row["error"] = f"no final answer within {ctx.config.expert_max_turns} turns"
    expected = {call_key(c["name"], c["arguments"]) for c in item["reference"]["calls"]}
    got = {k for k in (call_key(c["name"], c["arguments"]) for c in made) if k is not None}
    s = tool_call_scores(expected, got)
    row.update(
        tool_call_correctness=s["correctness"],
        tool_precision=s["precision"],
        tool_recall=s["recall"],
        rounds=max(turns, 1),
        answer=final,
    )
    details["tool_calls"] = made


_HANDLERS = {
    "design": _design,
    "implementation": _implementation,
    "text2sql": _text2sql,
    "progressive": _progressive,
    "dml": _dml,
    "debug": _debug,
    "assigner": _assigner,
    "expert": _expert,
}
