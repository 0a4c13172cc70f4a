"""Tool calls for models and servers without native tool calling: the ``json_schema`` protocol.

A model's ``tool_protocol`` (models table, :data:`schemas.models.ToolProtocol`) says how
:class:`tasks.core.llm.ChatModel` asks it for tool calls:

- ``native``: the OpenAI ``tools`` parameter; the server parses tool calls.
- ``json_schema``: no ``tools`` parameter. The tools are described in the system message and
  the reply is constrained by ``response_format`` to one JSON object, one alternative per tool
  ``{"name": <tool>, "arguments": <its parameters>}`` plus a final-answer alternative
  ``{"name": "final_answer", "arguments": {"answer": <text>}}`` (:func:`response_schema`).
  :func:`encode` rewrites the conversation for a chat template that knows no tools (earlier
  tool calls become the JSON the model wrote, tool results become user turns);
  :func:`decode` turns the reply back into an OpenAI tool call (id ``call_<call index>``) or
  a plain text reply, so the ReAct loop, transcripts and tool-use statistics see exactly what
  a native model would produce. A reply that is not such an object (cut off at the token
  limit, or from a server that ignores ``response_format``) is passed on as the text it is:
  the agent treats it as a reply without a tool call, as it would a native model's.
- ``auto``: :func:`detect` sends one probe request with a ``ping`` tool: native when it comes
  back with a tool call, json_schema when it does not or the server refuses ``tools``
  (HTTP 400/404/422). The result is kept per model and endpoint for the process.

Model output is hostile input: :func:`decode` parses the reply with ``json.loads`` only,
accepts nothing but a ``{"name": str, "arguments": ...}`` object, and never trusts ids from
the model (querylab numbers the calls); the tool box validates names and arguments as for any
model.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai
from openai.types.chat import ChatCompletion

#: Protocols a resolved model can use (``auto`` is resolved to one of them by :func:`detect`).
PROTOCOLS = ("native", "json_schema")
#: Name of the final-answer alternative (a trailing ``_`` is added while a tool has the name).
FINAL_ANSWER = "final_answer"

_PROMPT = """## Tools
Reply with exactly one JSON object and nothing else. When you have the answer and need no \
more tools: {{"name": "{final}", "arguments": {{"answer": <your answer>}}}}. Otherwise call one \
of these tools with {{"name": <tool name>, "arguments": <the tool's arguments>}}; its result \
comes back in the next message.
{tools}
For example: {example}"""


@dataclass(frozen=True)
class SchemaRequest:
    """A conversation encoded for the json_schema protocol: ``messages`` to send, ``body`` (the
    extra request fields: ``response_format``), the tool names offered and the name of the
    final-answer alternative."""

    messages: list[dict]
    body: dict
    tool_names: tuple[str, ...]
    final_name: str


def _functions(tools: list[dict]) -> list[dict]:
    """The ``function`` parts of OpenAI tool definitions (other kinds are left out)."""
    return [t["function"] for t in tools
            if isinstance(t, dict) and isinstance(t.get("function"), dict)]


def final_name(tool_names: list[str] | tuple[str, ...]) -> str:
    """``final_answer``, with ``_`` appended while a tool already has that name."""
    name = FINAL_ANSWER
    while name in tool_names:
        name += "_"
    return name


def _arguments_schema(parameters: Any) -> dict:
    """A tool's parameter schema as the ``arguments`` alternative: an object schema, with
    ``additionalProperties: false`` when the tool says nothing about extra properties (the
    constrained decoder then cannot wander into keys the tool does not take)."""
    schema = copy.deepcopy(parameters) if isinstance(parameters, dict) else {}
    schema.setdefault("type", "object")
    if schema.get("type") == "object":
        schema.setdefault("properties", {})
        schema.setdefault("additionalProperties", False)
    return schema


def response_schema(tools: list[dict]) -> dict:
    """The JSON schema of a reply: ``anyOf`` one ``{"name": {"const": tool}, "arguments":
    <parameters>}`` object per tool, then the final-answer object."""
    fns = _functions(tools)
    final = final_name([f.get("name", "") for f in fns])

    def alternative(name: str, arguments: dict) -> dict:
        return {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": arguments},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }

    answer = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    return {
        "anyOf": [alternative(f["name"], _arguments_schema(f.get("parameters"))) for f in fns]
        + [alternative(final, answer)]
    }


def tools_prompt(tools: list[dict]) -> str:
    """The system-message section describing the tools and the reply format."""
    fns = _functions(tools)
    lines = []
    for f in fns:
        params = f.get("parameters") if isinstance(f.get("parameters"), dict) else {}
        props = params.get("properties") or {}
        required = set(params.get("required") or [])
        args = ", ".join(
            f'"{k}": {v.get("type", "any")}{"" if k in required else " (optional)"}'
            + (f" -- {v['description']}" if v.get("description") else "")
            for k, v in props.items() if isinstance(v, dict)
        )
        lines.append(f"- {f['name']}: {f.get('description', '').strip()}\n  arguments: {{{args}}}")
    example = _example(fns[0]) if fns else "{}"
    return _PROMPT.format(final=final_name([f.get("name", "") for f in fns]),
                          tools="\n".join(lines), example=example)


def _example(fn: dict) -> str:
    """A call of ``fn`` with its required string arguments as placeholders (``"..."``)."""
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    args = {k: "..." for k in params.get("required") or [] if isinstance(k, str)}
    return json.dumps({"name": fn.get("name", ""), "arguments": args})


def _call_json(name: str, arguments: str) -> str:
    """An earlier tool call as the JSON object the model wrote (arguments parsed when they are
    JSON, else kept as the string they were)."""
    try:
        args: Any = json.loads(arguments) if arguments else {}
    except ValueError:
        args = arguments
    return json.dumps({"name": name, "arguments": args}, ensure_ascii=False)


def encode(messages: list[dict], tools: list[dict]) -> SchemaRequest:
    """Rewrite ``messages`` (OpenAI chat messages, possibly with assistant ``tool_calls`` and
    ``tool`` results) for the json_schema protocol: the tools section joins the first system
    message (or becomes one), assistant tool calls become their JSON objects, assistant text
    becomes the final-answer object, tool results become user messages naming the call."""
    fns = _functions(tools)
    names = tuple(f.get("name", "") for f in fns)
    final = final_name(names)
    section = tools_prompt(tools)
    out: list[dict] = []
    call_names: dict[str, str] = {}
    system_done = False
    for m in messages:
        role = m.get("role")
        if role == "system" and not system_done:
            out.append({"role": "system", "content": f"{m.get('content') or ''}\n\n{section}"})
            system_done = True
        elif role == "assistant" and m.get("tool_calls"):
            parts = []
            for tc in m["tool_calls"]:
                fn = tc.get("function") or {}
                call_names[tc.get("id", "")] = fn.get("name", "")
                parts.append(_call_json(fn.get("name", ""), fn.get("arguments") or ""))
            out.append({"role": "assistant", "content": "\n".join(parts)})
        elif role == "assistant":
            text = m.get("content") or ""
            out.append({"role": "assistant", "content": json.dumps(
                {"name": final, "arguments": {"answer": text}}, ensure_ascii=False)})
        elif role == "tool":
            cid = m.get("tool_call_id", "")
            name = call_names.get(cid, "tool")
            out.append({"role": "user", "content": f"Result of {name} (call {cid}):\n"
                        f"{m.get('content') or ''}"})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content", "name")})
    if not system_done:
        out.insert(0, {"role": "system", "content": section})
    body = {"response_format": {
        "type": "json_schema",
        "json_schema": {"name": "tool_call", "schema": response_schema(tools)},
    }}
    return SchemaRequest(out, body, names, final)


def parse_reply(content: str | None, final: str) -> tuple[str, Any] | None:
    """``("tool", (name, arguments_json))``, ``("final", text)`` or None (not a reply object)
    for the text of a json_schema reply."""
    if not content:
        return None
    try:
        obj = json.loads(content)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or "arguments" not in obj:
        return None
    name, args = obj["name"], obj["arguments"]
    if name == final:
        if isinstance(args, dict) and isinstance(args.get("answer"), str):
            return "final", args["answer"]
        return "final", json.dumps(args, ensure_ascii=False)
    arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return "tool", (name, arguments)


def decode(
    resp: ChatCompletion, request: SchemaRequest, call_index: int
) -> tuple[ChatCompletion, bool]:
    """``(response, valid)``: ``resp`` with its first choice's JSON reply turned into a tool
    call (``id`` ``call_<call_index>``, finish reason ``tool_calls``) or a text reply (the
    final answer's text, finish reason ``stop``); ``valid`` False when the content was not a
    reply object (the response is then returned unchanged)."""
    choice = resp.choices[0]
    parsed = parse_reply(choice.message.content, request.final_name)
    if parsed is None:
        return resp, False
    data = resp.model_dump(mode="json", exclude_unset=True)
    first = data["choices"][0]
    if parsed[0] == "final":
        first["message"] = {"role": "assistant", "content": parsed[1]}
        first["finish_reason"] = "stop"
    else:
        name, arguments = parsed[1]
        first["message"] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": f"call_{call_index}", "type": "function",
                            "function": {"name": name, "arguments": arguments}}],
        }
        first["finish_reason"] = "tool_calls"
    return ChatCompletion.model_validate(data), True


# --------------------------------------------------------------------------------------------
# auto: one probe request per model and endpoint
# --------------------------------------------------------------------------------------------

PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "ping",
        "description": "Answer a ping. Call it when asked to.",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer", "description": "the number to send"}},
            "required": ["n"],
        },
    },
}
PROBE_MESSAGES = [
    {"role": "system", "content": "You are a test harness. Use the tools you are given."},
    {"role": "user", "content": "Call the tool `ping` with n = 1. Do not write any text."},
]

_DETECTED: dict[tuple[str, str], str] = {}
_DETECT_LOCK = threading.Lock()


class ProbeError(Exception):
    """The probe request failed for a reason that says nothing about tool support (timeout,
    connection, 401, 5xx, ...): the message says what happened."""


def detect(
    post: Callable[..., ChatCompletion], model_id: str, endpoint: str, timeout_s: float = 60.0
) -> str:
    """``native`` or ``json_schema`` for ``model_id`` at ``endpoint`` (the key of the
    per-process memo), deciding with one probe request sent through ``post`` (the
    ``openai`` client's ``post``). Raises :class:`ProbeError` when the probe fails otherwise
    than by refusing ``tools``."""
    key = (model_id, endpoint)
    with _DETECT_LOCK:
        if key in _DETECTED:
            return _DETECTED[key]
        body = {"model": model_id, "messages": PROBE_MESSAGES, "tools": [PROBE_TOOL],
                "max_completion_tokens": 64, "temperature": 0}
        try:
            resp = post("/chat/completions", body=body, cast_to=ChatCompletion,
                        options={"timeout": timeout_s})
            calls = resp.choices[0].message.tool_calls if resp.choices else None
            protocol = "native" if calls else "json_schema"
        except openai.APIStatusError as exc:
            if exc.status_code not in (400, 404, 422):
                raise ProbeError(f"tool-protocol probe: HTTP {exc.status_code}: "
                                 f"{str(exc.message)[:200]}") from None
            protocol = "json_schema"  # the server refuses the tools parameter
        except openai.OpenAIError as exc:
            raise ProbeError(f"tool-protocol probe: {type(exc).__name__}: {exc}") from None
        _DETECTED[key] = protocol
        return protocol


def forget_detected() -> None:
    """Forget probe results (tests; a server that changed)."""
    with _DETECT_LOCK:
        _DETECTED.clear()
