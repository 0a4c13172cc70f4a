"""Agents that answer a dataset question with the four tools.

- ``oracle``: runs the query's reference solution through the same :class:`ToolBox` and returns
  the output of its last step (offline, deterministic; must score 1.0).
- ``openai:<model>``: a ReAct loop over OpenAI Chat Completions tool calling, through the
  ``openai`` client with a configurable ``base_url`` (OpenAI, vLLM, Ollama, OpenRouter, ...).

Terminate reasons: ``return_answer`` (the agent answered), ``no_tool_call`` (the model replied
with text and no tool call; its text is taken as the answer), ``max_iterations``, ``error``
(the API failed or the reference solution broke).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import openai

from tasks.tools import TOOL_SCHEMAS, ToolBox, ToolOutcome

SYSTEM_PROMPT = """You are a data agent. Answer the user's question using the databases below.
Use the tools: list_db to see databases and schemas, query_db to run one read-only query,
execute_python to compute with earlier results (available as var_<call_id>), and
return_answer to give the final answer. Data may be spread over several databases whose keys
are formatted differently; some facts are only written inside free text.

Databases:
{databases}

Hints:
{hints}
"""


@dataclass
class ToolCallRecord:
    """One tool call in a trajectory: the model turn that asked for it and what it did."""

    turn: int
    outcome: ToolOutcome


@dataclass
class TrialOutcome:
    """The result of one trial: answer text (or None), terminate reason, error message, token
    counts, number of model calls, the tool-call trajectory, and wall time in seconds."""

    answer: str | None
    terminate_reason: str
    error: str | None = None
    n_llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    latency_s: float = 0.0


def system_prompt(manifest: dict) -> str:
    """The system prompt for a dataset: its databases (engine, description) and hints."""
    dbs = "\n".join(
        f"- {name} ({d['engine']}): {d['description']}" for name, d in manifest["databases"].items()
    )
    return SYSTEM_PROMPT.format(databases=dbs, hints=manifest.get("hints", "").strip() or "-")


def run_oracle(toolbox: ToolBox, reference: list[dict]) -> TrialOutcome:
    """Run a reference solution (``[{"tool": ..., "args": {...}}, ...]``) through ``toolbox``.

    Calls are numbered ``call_1``, ``call_2``, ...; the stripped output of the last step is
    passed to ``return_answer``. A failing step ends the trial with terminate reason ``error``.
    """
    start = time.perf_counter()
    records: list[ToolCallRecord] = []
    last: ToolOutcome | None = None
    for i, step in enumerate(reference, start=1):
        last = toolbox.call(step["tool"], json.dumps(step["args"]), f"call_{i}")
        records.append(ToolCallRecord(turn=i - 1, outcome=last))
        if not last.success:
            return TrialOutcome(
                None, "error", f"reference step {i} ({step['tool']}) failed: {last.error}",
                tool_calls=records, latency_s=time.perf_counter() - start,
            )
    value = last.value if last is not None else ""
    answer = value.strip() if isinstance(value, str) else json.dumps(value, default=str)
    final = toolbox.call(
        "return_answer", json.dumps({"answer": answer}), f"call_{len(reference) + 1}"
    )
    records.append(ToolCallRecord(turn=len(reference), outcome=final))
    return TrialOutcome(
        final.answer, "return_answer", tool_calls=records, latency_s=time.perf_counter() - start
    )


def _assistant_message(msg) -> dict:
    out: dict = {"role": "assistant", "content": msg.content}
    if msg.tool_calls:
        out["tool_calls"] = [
            {
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments},
            }
            for tc in msg.tool_calls
        ]
    return out


def run_react(
    client: openai.OpenAI,
    model: str,
    toolbox: ToolBox,
    question: str,
    system: str,
    max_iterations: int = 100,
    temperature: float | None = None,
) -> TrialOutcome:
    """ReAct loop: ask the model, run the tool calls it returns, feed results back.

    Stops when the model calls ``return_answer`` (its ``answer``), replies without a tool call
    (its text becomes the answer, ``no_tool_call``), after ``max_iterations`` model calls, or
    when the API raises (``error``, message recorded). Tool errors go back to the model.
    """
    start = time.perf_counter()
    messages: list[dict] = [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
    ]
    result = TrialOutcome(None, "max_iterations")
    extra = {} if temperature is None else {"temperature": temperature}
    for turn in range(max_iterations):
        try:
            resp = client.chat.completions.create(
                model=model, messages=messages, tools=TOOL_SCHEMAS, **extra
            )
        except openai.OpenAIError as exc:
            result.terminate_reason, result.error = "error", f"{type(exc).__name__}: {exc}"
            break
        result.n_llm_calls += 1
        if resp.usage is not None:
            result.prompt_tokens += resp.usage.prompt_tokens or 0
            result.completion_tokens += resp.usage.completion_tokens or 0
        msg = resp.choices[0].message
        if not msg.tool_calls:
            result.answer, result.terminate_reason = msg.content, "no_tool_call"
            break
        messages.append(_assistant_message(msg))
        final: ToolOutcome | None = None
        for tc in msg.tool_calls:
            out = toolbox.call(tc.function.name, tc.function.arguments or "", tc.id)
            result.tool_calls.append(ToolCallRecord(turn=turn, outcome=out))
            if out.is_final:
                final = out
                break
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": out.content})
        if final is not None:
            result.answer, result.terminate_reason = final.answer, "return_answer"
            break
    result.latency_s = time.perf_counter() - start
    return result
