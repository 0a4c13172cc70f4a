"""One-line messages and small CLI outputs a newcomer hit (QA of issues 12/14, L2-L7)."""

from __future__ import annotations

import pytest

from querylab.cli import _print_timings, main
from tasks.core import runs
from tasks.core import storage
from tasks.core.llm import AgentConfigError, load_models_config


def test_rescore_of_an_unknown_run_says_no_such_run(tmp_path, capsys):
    assert main(["rescore", "--run-id", "nope", "--artifacts", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"querylab rescore: no run 'nope' under {tmp_path}"


def test_models_file_in_the_shape_of_a_bare_list_says_what_is_expected(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("- {name: x, prices: {input: 0, output: 0}, context_window: 10}\n")
    with pytest.raises(AgentConfigError, match="expected a mapping with a `models:` list"):
        load_models_config([path])


def test_models_command_names_the_missing_weights_file(tmp_path, monkeypatch, capsys):
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  - {name: badpath, provider: local, local: {path: "
                    "/nonexistent/model.gguf}, prices: {input: 0, output: 0}, "
                    "context_window: 100}\n")
    monkeypatch.setenv("QUERYLAB_MODELS", str(path))
    assert main(["models"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "local:badpath" in ln)
    assert "/nonexistent/model.gguf" in line and "make setup" not in line


def test_the_time_breakdown_adds_up(tmp_path, capsys):
    root = str(tmp_path)
    runs.record_benchmark(root, "t1", {"datasets": ["stocks"]})
    for stage, (a, b) in {"datasets": ("00:00", "00:10"), "trials": ("00:10", "00:40")}.items():
        storage.write_json(runs.stage_uri(root, "t1", stage), {
            "run_id": "t1", "stage": stage, "status": "completed", "attempt": 1,
            "started_at": f"2026-12-01T10:{a}Z", "finished_at": f"2026-12-01T10:{b}Z"})
    _print_timings(root, "t1", {}, 70.0)
    out = capsys.readouterr().out
    assert "70.0 s in all (datasets 10.0 s, trials 30.0 s, start-up and checks 30.0 s)" in out
