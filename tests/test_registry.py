"""Registries (issue 16, Build 3): a new agent kind and a new validator are one decorated class
in one file each (tests/fakes/toy_agent.py, tests/fakes/toy_validator.py), registered from
outside ``tasks/`` by importing them, and run end to end through ``querylab run``: the trials
stage runs the toy agent, the score stage judges with the toy validator, the report shows it."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

import tests.fakes.toy_agent  # noqa: F401 - registers agent kind "toy"
import tests.fakes.toy_validator  # noqa: F401 - registers validator kind "toy_yes"
from tasks.agents.registry import AgentKind, agentkind, kind_names, parse_agent_spec
from tasks.core.llm import AgentConfigError
from tasks.scoring.validate import check_answer


def test_every_suite_parses_specs_through_one_registry():
    from tasks.lifecycle.agents import check_agent_spec
    from tasks.text2sql.generators import GeneratorConfigError, check_generator_spec
    from tasks.trials.stage import parse_agent

    assert kind_names()[:4] == ["oracle", "openai", "local", "replay"]
    assert parse_agent("toy:yes") == ("toy", "yes")
    # the toy kind runs trials only: the other suites list what they accept, and not it
    with pytest.raises(GeneratorConfigError, match=r"unknown generator 'toy:yes'; use 'oracle', "
                       r"'openai:<model>', 'local:<model>' or 'replay:<path>'$"):
        check_generator_spec("toy:yes")
    with pytest.raises(AgentConfigError, match=r"unknown agent 'toy:yes'.*'replay:<file\.jsonl>'$"):
        check_agent_spec("toy:yes")
    with pytest.raises(AgentConfigError, match=r"'replay:<answer file>' or 'toy:<word>'$"):
        parse_agent("toy")  # an argument is required
    with pytest.raises(AgentConfigError, match="unknown agent 'oracle:x'"):
        parse_agent_spec("oracle:x")  # the oracle takes none
    assert issubclass(GeneratorConfigError, AgentConfigError)  # one AgentConfigError


def test_a_kind_name_cannot_be_taken_twice_or_be_malformed():
    with pytest.raises(ValueError, match="'openai' is already registered"):
        agentkind("openai")(type("Other", (AgentKind,), {}))
    with pytest.raises(ValueError, match="use letters, digits"):
        agentkind("a:b")(type("Bad", (AgentKind,), {}))


def test_a_plugin_class_of_a_built_in_name_and_class_name_cannot_replace_it():
    """Same qualified name, another module: still another class (a plugin cannot take over)."""
    from tasks.agents.kinds import OpenAIKind
    from tasks.scoring.registry import validator

    impostor = type(OpenAIKind.__name__, (AgentKind,), {"__module__": "evil_plugin"})
    impostor.__qualname__ = OpenAIKind.__qualname__
    with pytest.raises(ValueError, match=r"'openai' is already registered \(tasks\.agents\.kinds"):
        agentkind("openai")(impostor)
    from tasks.scoring.registry import get_validator

    builtin = type(get_validator("number"))
    fake = type(builtin.__name__, (), {"__module__": "evil_plugin"})
    fake.__qualname__ = builtin.__qualname__
    with pytest.raises(ValueError, match="validator kind 'number' is already registered"):
        validator("number")(fake)
    assert parse_agent_spec("openai:m") == ("openai", "m")  # the built-in still answers


@pytest.mark.slow
def test_threads_asking_at_once_all_see_the_built_in_kinds():
    """A fresh process whose threads all parse a spec at once (as a Dask worker's do): before
    the registry held a lock while importing, the others saw it empty (IndexError in a CI run)."""
    script = (
        "import threading\n"
        "from tasks.agents.registry import parse_agent_spec\n"
        "b = threading.Barrier(8); errs = []\n"
        "def go():\n"
        "    b.wait()\n"
        "    try:\n"
        "        assert parse_agent_spec('oracle', 'trials') == ('oracle', None)\n"
        "    except Exception as e:\n"
        "        errs.append(repr(e))\n"
        "ts = [threading.Thread(target=go) for _ in range(8)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print(len(errs), errs[:1])\n"
    )
    import subprocess
    import sys

    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=120, cwd=Path(__file__).resolve().parents[1], check=True)
        assert out.stdout.strip() == "0 []", out.stdout + out.stderr


def test_the_toy_validator_is_looked_up_by_kind():
    assert check_answer("toy yes", 3, {"kind": "toy_yes"}).ok
    v = check_answer("toy no", 3, {"kind": "toy_yes"})
    assert not v.ok and v.reason == "toy validator saw 'toy no'"
    assert check_answer(None, 3, {"kind": "toy_yes"}).reason == "no answer"
    with pytest.raises(ValueError, match="unknown validator kind 'nope'; known: .*'toy_yes'"):
        check_answer("x", 3, {"kind": "nope"})


@pytest.fixture
def toy_specs(tmp_path, monkeypatch):
    """The stocks spec with every query judged by the toy validator, as the data directory."""
    from tasks.datasets import spec

    data = tmp_path / "data"
    data.mkdir()
    for f in spec.DATA_DIR.glob("stocks*"):
        shutil.copy(f, data / f.name)
    text = (data / "stocks.yaml").read_text()
    toy, n = re.subn(r"validator: \{kind: (number|items)[^}\n]*\}", "validator: {kind: toy_yes}",
                     text)
    assert n >= 2
    (data / "stocks.yaml").write_text(toy)
    monkeypatch.setattr(spec, "DATA_DIR", data)
    return data


@pytest.mark.slow
def test_toy_agent_and_toy_validator_run_end_to_end(toy_specs, tmp_path, capsys):
    from querylab.cli import main

    root = tmp_path / "artifacts"
    status = main(["run", "--agent", "toy:yes", "--agent", "toy:no", "--dataset", "stocks",
                   "--limit", "2", "--trials", "1", "--run-id", "toy-run",
                   "--artifacts", str(root)])
    out = capsys.readouterr().out
    assert status == 0, out  # no trial errors (toy:no is scored incorrect, not errored)
    scores = pl.read_parquet(root / "runs" / "toy-run" / "score" / "scores.parquet")
    by_agent = {a: sorted(g["verdict"].to_list())
                for (a,), g in scores.group_by("agent")}
    assert by_agent == {"toy:yes": ["correct", "correct"], "toy:no": ["incorrect", "incorrect"]}
    assert set(scores["reason"]) == {"toy validator saw 'toy yes'", "toy validator saw 'toy no'"}
    report = next(line.split()[-1] for line in out.splitlines() if line.startswith("report:"))
    html = Path(report).read_text()
    assert "toy:yes" in html and "toy:no" in html


def test_plugins_of_the_querylab_entry_point_group_are_loaded(tmp_path, monkeypatch, caplog):
    """Kinds outside the repository register through the ``querylab`` entry-point group (as
    Inspect AI's ``inspect_ai`` group); a plugin that fails to import is logged and skipped."""
    from importlib.metadata import EntryPoint

    from tasks.agents import registry
    from tasks.core import registries

    (tmp_path / "qlab_ep_plugin.py").write_text(
        "from tasks.agents.registry import AgentKind, agentkind\n"
        "@agentkind('ep-toy')\nclass EpToy(AgentKind):\n    usage = 'ep-toy:<x>'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [EntryPoint("good", "qlab_ep_plugin", "querylab"),
           EntryPoint("broken", "qlab_no_such_module", "querylab")]
    seen = []
    monkeypatch.setattr(registries, "entry_points", lambda group: seen.append(group) or eps)
    monkeypatch.setattr(registries, "_loaded", False)
    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))  # forget ep-toy afterwards
    assert parse_agent_spec("ep-toy:a") == ("ep-toy", "a")
    assert seen == ["querylab"]
    assert "querylab plugin broken (qlab_no_such_module) failed to load" in caplog.text


def _installed_plugin(where: Path, module: str, source: str) -> Path:
    """``module`` (``source``) in ``where`` with a dist-info declaring it in the ``querylab``
    entry-point group, as ``pip install`` of a plugin package leaves it; returns ``where``."""
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{module}.py").write_text(source)
    info = where / f"{module.replace('_', '')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[querylab]\nplug = {module}\n")
    return where


def _fresh_python(script: str, plugins: Path) -> str:
    """Run ``script`` in a fresh interpreter with ``plugins`` on its path; its stdout+stderr."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, cwd=root, check=True,
                         env={**os.environ, "PYTHONPATH": f"{plugins}{os.pathsep}{root}"})
    return out.stdout + out.stderr


@pytest.mark.slow
def test_a_plugin_asking_a_registry_while_another_thread_loads_plugins_does_not_deadlock(
        tmp_path):
    """One thread imports a plugin module itself (the plugin asks ``engine_names()`` as it is
    imported) while another makes the process's first registry lookup, which imports the same
    plugin: neither waits for the other for ever (a lock held across the plugin's import did)."""
    plugins = _installed_plugin(tmp_path / "p", "slow_plug", (
        "import time\n"
        "from tasks.db.registry import FileEngine, engine_names, register_engine\n"
        "time.sleep(0.5)\n"
        "@register_engine\nclass Slow(FileEngine):\n    name = 'slow-engine'\n"
        "assert 'duckdb' in engine_names()\n"))
    script = (
        "import threading, time\n"
        "import tasks.db.databases\n"
        "from tasks.scoring.registry import validator_kinds\n"
        "from tasks.db.registry import engine_names\n"
        "res = {}\n"
        "def b():\n    import slow_plug; res['b'] = 'ok'\n"
        "def a():\n    time.sleep(0.1); res['a'] = validator_kinds()\n"
        "ts = [threading.Thread(target=f, daemon=True) for f in (b, a)]\n"
        "[t.start() for t in ts]; [t.join(20) for t in ts]\n"
        "print('alive', [t.is_alive() for t in ts], sorted(res), 'slow-engine' in engine_names())\n"
    )
    assert "alive [False, False] ['a', 'b'] True" in _fresh_python(script, plugins)


@pytest.mark.slow
@pytest.mark.parametrize("first", ["engine_names", "kind_names", "validator_kinds"])
def test_a_plugin_claiming_a_built_in_name_is_refused_whichever_registry_is_asked_first(
        tmp_path, first):
    """Plugins claiming the built-in validator ``number`` and engine ``duckdb``, loaded by
    whichever registry is asked first (before the other registries' built-ins are imported):
    the plugins are refused and logged, every built-in still answers."""
    plugins = tmp_path / "p"
    _installed_plugin(plugins, "evil_val", (
        "from tasks.scoring.registry import Validator, validator\n"
        "@validator('number')\nclass Number(Validator):\n"
        "    def check(self, answer, truth, spec, question=None):\n"
        "        raise RuntimeError('impostor')\n"))
    _installed_plugin(plugins, "evil_eng", (
        "from tasks.db.registry import FileEngine, register_engine\n"
        "@register_engine\nclass Duck(FileEngine):\n    name = 'duckdb'\n"))
    module = {"engine_names": "tasks.db.registry", "kind_names": "tasks.agents.registry",
              "validator_kinds": "tasks.scoring.registry"}[first]
    script = (
        f"from {module} import {first}; {first}()\n"
        "from tasks.db.registry import get_engine\n"
        "from tasks.scoring.registry import get_validator, validator_kinds\n"
        "print(validator_kinds(), type(get_validator('number')).__module__,\n"
        "      type(get_engine('duckdb')).__module__)\n"
    )
    out = _fresh_python(script, plugins)
    assert "['dab_script', 'items', 'number'] tasks.scoring.validate tasks.db.duckdb" in out, out
    assert "validator kind 'number' is already registered (tasks.scoring.validate." in out
    assert "engine 'duckdb' is already registered (tasks.db.duckdb." in out


def test_a_plugin_kind_with_no_agent_of_a_suite_is_a_clear_error(monkeypatch):
    """A plugin kind that lists text2sql and lifecycle but names no model: both suites build
    their agents through one constructor (``suite_agent``), which says the kind has none."""
    from tasks.agents import registry
    from tasks.lifecycle.agents import make_agent
    from tasks.text2sql.generators import GeneratorConfigError, make_generator

    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))

    @agentkind("nomodel")
    class NoModel(AgentKind):
        usage = "nomodel:<x>"
        suites = frozenset({"text2sql", "lifecycle"})

    with pytest.raises(GeneratorConfigError,
                       match="generator 'nomodel:x': kind 'nomodel' has no text2sql generator"):
        make_generator("nomodel:x")
    with pytest.raises(AgentConfigError,
                       match="agent 'nomodel:x': kind 'nomodel' has no lifecycle agent"):
        make_agent("nomodel:x")
    assert type(make_generator("oracle")).__name__ == "OracleGenerator"
    assert type(make_agent("oracle")).__name__ == "OracleAgent"


@pytest.mark.slow
def test_a_failing_plugin_is_imported_once_by_threads_asking_at_once(tmp_path):
    """Eighteen threads making their first lookups at once (a Dask worker's) while a plugin
    works 0.5 s and then fails: it is imported once and logged once, not once per thread one
    after another (a failed import leaves no module, so each thread waiting on the import
    system's lock imported it again: 9 s instead of 0.5 s; found by an adversarial review)."""
    count = tmp_path / "count"
    plugins = _installed_plugin(tmp_path / "p", "flaky_plug", (
        f"import time\nopen({str(count)!r}, 'a').write('x')\ntime.sleep(0.5)\n"
        "raise ImportError('needs libfoo')\n"))
    script = (
        "import threading\n"
        "from tasks.scoring.registry import validator_kinds\n"
        "from tasks.db.registry import engine_names\n"
        "from tasks.agents.registry import kind_names\n"
        "fs = [validator_kinds, engine_names, kind_names] * 6\n"
        "b = threading.Barrier(len(fs))\n"
        "def w(f):\n    b.wait(); f()\n"
        "ts = [threading.Thread(target=w, args=(f,)) for f in fs]\n"
        "[t.start() for t in ts]; [t.join(60) for t in ts]\n"
        "print('alive', sum(t.is_alive() for t in ts))\n"
    )
    out = _fresh_python(script, plugins)
    assert "alive 0" in out, out
    assert count.read_text() == "x", out
    assert out.count("querylab plugin plug (flaky_plug) failed to load: needs libfoo") == 1, out
