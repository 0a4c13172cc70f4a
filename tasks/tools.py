"""The four agent tools — ``list_db``, ``query_db``, ``execute_python``, ``return_answer`` — and
the per-trial :class:`ToolBox` that executes them.

Results of ``query_db`` and ``execute_python`` are kept as variables ``var_<call_id>`` (DAB's
convention): the model sees a preview, and later ``execute_python`` code sees the full value.
A tool's failure (bad SQL, unknown table, refused write, Python exception, timeout) is returned
to the model as an error message; it never ends the trial.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.databases import Database, QueryError

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
                "dicts). Standard library, pandas, polars and pyarrow are importable."
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

_PRELUDE = """
import glob as _g, json as _j, os as _o
for _f in sorted(_g.glob(_o.path.join("vars", "var_*.json"))):
    with open(_f) as _fh:
        globals()[_o.path.basename(_f)[:-5]] = _j.load(_fh)
del _g, _j, _o, _f
exec(compile(open("cell.py").read(), "cell.py", "exec"))
"""

#: Environment variables passed to ``execute_python``; everything else (API keys, cloud
#: credentials, database URLs) is stripped.
_PYTHON_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


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
    one-line descriptions; ``workdir`` a directory private to the trial. Limits: ``max_rows``
    rows kept per query, ``preview_rows`` shown to the model, ``max_content_chars`` per tool
    message, ``python_timeout_s`` wall-clock seconds per ``execute_python`` call.
    """

    databases: dict[str, Database]
    workdir: Path
    descriptions: dict[str, str] = field(default_factory=dict)
    max_rows: int = 10_000
    preview_rows: int = 20
    max_content_chars: int = 8_000
    python_timeout_s: float = 60.0
    variables: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        (self.workdir / "vars").mkdir(parents=True, exist_ok=True)

    # -- dispatch ---------------------------------------------------------------------------
    def call(self, name: str, arguments: str | dict, call_id: str) -> ToolOutcome:
        """Run tool ``name`` with JSON ``arguments``; never raises for agent mistakes."""
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        start = time.perf_counter()
        out = ToolOutcome(call_id=call_id, tool=name, arguments=raw, success=False, content="")
        try:
            args = json.loads(raw) if raw.strip() else {}
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
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
                except QueryError as exc:
                    self._fail(out, str(exc))
        out.duration_s = time.perf_counter() - start
        return out

    def _fail(self, out: ToolOutcome, message: str) -> None:
        out.success, out.error = False, message
        out.content = json.dumps({"error": message})
        out.result_size = len(out.content)

    def _ok(self, out: ToolOutcome, result: Any, shown: Any | None = None) -> None:
        full = json.dumps(result, default=str)
        text = full if shown is None else json.dumps(shown, default=str)
        if len(text) > self.max_content_chars:
            text = text[: self.max_content_chars] + f"... [truncated, {len(full)} chars]"
        out.success, out.content, out.value, out.result_size = True, text, result, len(full)

    def _store(self, call_id: str, value: Any) -> str:
        name = f"var_{call_id}"
        self.variables[name] = value
        (self.workdir / "vars" / f"{name}.json").write_text(json.dumps(value, default=str))
        return name

    # -- tools ------------------------------------------------------------------------------
    def _tool_list_db(self, out: ToolOutcome, db: str | None = None) -> None:
        if db is None:
            listing = [
                {
                    "db": name,
                    "engine": d.engine,
                    "description": self.descriptions.get(name, ""),
                    "tables": [t.name for t in d.list_tables()],
                }
                for name, d in self.databases.items()
            ]
            return self._ok(out, listing)
        if db not in self.databases:
            return self._fail(out, f"unknown database {db!r}; have {sorted(self.databases)}")
        tables = [
            {"table": t.name, "columns": {c.name: c.type for c in t.columns}}
            for t in self.databases[db].list_tables()
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
        self._ok(out, result.rows, shown)

    def _tool_execute_python(self, out: ToolOutcome, code: str) -> None:
        (self.workdir / "cell.py").write_text(code)
        env = {k: os.environ[k] for k in _PYTHON_ENV_KEEP if k in os.environ}
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _PRELUDE],
                cwd=self.workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=self.python_timeout_s,
            )
        except subprocess.TimeoutExpired:
            return self._fail(out, f"execute_python timed out after {self.python_timeout_s:g} s")
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
            return self._fail(out, f"python exited with code {proc.returncode}:\n{tail}")
        stdout = proc.stdout
        self._store(out.call_id, stdout)
        self._ok(out, stdout, {"stdout": stdout, "variable": f"var_{out.call_id}"})

    def _tool_return_answer(self, out: ToolOutcome, answer: Any) -> None:
        out.answer = answer if isinstance(answer, str) else json.dumps(answer)
        self._ok(out, out.answer)
