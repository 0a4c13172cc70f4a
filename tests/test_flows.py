"""End to end through Prefect: datasets → trials (mapped batches) → report, and the CLI."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from querylab.cli import main


@pytest.fixture(scope="module")
def oracle_run(prefect_harness, settings):
    from flows.benchmark import benchmark

    return benchmark(
        run_id="flow-test", datasets=["movies", "stocks"], agents=["oracle"], n_trials=2,
        batch_size=5,
        artifacts_root=settings.artifacts,
    )


def test_oracle_scores_one_on_every_query(oracle_run):
    trials = pl.read_parquet(oracle_run["trials"]["trials"])
    assert trials.height == (6 + 5) * 2
    assert set(trials["dataset"]) == {"movies", "stocks"}
    assert "is_correct" not in trials.columns  # verdicts come from the score stage
    scores = pl.read_parquet(oracle_run["score"]["scores"])
    assert scores.height == trials.height and set(scores["verdict"]) == {"correct"}, scores
    assert oracle_run["score"]["errored"] == 0 and oracle_run["score"]["flagged"] == 0
    assert set(trials["terminate_reason"]) == {"return_answer"}
    per_query = pl.read_parquet(oracle_run["report"]["pass_at_k"])
    assert per_query.filter(pl.col("k") == 1)["pass_at_k"].to_list() == [1.0] * 11
    assert oracle_run["report"]["failed"] == []
    calls = pl.read_parquet(oracle_run["trials"]["tool_calls"])
    # every trial used both of its dataset's databases and ended with return_answer
    assert calls.group_by("trial_key").agg(pl.col("tool").last())["tool"].unique().to_list() == [
        "return_answer"
    ]
    dbs = (
        calls.filter(pl.col("tool") == "query_db")
        .with_columns(pl.col("arguments").str.json_path_match("$.db").alias("db"))
        .group_by("trial_key")
        .agg(pl.col("db").n_unique())
    )
    assert dbs.height == trials.height and dbs["db"].to_list() == [2] * trials.height
    md = Path(oracle_run["report"]["markdown"]).read_text()
    assert "| oracle | movies" in md and "pass@2" in md


def test_rerun_skips_finished_batches(oracle_run, settings):
    from flows.trials import run_trials

    batches = sorted(Path(oracle_run["trials"]["trials"]).parent.glob("batches/*.trials.parquet"))
    assert len(batches) == 3 + 2  # movies 12 trials, stocks 10, in batches of 5
    before = {b: b.stat().st_mtime_ns for b in batches}
    out = run_trials(
        "flow-test", oracle_run["manifests"], ["oracle"], 2, 5, settings.artifacts
    )
    assert {b: b.stat().st_mtime_ns for b in batches} == before
    assert pl.read_parquet(out["trials"]).equals(pl.read_parquet(oracle_run["trials"]["trials"]))


def test_cli_run_prints_pass_at_k_and_artifacts(prefect_harness, settings, capsys):
    status = main(["run", "--dataset", "stocks", "--trials", "1", "--run-id", "cli-test"])
    out = capsys.readouterr().out
    assert status == 0
    assert "| oracle | stocks" in out and "pass@1" in out
    assert "trials.parquet" in out and "report.md" in out
    assert "pass@1 per query" in out and "| oracle | stocks  | nyse_drawdown_2008" in out
    report_path = next(line.split()[-1] for line in out.splitlines() if line.startswith("report:"))
    assert Path(report_path).exists()
    # the report can be recomputed from the artifacts alone
    assert main(["report", "--run-id", "cli-test"]) == 0


def test_oracle_failure_is_named_and_fails_the_run(capsys):
    from querylab.cmd_report import print_report

    rep = {
        "table": "| agent | dataset | pass@1 |",
        "failed": [{"agent": "oracle", "dataset": "movies", "query_id": "q_bad", "n": 5, "c": 0}],
        "markdown": "r.md",
        "pass_at_k": "p.parquet",
    }
    assert print_report(rep) == 1
    out = capsys.readouterr().out
    assert "oracle movies/q_bad: 0/5 correct" in out and "ORACLE FAILED" in out
    # an LLM agent failing queries is a result, not a dataset bug
    rep["failed"][0]["agent"] = "openai:m"
    assert print_report(rep) == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--agent", "foo"], "unknown agent 'foo'"),
        (["run", "--dataset", "nope"], "unknown dataset(s) ['nope']"),
        (["run", "--trials", "0"], "--trials and --batch-size must be at least 1"),
        (["report", "--run-id", "no-such-run"], "no run 'no-such-run'"),
        (["build", "nope"], "unknown dataset(s) ['nope']"),
    ],
)
def test_cli_rejects_bad_input_in_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_datasets_build_with_a_broken_spec_is_one_line_before_prefect(tmp_path, monkeypatch,
                                                                     capsys):
    """QA newcomer M1: a spec error under `datasets build` was printed after a Prefect server
    start, among two tracebacks; now it is the one line `run` prints, before any flow import
    (flows.datasets made unimportable here to prove it)."""
    import sys

    import tasks.datasets.spec as spec

    broken = tmp_path / "stocks.yaml"
    broken.write_text((spec.DATA_DIR / "stocks.yaml").read_text().replace(
        "validator: {kind: number, decimals: 1", "validator: {kind: number, decimals: one", 1))
    assert broken.read_text() != (spec.DATA_DIR / "stocks.yaml").read_text()
    monkeypatch.setattr(spec, "DATA_DIR", tmp_path)
    monkeypatch.setitem(sys.modules, "flows.datasets", None)
    for argv, prefix in ((["datasets", "build", "stocks"], "querylab datasets build stocks: "),
                         (["build", "stocks"], "querylab build: ")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(prefix), err
        assert f"{broken}: queries[" in err[0] and "decimals" in err[0], err
