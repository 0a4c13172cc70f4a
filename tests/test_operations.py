"""Operations: run records, stage bookkeeping, one failed trials batch re-run alone with
`querylab rerun` (over real HTTP against the scripted OpenAI server, counting requests), the
report afterwards equal to a clean run's, progress (Prefect artifacts, CLI bar), and the
stand-alone stage wrappers re-run from the run id alone."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import polars as pl
import pytest

import tasks.trials.stage
from schemas.runs import StageStatus
from tasks.core import runs
from tasks.core import storage
from tasks.core.progress import StageProgress, artifact_key, console_progress, count_finished_trials
from tests.fakes.openai_server import ScriptedOpenAIServer
from tests.helpers import ops_cli, three_step_turn

REPO = Path(__file__).resolve().parents[1]


# -- run records (plain functions, no Prefect) -------------------------------------------------


def test_run_record_created_updated_and_validated(tmp_path, caplog):
    root = str(tmp_path / "art")
    cfg = {"datasets": ["stocks"], "agents": ["oracle"], "n_trials": 2, "batch_size": 4}
    rec = runs.record_benchmark(root, "r-1", cfg)
    assert rec.benchmark.n_trials == 2 and rec.manifests == []
    stored = storage.read_json(runs.run_uri(root, "r-1"))
    assert stored["schema_version"] == "1" and stored["benchmark"]["datasets"] == ["stocks"]
    runs.record_manifests(root, "r-1", ["m.json"])
    # the same configuration again changes nothing; another replaces it, with a warning
    assert runs.record_benchmark(root, "r-1", cfg).manifests == ["m.json"]
    with caplog.at_level("WARNING", logger="querylab.runs"):
        rec = runs.record_benchmark(root, "r-1", {**cfg, "datasets": ["movies"], "n_trials": 3})
    assert "datasets, n_trials" in caplog.text
    assert rec.manifests == []  # manifests of other datasets are dropped
    assert runs.load_run(root, "r-1").benchmark.datasets == ["movies"]
    assert runs.configured_stages(rec) == ["datasets", "trials", "score", "report"]
    with pytest.raises(runs.RunError, match="n_trials"):
        runs.record_benchmark(root, "r-1", {**cfg, "n_trials": 0})
    for bad in ("../x", "a/b", "", "-x", "x" * 200):
        with pytest.raises(runs.RunError, match="bad run id"):
            runs.run_uri(root, bad)
    with pytest.raises(runs.RunError, match="no run 'nope'"):
        runs.load_run(root, "nope")
    with pytest.raises(runs.RunError, match="no dataset manifests yet"):
        runs.run_manifests(root, "r-1")
    with pytest.raises(runs.RunError, match="unknown stage 'build'"):
        runs.stage_uri(root, "r-1", "build")


def test_standalone_stage_parameters_are_recorded_once(tmp_path):
    root = str(tmp_path / "art")
    with pytest.raises(runs.RunError, match="needs pairs_path"):
        runs.resolve_stage_params(root, "eq", "equivalence", {"methods": ["finder"]})
    assert not storage.exists(runs.run_uri(root, "eq"))  # nothing recorded on bad input
    p = runs.resolve_stage_params(root, "eq", "equivalence",
                                  {"pairs_path": "/p.jsonl", "methods": None, "batch_size": 3})
    assert p == {"pairs_path": "/p.jsonl", "batch_size": 3}
    # later: the run id alone; given values override and are recorded
    assert runs.resolve_stage_params(root, "eq", "equivalence", {}) == p
    p2 = runs.resolve_stage_params(root, "eq", "equivalence", {"batch_size": 5})
    assert p2["batch_size"] == 5 and runs.load_run(root, "eq").stages["equivalence"] == p2
    assert runs.configured_stages(runs.load_run(root, "eq")) == ["equivalence"]
    with pytest.raises(runs.RunError, match="no benchmark configuration"):
        runs.benchmark_config(root, "eq")


def test_stage_attempts_and_pending_stages(tmp_path):
    root = str(tmp_path / "art")
    runs.record_benchmark(root, "r2", {"datasets": ["stocks"]})
    assert runs.pending_stages(root, "r2") == ["datasets", "trials", "score", "report"]
    with runs.stage_run(root, "r2", "datasets") as st:
        st.outputs = {"manifests": ["m"]}
    with pytest.raises(RuntimeError, match="boom"), runs.stage_run(root, "r2", "trials"):
        raise RuntimeError("boom")
    trials = runs.stage_status(root, "r2", "trials")
    assert trials.status == "failed" and trials.error == "RuntimeError: boom"
    assert trials.attempt == 1 and trials.finished_at
    assert runs.stage_status(root, "r2", "datasets").outputs == {"manifests": ["m"]}
    assert runs.pending_stages(root, "r2") == ["trials", "score", "report"]
    with runs.stage_run(root, "r2", "trials"):
        pass
    again = runs.stage_status(root, "r2", "trials")
    assert (again.status, again.attempt, again.error) == ("completed", 2, None)
    assert [(h.attempt, h.status) for h in again.history] == [(1, "failed")]
    assert runs.pending_stages(root, "r2") == ["score", "report"]
    # a stage left "running" (its process was killed) counts as not completed
    StageStatus.model_validate(again.model_dump())  # round-trips
    storage.write_json(runs.stage_uri(root, "r2", "report"), {
        "run_id": "r2", "stage": "report", "status": "running", "attempt": 1,
        "started_at": runs.now_iso()})
    assert runs.pending_stages(root, "r2") == ["score", "report"]


# -- progress ----------------------------------------------------------------------------------


def test_progress_counts_checkpointed_trials_and_draws_a_bar(tmp_path):
    root = str(tmp_path / "art")
    batches = [{"key": "a-0", "items": [["q", 0], ["q", 1]]},
               {"key": "a-1", "items": [["q", 2], ["q", 3], ["q", 4]]}]
    prefix = storage.join(root, "runs", "r", "trials", "batches")
    assert count_finished_trials(root, "r", batches) == 0
    storage.write_bytes(storage.join(prefix, "a-0.trials.parquet"), b"x")
    storage.write_bytes(storage.join(prefix, "a-1.parts", "00000.json"), b"{}")
    storage.write_bytes(storage.join(prefix, "a-1.parts", "00001.json"), b"{}")
    assert count_finished_trials(root, "r", batches) == 2 + 2
    assert artifact_key("Run_2025.01", "trials") == "run-2025-01-trials-progress"

    buf = io.StringIO()
    done = iter([1, 3, 5])
    with console_progress(True, buf), StageProgress("trials", "r", 5, unit="trials") as p:
        p.poll(lambda: next(done), interval=0.01)
        deadline = time.monotonic() + 30
        while p.completed < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "trials r" in buf.getvalue() and "5/5 trials" in buf.getvalue()
    # no bar when disabled, and nothing breaks outside a flow run (no artifact)
    with console_progress(False, buf), StageProgress("trials", "r", 2) as p:
        p.advance(3)
    assert p.completed == 2 and p.percent() == 100.0


# -- failure injection, rerun of one stage, report equal to a clean run --------------------------


def _report_tables(root: str, run_id: str) -> dict[str, pl.DataFrame]:
    prefix = storage.join(root, "runs", run_id, "report")
    out = {}
    for uri in storage.list_uris(prefix, ".parquet"):
        df = pl.read_parquet(uri)
        volatile = [c for c in df.columns if "latency" in c or c == "run_id"]
        out[uri[len(prefix):]] = df.drop(volatile)
    return out


def _progress_value(key: str) -> float | None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    return float(max(found, key=lambda a: a.created).data) if found else None


def test_failed_batch_rerun_alone_matches_a_clean_run(
    prefect_harness, tmp_path, scripted_model, monkeypatch, capsys
):
    from flows.benchmark import benchmark

    clean_root, root = str(tmp_path / "clean"), str(tmp_path / "flaky")
    with ScriptedOpenAIServer(lambda body, i: three_step_turn(body)) as srv:
        agent = scripted_model(srv)
        kw = {"datasets": ["stocks"], "agents": [agent], "n_trials": 2, "batch_size": 4}
        clean = benchmark(run_id="ops-clean", artifacts_root=clean_root, **kw)
        n_clean = srv.trial_request_count
        assert n_clean == 5 * 2 * 3  # 5 queries × 2 trials × 3 model calls
        assert srv.preflight_count == 1  # the agent was checked once before any dataset
        assert _progress_value("ops-clean-trials-progress") == 100.0
        assert _progress_value("ops-clean-datasets-progress") == 100.0
        # re-running a finished run does nothing: no stage is pending, and the trials stage
        # named explicitly skips every batch (no request, no file rewritten)
        assert ops_cli(["rerun", "--run-id", "ops-clean", "--artifacts", clean_root]) == 0
        assert "every stage has completed" in capsys.readouterr().out
        clean_batches = sorted(Path(clean_root, "runs", "ops-clean", "trials").glob("**/*.parquet"))
        before = [p.stat().st_mtime_ns for p in clean_batches if "batches" in p.parts]
        capsys.readouterr()
        assert ops_cli(["rerun", "--run-id", "ops-clean", "--stage", "trials",
                     "--artifacts", clean_root]) == 0
        assert srv.trial_request_count == n_clean
        out = capsys.readouterr().out  # nothing to rescore (it said "the trials changed")
        assert "note: no trial changed" in out and "the trials changed" not in out
        assert [p.stat().st_mtime_ns for p in clean_batches if "batches" in p.parts] == before
        assert pl.read_parquet(clean["trials"]["trials"]).height == 10
        assert runs.stage_status(clean_root, "ops-clean", "trials").attempt == 2

        # inject a failure of the batch machinery at the 3rd trial of the 2nd batch (before any
        # model call of that trial): that batch stops, the other two finish. (An exception
        # inside a trial only makes that trial errored; see tests/test_honest_scores.py.)
        batches = tasks.trials.stage.plan_batches(clean["manifests"], [agent], 2, 4)
        assert [len(b["items"]) for b in batches] == [4, 4, 2]
        target = tuple(batches[1]["items"][2])
        original = tasks.trials.stage.trial_key

        def flaky(agent_, dataset, query_id, trial):
            if (query_id, trial) == target:
                raise ConnectionError("injected: lost the artifact store")
            return original(agent_, dataset, query_id, trial)

        monkeypatch.setattr(tasks.trials.stage, "trial_key", flaky)
        with pytest.raises(Exception, match=batches[1]["key"]) as failure:
            benchmark(run_id="ops-flaky", artifacts_root=root, **kw)
        assert "1 of 3 items failed" in str(failure.value)
        assert "injected: lost the artifact store" in str(failure.value)
        n_first = srv.trial_request_count - n_clean
        assert n_first == n_clean - 2 * 3  # the failed batch's last two trials never ran
        monkeypatch.setattr(tasks.trials.stage, "trial_key", original)

        bdir = Path(root, "runs", "ops-flaky", "trials", "batches")
        done = {b["key"]: bdir / f"{b['key']}.trials.parquet" for b in batches}
        assert done[batches[0]["key"]].exists() and done[batches[2]["key"]].exists()
        assert not done[batches[1]["key"]].exists()
        assert len(list(bdir.glob(f"{batches[1]['key']}.parts/*.json"))) == 2
        mtimes = {k: p.stat().st_mtime_ns for k, p in done.items() if p.exists()}
        status = runs.stage_status(root, "ops-flaky", "trials")
        assert status.status == "failed" and batches[1]["key"] in status.error
        assert runs.stage_status(root, "ops-flaky", "report") is None
        assert _progress_value("ops-flaky-trials-progress") == 80.0  # 8 of 10 trials

        capsys.readouterr()
        assert ops_cli(["status", "--run-id", "ops-flaky", "--artifacts", root]) == 0
        out = capsys.readouterr().out
        assert "trials       failed" in out and "not completed: trials, score, report" in out

        # re-run the trials stage alone: only the failed batch runs, only its unfinished trials
        # call the model
        capsys.readouterr()
        assert ops_cli(["rerun", "--run-id", "ops-flaky", "--stage", "trials",
                     "--artifacts", root]) == 0
        assert srv.trial_request_count - n_clean - n_first == 2 * 3
        assert "note: the trials changed; score and report them" in capsys.readouterr().out
        assert {k: p.stat().st_mtime_ns for k, p in done.items() if k in mtimes} == mtimes
        assert runs.pending_stages(root, "ops-flaky") == ["score", "report"]
        # the rest of the run: score and report
        capsys.readouterr()
        assert ops_cli(["rerun", "--run-id", "ops-flaky", "--artifacts", root]) == 0
        out = capsys.readouterr().out
        assert "stages score, report" in out and f"| {agent} | stocks" in out
        assert runs.pending_stages(root, "ops-flaky") == []
        total = srv.trial_request_count

    # no finished trial called the model again: exactly the clean run's requests, no cache hits
    assert total - n_clean == n_clean
    llm = pl.read_parquet(storage.join(root, "runs", "ops-flaky", "trials", "llm_calls.parquet"))
    assert llm.height == n_clean and llm.select("trial_key", "call_index").n_unique() == n_clean
    assert not llm["cache_hit"].any()
    trials = pl.read_parquet(storage.join(root, "runs", "ops-flaky", "trials", "trials.parquet"))
    ref = pl.read_parquet(clean["trials"]["trials"])
    cols = ["trial_key", "answer", "terminate_reason", "n_llm_calls",
            "n_tool_calls", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd"]
    assert trials.select(cols).equals(ref.select(cols))
    scores = pl.read_parquet(storage.join(root, "runs", "ops-flaky", "score", "scores.parquet"))
    ref_scores = pl.read_parquet(clean["score"]["scores"])
    assert scores.select("trial_key", "verdict").equals(ref_scores.select("trial_key", "verdict"))
    assert "correct" in set(scores["verdict"]) and "incorrect" in set(scores["verdict"])
    # the report equals the clean run's, table by table
    got, want = _report_tables(root, "ops-flaky"), _report_tables(clean_root, "ops-clean")
    assert set(got) == set(want) and "/pass_at_k.parquet" in got
    for name in want:
        assert got[name].equals(want[name]), name
    status = runs.stage_status(root, "ops-flaky", "trials")
    assert status.status == "completed" and status.attempt == 2
    assert [h.status for h in status.history] == ["failed"]
    # the key never reaches an artifact
    for f in Path(root).rglob("*.json"):
        assert "sk-ops-SECRET" not in f.read_text(), f


@pytest.mark.parametrize(
    "argv, message",
    [
        (["rerun", "--run-id", "no-such-run"], "no run 'no-such-run'"),
        (["rerun", "--run-id", "../etc"], "bad run id"),
        (["rerun", "--run-id", "cfg", "--stage", "generation"],
         "has no configuration for stage(s) ['generation']"),
        (["rerun", "--run-id", "cfg", "--stage", "trials"], "no dataset manifests yet"),
        (["status", "--run-id", "no-such-run"], "no run 'no-such-run'"),
    ],
)
def test_rerun_rejects_bad_input_in_one_line(tmp_path, argv, message, capsys):
    root = str(tmp_path / "art")
    runs.record_benchmark(root, "cfg", {"datasets": ["stocks"]})
    assert ops_cli([*argv, "--artifacts", root]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_equivalence_stage_reruns_from_the_run_id_alone(prefect_harness, tmp_path, capsys):
    from flows.stages import stage_equivalence

    root = str(tmp_path / "art")
    pairs = REPO / "data" / "equivalence" / "classic_not_equivalent.jsonl"
    out = stage_equivalence(
        "eq-stage", artifacts_root=root, pairs_path=str(pairs), methods=["finder"],
        options={"budget": {"max_instances": 30, "time_limit_s": 20}}, batch_size=5,
    )
    df = pl.read_parquet(out["equivalence"])
    assert df.height == 9 and set(df["method"]) == {"finder"}
    record = runs.load_run(root, "eq-stage")
    assert record.benchmark is None and record.stages["equivalence"]["pairs_path"] == str(pairs)
    batches = sorted(Path(out["equivalence"]).parent.glob("batches/*.parquet"))
    mtimes = [b.stat().st_mtime_ns for b in batches]
    assert ops_cli(["rerun", "--run-id", "eq-stage", "--stage", "equivalence",
                 "--artifacts", root]) == 0
    assert [b.stat().st_mtime_ns for b in batches] == mtimes
    assert pl.read_parquet(out["equivalence"]).equals(df)
    status = json.loads(Path(runs.stage_uri(root, "eq-stage", "equivalence")).read_text())
    assert status["status"] == "completed" and status["attempt"] == 2
