"""Every ``QUERYLAB_*`` variable is a typed, documented field of :class:`Settings` (issue 16
Build 4): the source names no other, the README table lists exactly these, and the modules
read them through ``Settings`` with the semantics they had (defaults, parsing, one-line errors
naming the variable, re-read at each call or read on import as before)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.core.settings import Settings, SettingsError

REPO = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("tasks", "flows", "querylab", "schemas")
NAME = re.compile(r"QUERYLAB_[A-Z0-9_]*")


def _env_names() -> set[str]:
    return {n for f in Settings.model_fields for n in Settings.env_names(f)
            if n.startswith("QUERYLAB_")}


def test_every_querylab_name_in_the_source_is_a_settings_field():
    """A new ``QUERYLAB_*`` variable cannot bypass Settings: any such name in the source is a
    field's variable (a name ending in ``_``, as in ``QUERYLAB_OPENAI_*``, a prefix of one)."""
    names = _env_names()
    unknown = []
    for top in SOURCE_DIRS:
        for path in sorted((REPO / top).rglob("*.py")):
            for lineno, line in enumerate(path.read_text().splitlines(), 1):
                for name in NAME.findall(line):
                    known = (any(n.startswith(name) for n in names) if name.endswith("_")
                             else name in names)
                    if not known:
                        unknown.append(f"{path.relative_to(REPO)}:{lineno}: {name}")
    assert not unknown, "QUERYLAB_ names that are no Settings field:\n" + "\n".join(unknown)


def test_no_module_reads_a_querylab_variable_past_settings():
    """The ``env_*`` pass-through functions never get a querylab variable by name."""
    bypass = re.compile(r"""(env_get|env_setdefault|\.get|getenv)\(\s*["']QUERYLAB_""")
    hits = [f"{p.relative_to(REPO)}:{i}" for top in SOURCE_DIRS for p in (REPO / top).rglob("*.py")
            if p.name != "settings.py"
            for i, line in enumerate(p.read_text().splitlines(), 1) if bypass.search(line)]
    assert not hits


def test_every_field_documents_its_variable_units_and_default():
    for name, field in Settings.model_fields.items():
        doc = field.description or ""
        assert Settings.env_names(name)[0] in doc and "default" in doc, name


def test_the_readme_table_lists_exactly_the_settings():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    listed = {n for row in rows for n in NAME.findall(row.split("|")[1])}
    assert listed == _env_names()


def test_read_takes_one_field_now(monkeypatch):
    """``Settings.read`` reads the environment at each call (never cached), ignores empty
    values and other fields' bad values, and takes a mapping in place of the environment."""
    monkeypatch.setenv("QUERYLAB_STATEMENT_TIMEOUT_MS", "0")  # bad, but not read here
    monkeypatch.setenv("QUERYLAB_TASK_RUNNER", "dask")
    assert Settings.read("task_runner") == "dask"
    monkeypatch.setenv("QUERYLAB_TASK_RUNNER", "")
    assert Settings.read("task_runner") == "threads"
    assert Settings.read("task_runner", {"QUERYLAB_TASK_RUNNER": " Dask://H:1 "}) == "tcp://H:1"
    assert Settings.read("models", {"QUERYLAB_MODELS": os.pathsep.join(["a", "", "b"])}) == [
        Path("a"), Path("b")]
    assert Settings.read("dask_workers", {"QUERYLAB_DASK_WORKERS": " 3"}) == 3
    assert Settings.read("sandbox_uid", {}) == 61000
    assert Settings.read("openai_base_url", {"QUERYLAB_OPENAI_BASE_URL": "",
                                             "OPENAI_BASE_URL": "u"}) == "u"


@pytest.mark.parametrize(("field", "value", "message"), [
    ("dask_workers", "zero", "QUERYLAB_DASK_WORKERS='zero': give a whole number >= 1"),
    ("model_limits", " Sometimes", "QUERYLAB_MODEL_LIMITS='sometimes': use 'prefect' (on)"),
    ("task_runner", "ray", "QUERYLAB_TASK_RUNNER='ray': use 'threads' (default)"),
    ("sandbox_uid", "root", "QUERYLAB_SANDBOX_UID='root': give a uid"),
    ("query_worker_memory_mb", "1G", "QUERYLAB_QUERY_WORKER_MEMORY_MB='1G': give a whole"),
    ("statement_timeout_ms", "0", "QUERYLAB_STATEMENT_TIMEOUT_MS='0': Input should be"),
])
def test_a_bad_value_is_one_line_naming_the_variable(field, value, message, monkeypatch):
    with pytest.raises(SettingsError) as one:
        Settings.read(field, {Settings.env_names(field)[0]: value})
    monkeypatch.setenv(Settings.env_names(field)[0], value)
    with pytest.raises(SettingsError) as whole:
        Settings.from_env()
    for exc in (one.value, whole.value):
        assert str(exc).startswith(message) and "\n" not in str(exc)


def test_modules_read_their_settings_at_each_call(monkeypatch, tmp_path):
    from tasks.core.llm import load_models_config, model_limits_enabled
    from tasks.core.task_runners import task_runner_spec
    from tasks.datasets.catalogue import shared_data_dir
    from tasks.sandbox.host import protected_paths
    from tasks.trials.trial_rows import work_root

    s = Settings(home=tmp_path / "home")
    monkeypatch.setenv("QUERYLAB_WORK_DIR", str(tmp_path / "w1"))
    assert work_root(s) == tmp_path / "w1"
    monkeypatch.setenv("QUERYLAB_WORK_DIR", str(tmp_path / "w2"))
    assert work_root(s) == tmp_path / "w2"
    monkeypatch.setenv("QUERYLAB_SHARED_DATA", str(tmp_path / "shared"))
    assert shared_data_dir() == (tmp_path / "shared").resolve()
    monkeypatch.setenv("QUERYLAB_MODEL_LIMITS", "prefect")
    assert model_limits_enabled()
    monkeypatch.setenv("QUERYLAB_MODEL_LIMITS", "off")
    assert not model_limits_enabled()
    monkeypatch.setenv("QUERYLAB_TASK_RUNNER", "dask")
    monkeypatch.setenv("QUERYLAB_DASK_WORKERS", "3")
    assert task_runner_spec()["n_workers"] == 3
    monkeypatch.setenv("QUERYLAB_MODELS", str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="missing.yaml"):
        load_models_config()
    # a bad value of another variable drops no protected path
    monkeypatch.setenv("QUERYLAB_STATEMENT_TIMEOUT_MS", "0")
    paths = protected_paths()
    assert {str((tmp_path / p).resolve()) for p in ("w2", "shared")} <= set(paths)
    assert os.path.realpath(os.environ["QUERYLAB_HOME"]) in paths


def _import_in_child(env: dict[str, str], code: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("QUERYLAB_")}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, env={**base, "PYTHONPATH": str(REPO), **env}, timeout=120)


def test_import_time_settings_are_read_on_import():
    """The sandbox identity and the query workers' memory limits are read when their modules
    are imported, from the environment the process has then; a bad one stops the import with
    one line naming it."""
    code = ("import tasks.sandbox.isolation as i, tasks.db.db_worker as w; "
            "print(i.SANDBOX_UID, i.SANDBOX_GID, w.SQL_WORKER_MEMORY_MB, w.MONGO_QUERY_MEMORY_MB)")
    assert _import_in_child({}, code).stdout.split() == ["61000", "61000", "1536", "1024"]
    env = {"QUERYLAB_SANDBOX_UID": "62000", "QUERYLAB_QUERY_WORKER_MEMORY_MB": "99",
           "QUERYLAB_MONGO_QUERY_MEMORY_MB": "7"}
    assert _import_in_child(env, code).stdout.split() == ["62000", "62000", "99", "7"]
    env["QUERYLAB_SANDBOX_GID"] = "5"
    assert _import_in_child(env, code).stdout.split()[:2] == ["62000", "5"]
    bad = _import_in_child({"QUERYLAB_SANDBOX_UID": "root"}, code)
    assert bad.returncode and bad.stderr.strip().splitlines()[-1].endswith(
        "QUERYLAB_SANDBOX_UID='root': give a uid")
