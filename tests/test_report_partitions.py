"""The report's tables computed partition by partition (a large run: tool use and cost by
tid-hash partitions, failure modes by consecutive slices of the incorrect trials) equal the
tables computed in one pass, whatever the trials' order (issue 17: 10M trials in 4 GB)."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from schemas import artifacts
from tasks.report import features, tool_use
from tasks.report.failure_modes import (
    classify_failures,
    failure_mode_table,
    requirements_from_manifests,
)
from tasks.report.metrics import cost_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from report_scale import synthetic_run  # noqa: E402  (the bench's realistic trajectories)


@pytest.fixture(scope="module")
def run():
    trials, calls, llm, manifests = synthetic_run(3_000, 15_000, seed=11)
    calls = pl.from_arrow(features.tool_calls_with_features(
        pa.Table.from_pylist(calls.to_dicts(), schema=artifacts.TOOL_CALLS)))
    return trials, calls, llm, requirements_from_manifests(manifests)


def _tables(trials, calls, llm, reqs):
    labels = classify_failures(trials, calls.lazy(), reqs)
    return {
        "tool_use": tool_use.tool_use_table(trials, calls.lazy()),
        "cost": cost_table(trials, llm.lazy()),
        "labels": labels,
        "failure_modes": failure_mode_table(trials, labels),
    }


@pytest.mark.parametrize("order", ["key", "shuffled"])
def test_partitioned_tables_equal_one_pass(run, monkeypatch, order):
    trials, calls, llm, reqs = run
    if order == "shuffled":  # not sorted by key: failure modes sort the incorrect trials
        trials = trials.sample(fraction=1.0, shuffle=True, seed=3)
    else:
        trials = trials.sort("trial_key")
    monkeypatch.setattr(tool_use, "PARTITION_TRIALS", 10**9)
    whole = _tables(trials, calls, llm, reqs)
    for n in (700, 1_001):
        monkeypatch.setattr(tool_use, "PARTITION_TRIALS", n)
        monkeypatch.setattr("tasks.report.failure_modes.PARTITION_TRIALS", n)
        assert len(tool_use.trial_partitions(trials.height)) == -(-trials.height // n) > 1
        parts = _tables(trials, calls, llm, reqs)
        for name, table in whole.items():
            assert parts[name].equals(table), name
    assert whole["labels"]["trial_key"].is_sorted()
    assert whole["tool_use"]["tool_calls"].sum() == 2 * calls.height  # per dataset + ALL rows
    assert whole["cost"].filter(pl.col("dataset") == "ALL")["llm_calls"].sum() == llm.height


def test_partitions_cover_every_trial_once():
    tids = pl.DataFrame({"tid": pl.Series(range(10_000), dtype=pl.UInt64)})
    wheres = tool_use.trial_partitions(10 * tool_use.PARTITION_TRIALS)
    assert len(wheres) == 10
    sizes = [tids.filter(w).height for w in wheres]
    assert sum(sizes) == tids.height and min(sizes) > 800
    assert tool_use.trial_partitions(tool_use.PARTITION_TRIALS) == [None]


def test_labels_from_answer_flags_equal_labels_from_answers(run):
    """The report's loader keeps only the booleans the rules read of answer and error."""
    from tasks.report.failure_modes import answer_flags

    trials, calls, _, reqs = run
    i = pl.int_range(pl.len())
    trials = trials.with_columns(  # blank and missing answers, errors beside answers
        pl.when(i % 7 == 0).then(pl.lit("  ")).when(i % 11 == 0).then(None)
        .otherwise(pl.col("answer")).alias("answer"),
        pl.when(i % 5 == 0).then(pl.lit("Timeout")).otherwise(pl.col("error")).alias("error"),
    )
    raw = classify_failures(trials, calls.lazy(), reqs)
    flags = classify_failures(trials.with_columns(answer_flags()).drop("answer", "error"),
                              calls.lazy(), reqs)
    assert flags.equals(raw)
    assert {"no_answer", "runtime_error"} <= set(raw["rule"])


def test_repeated_and_null_keys_label_as_one_pass(run, monkeypatch):
    """Keys that repeat (never cut apart) or are null (sorted first, matching no call) give
    the one-pass labels and costs at any partition size (found by an adversarial review)."""
    trials, calls, llm, reqs = run
    bad = trials.sort("trial_key").filter(pl.col("verdict") == "incorrect")
    twice = pl.concat([bad.head(3), bad.head(3)]).sort("trial_key")
    nulls = bad.head(4).with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("trial_key"))
        .alias("trial_key")).sort("trial_key", nulls_last=True)  # flagged sorted, nulls last
    monkeypatch.setattr(tool_use, "PARTITION_TRIALS", 10**9)
    whole = [classify_failures(t, calls.lazy(), reqs) for t in (twice, nulls)]
    null_llm = pl.concat(
        [llm, llm.head(3).with_columns(pl.lit(None, pl.String).alias("trial_key"))])
    cost = cost_table(nulls, null_llm.lazy())
    for n in (1, 2):
        monkeypatch.setattr(tool_use, "PARTITION_TRIALS", n)
        monkeypatch.setattr("tasks.report.failure_modes.PARTITION_TRIALS", n)
        assert [classify_failures(t, calls.lazy(), reqs) for t in (twice, nulls)][0].equals(
            whole[0])
        assert classify_failures(nulls, calls.lazy(), reqs).equals(whole[1])
        assert cost_table(nulls, null_llm.lazy()).equals(cost)
    assert whole[1]["trial_key"][0] is None  # nulls first, as the sort puts them
    assert cost["llm_calls"].sum() == 2 * 2 * 3  # 3 keyed trials x 2 calls, per dataset + ALL


@pytest.mark.parametrize("coded", [False, True])
def test_streamed_labels_artifact_equals_one_pass(run, monkeypatch, tmp_path, coded):
    """The report stage streams the labels into ``failure_labels.parquet`` slice by slice and
    counts the failure-mode table from the written file: the artifact holds the one-pass
    labels (byte for byte with one slice), the table is the one-pass table, with the trials'
    keys as String or Categorical (as the report's loader holds them)."""
    from schemas import report as rs
    from tasks.core import storage
    from tasks.report.failure_modes import LABEL_CODED
    from tasks.report.stage import write_failure_labels

    trials, calls, _, reqs = run
    trials = trials.sort("trial_key")
    if coded:
        trials = trials.with_columns(
            pl.col(c).cast(pl.Categorical) for c in LABEL_CODED if c in trials.columns)
    monkeypatch.setattr(tool_use, "PARTITION_TRIALS", 10**9)
    labels = classify_failures(trials, calls.lazy(), reqs)
    assert labels.height > 1_001 and all(labels[c].dtype == pl.String for c in LABEL_CODED)
    table = failure_mode_table(trials, labels)
    whole = storage.write_parquet(str(tmp_path / "whole.parquet"), labels.to_arrow(),
                                  rs.FAILURE_LABELS)
    for n in (10**9, 700):
        monkeypatch.setattr("tasks.report.failure_modes.PARTITION_TRIALS", n)
        uri = str(tmp_path / f"streamed-{n}.parquet")
        written, streamed = write_failure_labels(trials, calls.lazy(), reqs, uri)
        assert written == labels.height
        assert streamed.equals(table)
        back = pl.from_arrow(storage.read_parquet(uri, rs.FAILURE_LABELS))
        assert back.equals(labels)
        if n == 10**9:  # one slice: the bytes of writing the labels whole
            assert Path(uri).read_bytes() == Path(whole).read_bytes()
        else:
            assert pq_row_groups(uri) == -(-labels.height // n)


def pq_row_groups(uri: str) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(uri).metadata.num_row_groups


def test_failure_mode_table_from_a_scan_checks_its_labels(run, tmp_path):
    """Counted from the written artifact, a missing or repeated label is still refused."""
    trials, calls, _, reqs = run
    labels = classify_failures(trials, calls.lazy(), reqs)
    assert failure_mode_table(trials, labels.lazy()).equals(failure_mode_table(trials, labels))
    for broken in (labels.slice(1), pl.concat([labels.slice(1), labels.head(1).with_columns(
            pl.lit(labels["trial_key"][2]).alias("trial_key"))])):
        path = tmp_path / "labels.parquet"
        broken.write_parquet(path)
        with pytest.raises(ValueError, match="every incorrect trial needs exactly one label"):
            failure_mode_table(trials, pl.scan_parquet(path))


@pytest.mark.parametrize("slice_size", [10**9, 2])
def test_labels_that_break_the_one_label_rule_never_replace_the_artifact(
        run, monkeypatch, tmp_path, slice_size):
    """Trials whose incorrect keys repeat or are null are refused while the labels are
    streamed, with the one-label message: the artifact written before stays as it was, and no
    temporary file is left (found by an adversarial review: the check came after the rename,
    and null keys failed as a schema cast)."""
    from schemas import report as rs
    from tasks.report.stage import write_failure_labels

    trials, calls, _, reqs = run
    trials = trials.sort("trial_key")
    uri = tmp_path / "failure_labels.parquet"
    write_failure_labels(trials, calls.lazy(), reqs, str(uri))
    good = uri.read_bytes()
    bad = trials.filter(pl.col("verdict") == "incorrect")
    twice = pl.concat([trials, bad.head(2)]).sort("trial_key")
    nulls = trials.with_columns(
        pl.when(pl.col("trial_key").is_in(bad["trial_key"].head(2).implode())).then(None)
        .otherwise(pl.col("trial_key")).alias("trial_key")).sort("trial_key")
    monkeypatch.setattr("tasks.report.failure_modes.PARTITION_TRIALS", slice_size)
    for broken, why in ((twice, "a trial_key has more than one failure label"),
                        (nulls, "2 incorrect trials have no trial_key")):
        with pytest.raises(ValueError,
                           match=f"every incorrect trial needs exactly one label: {why}"):
            write_failure_labels(broken, calls.lazy(), reqs, str(uri))
        assert uri.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["failure_labels.parquet"]
    assert rs.FAILURE_LABELS.names == pl.read_parquet(uri).columns


def test_no_incorrect_trial_streams_the_bytes_of_the_empty_labels(run, tmp_path):
    """Without an incorrect trial the streamed artifact is the empty labels' file, byte for
    byte (it had no row group, the one-pass file one empty row group)."""
    from schemas import report as rs
    from tasks.core import storage
    from tasks.report.stage import write_failure_labels

    trials, calls, _, reqs = run
    fine = trials.filter(pl.col("verdict") != "incorrect")
    labels = classify_failures(fine, calls.lazy(), reqs)
    assert labels.height == 0
    whole = storage.write_parquet(str(tmp_path / "whole.parquet"), labels.to_arrow(),
                                  rs.FAILURE_LABELS)
    uri = tmp_path / "streamed.parquet"
    assert write_failure_labels(fine, calls.lazy(), reqs, str(uri))[0] == 0
    assert uri.read_bytes() == Path(whole).read_bytes()
