"""The authoring path: ``querylab datasets new`` scaffolds a dataset whose generated test passes
unchanged; ``datasets list`` and ``datasets build`` work for the catalogue."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from querylab import cmd_datasets

REPO = Path(__file__).resolve().parents[1]


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cmd_datasets.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return args.func(args)


@pytest.mark.slow
def test_scaffolded_dataset_builds_and_its_test_passes_unchanged(tmp_path, capsys):
    assert cli("datasets", "new", "demo", "--root", str(tmp_path)) == 0
    out = capsys.readouterr().out
    files = [tmp_path / "data" / "demo.yaml", tmp_path / "flows" / "datasets" / "demo.py",
             tmp_path / "tests" / "test_dataset_demo.py"]
    for f in files:
        assert f.is_file() and f"wrote {f}" in out
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(files[2])],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "4 passed" in proc.stdout
    # the generated flow module exposes build_demo and points at the generated spec
    spec = importlib.util.spec_from_file_location("scaffolded_demo_flow", files[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.SPEC == files[0].resolve() and module.build_demo.name == "build-demo"


def test_scaffold_refuses_to_overwrite_or_bad_names(tmp_path, capsys):
    assert cli("datasets", "new", "demo", "--root", str(tmp_path)) == 0
    spec = tmp_path / "data" / "demo.yaml"
    spec.write_text("# my edits\n")
    assert cli("datasets", "new", "demo", "--root", str(tmp_path)) == 2
    assert "not overwriting" in capsys.readouterr().err
    assert spec.read_text() == "# my edits\n"  # nothing lost
    assert cli("datasets", "new", "Demo-1", "--root", str(tmp_path)) == 2
    assert "bad dataset name" in capsys.readouterr().err
    assert cli("datasets", "new", "demo", "--root", str(tmp_path), "--force") == 0
    assert spec.read_text().startswith("# demo:")


def test_datasets_list_shows_the_catalogue(capsys):
    assert cli("datasets", "list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "source", "engines", "queries", "status"]
    names = [line.split()[0] for line in lines[1:]]
    assert names[:10] == ["movies", "stocks", "flights", "superstore", "aircraft", "military",
                          "news", "pancancer", "github", "music"]
    flights = next(line for line in lines if line.startswith("flights"))
    assert "duckdb, postgres, sqlite" in flights and flights.rstrip().endswith("ready")


def test_datasets_list_says_when_shared_data_is_missing(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("QUERYLAB_SHARED_DATA", str(tmp_path / "nowhere"))
    assert cli("datasets", "list") == 0
    news = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("news"))
    assert "not buildable: sources.news_raw.path" in news and "QUERYLAB_SHARED_DATA" in news


def test_default_datasets_skip_shared_ones_without_the_directory(monkeypatch, tmp_path):
    from flows.datasets import default_datasets

    said: list[str] = []
    monkeypatch.setenv("QUERYLAB_SHARED_DATA", str(tmp_path / "nowhere"))
    assert default_datasets(said.append) == ["movies", "stocks", "flights", "superstore",
                                             "aircraft", "military"]
    assert "skipping datasets ['news', 'pancancer', 'github', 'music']" in said[0]
    assert str(tmp_path / "nowhere") in said[0]
    monkeypatch.setenv("QUERYLAB_SHARED_DATA", str(tmp_path))
    assert default_datasets(said.append)[6:] == ["news", "pancancer", "github", "music"]


def test_datasets_build_runs_the_flow(prefect_harness, settings, capsys):
    assert cli("datasets", "build", "superstore", "--artifacts", settings.artifacts) == 0
    uri = capsys.readouterr().out.strip().splitlines()[-1]
    assert uri.startswith(settings.artifacts) and uri.endswith("manifest.json")
    assert Path(uri).is_file()
    assert cli("datasets", "build", "nosuch") == 2
    assert "querylab datasets build: unknown dataset(s) ['nosuch']" in capsys.readouterr().err


def test_datasets_build_reports_a_missing_source(prefect_harness, settings, capsys, tmp_path):
    assert cli("datasets", "build", "news", "--source-dir", str(tmp_path),
               "--artifacts", settings.artifacts) == 2
    err = capsys.readouterr().err
    assert "news.yaml: sources.news_raw.path: source file not found" in err
