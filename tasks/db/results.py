"""Query results and their limits, shared by every engine: :class:`QueryError` (the agent's
fault: shown to it as a tool error), :class:`DatabaseUnavailable` (infrastructure),
:class:`ColumnInfo` / :class:`TableInfo` (what ``list_tables`` returns), :class:`QueryResult`
(JSON-safe rows) and :class:`ResultLimits` (at most ``max_rows`` rows, each value cut at
``max_value_bytes``, the whole result at ``max_result_bytes``; defaults 10,000 rows, 1 MiB,
16 MiB), with the builder that applies them. Moved verbatim from ``tasks/db/databases.py``.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
import math
import re
import uuid
from dataclasses import dataclass
from typing import Any, Iterable


DEFAULT_MAX_ROWS = 10_000
#: Per-value and per-result byte caps of a query result (see :class:`ResultLimits`).
DEFAULT_MAX_VALUE_BYTES = 1 << 20
DEFAULT_MAX_RESULT_BYTES = 16 << 20
DEFAULT_TIMEOUT_MS = 30_000
_MAX_ERROR_CHARS = 500


# --------------------------------------------------------------------------------------------
# Result types
# --------------------------------------------------------------------------------------------


class QueryError(Exception):
    """An error the agent sees as a tool error.

    Raised for: SQL/JSON that does not parse, a refused (non read-only) statement, an unknown
    table or collection, an engine error while running the query, a timeout. ``str(err)`` is a
    short, human-readable message (at most a few lines).
    """


class DatabaseUnavailable(Exception):
    """The database server could not be reached or dropped the connection (refused, shut
    down, restarted, network gone): an infrastructure failure, not the query's. The trial that
    hit it is errored (no verdict, retried with ``--retry-errors``), never shown to the model
    as a query error it could be scored on. ``str(err)`` names the database and the cause."""


@dataclass
class ColumnInfo:
    """One column (SQL) or field (Mongo): ``name`` and the engine's ``type`` name as text
    (e.g. ``"bigint"``, ``"DOUBLE"``, ``"TEXT"``; Mongo: Python type names like ``"int"`` or
    ``"int|NoneType"`` when several were seen)."""

    name: str
    type: str


@dataclass
class TableInfo:
    """A table, view or collection: ``name``, its ``columns`` in order, and ``row_count``
    (exact count of rows/documents, ``None`` when unknown)."""

    name: str
    columns: list[ColumnInfo]
    row_count: int | None = None


@dataclass
class QueryResult:
    """Rows of a query.

    - ``columns``: column names in result order (Mongo: union of document keys in order of first
      appearance). Duplicate SQL column names are made unique with a ``_2``, ``_3``... suffix.
    - ``rows``: one dict per row, keyed by ``columns``; values are JSON-safe: ``None``, bool,
      int, float, str, lists and dicts of those. Dates/datetimes/times become ISO-8601 strings,
      ``Decimal`` becomes float, bytes become a hex string, ``ObjectId``/UUID become str,
      timedeltas become their ``str()``, NaN/±inf floats become the strings ``"NaN"``,
      ``"Infinity"``, ``"-Infinity"``. A value larger than the per-value byte cap is replaced
      by a string: its first bytes (JSON text for lists/dicts) followed by
      ``"… [value cut at <cap> of <size> bytes]"`` (see :class:`ResultLimits`).
    - ``truncated``: True when rows were left out: more than ``max_rows`` existed
      (``truncated_by == "rows"``) or the next row would have taken the result past its byte
      cap (``truncated_by == "bytes"``).
    - ``cut_values``: how many values were cut at the per-value cap.
    - ``result_bytes``: approximate size of ``rows`` as JSON (bytes).
    """

    columns: list[str]
    rows: list[dict]
    truncated: bool = False
    truncated_by: str | None = None
    cut_values: int = 0
    result_bytes: int = 0

    def preview(self, n: int = 20) -> str:
        """A compact text table of the first ``n`` rows (cells cut to 40 characters, ``NULL``
        for None), followed by a line ``"(N rows)"`` or ``"(N rows, truncated)"`` where N is
        ``len(self.rows)``."""
        shown = self.rows[: max(n, 0)]

        def cell(v: Any) -> str:
            if v is None:
                s = "NULL"
            elif isinstance(v, (list, dict)):
                s = json.dumps(v, ensure_ascii=False, default=str)
            else:
                s = str(v)
            s = s.replace("\n", "\\n")
            return s if len(s) <= 40 else s[:39] + "…"

        lines: list[str] = []
        if self.columns:
            table = [list(self.columns)] + [[cell(r.get(c)) for c in self.columns] for r in shown]
            widths = [max(len(row[i]) for row in table) for i in range(len(self.columns))]
            fmt = lambda row: " | ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()  # noqa: E731
            lines.append(fmt(table[0]))
            lines.append("-+-".join("-" * w for w in widths))
            lines.extend(fmt(row) for row in table[1:])
            if len(self.rows) > len(shown):
                lines.append(f"... ({len(self.rows) - len(shown)} more rows not shown)")
        lines.append(f"({len(self.rows)} rows{', truncated' if self.truncated else ''})")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """The result as a JSON-able dict (the fields above); :meth:`from_json` inverts it."""
        return {"columns": self.columns, "rows": self.rows, "truncated": self.truncated,
                "truncated_by": self.truncated_by, "cut_values": self.cut_values,
                "result_bytes": self.result_bytes}

    @classmethod
    def from_json(cls, data: dict) -> "QueryResult":
        """Inverse of :meth:`to_json`; ValueError for anything else."""
        if not isinstance(data, dict) or not isinstance(data.get("columns"), list) \
                or not isinstance(data.get("rows"), list):
            raise ValueError("not a query result")
        return cls(
            columns=[str(c) for c in data["columns"]],
            rows=[r for r in data["rows"] if isinstance(r, dict)],
            truncated=bool(data.get("truncated")),
            truncated_by=data.get("truncated_by") if data.get("truncated_by") in ("rows", "bytes") else None,
            cut_values=int(data.get("cut_values") or 0),
            result_bytes=int(data.get("result_bytes") or 0),
        )


@dataclass(frozen=True)
class ResultLimits:
    """How much one query may return.

    ``max_rows``: rows kept (``max_rows + 1`` are fetched to tell whether more existed);
    ``max_value_bytes``: bytes of one value (a longer one is cut, see :class:`QueryResult`);
    ``max_result_bytes``: bytes of the whole result as JSON (rows past it are left out). With
    many columns the per-value cap shrinks to ``max_result_bytes / columns`` (at least 1 KiB)
    so that one row always fits. Engines fetch in chunks and never hold more than a bounded
    multiple of these in querylab's process. ValueError for negative or non-int values.
    """

    max_rows: int = 10_000
    max_value_bytes: int = 1 << 20
    max_result_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_value_bytes", "max_result_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative int, got {v!r}")

    def value_cap(self, n_columns: int) -> int:
        """The per-value cap for a result of ``n_columns`` columns (bytes)."""
        share = self.max_result_bytes // max(1, n_columns) - 128  # room for names and notes
        return max(1024, min(self.max_value_bytes, share))


def _json_safe(v: Any) -> Any:
    """Convert a driver value to a JSON-safe value (see :class:`QueryResult`)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return v
    if isinstance(v, decimal.Decimal):
        return _json_safe(float(v))
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_json_safe(x) for x in v]
    if isinstance(v, (uuid.UUID, _dt.timedelta)):
        return str(v)
    tname = type(v).__name__
    if tname == "Decimal128":  # bson
        return _json_safe(v.to_decimal())
    if tname in ("Int64",):  # bson
        return int(v)
    if hasattr(v, "item") and callable(v.item):  # numpy scalars
        try:
            return _json_safe(v.item())
        except Exception:  # pragma: no cover
            pass
    return str(v)  # ObjectId, Regex, Timestamp, anything else


class _Cut:
    """A value the engine already cut (PostgreSQL): its first characters and its full size."""

    __slots__ = ("head", "size")

    def __init__(self, head: str, size: int):
        self.head, self.size = head, size


def _cut_note(cap: int, size: int) -> str:
    return f"… [value cut at {cap} of {size} bytes]"


def _text_bytes(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


def _cut_text(s: str, cap: int, size: int) -> str:
    head = s[:cap] if s.isascii() else s[: cap // 4]
    return head + _cut_note(cap, size)


def _cap_value(v: Any, cap: int) -> tuple[Any, int, bool]:
    """``(JSON-safe value, its approximate JSON size in bytes, whether it was cut)``."""
    safe, size, cut, _ = _cap(v, cap)
    return safe, size, cut


def _cap(v: Any, cap: int) -> tuple[Any, int, bool, int]:
    """:func:`_cap_value` plus the value's size before cutting (bytes)."""
    if v is None or isinstance(v, (bool, int, float)):
        return _json_safe(v), 8, False, 8
    if isinstance(v, str):
        n = _text_bytes(v)
        if n <= cap:
            return v, n + 2, False, n
        return _cut_text(v, cap, n), cap + 48, True, n
    if isinstance(v, (bytes, bytearray, memoryview)):
        n = 2 * len(v)
        if n <= cap:
            return bytes(v).hex(), n + 2, False, n
        return bytes(v[: cap // 2]).hex() + _cut_note(cap, n), cap + 48, True, n
    if isinstance(v, _Cut):
        return _cut_text(v.head, cap, v.size), cap + 48, True, v.size
    try:
        safe = _json_safe(v)
        if isinstance(safe, str):
            return _cap(safe, cap)
        text = json.dumps(safe, ensure_ascii=False, default=str)
    except RecursionError:
        return "[value nested too deeply to show]", 40, True, 40
    n = _text_bytes(text)
    if n <= cap:
        return safe, n, False, n
    return _cut_text(text, cap, n), cap + 48, True, n


def _unique_columns(names: Iterable[str]) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for n in names:
        cand, k = n, 1
        while cand in seen:
            k += 1
            cand = f"{n}_{k}"
        seen.add(cand)
        out.append(cand)
    return out


class _ResultBuilder:
    """Collects rows under :class:`ResultLimits`: values are capped as they arrive and
    :meth:`add` / :meth:`add_doc` return False once the result is full (the row that did not
    fit is left out and ``truncated`` is set), so callers stop fetching."""

    def __init__(self, limits: ResultLimits, columns: list[str] | None = None):
        self.limits = limits
        self.columns = _unique_columns(columns) if columns is not None else []
        self._seen = set(self.columns)
        self.cap = limits.value_cap(len(self.columns)) if columns is not None else limits.max_value_bytes
        self.rows: list[dict] = []
        self.bytes = 2
        self.cut = 0
        self.truncated_by: str | None = None
        self.largest_row = 0  # bytes of the largest row before cutting (to size fetches)

    def _room(self) -> bool:
        if len(self.rows) >= self.limits.max_rows:
            self.truncated_by = "rows"
            return False
        return True

    def _keep(self, row: dict, size: int) -> bool:
        if self.bytes + size > self.limits.max_result_bytes:
            self.truncated_by = "bytes"
            return False
        self.rows.append(row)
        self.bytes += size
        return True

    def add(self, values: Iterable[Any]) -> bool:
        """Add one row of values in column order; False when the result is full."""
        if not self._room():
            return False
        row, size, raw = {}, 2, 0
        for col, v in zip(self.columns, values):
            safe, n, cut, r = _cap(v, self.cap)
            row[col] = safe
            size += n + len(col) + 4
            raw += r
            self.cut += cut
        self.largest_row = max(self.largest_row, raw)
        return self._keep(row, size)

    def chunk(self, most: int = 256, budget: int = 8 << 20) -> int:
        """Rows to fetch next so that a chunk of rows like the largest seen so far stays
        within ``budget`` bytes (1 until a row was seen)."""
        if not self.rows and not self.largest_row:
            return 1
        return max(1, min(most, budget // max(1, self.largest_row)))

    def add_doc(self, doc: dict) -> bool:
        """Add one document (Mongo); new keys become columns in order of appearance."""
        if not self._room():
            return False
        row, size = {}, 2
        for k, v in doc.items():
            key = str(k)
            safe, n, cut = _cap_value(v, self.cap)
            row[key] = safe
            size += n + len(key) + 4
            self.cut += cut
        if not self._keep(row, size):
            return False
        for key in row:
            if key not in self._seen:
                self._seen.add(key)
                self.columns.append(key)
        return True

    def result(self) -> QueryResult:
        return QueryResult(columns=self.columns, rows=self.rows,
                           truncated=self.truncated_by is not None,
                           truncated_by=self.truncated_by, cut_values=self.cut,
                           result_bytes=self.bytes)


def _short(msg: Any, max_lines: int = 3) -> str:
    """The first non-empty lines of an engine message, ANSI codes removed, trimmed."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(msg))
    lines = [ln.rstrip() for ln in text.strip().splitlines() if ln.strip()]
    out = "\n".join(lines[:max_lines]).strip()
    if len(out) > _MAX_ERROR_CHARS:
        out = out[: _MAX_ERROR_CHARS - 1] + "…"
    return out or type(msg).__name__


def _limits(max_rows: Any, max_result_bytes: Any = None, max_value_bytes: Any = None) -> ResultLimits:
    """:class:`ResultLimits` from ``query()`` arguments (a ResultLimits passes through);
    ValueError for a negative or non-int value."""
    if isinstance(max_rows, ResultLimits):
        return max_rows
    return ResultLimits(
        max_rows=max_rows,
        max_result_bytes=DEFAULT_MAX_RESULT_BYTES if max_result_bytes is None else max_result_bytes,
        max_value_bytes=DEFAULT_MAX_VALUE_BYTES if max_value_bytes is None else max_value_bytes,
    )
