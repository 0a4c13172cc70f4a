"""What the equivalence suite adds to the shared relational-schema model
(:mod:`tasks.db.relschema`: columns, keys, tables, type classes and categories): unique indexes
on expressions or partial ones (:class:`UniqueIndex`, enforced by the instance database),
identifiers and per-category column types for the DDL it writes for an engine (:func:`ident`,
``_CATEGORY_SQL``)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from tasks.equivalence.sql_dialects import sqlglot_dialect


_CATEGORY_SQL = {
    "int": "BIGINT", "float": "DOUBLE", "decimal": "DECIMAL(18, 4)", "text": "VARCHAR",
    "date": "DATE", "time": "TIME", "timestamp": "TIMESTAMP", "bool": "BOOLEAN",
    "uuid": "UUID", "json": "JSON", "other": "VARCHAR",
}


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


def ident(name: str, dialect: str | None) -> str:
    """``name`` as an identifier in ``dialect`` (quoted when needed)."""
    return exp.to_identifier(name).sql(dialect=sqlglot_dialect(dialect))


_FK = tuple[tuple[str, ...], str, tuple[str, ...]]
