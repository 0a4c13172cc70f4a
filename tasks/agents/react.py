"""Agents that answer a dataset question with the four tools.

- ``oracle``: runs the query's reference solution through the same :class:`ToolBox` and returns
  the output of its last step (offline, deterministic; must score 1.0).
- ``openai:<model>``: a ReAct loop over OpenAI Chat Completions tool calling through
  :class:`tasks.core.llm.ChatModel` (the ``openai`` client at the model's ``base_url``, with
  querylab's infrastructure retries and response cache).
- ``replay:<file>``: recorded answers (see :mod:`tasks.agents.replay`).

Terminate reasons (a trial's ``terminate_reason``; see :data:`TERMINATE_REASONS`):
``return_answer``, ``no_tool_call`` (text reply without a tool call; the text is the answer),
``replay`` / ``no_answer`` (replay agent), and the runtime failures (DAB's FM5)
``max_iterations``, ``max_wall_time``, ``max_tool_calls_per_turn``, ``token_budget``,
``context_window``, ``api_error`` (infrastructure retries exhausted or a non-retryable API
error) and ``error`` (a configuration or harness error). ``reference_failed``: a step of the
oracle's reference solution failed (a dataset bug, scored incorrect). Trials ending ``api_error``
or ``error`` are *errored* (:data:`tasks.scoring.stage.ERRORED_REASONS`): they get no verdict.

Every agent records its transcript (:class:`Transcript`, the ``messages`` artifact): the ReAct
agent every message it sends and receives, the oracle its question, steps and results, the
replay agent its question and recorded answer.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from schemas.models import AgentOptions
from tasks.core import interrupt
from tasks.core.llm import ChatModel, LLMCallError, LLMCallRecord
from tasks.agents.tools import TOOL_SCHEMAS, ToolBox, ToolOutcome, as_text, clean_text

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
    "error": "configuration or harness error (the trial is errored, not scored)",
    "reference_failed": "a step of the oracle's reference solution failed (a dataset bug)",
}
#: Terminate reasons that are runtime failures (DAB failure mode FM5).
RUNTIME_FAILURES = frozenset(
    {"max_iterations", "max_wall_time", "max_tool_calls_per_turn", "token_budget",
     "context_window", "api_error", "error"}
)

#: The system prompt of LLM agents: instructions only, the same for every dataset (as DAB's
#: ``common_scaffold/prompts/prompt_builder.py``: the databases and hints go in the first user
#: message, see :func:`user_prompt`).
SYSTEM_PROMPT = """You are a data analysis agent. Use only the tools to answer the user's query, \
based on the DATABASE DESCRIPTION in the user's message (logical database names and their \
engines) and the results of earlier tool calls.

TOOLS:
- list_db: list the databases, or the tables / collections of one database with their columns.
- query_db: run one read-only query on a database: SQL in the engine's dialect, or a MongoDB \
request as JSON.
- execute_python: run Python code; the result of an earlier tool call with id <call_id> is \
available as the variable var_<call_id>. Print what you need.
- return_answer: finish and give the final answer (plain text).

RULES:
1. Always use tool calls; return the final answer only through one return_answer call.
2. A large result is shown as a preview; the full result is in var_<call_id>.
3. Data may be spread over several databases whose keys are written differently, and some \
facts exist only inside free text.
"""


class Transcript:
    """The messages of one trial in order, as rows of the ``messages`` artifact (without run
    and trial keys; see :data:`schemas.artifacts.MESSAGES`)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, role: str, turn: int, content: str | None = None, *,
            reasoning: str | None = None, tool_calls: list[dict] | None = None,
            tool_call_id: str | None = None, tool_name: str | None = None,
            full_size: int | None = None, runtime_events: list | None = None) -> None:
        """Append one message; ``tool_calls`` as ``[{"id", "name", "arguments"}]``;
        ``runtime_events`` what an execute_python cell's audit hook reported (stored as
        JSON)."""
        self.rows.append({
            "index": len(self.rows), "turn": turn, "role": role, "content": content,
            "reasoning": reasoning,
            "tool_calls": json.dumps(tool_calls, ensure_ascii=False) if tool_calls else None,
            "tool_call_id": tool_call_id, "tool_name": tool_name,
            "content_chars": len(content or ""), "full_size": full_size,
            "runtime_events": (json.dumps(runtime_events, ensure_ascii=False, default=str)
                               if runtime_events else None),
        })

    def tool_result(self, turn: int, out: ToolOutcome) -> None:
        """Append a tool result exactly as the model saw it, with the full result's size (and
        a cell's run-time audit events)."""
        self.add("tool", turn, out.content, tool_call_id=out.call_id, tool_name=out.tool,
                 full_size=out.result_size, runtime_events=out.runtime_events)


def reasoning_text(msg) -> str | None:
    """The reasoning text of an assistant message when the API returned one
    (``reasoning_content``: DeepSeek, vLLM, llama.cpp; ``reasoning``: OpenRouter), else None."""
    extra = getattr(msg, "model_extra", None) or {}
    for name in ("reasoning_content", "reasoning"):
        value = extra.get(name) or getattr(msg, name, None)
        if isinstance(value, str) and value:
            return value
    return None


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
    trajectory, the model-call records, wall time in seconds and the transcript
    (``messages``: :class:`Transcript` rows)."""

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
    messages: list[dict] = field(default_factory=list)
    #: Called with the model-call records so far after each one is added (the batch journals
    #: them, so the calls of a trial interrupted by a kill are still counted on resume).
    on_call: Callable[[list[LLMCallRecord]], None] | None = field(default=None, repr=False)

    def add_call(self, rec: LLMCallRecord) -> None:
        """Count one model call (its tokens and cost) in the totals."""
        self.llm_calls.append(rec)
        self.n_llm_calls += 1
        self.prompt_tokens += rec.prompt_tokens
        self.completion_tokens += rec.completion_tokens
        self.cached_tokens += rec.cached_tokens
        self.cost_usd += rec.cost_usd
        if self.on_call is not None:
            self.on_call(self.llm_calls)


def system_prompt(manifest: dict | None = None) -> str:
    """The system prompt of LLM agents (:data:`SYSTEM_PROMPT`): tool instructions only, the same
    for every dataset; ``manifest`` is accepted for callers that pass it and not used."""
    return SYSTEM_PROMPT


def hint_text(manifest: dict) -> str:
    """The dataset's hint text as an agent sees it with hints on: DAB's
    ``db_description_withhint.txt`` as it is for imported DAB datasets (DAB's ``run_agent.py``
    appends the file's stripped text), the spec's ``hints`` for built ones under a ``HINTS:``
    heading unless the text starts with one. ``""`` when the dataset has no hints."""
    text = str(manifest.get("hints") or "").strip()
    if not text or text.upper().startswith("HINTS") or manifest.get("format") == "dab":
        return text  # DAB appends db_description_withhint.txt as it is
    return "HINTS:\n" + text


def database_description(manifest: dict) -> str:
    """The DATABASE DESCRIPTION an agent sees: the manifest's ``schema_description`` (DAB's
    ``db_description.txt``; for built datasets :func:`tasks.datasets.build.describe_schema` over the
    spec's database, table and column descriptions), else one line per database."""
    text = str(manifest.get("schema_description") or "").strip()
    if text:
        return text
    return "\n".join(
        f"- {name} ({d['engine']}): {d.get('description', '')}".rstrip()
        for name, d in manifest["databases"].items()
    )


def user_prompt(manifest: dict, question: str, hints: bool = False) -> str:
    """The first user message, built as DAB's ``prompt_builder.init_messages`` builds it::

        QUERY:
        <question>

        DATABASE DESCRIPTION:
        <database description>

    With ``hints`` (DAB's ``--use_hints``) the hint text (:func:`hint_text`) follows after a
    blank line, as DAB appends ``db_description_withhint.txt``. Without hints it is absent:
    DAB's default, and ours."""
    description = database_description(manifest)
    if hints:
        extra = hint_text(manifest)
        if extra:
            description += "\n\n" + extra
    return f"QUERY:\n{question.strip()}\n\nDATABASE DESCRIPTION:\n{description}"


def run_oracle(toolbox: ToolBox, reference: list[dict], question: str | None = None) -> TrialOutcome:
    """Run a reference solution (``[{"tool": ..., "args": {...}}, ...]``) through ``toolbox``.

    Calls are numbered ``call_1``, ``call_2``, ...; the stripped output of the last step is
    passed to ``return_answer``. A failing step ends the trial with terminate reason
    ``reference_failed`` (a dataset bug: scored incorrect, so the run names it). The
    transcript holds ``question`` (when given), each step as an assistant tool call and its
    result.
    """
    start = time.perf_counter()
    records: list[ToolCallRecord] = []
    transcript = Transcript()
    if question is not None:
        transcript.add("user", 0, question)
    last: ToolOutcome | None = None

    def step(turn: int, tool: str, args: str, call_id: str) -> ToolOutcome:
        transcript.add("assistant", turn, None,
                       tool_calls=[{"id": call_id, "name": tool, "arguments": args}])
        out = toolbox.call(tool, args, call_id)
        records.append(ToolCallRecord(turn=turn, outcome=out))
        if tool != "return_answer":
            transcript.tool_result(turn, out)
        return out

    for i, s in enumerate(reference, start=1):
        last = step(i - 1, s["tool"], json.dumps(s["args"]), f"call_{i}")
        if not last.success:
            return TrialOutcome(  # a harness error is querylab's, not the dataset's
                None, "error" if last.harness_error else "reference_failed",
                f"reference step {i} ({s['tool']}) failed: {last.error}",
                tool_calls=records, latency_s=time.perf_counter() - start,
                messages=transcript.rows,
            )
    value = last.value if last is not None else ""
    answer = value.strip() if isinstance(value, str) else json.dumps(value, default=str)
    final = step(len(reference), "return_answer", json.dumps({"answer": answer}),
                 f"call_{len(reference) + 1}")
    return TrialOutcome(
        final.answer, "return_answer", tool_calls=records, latency_s=time.perf_counter() - start,
        messages=transcript.rows,
    )


def _field(obj, name: str):
    """``obj.name`` or ``obj[name]`` (a response the client could not type keeps dicts)."""
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


#: A tool-call id echoed back to the API as the model sent it: what OpenAI accepts (at most 40
#: characters of ``[A-Za-z0-9_-]``). Any other id is replaced (:func:`safe_call_id`).
_SAFE_CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")
#: Longest original tool-call id kept in the transcript beside its replacement (characters).
ORIGINAL_ID_CHARS = 200


def safe_call_id(raw, turn: int, i: int, taken: set[str] | None = None) -> str:
    """The id querylab uses for a tool call the model returned (``raw``, any type): ``raw``
    itself when it is 1–40 characters of ``[A-Za-z0-9_-]`` and not already used in the
    conversation (``taken``), else ``call_<turn>_<i>_<8 hex of SHA-256 of the original>`` —
    short, valid for any OpenAI-compatible endpoint (which may reject longer or odd ids with
    HTTP 400), unique within the trial and stable (the same response gives the same id, so the
    next request, and its response-cache key, are the same on a re-run). A missing id (some
    local servers send none) becomes ``call_<turn>_<i>``."""
    taken = taken if taken is not None else set()
    if isinstance(raw, str) and _SAFE_CALL_ID.fullmatch(raw) and raw not in taken:
        return raw
    if raw in (None, ""):
        cid = f"call_{turn}_{i}"
    else:
        text = raw if isinstance(raw, str) else as_text(raw)
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        cid = f"call_{turn}_{i}_{digest}"
    n = 1
    while cid in taken:  # a model reusing ids (or colliding with ours)
        cid, n = f"{cid[:36]}_{n}", n + 1
    return cid


def _tool_call_parts(tc, turn: int, i: int,
                     taken: set[str] | None = None) -> tuple[str, str, str, str | None]:
    """``(call_id, name, arguments, original id)`` of a returned tool call as clean text,
    whatever its shape (model output is hostile: ids of any length or type, names and arguments
    that are not strings, lone surrogates). ``call_id`` is :func:`safe_call_id` (what the
    conversation, the tools and the variables use); the original id is given when it was
    replaced (cut to :data:`ORIGINAL_ID_CHARS`), else None. A non-function (custom) tool call is
    reported to the model as an unknown tool."""
    fn = _field(tc, "function")
    if fn is None:
        fn = _field(tc, "custom")
        name, args = _field(fn, "name"), _field(fn, "input")
    else:
        name, args = _field(fn, "name"), _field(fn, "arguments")
    raw = _field(tc, "id")
    cid = safe_call_id(raw, turn, i, taken)
    if taken is not None:
        taken.add(cid)
    original = None
    if raw not in (None, "") and cid != raw:
        text = as_text(raw)
        original = text if len(text) <= ORIGINAL_ID_CHARS else (
            text[:ORIGINAL_ID_CHARS] + f"… [{len(text)} characters]")
    return (cid, as_text(name),
            as_text(args) if not isinstance(args, str) else clean_text(args), original)


def _reply_parts(resp) -> tuple[object, str | None, list]:
    """``(message, content, tool calls)`` of a completion's first choice; ValueError when it
    has no message. Non-string content becomes its JSON, a non-list ``tool_calls`` a list of
    one, lone surrogates U+FFFD."""
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
    return msg, content, calls


def run_react(
    chat: ChatModel,
    toolbox: ToolBox,
    question: str,
    system: str,
    trial: int = 0,
    options: AgentOptions | None = None,
    on_call: Callable[[list[LLMCallRecord]], None] | None = None,
) -> TrialOutcome:
    """ReAct loop: ask the model, run the tool calls it returns in order, feed results back.

    ``trial`` is the trial index (part of the response-cache key); ``options`` the limits
    (default: ``chat.options``). Ends with ``return_answer`` (its ``answer``), ``no_tool_call``
    (the reply text becomes the answer), or a limit: ``max_iterations`` model calls,
    ``max_wall_time`` (checked before every model and tool call; also bounds request timeouts
    and execute_python; time spent waiting for a call slot — querylab's own queue of model
    calls, ``queue_s`` — is not counted), ``max_tool_calls_per_turn`` (none of that turn's calls is run),
    ``token_budget`` (checked before each call), ``context_window`` (the estimated prompt —
    last call's prompt + completion tokens + 1 token per 4 new characters — exceeds the model's
    window, or the API said so), ``api_error`` (also when the wall time ran out waiting for
    the API: a hang, a ``Retry-After`` beyond it, no concurrency slot) or ``error`` (querylab's
    side failed: a database server gone, the sandbox broken, a harness bug; the trial keeps
    its model calls and transcript so far). Tool errors (bad SQL, malformed JSON arguments,
    unknown tool) go back to the model and the trial continues. Tool-call ids are echoed back
    to the API only as :func:`safe_call_id` makes them (the original is kept in the
    transcript as ``original_id``). ``on_call``: called with the call records so far after
    each model call (:attr:`TrialOutcome.on_call`); a call whose response arrived before a
    harness failure is counted too (its cost was paid).
    """
    o = options or chat.options
    start = time.monotonic()
    deadline = start + o.max_wall_time_s
    toolbox.deadline = deadline
    messages: list[dict] = [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
    ]
    transcript = Transcript()
    transcript.add("system", 0, system)
    transcript.add("user", 0, question)
    result = TrialOutcome(None, "max_iterations", messages=transcript.rows, on_call=on_call)
    window = chat.resolved.context_window
    context_tokens, new_chars = 0, len(system) + len(question)
    call_ids: set[str] = set()  # tool-call ids used so far (each echoed back exactly once)

    def stop(reason: str, error: str | None = None) -> None:
        result.terminate_reason, result.error = reason, error

    try:
        for turn in range(o.max_iterations):
            interrupt.check()  # Ctrl-C / SIGTERM: the trial is cancelled, not scored
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
            # the wait for a call slot (other trials held them) is not this trial's wall time
            deadline += rec.queue_s
            toolbox.deadline = deadline
            context_tokens, new_chars = rec.prompt_tokens + rec.completion_tokens, 0
            try:
                msg, content, calls = _reply_parts(resp)
            except ValueError as exc:
                stop("api_error", f"malformed model response: {exc}")
                break
            parts = [_tool_call_parts(tc, turn, i, call_ids) for i, tc in enumerate(calls)]
            reasoning = reasoning_text(msg)
            transcript.add(
                "assistant", turn, content,
                reasoning=None if reasoning is None else clean_text(reasoning),
                tool_calls=[{"id": c, "name": n, "arguments": a,
                             **({"original_id": orig} if orig is not None else {})}
                            for c, n, a, orig in parts],
            )
            if not calls:
                result.answer = content
                stop("no_tool_call")
                break
            if len(calls) > o.max_tool_calls_per_turn:
                stop("max_tool_calls_per_turn",
                     f"{len(calls)} tool calls in one turn; the limit is "
                     f"{o.max_tool_calls_per_turn}")
                break
            messages.append(
                {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": [
                        {"id": cid, "type": "function", "function": {"name": n, "arguments": a}}
                        for cid, n, a, _ in parts
                    ],
                }
            )
            final: ToolOutcome | None = None
            for cid, name, args, _ in parts:
                if time.monotonic() >= deadline:
                    stop("max_wall_time", f"wall time of {o.max_wall_time_s:g} s used up")
                    break
                out = interrupt.call(toolbox.call, name, args, cid)  # abandoned on a signal
                result.tool_calls.append(ToolCallRecord(turn=turn, outcome=out))
                if out.harness_error:  # shown in the transcript: why the trial is errored
                    transcript.tool_result(turn, out)
                    stop("error", out.error)
                    break
                if out.is_final:
                    final = out
                    break
                messages.append({"role": "tool", "tool_call_id": cid, "content": out.content})
                transcript.tool_result(turn, out)
                new_chars += len(out.content)
            if final is not None:
                result.answer = final.answer
                stop("return_answer")
                break
            if result.terminate_reason in ("max_wall_time", "error"):
                break
        else:
            result.error = f"{o.max_iterations} model calls made without an answer"
    except interrupt.RunInterrupted:
        raise  # not a harness bug: the run is stopping (the trial is not checkpointed)
    except Exception as exc:  # noqa: BLE001 - a harness bug: errored, with what happened so far
        paid = getattr(chat, "in_flight", None)
        if paid is not None and all(paid is not c for c in result.llm_calls):
            paid.error = paid.error or f"{type(exc).__name__} after the response arrived"
            result.add_call(paid)  # the response arrived (and was paid) before the failure
        stop("error", f"harness error: {type(exc).__name__}: {clean_text(str(exc))[:500]}")
    # the trial's own time: waits for a model-call slot (other trials held them) left out,
    # as from its wall-time limit
    queued = sum(c.queue_s for c in result.llm_calls)
    result.latency_s = max(0.0, time.monotonic() - start - queued)
    return result
