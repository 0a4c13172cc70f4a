"""The shared relational-schema model (tasks.db.relschema) both the lifecycle and the
equivalence suites build their schemas from."""

from __future__ import annotations

import pytest

import tasks.db.relschema as shared
import tasks.equivalence.relschema as eq_schema
import tasks.lifecycle.schema as lc_schema
from tasks.db.relschema import Column, SchemaError, Table, type_class
from tasks.equivalence.instances import RelSchema
from tasks.equivalence.value_domains import _type_defaults

DDL = """CREATE TABLE t (
    a INT PRIMARY KEY,
    b VARCHAR(10) NOT NULL,
    c NUMERIC(10, 2),
    d DATETIME,
    e DATE
)"""


def test_both_suites_use_one_model():
    for name in ("Column", "ForeignKey", "Table", "SchemaError"):
        assert getattr(eq_schema, name) is getattr(shared, name)
    for name in ("Column", "ForeignKey", "Table", "type_class", "TYPE_CLASSES"):
        assert getattr(lc_schema, name) is getattr(shared, name)
    # the lifecycle suite's parse errors are schema errors of the shared model
    assert issubclass(lc_schema.SchemaParseError, SchemaError)
    assert issubclass(lc_schema.DDLError, SchemaError)


def test_declared_type_classes_agree_across_suites():
    """The equivalence suite's columns carry their declared type text, so the lifecycle type
    classes apply to them: the same DDL read by both suites gives the same classes."""
    rel = RelSchema.from_ddl(DDL, "sqlite").table("t")
    lc = lc_schema.schema_from_ddl(DDL).table("t")
    eq_classes = [type_class(c.type) for c in rel.columns]
    assert eq_classes == [type_class(c.type) for c in lc.columns]
    assert eq_classes == ["integer", "text", "number", "datetime", "date"]
    assert rel.primary_key == lc.primary_key == ("a",)
    assert rel.column("B").not_null and rel.column("b").length == 10


def test_untyped_and_altered_columns_keep_their_declared_type_text():
    s = RelSchema.from_ddl("CREATE TABLE u (x, y INT); ALTER TABLE u ALTER COLUMN y TYPE TEXT",
                           "postgres")
    x, y = s.table("u").columns
    assert x.untyped and x.type == ""
    assert type_class(y.type) == "text" and y.category == "text"


def test_table_lookups():
    t = Table("T", [Column("Id", "INTEGER"), Column("name")], ("Id",))
    assert t.column("id") is t.columns[0] and t.find_column("NAME") is t.columns[1]
    assert t.find_column("missing") is None
    with pytest.raises(KeyError, match="no column 'missing'"):
        t.column("missing")
    # a column whose type was not parsed (lifecycle) accepts any non-NULL value
    assert t.columns[0].accepts(3) and t.columns[0].accepts("x") and t.columns[0].length is None


def test_integer_type_defaults_use_the_declared_range():
    """value_domains read the integer ranges from the model module (the import used to name
    a module that has no such name)."""
    year = RelSchema.from_ddl("CREATE TABLE y (v YEAR)", "mysql").table("y").column("v")
    tiny = RelSchema.from_ddl("CREATE TABLE y (v TINYINT UNSIGNED)", "mysql").table("y").column("v")
    assert _type_defaults(year) == [1901, 1902, 1903]
    assert _type_defaults(tiny) == [0, 1, 2]
