"""Acceptance: the HTML report opens in headless Chromium without errors and shows every table
and plot — for a run shaped like the default one (oracle agent, as ``make run`` does)
and for a hand-built run with failures of every kind.

Chromium comes from Debian (``apt-get install -y chromium``); the test fails, not skips, when it
is missing, because this is an acceptance check.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import CHROMIUM_FLAGS, chromium
from tests.helpers import make_report, write_run

pytestmark = pytest.mark.integration  # a headless Chromium per test


def browse(html: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run(
        [
            chromium(),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            *extra,
            html.resolve().as_uri(),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def check_in_browser(html: Path, tmp_path: Path, n_images: int = 4) -> str:
    """Load ``html`` in headless Chromium; assert the render check reports every figure decoded,
    every table present, no script/resource error and — at 1400 px — no table that scrolls
    horizontally; take a screenshot and check it is not blank. Returns the dumped DOM."""
    source = html.read_text()
    n_tables = source.count('<table class="data')
    assert source.count('<img class="plot"') == n_images
    dom = browse(html, tmp_path, "--dump-dom", "--window-size=1400,1000")
    assert dom.returncode == 0, dom.stderr[-2000:]
    m = re.search(r'<div id="render-check"([^>]*)>', dom.stdout)
    assert m, dom.stdout[-2000:]
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', m.group(1)))
    assert attrs["status"] == "ok", attrs
    assert attrs["errors"] == "0"
    assert int(attrs["images"]) == n_images
    assert int(attrs["images-loaded"]) == n_images
    assert int(attrs["tables"]) == n_tables >= 8
    assert attrs["viewport"] == "1400" and attrs["wide-tables"] == "0", attrs  # readable at 1400 px
    names = ["pass_at_k", "pass_at_1_heatmap", "cost_vs_pass_at_1", "failure_modes"][:n_images]
    for name in names:
        assert f'data-name="{name}"' in dom.stdout

    shot = tmp_path / f"{html.parent.parent.name}.png"
    res = browse(html, tmp_path, f"--screenshot={shot}", "--window-size=1280,2400")
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[0] == 2400 and pixels.shape[1] == 1280
    assert float(pixels[..., :3].std()) > 0.05  # text, tables and plots, not a blank page
    return dom.stdout


def test_default_run_report_opens_in_browser(prefect_harness, settings, tmp_path):
    from flows.benchmark import benchmark

    # the default run's shape (oracle agent, several trials per query) on the two original
    # datasets, which other tests of the session build too; the full default catalogue only
    # adds rows, not kinds of tables or plots
    out = benchmark(
        run_id="browser-default",
        datasets=["movies", "stocks"],
        agents=["oracle"],
        n_trials=2,
        batch_size=25,
        artifacts_root=settings.artifacts,
    )
    rep = out["report"]
    assert rep["failed"] == []
    # no incorrect trials: the failure-mode section is one sentence, without table or plot
    dom = check_in_browser(Path(rep["html"]), tmp_path, n_images=3)
    assert "oracle" in dom and "movies" in dom and "stocks" in dom
    assert "No incorrect trials among the" in dom and "No trial errored" in dom
    assert rep["counts"]["incorrect"] == 0


def test_report_with_failures_opens_in_browser(tmp_path):
    root = tmp_path / "artifacts"
    write_run(str(root), llm_calls=True)
    _, out = make_report(str(root))
    dom = check_in_browser(Path(out["html"]), tmp_path)
    assert "openai:m" in dom and "FM3" in dom and "source_not_touched" in dom
