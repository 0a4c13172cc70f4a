"""Agents that answer a dataset question with the four tools.

- ``oracle``: runs the query's reference solution through the same :class:`ToolBox` and returns
  the output of its last step (offline, deterministic; must score 1.0).
- ``openai:<model>``: a ReAct loop over OpenAI Chat Completions tool calling through
  :class:`tasks.llm.ChatModel` (the ``openai`` client at the model's ``base_url``, with
  querylab's infrastructure retries and response cache).
- ``replay:<file>``: recorded answers (see :mod:`tasks.replay`).

Terminate reasons (a trial's ``terminate_reason``; see :data:`TERMINATE_REASONS`):
``return_answer``, ``no_tool_call`` (text reply without a tool call; the text is the answer),
``replay`` / ``no_answer`` (replay agent), and the runtime failures (DAB's FM5)
``max_iterations``, ``max_wall_time``, ``max_tool_calls_per_turn``, ``token_budget``,
``context_window``, ``api_error`` (infrastructure retries exhausted or a non-retryable API
error) and ``error`` (a configuration or harness error, or a failing reference solution).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from schemas.models import AgentOptions
from tasks.llm import ChatModel, LLMCallError, LLMCallRecord
from tasks.tools import TOOL_SCHEMAS, ToolBox, ToolOutcome, as_text, clean_text

#: Every terminate reason with its meaning.
TERMINATE_REASONS: dict[str, str] = {
    "return_answer": "the agent called return_answer",
    "no_tool_call": "the model replied with text and no tool call; its text is the answer",
    "replay": "a recorded answer was scored (replay agent)",
    "no_answer": "the replay file has no answer for this trial",
    "max_iterations": "the model-call limit per trial was reached",
    "max_wall_time": "the wall-time limit per trial was reached",
    "max_tool_calls_per_turn": "one model response asked for more tool calls than allowed",
    "token_budget": "the trial's prompt + completion token budget was used up",
    "context_window": "the conversation no longer fits the model's context window",
    "api_error": "the model API failed (retries exhausted, or a non-retryable error)",
    "error": "configuration or harness error, or a failing reference solution",
}
#: Terminate reasons that are runtime failures (DAB failure mode FM5).
RUNTIME_FAILURES = frozenset(
    {"max_iterations", "max_wall_time", "max_tool_calls_per_turn", "token_budget",
     "context_window", "api_error", "error"}
)

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
    counts (sums over the model calls; ``cached_tokens`` is the prompt-cache part of the prompt
    tokens), ``cost_usd`` (sum of the calls' costs), number of model calls, the tool-call
    trajectory, the model-call records and wall time in seconds."""

    answer: str | None
    terminate_reason: str
    error: str | None = None
    n_llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    latency_s: float = 0.0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    llm_calls: list[LLMCallRecord] = field(default_factory=list)

    def add_call(self, rec: LLMCallRecord) -> None:
        """Count one model call (its tokens and cost) in the totals."""
        self.llm_calls.append(rec)
        self.n_llm_calls += 1
        self.prompt_tokens += rec.prompt_tokens
        self.completion_tokens += rec.completion_tokens
        self.cached_tokens += rec.cached_tokens
        self.cost_usd += rec.cost_usd


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


def _field(obj, name: str):
    """``obj.name`` or ``obj[name]`` (a response the client could not type keeps dicts)."""
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _tool_call_parts(tc, turn: int, i: int) -> tuple[str, str, str]:
    """``(call_id, name, arguments)`` of a returned tool call as clean text, whatever its shape
    (model output is hostile: ids of any length or type, names and arguments that are not
    strings, lone surrogates). A missing id (some local servers) becomes ``call_<turn>_<i>``;
    a non-function (custom) tool call is reported to the model as an unknown tool."""
    fn = _field(tc, "function")
    if fn is None:
        fn = _field(tc, "custom")
        name, args = _field(fn, "name"), _field(fn, "input")
    else:
        name, args = _field(fn, "name"), _field(fn, "arguments")
    cid = _field(tc, "id")
    return (as_text(cid) if cid not in (None, "") else f"call_{turn}_{i}", as_text(name),
            as_text(args) if not isinstance(args, str) else clean_text(args))


def _reply_parts(resp) -> tuple[str | None, list]:
    """``(content, tool calls)`` of a completion's first choice; ValueError when it has no
    message. Non-string content becomes its JSON, a non-list ``tool_calls`` a list of one."""
    choices = _field(resp, "choices")
    if not choices:
        raise ValueError("the response has no choices")
    msg = _field(choices[0], "message")
    if msg is None:
        raise ValueError("the response's first choice has no message")
    content = _field(msg, "content")
    if content is not None:
        content = clean_text(content) if isinstance(content, str) else as_text(content)
    calls = _field(msg, "tool_calls") or []
    if not isinstance(calls, list):
        calls = [calls]
    return content, calls


def run_react(
    chat: ChatModel,
    toolbox: ToolBox,
    question: str,
    system: str,
    trial: int = 0,
    options: AgentOptions | None = None,
) -> TrialOutcome:
    """ReAct loop: ask the model, run the tool calls it returns in order, feed results back.

    ``trial`` is the trial index (part of the response-cache key); ``options`` the limits
    (default: ``chat.options``). Ends with ``return_answer`` (its ``answer``), ``no_tool_call``
    (the reply text becomes the answer), or a limit: ``max_iterations`` model calls,
    ``max_wall_time`` (checked before every model and tool call; also bounds request timeouts
    and execute_python), ``max_tool_calls_per_turn`` (none of that turn's calls is run),
    ``token_budget`` (checked before each call), ``context_window`` (the estimated prompt —
    last call's prompt + completion tokens + 1 token per 4 new characters — exceeds the model's
    window, or the API said so), ``api_error``. Tool errors (bad SQL, malformed JSON
    arguments, unknown tool) go back to the model and the trial continues.
    """
    o = options or chat.options
    start = time.monotonic()
    deadline = start + o.max_wall_time_s
    toolbox.deadline = deadline
    messages: list[dict] = [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
    ]
    result = TrialOutcome(None, "max_iterations")
    window = chat.resolved.context_window
    context_tokens, new_chars = 0, len(system) + len(question)

    def stop(reason: str, error: str | None = None) -> None:
        result.terminate_reason, result.error = reason, error

    for turn in range(o.max_iterations):
        if time.monotonic() >= deadline:
            stop("max_wall_time", f"wall time of {o.max_wall_time_s:g} s used up")
            break
        used = result.prompt_tokens + result.completion_tokens
        if o.max_total_tokens is not None and used >= o.max_total_tokens:
            stop("token_budget", f"{used} tokens used of a budget of {o.max_total_tokens}")
            break
        estimate = context_tokens + new_chars // 4
        if window is not None and estimate > window:
            stop("context_window",
                 f"the next prompt (~{estimate} tokens) exceeds the context window ({window})")
            break
        try:
            resp, rec = chat.complete(messages, TOOL_SCHEMAS, trial, turn, deadline)
        except LLMCallError as exc:
            result.add_call(exc.record)
            stop(exc.reason, str(exc))
            break
        result.add_call(rec)
        context_tokens, new_chars = rec.prompt_tokens + rec.completion_tokens, 0
        try:
            content, calls = _reply_parts(resp)
        except ValueError as exc:
            stop("api_error", f"malformed model response: {exc}")
            break
        if not calls:
            result.answer = content
            stop("no_tool_call")
            break
        if len(calls) > o.max_tool_calls_per_turn:
            stop("max_tool_calls_per_turn",
                 f"{len(calls)} tool calls in one turn; the limit is "
                 f"{o.max_tool_calls_per_turn}")
            break
        parts = [_tool_call_parts(tc, turn, i) for i, tc in enumerate(calls)]
        messages.append(
            {
                "role": "assistant",
                "content": content,
                "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": n, "arguments": a}}
                    for cid, n, a in parts
                ],
            }
        )
        final: ToolOutcome | None = None
        for cid, name, args in parts:
            if time.monotonic() >= deadline:
                stop("max_wall_time", f"wall time of {o.max_wall_time_s:g} s used up")
                break
            out = toolbox.call(name, args, cid)
            result.tool_calls.append(ToolCallRecord(turn=turn, outcome=out))
            if out.harness_error:
                stop("error", out.error)
                break
            if out.is_final:
                final = out
                break
            messages.append({"role": "tool", "tool_call_id": cid, "content": out.content})
            new_chars += len(out.content)
        if final is not None:
            result.answer = final.answer
            stop("return_answer")
            break
        if result.terminate_reason in ("max_wall_time", "error"):
            break
    else:
        result.error = f"{o.max_iterations} model calls made without an answer"
    result.latency_s = time.monotonic() - start
    return result
