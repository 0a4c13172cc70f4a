"""The run/dataset layout and the settings module own every artifact path and every
environment variable (issue 16 Build 4): the greps of the acceptance criteria stay true, and
the layout builds exactly the paths the stages wrote before it existed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tasks.core import settings as core_settings
from tasks.core.layout import DatasetLayout, RunLayout, dab_import_root, runs_root

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("tasks", "flows", "querylab")
#: The parts of the zygote program (joined, they run as one file inside the sandbox, where
#: tasks.core.settings cannot be imported) that set the cells' environment.
ENV_EXEMPT = {"tasks/core/settings.py", "tasks/sandbox/zygote/session_server.py",
              "tasks/sandbox/zygote/cell.py"}


#: A ``runs``/``datasets`` path component built outside the layout: an argument after the first
#: of a path join (``storage.join``, ``os.path.join``, ``Path(...)``), a ``/ "runs"`` path
#: operand (``"flows" / "datasets"`` is the source tree of dataset flows, not an artifact), or
#: an f-string ``{root}/runs/``.
PATH_COMPONENT = re.compile(
    r"""\b(?:join|Path|PurePath|joinpath)\((?:[^()]|\([^()]*\))*?,\s*["'](?:runs|datasets)["']"""
    r"""|(?<!["']flows["'] )/\s*["'](?:runs|datasets)["']"""
    r"""|\}/(?:runs|datasets)(?:/|["'])""")


def _sources(packages=PACKAGES):
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            yield path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8")


def test_only_settings_reads_the_environment():
    offenders = [
        f"{rel}:{n}: {line.strip()}"
        for rel, text in _sources() if rel not in ENV_EXEMPT
        for n, line in enumerate(text.splitlines(), 1)
        if "os.environ" in line or re.search(r"\bgetenv\(", line)
    ]
    assert offenders == []


def test_only_layout_builds_run_and_dataset_paths():
    offenders = [
        f"{rel}: {m.group(0)!r}" for rel, text in _sources(PACKAGES + ("bench",))
        if rel != "tasks/core/layout.py" for m in PATH_COMPONENT.finditer(text)
    ]
    assert offenders == []


def test_the_layout_grep_catches_every_way_of_building_a_run_path():
    built = [
        'storage.join(root, "runs", run_id)', "os.path.join(root, 'datasets', name)",
        'Path(root, "runs", run_id)', 'Path(str(root), "runs")', 'art / "runs" / run_id',
        'root/"datasets"', 'f"{root}/runs/{run_id}"', 'f"{root}/datasets"',
    ]
    kept = [
        'REPO_ROOT / "flows" / "datasets"', '", ".join(r["datasets"])',
        "', '.join(p.get('datasets') or [])", 'plan["datasets"]', 'help="every run: runs"',
    ]
    assert [b for b in built if not PATH_COMPONENT.search(b)] == []
    assert [k for k in kept if PATH_COMPONENT.search(k)] == []


@pytest.mark.parametrize("root", ["/tmp/art", "/tmp/art/", "s3://bucket/prefix"])
def test_run_layout_paths(root):
    base = root.rstrip("/")
    run = RunLayout(root, "r1")
    assert run.root == f"{base}/runs/r1"
    assert run.record == f"{base}/runs/r1/run.json"
    assert run.lease == f"{base}/runs/r1/lease.json"
    assert run.preflight == f"{base}/runs/r1/preflight.json"
    assert run.stage_status("score") == f"{base}/runs/r1/stages/score.json"
    assert run.trials("trials.parquet") == f"{base}/runs/r1/trials/trials.parquet"
    assert run.trials() == f"{base}/runs/r1/trials"
    assert run.batches("k.calls", "00001.json") == f"{base}/runs/r1/trials/batches/k.calls/00001.json"
    assert run.score() == f"{base}/runs/r1/score"
    assert run.report("viewer.html") == f"{base}/runs/r1/report/viewer.html"
    assert run.stage_dir("generation") == f"{base}/runs/r1/generation"
    assert runs_root(root) == f"{base}/runs"


def test_dataset_layout_paths():
    ds = DatasetLayout("/tmp/art", "toy", "v1")
    assert ds.name_dir == "/tmp/art/datasets/toy"
    assert ds.root == "/tmp/art/datasets/toy/v1"
    assert ds.manifest == "/tmp/art/datasets/toy/v1/manifest.json"
    assert dab_import_root("/tmp/art") == "/tmp/art/datasets/_dab"
    with pytest.raises(ValueError, match="no version"):
        DatasetLayout("/tmp/art", "toy").root


def test_env_subset_passes_only_named_variables(monkeypatch):
    monkeypatch.setenv("QUERYLAB_TEST_KEEP", "1")
    monkeypatch.setenv("QUERYLAB_TEST_SECRET", "s3cret")
    monkeypatch.delenv("QUERYLAB_TEST_ABSENT", raising=False)
    env = core_settings.env_subset(["QUERYLAB_TEST_KEEP", "QUERYLAB_TEST_ABSENT"])
    assert env == {"QUERYLAB_TEST_KEEP": "1"}


def test_schemas_settings_is_the_core_definition():
    from schemas.settings import Settings

    assert Settings is core_settings.Settings


def test_settings_read_querylab_variables_and_openai_fallbacks(monkeypatch):
    monkeypatch.setenv("QUERYLAB_ARTIFACTS", "s3://bucket/prefix")
    monkeypatch.setenv("QUERYLAB_STATEMENT_TIMEOUT_MS", "5")
    monkeypatch.setenv("QUERYLAB_HOME", "")
    monkeypatch.delenv("QUERYLAB_OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fallback")
    monkeypatch.setenv("QUERYLAB_OPENAI_BASE_URL", "")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    s = core_settings.Settings.from_env()
    assert (s.artifacts, s.statement_timeout_ms, str(s.home)) == ("s3://bucket/prefix", 5, ".querylab")
    assert (s.openai_api_key, s.openai_base_url) == ("sk-fallback", "http://127.0.0.1:9/v1")
    assert "sk-fallback" not in repr(s)
    assert core_settings.Settings(artifacts="/tmp/x", openai_api_key="k").openai_api_key == "k"
    monkeypatch.setenv("QUERYLAB_STATEMENT_TIMEOUT_MS", "0")
    with pytest.raises(ValueError):
        core_settings.Settings.from_env()
