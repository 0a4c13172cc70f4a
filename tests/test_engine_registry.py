"""The engine registry (tasks/db/registry.py): a toy engine in one decorated class is loaded and
opened through tasks.db.engines with no other edit; an unknown engine is a clear ValueError."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.settings import Settings
from tasks.db import engines
from tasks.db.registry import FileEngine, engine_names, get_engine, register_engine
from tasks.db.results import QueryError
from tasks.db.sqlite import SQLiteDatabase, load_sqlite


@register_engine
class ToyEngine(FileEngine):
    """A file engine that stores its database as SQLite under its own name."""

    name = "toy"
    database = SQLiteDatabase

    def write(self, path, tables):
        self.writes = getattr(self, "writes", 0) + 1
        load_sqlite(path, tables)


def _manifest(tmp_path, engine):
    uri = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"id": [1, 2], "name": ["a", "b"]}), uri)
    return {"name": f"regtest_{engine}", "version": "v1",
            "databases": {"main": {"engine": engine, "tables": {"t": {"uri": uri, "rows": 2}}}}}


def test_builtin_engines_are_registered():
    assert {"sqlite", "duckdb", "postgres", "mongodb"} <= set(engine_names())


def test_a_toy_engine_loads_and_opens_through_the_registry(tmp_path):
    settings = Settings(artifacts=str(tmp_path / "art"), home=tmp_path / "home")
    m = _manifest(tmp_path, "toy")
    where = engines.ensure_loaded(m, "main", settings)
    assert where.endswith("main.toy") and where.startswith(str(tmp_path / "home" / "build"))
    assert engines.ensure_loaded(m, "main", settings) == where
    assert get_engine("toy").writes == 1  # loaded once
    db = engines.open_database(m, "main", settings)
    assert isinstance(db, SQLiteDatabase)
    assert db.query("SELECT name FROM t ORDER BY id").rows == [{"name": "a"}, {"name": "b"}]
    with pytest.raises(QueryError):  # the SQLite adapter's read-only guards come with it
        db.query("DELETE FROM t")


def test_an_unknown_engine_is_a_clear_error(tmp_path):
    settings = Settings(artifacts=str(tmp_path / "art"), home=tmp_path / "home")
    with pytest.raises(ValueError, match="unknown engine 'nosuch'"):
        engines.ensure_loaded(_manifest(tmp_path, "nosuch"), "main", settings)


def test_a_name_taken_by_another_class_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        @register_engine
        class Other(FileEngine):
            name = "sqlite"


def test_a_spec_accepts_a_registered_engine_with_no_other_edit(tmp_path):
    """schemas/spec.py checks a database's engine against the registry: the toy engine is valid
    in a spec, and the one-line SpecError for an unknown or missing engine lists it."""
    import yaml

    from tasks.datasets.spec import SpecError, load_spec
    from tests.helpers import scaffold_spec

    raw = scaffold_spec()
    raw["databases"]["lab"]["engine"] = "toy"
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert load_spec(path).databases["lab"].engine == "toy"
    for edit, problem in (
            (lambda db: db.update(engine="nosuch"), "unknown engine 'nosuch'; fix: use one of "),
            (lambda db: db.pop("engine"), "required field missing; fix: add `engine:` one of ")):
        raw = scaffold_spec()
        edit(raw["databases"]["lab"])
        path.write_text(yaml.safe_dump(raw))
        with pytest.raises(SpecError) as err:
            load_spec(path)
        assert err.value.field == "databases.lab.engine" and str(path) in str(err.value)
        assert err.value.problem.startswith(problem), err.value.problem
        assert err.value.problem.endswith("postgres, mongodb, sqlite, duckdb, toy")
        assert "\n" not in str(err.value)


def test_an_engine_of_a_plugin_registers_through_the_entry_point_group(tmp_path, monkeypatch):
    """An engine outside the repository registers through the ``querylab`` entry-point group,
    as agent kinds and validators do: the first lookup imports the plugin module."""
    from importlib.metadata import EntryPoint

    from tasks.core import registries
    from tasks.db import registry

    (tmp_path / "qlab_engine_plugin.py").write_text(
        "from tasks.db.registry import FileEngine, register_engine\n"
        "from tasks.db.sqlite import SQLiteDatabase, load_sqlite\n"
        "@register_engine\nclass EpEngine(FileEngine):\n    name = 'ep-engine'\n"
        "    database = SQLiteDatabase\n"
        "    def write(self, path, tables):\n        load_sqlite(path, tables)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registries, "entry_points",
                        lambda group: [EntryPoint("eng", "qlab_engine_plugin", group)])
    monkeypatch.setattr(registries, "_loaded", False)
    monkeypatch.setattr(registry, "_ENGINES", dict(registry._ENGINES))  # forget it afterwards
    assert "ep-engine" in engine_names()
    assert get_engine("ep-engine").database is SQLiteDatabase
