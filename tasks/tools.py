"""The four agent tools — ``list_db``, ``query_db``, ``execute_python``, ``return_answer`` — and
the per-trial :class:`ToolBox` that executes them.

Results of ``query_db`` and ``execute_python`` are kept as variables ``var_<call_id>`` (DAB's
convention; characters of the call id other than letters, digits and ``_`` become ``_``): the
model sees a preview, and later ``execute_python`` code sees the full value. Results are saved
as files in the trial's sandbox work directory (``vars/var_<call_id>.json``; a large
``execute_python`` output also as ``results/<call_id>.stdout.txt``) and the preview says where
(an ``execute_python`` variable holds the first 100,000 characters of its output; the saved
file holds all of it). Tool
messages are JSON of at most ``max_content_chars`` characters: previews are cut to fit.
A tool's failure (bad SQL, unknown table, refused write, Python exception, timeout) is returned
to the model as an error message; it never ends the trial.

``list_db``, ``query_db`` and ``return_answer`` run in-process (databases are opened once per
process and shared); ``execute_python`` runs each cell in a sealed, unprivileged,
resource-limited process of the trial's sandbox session (:mod:`tasks.sandbox`), opened at the
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

from tasks.databases import Database, QueryError
from tasks.sandbox import Sandbox, SandboxError, Session, shared_sandbox

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

_NON_WORD = re.compile(r"\W")
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


def variable_name(call_id: str) -> str:
    """``var_<call_id>`` with every character that is not a letter, digit or ``_`` replaced by
    ``_`` (so it is a Python identifier and a safe file name)."""
    return "var_" + _NON_WORD.sub("_", call_id)


@dataclass
class ToolOutcome:
    """What one tool call did.

    ``content`` is the text the model sees; ``value`` the full result kept as ``var_<call_id>``;
    ``result_size`` the length in characters of the full JSON result; ``duration_s`` seconds.
    ``answer`` is set only by ``return_answer``.
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

    @property
    def is_final(self) -> bool:
        return self.tool == "return_answer" and self.success


@dataclass
class ToolBox:
    """Executes tool calls for one trial.

    ``databases`` maps logical names to open read-only databases; ``descriptions`` their
    one-line descriptions. Limits: ``max_rows`` rows kept per query, ``preview_rows`` shown to
    the model, ``max_content_chars`` per tool message; ``execute_python`` cells get
    ``python_timeout_s`` wall-clock seconds, ``python_memory_mb`` MiB (their process tree and
    work-directory files; also the address space per process), ``python_cpu_s`` CPU seconds,
    ``python_max_procs`` processes + threads, cut to the trial's ``deadline`` (a
    ``time.monotonic()`` instant) when one is set, and a ``python_disk_mb`` MiB work directory.

    The cells run in ``session`` (a :class:`tasks.sandbox.Session`), by default one opened
    from ``sandbox`` (default :func:`tasks.sandbox.shared_sandbox`) at the first
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
    preview_rows: int = 20
    max_content_chars: int = 8_000
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
    def call(self, name: str, arguments: str | dict, call_id: str) -> ToolOutcome:
        """Run tool ``name`` with JSON ``arguments``; never raises for agent mistakes."""
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        start = time.perf_counter()
        out = ToolOutcome(call_id=call_id, tool=name, arguments=raw, success=False, content="")
        try:
            args = json.loads(raw) if raw.strip() else {}
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")  # noqa: TRY004 (caught below)
        except ValueError as exc:
            self._fail(out, f"malformed arguments for {name}: {exc}")
        else:
            handler = getattr(self, f"_tool_{name}", None) if name in TOOL_NAMES else None
            if handler is None:
                self._fail(out, f"unknown tool {name!r}; available: {', '.join(TOOL_NAMES)}")
            else:
                try:
                    handler(out, **args)
                except TypeError as exc:
                    self._fail(out, f"bad arguments for {name}: {exc}")
                except (QueryError, SandboxError) as exc:
                    self._fail(out, str(exc))
        out.duration_s = time.perf_counter() - start
        return out

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
        """Keep ``value`` as variable ``var_<call_id>`` (returned; a name over 200 characters is
        cut and given a hash suffix) and, once the sandbox session is open, as
        ``vars/<name>.json`` in its work directory. Raises SandboxError when that fails."""
        name = variable_name(call_id)
        if len(name) > 200:
            name = f"{name[:180]}_{hashlib.sha256(name.encode()).hexdigest()[:16]}"
        self.variables[name] = value
        if self.session is not None and self.session.alive:
            self.session.put_file(f"vars/{name}.json", json.dumps(value, default=str).encode())
        return name

    # -- tools ------------------------------------------------------------------------------
    def _tool_list_db(self, out: ToolOutcome, db: str | None = None) -> None:
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
            return self._fail(out, f"unknown database {db!r}; have {sorted(self.databases)}")
        tables = [
            {"table": t.name, "columns": {c.name: c.type for c in t.columns}}
            for t in cached_tables(self.databases[db])
        ]
        self._ok(out, {"db": db, "engine": self.databases[db].engine, "tables": tables})

    def _tool_query_db(self, out: ToolOutcome, db: str, query: Any) -> None:
        if db not in self.databases:
            return self._fail(out, f"unknown database {db!r}; have {sorted(self.databases)}")
        result = self.databases[db].query(query, max_rows=self.max_rows)
        var = self._store(out.call_id, result.rows)
        shown = {
            "columns": result.columns,
            "row_count": len(result.rows),
            "truncated": result.truncated,
            "preview": result.rows[: self.preview_rows],
            "variable": var,
        }
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
        if len(stem) > 100:
            stem = f"{stem[:80]}_{hashlib.sha256(stem.encode()).hexdigest()[:16]}"
        try:
            session = self.python_session()
            res = session.run(
                code, name=stem, timeout_s=timeout, memory_mb=self.python_memory_mb,
                cpu_s=self.python_cpu_s, max_procs=self.python_max_procs,
                max_output_chars=max(self.max_content_chars, 100_000),
            )
        except SandboxError as exc:
            return self._fail(out, f"execute_python could not run: {exc}")
        if res.error:
            return self._fail(out, res.error)
        shown: dict[str, Any] = {"stdout": res.stdout}
        try:
            shown["variable"] = self._store(out.call_id, res.stdout)
        except SandboxError as exc:  # e.g. the cell filled its work directory
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
            except SandboxError as exc:
                shown["not_saved"] = str(exc)
        self._ok(out, res.stdout, shown)

    def _tool_return_answer(self, out: ToolOutcome, answer: Any) -> None:
        out.answer = answer if isinstance(answer, str) else json.dumps(answer)
        self._ok(out, out.answer)
