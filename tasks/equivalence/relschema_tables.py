"""Columns, keys and tables of a relational schema — the parts :class:`tasks.equivalence.relschema.RelSchema`
is made of: :class:`Column` (type category, constraints, collation), :class:`ForeignKey`,
:class:`UniqueIndex`, :class:`Table`, the type categories (:func:`type_category`) and
:class:`SchemaError`.

Split out of :mod:`tasks.equivalence.relschema`; the code moved verbatim."""

from __future__ import annotations

import decimal
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from tasks.equivalence.sql_dialects import sqlglot_dialect


class SchemaError(ValueError):
    """A schema cannot be read (bad DDL or mapping, unknown table in a key, no CREATE TABLE)."""


_CATEGORY_SQL = {
    "int": "BIGINT", "float": "DOUBLE", "decimal": "DECIMAL(18, 4)", "text": "VARCHAR",
    "date": "DATE", "time": "TIME", "timestamp": "TIMESTAMP", "bool": "BOOLEAN",
    "uuid": "UUID", "json": "JSON", "other": "VARCHAR",
}

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


@dataclass
class Column:
    """One column: declared ``name``, sqlglot ``dtype``, value ``category``, ``not_null``;
    ``generated``: the expression of a generated column (computed by the engine, never
    inserted; ``stored`` as declared); ``collation`` as declared (lower case); ``untyped``: no
    declared type (SQLite); ``enum``: the values an ENUM (or an enum type) allows;
    ``set_members``: the members of a MySQL SET."""

    name: str
    dtype: exp.DataType
    category: str
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
        length, an enum's or a SET's values."""
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


@dataclass
class ForeignKey:
    """``columns`` reference ``ref_columns`` of ``ref_table`` (lower-case table key)."""

    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]


@dataclass
class UniqueIndex:
    """``CREATE UNIQUE INDEX name ON table (keys) [WHERE where]`` whose keys are expressions or
    which is partial: no two rows satisfying ``where`` with every key non-NULL have equal keys.
    Enforced by :meth:`tasks.equivalence.instance_db.InstanceDB.load` with :meth:`violation_sql` (no engine
    builds both forms: DuckDB has no partial index)."""

    name: str
    keys: list[exp.Expression]
    where: exp.Expression | None = None

    def violation_sql(self, table_sql: str, dialect: str | None) -> str:
        """A query returning a row when the table (``table_sql``, already quoted) breaks it."""
        keys = [k.sql(dialect=dialect) for k in self.keys]
        conds = [f"({k}) IS NOT NULL" for k in keys]
        if self.where is not None:
            conds.append(f"({self.where.sql(dialect=dialect)})")
        return (f"SELECT 1 FROM {table_sql} WHERE {' AND '.join(conds)} GROUP BY {', '.join(keys)} "
                "HAVING COUNT(*) > 1 LIMIT 1")

    def create_sql(self, table_sql: str, dialect: str | None) -> str:
        """The index as DDL in ``dialect``."""
        where = f" WHERE {self.where.sql(dialect=dialect)}" if self.where is not None else ""
        return (f"CREATE UNIQUE INDEX {ident(self.name, dialect)} ON {table_sql} "
                f"({', '.join(k.sql(dialect=dialect) for k in self.keys)}){where}")


@dataclass
class Table:
    """A table with its keys: ``primary_key`` and ``unique`` column-name tuples
    (``nulls_not_distinct``: UNIQUE keys under which two NULLs collide), ``foreign_keys``,
    ``checks`` (CHECK constraint expressions, as parsed); ``qualifier``: the schema it was
    declared in (``hr`` of ``hr.emp``); ``key_prefixes``: MySQL prefix keys (``UNIQUE
    (name(10))``: the first 10 characters must differ), lower-case column → length;
    ``unique_indexes``: unique indexes a key tuple cannot say (on expressions such as
    ``lower(s)``, or partial ``WHERE ...``), as :class:`UniqueIndex`. Column names keep their
    declared spelling; look-ups are case-insensitive."""

    name: str
    columns: list[Column]
    primary_key: tuple[str, ...] = ()
    unique: list[tuple[str, ...]] = field(default_factory=list)
    foreign_keys: list[ForeignKey] = field(default_factory=list)
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
        """The :class:`Column` named ``column`` (case-insensitive)."""
        return self.columns[self.index(column)]

    @property
    def keys(self) -> list[tuple[str, ...]]:
        """Every uniqueness constraint: the primary key (if any) and the UNIQUE sets."""
        return ([self.primary_key] if self.primary_key else []) + list(self.unique)

    @property
    def inserted(self) -> list[int]:
        """Positions of the columns an INSERT gives values for (generated ones excluded)."""
        return [i for i, c in enumerate(self.columns) if c.generated is None]


def ident(name: str, dialect: str | None) -> str:
    """``name`` as an identifier in ``dialect`` (quoted when needed)."""
    return exp.to_identifier(name).sql(dialect=sqlglot_dialect(dialect))


_FK = tuple[tuple[str, ...], str, tuple[str, ...]]
