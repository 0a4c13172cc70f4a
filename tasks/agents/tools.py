"""The four agent tools — ``list_db``, ``query_db``, ``execute_python``, ``return_answer`` — and
the per-trial :class:`ToolBox` that executes them.

Results of ``query_db`` and ``execute_python`` are kept as variables ``var_<call_id>`` (DAB's
convention; characters of the call id other than letters, digits and ``_`` become ``_``, and an
id longer than 64 characters, empty or not printable ASCII is shortened and suffixed with a
hash, see :func:`variable_name`): the model sees a preview, and later ``execute_python`` code
sees the full value. Results are saved as files in the trial's sandbox work directory
(``vars/var_<call_id>.json``; a large ``execute_python`` output also as
``results/<call_id>.stdout.txt``) and the preview says where (an ``execute_python`` variable
holds the first 100,000 characters of its output; the saved file holds all of it). Tool
messages are JSON of at most ``max_content_chars`` characters: previews are cut to fit.
A tool's failure (bad SQL, unknown table, refused write, Python exception, timeout) is returned
to the model as an error message; it never ends the trial.

Model output is hostile input: :meth:`ToolBox.call` accepts any tool name, call id and
arguments (any type, size, nesting or characters) and always returns a :class:`ToolOutcome`.
Arguments larger than :data:`MAX_ARGUMENT_CHARS` or nested deeper than
:data:`MAX_ARGUMENT_DEPTH`, non-JSON or non-object arguments and unknown tools are tool errors;
lone surrogates (invalid UTF-8) in any string become U+FFFD, so every recorded string can be
written as UTF-8. Only a failure of querylab's side — an unexpected exception inside a tool (a
harness bug), a database server that cannot be reached or dropped the connection
(:class:`tasks.db.databases.DatabaseUnavailable`), the sandbox itself failing (a
:class:`tasks.sandbox.session.SandboxError` other than a full work directory) — is flagged
``harness_error`` for the agent loop to end the trial as ``error`` (errored, not scored).
``query_db`` results are capped in rows and bytes, per query and per trial
(:data:`MAX_TRIAL_RESULT_BYTES`).

``list_db``, ``query_db`` and ``return_answer`` run in-process (databases are opened once per
process and shared); ``execute_python`` runs each cell in a sealed, unprivileged,
resource-limited process of the trial's sandbox session (:mod:`tasks.sandbox.session`), opened at the
first cell and closed by :meth:`ToolBox.close`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.db.databases import (
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_MAX_VALUE_BYTES,
    Database,
    DatabaseUnavailable,
    QueryError,
)
from tasks.sandbox.session import Sandbox, SandboxError, Session, WorkdirError, shared_sandbox

TOOL_SCHEMAS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": "list_db",
            "description": (
                "List the databases (engine, description, tables). Give `db` to list that "
                "database's tables or collections with their columns and types."
            ),
            "parameters": {
                "type": "object",
                "properties": {"db": {"type": "string", "description": "database name"}},
                "required": [],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "query_db",
            "description": (
                "Run one read-only query on a database. SQL databases take a single SELECT "
                "(WITH allowed) in their dialect; MongoDB takes JSON: "
                '{"collection": "c", "find": {...}, "projection": {...}, "sort": [["f", 1]], '
                '"limit": 10} or {"collection": "c", "aggregate": [...]}. Returns a preview; '
                "the full rows are stored as the Python variable var_<call_id>."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "db": {"type": "string", "description": "database name"},
                    "query": {"type": "string", "description": "SQL text or Mongo JSON"},
                },
                "required": ["db", "query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "execute_python",
            "description": (
                "Run Python 3 code in a fresh process; print what you need. Results of earlier "
                "tool calls are available as variables var_<call_id> (query rows are a list of "
                "dicts). Standard library, pandas, polars and pyarrow are importable. Limits: "
                "wall-clock time, memory and CPU per call; no state is kept between calls "
                "except files in the working directory."
            ),
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "return_answer",
            "description": "Give the final answer to the question. Ends the task.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string"}},
                "required": ["answer"],
            },
        },
    },
]

TOOL_NAMES = [t["function"]["name"] for t in TOOL_SCHEMAS]

_TABLES: dict[int, tuple[Database, list]] = {}
_TABLES_LOCK = threading.Lock()


def cached_tables(db: Database) -> list:
    """``db.list_tables()``, computed once per open database (they are read-only, so their
    tables, columns and row counts cannot change while open)."""
    hit = _TABLES.get(id(db))
    if hit is not None and hit[0] is db:
        return hit[1]
    tables = db.list_tables()
    with _TABLES_LOCK:
        _TABLES[id(db)] = (db, tables)
    return tables


#: Longest tool-call arguments accepted (characters of JSON text).
MAX_ARGUMENT_CHARS = 1_000_000
#: Deepest nesting of tool-call arguments accepted (tool arguments are flat objects).
MAX_ARGUMENT_DEPTH = 32
#: Longest arguments text kept in a :class:`ToolOutcome` (and the tool_calls artifact).
MAX_RECORDED_ARGUMENT_CHARS = 100_000
#: Bytes of ``query_db`` results one trial may hold (its variables), in total.
MAX_TRIAL_RESULT_BYTES = 64 << 20


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with lone surrogates (what invalid UTF-8 or a ``\\udxxx`` JSON escape gives)
    replaced by U+FFFD, so it encodes as UTF-8. Other characters (NUL included) are kept."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)


def clean_events(events: list) -> list:
    """A cell's audit events (JSON values the cell could write to its audit pipe) with every
    string :func:`clean_text`-ed, so they encode as UTF-8 (a lone ``\\ud800`` in one failed
    the whole batch's Parquet write: QA adversary)."""
    text = json.dumps(events, ensure_ascii=False, default=str)
    cleaned = clean_text(text)
    return events if cleaned is text else json.loads(cleaned)


def as_text(value) -> str:
    """A model-provided name or id as clean text: a str is cleaned, None becomes ``""``,
    anything else its JSON (or ``repr``)."""
    if isinstance(value, str):
        return clean_text(value)
    if value is None:
        return ""
    try:
        return clean_text(json.dumps(value, default=repr))
    except (TypeError, ValueError, RecursionError):
        return clean_text(repr(value)[:1000])


def _clean_arguments(value, depth: int = 0):
    """Parsed JSON arguments with every string (keys too) cleaned; ValueError when nested
    deeper than :data:`MAX_ARGUMENT_DEPTH`."""
    if depth > MAX_ARGUMENT_DEPTH:
        raise ValueError(f"arguments nested deeper than {MAX_ARGUMENT_DEPTH} levels")
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(k): _clean_arguments(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean_arguments(v, depth + 1) for v in value]
    return value


def _nesting_depth(text: str, limit: int) -> int:
    """Maximum bracket nesting of JSON text (brackets inside strings ignored), counted up to
    ``limit + 1`` so that deep text is refused before ``json.loads`` recurses into it."""
    depth = top = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > top:
                top = depth
                if top > limit:
                    return top
        elif ch in "]}":
            depth -= 1
    return top


#: Longest value shown in a ``query_db`` preview (characters; the variable holds all of it).
PREVIEW_VALUE_CHARS = 300


def _preview(rows: list[dict], value_chars: int = PREVIEW_VALUE_CHARS) -> list[dict]:
    """Preview rows with long values shortened for display (strings and nested values longer
    than ``value_chars`` (default :data:`PREVIEW_VALUE_CHARS`) end in ``"…"``); rows without
    such values are returned
    unchanged."""
    out = []
    for row in rows:
        short = None
        for k, v in row.items():
            text = v if isinstance(v, str) else None
            if text is None and isinstance(v, (list, dict)):
                text = json.dumps(v, default=str)
                if len(text) <= value_chars:
                    continue
            if text is not None and len(text) > value_chars:
                short = dict(row) if short is None else short
                short[k] = text[:value_chars] + "…"
        out.append(row if short is None else short)
    return out


def variable_name(call_id) -> str:
    """``var_<call_id>`` with every character that is not an ASCII letter, digit or ``_``
    replaced by ``_`` (so it is a Python identifier and a safe file name). An id that is empty,
    longer than 64 characters, not printable ASCII or not a string becomes ``var_<its first
    32 safe characters>_<12 hex of its SHA-256>`` (short, and distinct for distinct ids)."""
    text = call_id if isinstance(call_id, str) else as_text(call_id)
    safe = re.sub(r"[^A-Za-z0-9_]", "_", text)
    if 1 <= len(text) <= 64 and text.isascii() and text.isprintable() and isinstance(call_id, str):
        return "var_" + safe
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"var_{safe[:32]}_{digest}"


@dataclass
class ToolOutcome:
    """What one tool call did.

    ``content`` is the text the model sees; ``value`` the full result kept as ``var_<call_id>``;
    ``result_size`` the length in characters of the full JSON result; ``duration_s`` seconds.
    ``answer`` is set only by ``return_answer``. ``runtime_events``: what an
    ``execute_python`` cell's run-time audit hook reported (see
    :attr:`tasks.sandbox.session.CellResult.audit_events`; ``{"e": "_incomplete"}`` last when the cell
    cut its audit channel). ``harness_error``: the tool failed because
    of querylab, not the agent (an unexpected exception); the agent loop ends the trial.
    """

    call_id: str
    tool: str
    arguments: str
    success: bool
    content: str
    error: str | None = None
    value: Any = None
    result_size: int = 0
    duration_s: float = 0.0
    answer: str | None = None
    harness_error: bool = False
    runtime_events: list | None = None

    @property
    def is_final(self) -> bool:
        return self.tool == "return_answer" and self.success


@dataclass
class ToolBox:
    """Executes tool calls for one trial.

    ``databases`` maps logical names to open read-only databases; ``descriptions`` their
    one-line descriptions. Limits: ``max_rows`` rows, ``max_result_bytes`` bytes and
    ``max_value_bytes`` bytes per value kept per query, ``max_trial_result_bytes`` bytes of query
    results per trial (a query gets what is left of it), ``preview_rows`` shown to the model
    (each value cut at ``preview_value_chars``), ``max_content_chars`` per tool message;
    ``execute_python`` cells get ``python_timeout_s``
    wall-clock seconds, ``python_memory_mb`` MiB (their process tree and work-directory files;
    also the address space per process), ``python_cpu_s`` CPU seconds, ``python_max_procs``
    processes + threads, cut to the trial's ``deadline`` (a ``time.monotonic()`` instant) when
    one is set, and a ``python_disk_mb`` MiB work directory.

    The cells run in ``session`` (a :class:`tasks.sandbox.session.Session`), by default one opened
    from ``sandbox`` (default :func:`tasks.sandbox.session.shared_sandbox`) at the first
    ``execute_python`` call and closed by :meth:`close`; earlier results are put into it then.
    ``require_isolation``: that session must have every isolation mechanism (else the call
    fails with the reason). ``workdir``: a host directory private to the trial, used as the
    work directory only when the machine cannot give a sealed one and isolation is not
    required (unsafe runs; the session's ``mechanisms`` say so).
    """

    databases: dict[str, Database]
    workdir: Path
    descriptions: dict[str, str] = field(default_factory=dict)
    max_rows: int = 10_000
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    max_trial_result_bytes: int = MAX_TRIAL_RESULT_BYTES
    preview_rows: int = 20
    max_content_chars: int = 8_000
    preview_value_chars: int = PREVIEW_VALUE_CHARS
    python_timeout_s: float = 60.0
    python_memory_mb: int = 2048
    python_cpu_s: int = 60
    python_disk_mb: int = 1024
    python_max_procs: int = 128
    deadline: float | None = None
    sandbox: Sandbox | None = None
    session: Session | None = None
    require_isolation: bool = False
    variables: dict[str, Any] = field(default_factory=dict)
    result_bytes: int = 0

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self._own_session = False

    def close(self) -> None:
        """Close the sandbox session this ToolBox opened (its work directory goes with it)."""
        if self._own_session and self.session is not None:
            self.session.close()
        self.session, self._own_session = None, False

    def python_session(self) -> Session:
        """The trial's sandbox session, opened (with every stored variable put into its work
        directory) at the first call. Raises SandboxError / SandboxUnavailable."""
        if self.session is None or not self.session.alive:
            sandbox = self.sandbox or shared_sandbox()
            session = sandbox.open_session(
                disk_mb=self.python_disk_mb, require_isolation=self.require_isolation,
                fallback_workdir=self.workdir,
            )
            self.session, self._own_session = session, True
            for name, value in self.variables.items():
                session.put_file(f"vars/{name}.json", json.dumps(value, default=str).encode())
        return self.session

    # -- dispatch ---------------------------------------------------------------------------
    def call(self, name: Any, arguments: Any, call_id: Any) -> ToolOutcome:
        """Run tool ``name`` with JSON ``arguments`` (text, or an already parsed object);
        never raises: whatever the model sent, the outcome is a result or a tool error
        (module docstring), with every string in it clean UTF-8."""
        start = time.perf_counter()
        tool, cid = as_text(name)[:200], as_text(call_id)
        if len(cid) > 256:  # kept whole in the conversation; recorded (and hashed) shortened
            cid = cid[:200] + "…" + hashlib.sha256(cid.encode()).hexdigest()[:16]
        out = ToolOutcome(call_id=cid, tool=tool, arguments="", success=False, content="")
        try:
            raw = arguments if isinstance(arguments, str) else (
                "" if arguments is None else json.dumps(arguments, default=repr))
            raw = clean_text(raw)
            out.arguments = raw if len(raw) <= MAX_RECORDED_ARGUMENT_CHARS else (
                raw[:MAX_RECORDED_ARGUMENT_CHARS] + f"... [cut: {len(raw)} characters]")
            self._dispatch(out, tool, raw)
        except RecursionError:
            self._fail(out, f"malformed arguments for {tool!r}: nested too deeply")
        except MemoryError:
            self._fail(out, f"arguments for {tool!r} are too large")
        except (DatabaseUnavailable, SandboxError) as exc:
            # the infrastructure failed (a database server gone, the sandbox itself broken),
            # not the agent: the trial ends errored instead of being scored on it
            what = "database" if isinstance(exc, DatabaseUnavailable) else "sandbox"
            self._fail(out, f"{what} unavailable ({tool}): {clean_text(str(exc))[:500]}")
            out.harness_error = True
        except Exception as exc:  # noqa: BLE001 - a harness bug must not crash the batch
            self._fail(out, f"internal error in tool {tool!r}: {type(exc).__name__}: "
                            f"{clean_text(str(exc))[:500]}")
            out.harness_error = True
        if out.error is not None:
            out.error = clean_text(out.error)
        if out.answer is not None:
            out.answer = clean_text(out.answer)
        out.duration_s = time.perf_counter() - start
        return out

    def _dispatch(self, out: ToolOutcome, name: str, raw: str) -> None:
        if len(raw) > MAX_ARGUMENT_CHARS:
            return self._fail(out, f"arguments for {name!r} are too large ({len(raw)} "
                                   f"characters; at most {MAX_ARGUMENT_CHARS})")
        brackets = raw.count("[") + raw.count("{")
        if brackets > MAX_ARGUMENT_DEPTH and _nesting_depth(raw, MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:
            return self._fail(out, f"malformed arguments for {name!r}: nested deeper than "
                                   f"{MAX_ARGUMENT_DEPTH} levels")
        try:
            args = json.loads(raw) if raw.strip() else {}
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")  # noqa: TRY004 (caught below)
            args = _clean_arguments(args)
        except ValueError as exc:
            return self._fail(out, f"malformed arguments for {name!r}: {clean_text(str(exc))[:300]}")
        handler = getattr(self, f"_tool_{name}", None) if name in TOOL_NAMES else None
        if handler is None:
            shown = name if len(name) <= 60 else name[:60] + "…"
            return self._fail(out, f"unknown tool {shown!r}; available: {', '.join(TOOL_NAMES)}")
        if not all(k.isidentifier() for k in args):
            return self._fail(out, f"bad arguments for {name}: unexpected argument names "
                                   f"{[k[:40] for k in args if not k.isidentifier()][:5]}")
        try:
            handler(out, **args)
        except TypeError as exc:
            if exc.__traceback__ is not None and exc.__traceback__.tb_next is not None:
                raise  # raised inside the tool, not by the call: a harness error
            self._fail(out, f"bad arguments for {name}: {clean_text(str(exc))[:300]}")
        except (QueryError, WorkdirError) as exc:  # the agent's query / what its cells left
            self._fail(out, str(exc))

    def _fail(self, out: ToolOutcome, message: str) -> None:
        out.success, out.error = False, message
        out.content = json.dumps({"error": message})
        out.result_size = len(out.content)

    def _fit(self, shown: dict) -> str:
        """JSON of ``shown`` within ``max_content_chars``: fewer preview rows / a shorter
        stdout preview first (marked ``"preview_cut": true``), so it stays valid JSON."""
        text = json.dumps(shown, default=str)
        limit = self.max_content_chars
        while len(text) > limit:
            if isinstance(shown.get("preview"), list) and len(shown["preview"]) > 1:
                shown["preview"] = shown["preview"][: len(shown["preview"]) // 2]
            elif isinstance(shown.get("stdout"), str) and len(shown["stdout"]) > 200:
                keep = int(len(shown["stdout"]) * limit / len(text)) - 100
                shown["stdout"] = shown["stdout"][: max(keep, 200)]
            else:
                break
            shown["preview_cut"] = True
            text = json.dumps(shown, default=str)
        return text

    def _ok(self, out: ToolOutcome, result: Any, shown: Any | None = None) -> None:
        full = json.dumps(result, default=str)
        if shown is None:
            text = full
        elif isinstance(shown, dict):
            text = self._fit(shown)
        else:
            text = json.dumps(shown, default=str)
        if len(text) > self.max_content_chars:
            text = text[: self.max_content_chars] + f"... [truncated, {len(full)} chars]"
        out.success, out.content, out.value, out.result_size = True, text, result, len(full)

    def _store(self, call_id: str, value: Any) -> str:
        """Keep ``value`` as variable ``var_<call_id>`` (returned; :func:`variable_name` keeps
        it short) and, once the sandbox session is open, as ``vars/<name>.json`` in its work
        directory. Raises WorkdirError when the cells left something in the way (the
        variable is then not kept), SandboxError when the session failed."""
        name = variable_name(call_id)
        if self.session is not None and self.session.alive:
            self.session.put_file(f"vars/{name}.json", json.dumps(value, default=str).encode())
        self.variables[name] = value
        return name

    # -- tools ------------------------------------------------------------------------------
    def _tool_list_db(self, out: ToolOutcome, db: str | None = None) -> None:
        if db is not None and not isinstance(db, str):
            return self._fail(out, f"bad arguments for list_db: db must be a string, got "
                                   f"{type(db).__name__}")
        if db is None:
            listing = [
                {
                    "db": name,
                    "engine": d.engine,
                    "description": self.descriptions.get(name, ""),
                    "tables": [t.name for t in cached_tables(d)],
                }
                for name, d in self.databases.items()
            ]
            return self._ok(out, listing)
        if db not in self.databases:
            return self._fail(out, f"unknown database {db[:100]!r}; have {sorted(self.databases)}")
        tables = [
            {"table": t.name, "columns": {c.name: c.type for c in t.columns}}
            for t in cached_tables(self.databases[db])
        ]
        self._ok(out, {"db": db, "engine": self.databases[db].engine, "tables": tables})

    def _tool_query_db(self, out: ToolOutcome, db: str, query: Any) -> None:
        if not isinstance(db, str):
            return self._fail(out, f"bad arguments for query_db: db must be a string, got "
                                   f"{type(db).__name__}")
        if db not in self.databases:
            return self._fail(out, f"unknown database {db[:100]!r}; have {sorted(self.databases)}")
        if not isinstance(query, (str, dict)):
            return self._fail(out, f"bad arguments for query_db: query must be a string, got "
                                   f"{type(query).__name__}")
        budget = self.max_trial_result_bytes - self.result_bytes
        if budget < 64 << 10:
            return self._fail(out, f"query_db not run: this trial's results already hold "
                                   f"{self.result_bytes} bytes, the limit per trial; work with "
                                   "the results you have (aggregate in SQL to get smaller ones)")
        result = self.databases[db].query(
            query, max_rows=self.max_rows, max_result_bytes=min(self.max_result_bytes, budget),
            max_value_bytes=self.max_value_bytes)
        self.result_bytes += result.result_bytes
        try:
            var, not_saved = self._store(out.call_id, result.rows), None
        except WorkdirError as exc:  # the cells put something in the way of vars/<var>.json
            var, not_saved = None, str(exc)
        shown = {
            "columns": result.columns,
            "row_count": len(result.rows),
            "truncated": result.truncated,
            "preview": _preview(result.rows[: self.preview_rows], self.preview_value_chars),
            "variable": var,
        }
        if not_saved is not None:
            shown["variable_not_saved"] = not_saved
        if result.truncated_by == "bytes":
            shown["note"] = (f"result cut at {result.result_bytes} bytes (the size limit); "
                             f"only the first {len(result.rows)} rows are kept")
        elif result.truncated:
            shown["note"] = f"only the first {len(result.rows)} rows are kept (the row limit)"
        if result.cut_values:
            shown["values_cut"] = (f"{result.cut_values} values longer than "
                                   f"{self.max_value_bytes} bytes were cut (they end in "
                                   "'… [value cut at ...]')")
        if len(result.rows) > self.preview_rows:
            shown["saved_to"] = f"vars/{var}.json"
        self._ok(out, result.rows, shown)

    def _tool_execute_python(self, out: ToolOutcome, code: str) -> None:
        if not isinstance(code, str):
            return self._fail(out, "bad arguments for execute_python: code must be a string")
        timeout = self.python_timeout_s
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
            if timeout <= 0:
                return self._fail(out, "execute_python not run: the trial's wall time is up")
        stem = variable_name(out.call_id)[4:]
        try:
            session = self.python_session()
            res = session.run(
                code, name=stem, timeout_s=timeout, memory_mb=self.python_memory_mb,
                cpu_s=self.python_cpu_s, max_procs=self.python_max_procs,
                max_output_chars=max(self.max_content_chars, 100_000),
            )
        except WorkdirError as exc:
            return self._fail(out, f"execute_python could not run: {exc}")
        # any other SandboxError (the sandbox failing, not the cell) ends the trial errored
        if res.sandbox_failed:
            raise SandboxError(res.error or "the sandbox failed")
        killed = res.timed_out or res.cpu_exceeded or res.oom_killed or res.signal is not None
        out.runtime_events = clean_events(list(res.audit_events) + (
            [] if res.audit_complete or killed else [{"e": "_incomplete"}]))
        if res.error:
            return self._fail(out, res.error)
        shown: dict[str, Any] = {"stdout": res.stdout}
        try:
            shown["variable"] = self._store(out.call_id, res.stdout)
        except WorkdirError as exc:  # what the cells left in the work directory
            shown["variable_not_saved"] = str(exc)
        if res.stderr.strip():
            shown["stderr"] = res.stderr[-1000:]
        if res.stdout_bytes > len(res.stdout.encode()) or len(self._fit(dict(shown))) < len(
            json.dumps(shown, default=str)
        ):
            shown["truncated"] = True
            shown["stdout_bytes"] = res.stdout_bytes
            try:
                session.save_output(f"results/{stem}.stdout.txt")
                shown["saved_to"] = f"results/{stem}.stdout.txt"
            except WorkdirError as exc:
                shown["not_saved"] = str(exc)
        self._ok(out, res.stdout, shown)

    def _tool_return_answer(self, out: ToolOutcome, answer: Any) -> None:
        out.answer = answer if isinstance(answer, str) else json.dumps(answer)
        self._ok(out, out.answer)
