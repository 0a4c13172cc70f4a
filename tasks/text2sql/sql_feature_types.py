"""The value types of SQL structural features: :class:`SQLFeatures` (the bags and counts of one
query; definitions in :mod:`tasks.text2sql.sql_features`), :class:`SchemaIndex` (the
lower-cased ``{table: columns}`` used to attribute unqualified columns) and
:class:`SQLFeatureError` (the text is not one query sqlglot can read).

Split out of :mod:`tasks.text2sql.sql_features`; the code moved verbatim."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas.text2sql import BAG_FEATURES, NUMERIC_FEATURES


class SQLFeatureError(ValueError):
    """The text is not one SQL query sqlglot can read in the given dialect (parse error, several
    statements, or a statement that is not a query); the message says which."""


@dataclass(frozen=True)
class SQLFeatures:
    """Features of one query (definitions in the :mod:`tasks.text2sql.sql_features` docstring).

    Bag features are sorted tuples of strings (duplicates kept); ``cte_count``,
    ``subquery_count`` and ``join_count`` are stored, the other counts are the bag sizes.
    """

    columns: tuple[str, ...]
    relations: tuple[str, ...]
    where_predicates: tuple[str, ...]
    join_pairs: tuple[str, ...]
    aggregations: tuple[str, ...]
    window_functions: tuple[str, ...]
    functions: tuple[str, ...]
    constants: tuple[str, ...]
    cte_count: int
    subquery_count: int
    join_count: int

    @property
    def predicate_count(self) -> int:
        return len(self.where_predicates)

    @property
    def column_count(self) -> int:
        return len(self.columns)

    @property
    def relation_count(self) -> int:
        return len(self.relations)

    @property
    def function_count(self) -> int:
        return len(self.functions)

    @property
    def aggregation_count(self) -> int:
        return len(self.aggregations)

    @property
    def window_function_count(self) -> int:
        return len(self.window_functions)

    @property
    def join_pair_count(self) -> int:
        return len(self.join_pairs)

    @property
    def constant_count(self) -> int:
        return len(self.constants)

    def numeric(self) -> dict[str, int]:
        """``{feature: count}`` for every name in :data:`NUMERIC_FEATURES`."""
        return {name: int(getattr(self, name)) for name in NUMERIC_FEATURES}

    def bags(self) -> dict[str, list[str]]:
        """``{feature: sorted list}`` for every name in :data:`BAG_FEATURES`."""
        return {name: list(getattr(self, name)) for name in BAG_FEATURES}

    def as_row(self) -> dict[str, Any]:
        """One flat row: the numeric features then the bags (lists of str)."""
        return {**self.numeric(), **self.bags()}


class SchemaIndex:
    """A lower-cased ``{table: frozenset(columns)}`` for column attribution (build it once with
    :func:`prepare_schema` and pass it to many :func:`extract_features` calls)."""

    __slots__ = ("tables",)

    def __init__(self, tables: dict[str, frozenset[str]]):
        self.tables = tables

    def columns(self, table: str) -> frozenset[str] | None:
        return self.tables.get(table)
