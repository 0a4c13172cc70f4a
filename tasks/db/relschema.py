"""The one relational-schema model every suite uses: :class:`Column`, :class:`ForeignKey`,
:class:`Table`, the two ways of classing a declared type, and :class:`SchemaError`.

- A :class:`Column` has its ``name`` and its declared ``type`` as written (``""``: none);
  a suite that parses types (the equivalence suite, with sqlglot) also sets ``dtype`` (the
  parsed :class:`sqlglot.exp.DataType`) and ``category`` (:func:`type_category`), and the
  constraints it reads: ``not_null``, a generated expression, collation, enum / SET values.
- A :class:`Table` has its columns in order, ``primary_key``, ``unique`` keys,
  ``foreign_keys`` (:class:`ForeignKey`) and, where the DDL says them, CHECKs, a qualifier,
  MySQL prefix keys and unique indexes on expressions. Look-ups are case-insensitive.
- **Type classes** (:func:`type_class`) compare declared type *texts* across dialects (SQLite
  affinity rules refined for dates): ``integer``, ``number``, ``text``, ``boolean``, ``date``,
  ``datetime``, ``time``, ``blob``. **Type categories** (:func:`type_category`) class a parsed
  sqlglot type finer, for choosing values: ``int``, ``float``, ``decimal``, ``text``, ``date``,
  ``time``, ``timestamp``, ``bool``, ``uuid``, ``json``, ``other``.

The schema containers stay with their suites, since they hold what only that suite needs:
:class:`tasks.lifecycle.schema.Schema` (tables in order, the JSON form of design answers, DDL
execution and rendering in SQLite) and :class:`tasks.equivalence.relschema.RelSchema` (tables
by lower-case name read from DDL in any dialect, enum types, reading notes, DDL per engine for
the counterexample finder). Both are lists/maps of the :class:`Table` defined here.
"""

from __future__ import annotations

import decimal
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlglot import exp

if TYPE_CHECKING:  # the equivalence suite's unique indexes on expressions / partial ones
    from tasks.equivalence.relschema_constraints import UniqueIndex

__all__ = [
    "TYPE_CLASSES",
    "Column",
    "ForeignKey",
    "SchemaError",
    "Table",
    "type_category",
    "type_class",
]


class SchemaError(ValueError):
    """A schema cannot be read (bad DDL or mapping, unknown table in a key, no CREATE TABLE);
    the message says which statement or table and why."""


# --------------------------------------------------------------------------------------------
# Classing declared types
# --------------------------------------------------------------------------------------------

TYPE_CLASSES = ("integer", "number", "text", "boolean", "date", "datetime", "time", "blob")

_TYPE_RULES = (
    (re.compile(r"DATETIME|TIMESTAMP", re.IGNORECASE), "datetime"),
    (re.compile(r"DATE", re.IGNORECASE), "date"),
    (re.compile(r"^TIME|\bTIME\b", re.IGNORECASE), "time"),
    (re.compile(r"BOOL|^BIT\b", re.IGNORECASE), "boolean"),
    (re.compile(r"INT|^YEAR$", re.IGNORECASE), "integer"),
    (re.compile(r"CHAR|CLOB|TEXT|STRING|VARCHAR", re.IGNORECASE), "text"),
    (re.compile(r"BLOB|BINARY|BYTEA", re.IGNORECASE), "blob"),
    (re.compile(r"REAL|FLOA|DOUB|DEC|NUM|MONEY", re.IGNORECASE), "number"),
)


def type_class(declared: str | None) -> str:
    """The type class (one of :data:`TYPE_CLASSES`) of a declared column type, e.g.
    ``NVARCHAR(120)`` → ``text``, ``NUMERIC(10,2)`` → ``number``, ``DATETIME`` → ``datetime``;
    an empty or unknown type is ``text``."""
    t = (declared or "").strip()
    for rx, cls in _TYPE_RULES:
        if rx.search(t):
            return cls
    return "text"


_T = exp.DataType.Type
#: Integer ranges of integer types (inclusive).
_INT_RANGES = {
    _T.TINYINT: (-128, 127), _T.UTINYINT: (0, 255), _T.SMALLINT: (-32768, 32767),
    _T.USMALLINT: (0, 65535), _T.MEDIUMINT: (-8388608, 8388607), _T.UMEDIUMINT: (0, 16777215),
    _T.INT: (-2**31, 2**31 - 1), _T.UINT: (0, 2**32 - 1), _T.BIGINT: (-2**63, 2**63 - 1),
    _T.UBIGINT: (0, 2**64 - 1), _T.YEAR: (1901, 2155), _T.BIT: (0, 1),
}


def type_category(dtype: exp.DataType) -> str:
    """``int``, ``float``, ``decimal``, ``text``, ``date``, ``time``, ``timestamp``, ``bool``,
    ``uuid``, ``json`` or ``other`` for a sqlglot data type (used to choose values and
    neighbours of constants)."""
    if dtype.this in (_T.BOOLEAN,):
        return "bool"
    if dtype.this in (_T.UUID,):
        return "uuid"
    if dtype.this in (_T.JSON, _T.JSONB):
        return "json"
    if dtype.this in (_T.TIME, _T.TIMETZ):
        return "time"
    if dtype.is_type(*exp.DataType.INTEGER_TYPES) or dtype.this in (_T.YEAR, _T.BIT):
        return "int"
    if dtype.this in (_T.DECIMAL, _T.MONEY, _T.SMALLMONEY, _T.BIGDECIMAL):
        return "decimal"
    if dtype.is_type(*exp.DataType.REAL_TYPES):
        return "float"
    if dtype.this in (_T.DATE, _T.DATE32):
        return "date"
    if dtype.is_type(*exp.DataType.TEMPORAL_TYPES):
        return "timestamp"
    if dtype.is_type(*exp.DataType.TEXT_TYPES) or dtype.this in (
            _T.CHAR, _T.NCHAR, _T.UNKNOWN, _T.ENUM, _T.SET, _T.USERDEFINED):
        return "text"
    return "other"


def _type_params(dtype: exp.DataType) -> list[int]:
    out = []
    for p in dtype.expressions:
        node = p.this if isinstance(p, exp.DataTypeParam) else p
        if isinstance(node, exp.Literal) and not node.is_string:
            try:
                out.append(int(node.this))
            except ValueError:
                pass
    return out


# --------------------------------------------------------------------------------------------
# Columns, keys, tables
# --------------------------------------------------------------------------------------------


@dataclass
class Column:
    """One column: declared ``name`` and ``type`` (the declared type's text, ``""`` when it
    has none; :func:`type_class` compares them). Set by a suite that parses the DDL: ``dtype``
    (sqlglot type; None when not parsed) and its ``category`` (:func:`type_category`, ``""``
    when not parsed), ``not_null``; ``generated``: the expression of a generated column
    (computed by the engine, never inserted; ``stored`` as declared); ``collation`` as declared
    (lower case); ``untyped``: no declared type (SQLite); ``enum``: the values an ENUM (or an
    enum type) allows; ``set_members``: the members of a MySQL SET."""

    name: str
    type: str = ""
    dtype: exp.DataType | None = None
    category: str = ""
    not_null: bool = False
    generated: exp.Expression | None = None
    stored: bool = False
    collation: str | None = None
    untyped: bool = False
    enum: list[str] | None = None
    set_members: list[str] | None = None

    @property
    def length(self) -> int | None:
        """The declared maximum length of a string type (``VARCHAR(n)``, ``CHAR(n)``)."""
        if self.category == "text" and self.dtype.this in (
                _T.VARCHAR, _T.CHAR, _T.NVARCHAR, _T.NCHAR, _T.BPCHAR):
            params = _type_params(self.dtype)
            return params[0] if params and params[0] > 0 else None
        return None

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` (a generated Python value; None = NULL) is a value of the declared
        type: within an integer type's range, a DECIMAL(p, s)'s digits, a string type's
        length, an enum's or a SET's values. A column whose type was not parsed (no
        ``category``) accepts any non-NULL value."""
        if value is None:
            return not self.not_null
        if self.enum is not None:
            return value in self.enum
        if self.set_members is not None:
            parts = [] if value == "" else str(value).split(",")
            return len(set(parts)) == len(parts) and all(p in self.set_members for p in parts)
        if self.category == "int":
            if not isinstance(value, int) or isinstance(value, bool):
                return False
            lo, hi = _INT_RANGES.get(self.dtype.this, (-2**63, 2**63 - 1))
            if self.dtype.this == _T.BIT:
                params = _type_params(self.dtype)
                hi = 2 ** (params[0] if params else 1) - 1
            return lo <= value <= hi
        if self.category == "decimal":
            params = _type_params(self.dtype)
            if len(params) >= 1:
                p, s = params[0], params[1] if len(params) > 1 else 0
                try:
                    d = decimal.Decimal(str(value))
                except decimal.InvalidOperation:
                    return False
                if d != round(d, s) or abs(d) >= decimal.Decimal(10) ** (p - s):
                    return False
            return True
        if self.category == "text" and self.length is not None:
            return len(str(value)) <= self.length
        return True


@dataclass(frozen=True)
class ForeignKey:
    """``columns`` of the owning table reference ``ref_columns`` of ``ref_table`` (empty
    ``ref_columns``: the referenced table's primary key). ``ref_table`` is spelled as the
    container keeps it (the equivalence suite: its lower-case key; lifecycle: as declared)."""

    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...] = ()


@dataclass
class Table:
    """A table with its keys: ``columns`` in order, ``primary_key`` column names,
    ``foreign_keys``; ``unique`` column-name tuples (``nulls_not_distinct``: UNIQUE keys under
    which two NULLs collide); ``checks`` (CHECK constraint expressions, as parsed);
    ``qualifier``: the schema it was declared in (``hr`` of ``hr.emp``); ``key_prefixes``:
    MySQL prefix keys (``UNIQUE (name(10))``: the first 10 characters must differ), lower-case
    column → length; ``unique_indexes``: unique indexes a key tuple cannot say (on expressions
    such as ``lower(s)``, or partial ``WHERE ...``), as
    :class:`tasks.equivalence.relschema_constraints.UniqueIndex`. Column names keep their
    declared spelling; look-ups are case-insensitive."""

    name: str
    columns: list[Column] = field(default_factory=list)
    primary_key: tuple[str, ...] = ()
    foreign_keys: list[ForeignKey] = field(default_factory=list)
    unique: list[tuple[str, ...]] = field(default_factory=list)
    checks: list[exp.Expression] = field(default_factory=list)
    nulls_not_distinct: list[tuple[str, ...]] = field(default_factory=list)
    qualifier: str | None = None
    key_prefixes: dict[tuple[str, ...], dict[str, int]] = field(default_factory=dict)
    unique_indexes: list[UniqueIndex] = field(default_factory=list)

    def index(self, column: str) -> int:
        """Position of ``column`` (case-insensitive); KeyError naming the table otherwise."""
        low = column.lower()
        for i, c in enumerate(self.columns):
            if c.name.lower() == low:
                return i
        raise KeyError(f"table {self.name}: no column {column!r}")

    def column(self, column: str) -> Column:
        """The :class:`Column` named ``column`` (case-insensitive); KeyError naming the table
        otherwise (:meth:`find_column` returns None instead)."""
        return self.columns[self.index(column)]

    def find_column(self, column: str) -> Column | None:
        """The :class:`Column` named ``column`` (case-insensitive) or None."""
        low = column.lower()
        return next((c for c in self.columns if c.name.lower() == low), None)

    @property
    def keys(self) -> list[tuple[str, ...]]:
        """Every uniqueness constraint: the primary key (if any) and the UNIQUE sets."""
        return ([self.primary_key] if self.primary_key else []) + list(self.unique)

    @property
    def inserted(self) -> list[int]:
        """Positions of the columns an INSERT gives values for (generated ones excluded)."""
        return [i for i, c in enumerate(self.columns) if c.generated is None]
