"""The trials stage on a real distributed engine (issue 17 point 3): ``QUERYLAB_TASK_RUNNER=dask``
runs the batches on a ``distributed.LocalCluster`` of two worker processes through
``prefect-dask``'s ``DaskTaskRunner``; the result equals the thread-pool run's (same verdicts,
same artifacts modulo timings). The scripted model's trajectories touch both engines of
``stocks`` and ``execute_python``, so every worker opens its own databases, SQL query worker
and sealed sandbox; settings reach the workers through the environment only."""

from __future__ import annotations

import json

import polars as pl
import pytest

from tasks.core import storage
from tests.fakes.openai_server import ScriptedOpenAIServer, raw_tool_calls
from tests.helpers import register_model

#: Columns that hold wall-clock timings or the run id (everything else must be equal).
VOLATILE = {"latency_s", "queue_s", "duration_s", "run_id"}


def _call(n: int, name: str, arguments: dict):
    """A tool call whose id depends on the conversation only (``step<n>``), not on the order
    requests reach the server (the server's own ids number its requests)."""
    return raw_tool_calls([{"id": f"step{n}", "type": "function",
                            "function": {"name": name, "arguments": json.dumps(arguments)}}])


def _turn(body: dict, index: int):
    """A deterministic 5-step trajectory chosen by how far the conversation is."""
    n = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if n == 0:
        return _call(n, "list_db", {})
    if n == 1:
        return _call(n, "query_db", {"db": "listings", "query":
                     "SELECT listing, company FROM listings WHERE listing LIKE 'NASDAQ:%'"})
    if n == 2:
        return _call(n, "query_db", {"db": "market", "query":
                     "SELECT avg(volume) AS v FROM fb WHERE year(date) = 2012"})
    if n == 3:
        code = "import os\nprint(len(var_step1), var_step2[0]['v'] > 0, os.getuid() != 0)"
        return _call(n, "execute_python", {"code": code})
    return _call(n, "return_answer", {"answer": "Facebook"})


def _tables(out: dict) -> dict[str, pl.DataFrame]:
    tables = {}
    for what in ("trials", "tool_calls", "llm_calls", "messages"):
        df = pl.read_parquet(out[what])
        tables[what] = df.drop([c for c in df.columns if c in VOLATILE])
    return tables


def test_trials_on_a_local_dask_cluster_equal_the_thread_pool_run(
    prefect_harness, settings, stocks_manifest, tmp_path, monkeypatch
):
    from flows.trials import run_trials
    from tasks.scoring.stage import score_run
    from tasks.core.task_runners import EnvTaskRunner

    manifest = storage.join(settings.artifacts, "datasets", "stocks", stocks_manifest["version"],
                            "manifest.json")
    with ScriptedOpenAIServer(_turn) as srv:
        # the table and the key reach the workers by environment
        register_model(srv.base_url, tmp_path, monkeypatch.setenv, name="dask-m",
                       key_env="QL_DASK_KEY", key="sk-dask-test", prices="{input: 1, output: 2}")
        agents = ["openai:dask-m", "oracle"]
        outs = {}
        for name, runner in (("threads", "threads"), ("dask", "dask")):
            monkeypatch.setenv("QUERYLAB_TASK_RUNNER", runner)
            monkeypatch.setenv("QUERYLAB_DASK_WORKERS", "2")
            root = str(tmp_path / name)  # own artifact root: no shared response cache
            flow = run_trials.with_options(task_runner=EnvTaskRunner(4))
            outs[name] = (root, flow(f"run-{name}", [manifest], agents, 2, 3, root,
                                     max_concurrency=4))
        assert srv.errors == []
        assert srv.trial_request_count == 2 * (5 * 2 * 5)  # both runs, every trial called
    threads, dask = (_tables(outs[k][1]) for k in ("threads", "dask"))
    for what in threads:
        assert threads[what].equals(dask[what]), what
    assert threads["trials"].height == 2 * 5 * 2
    calls = threads["tool_calls"]
    python = calls.filter(pl.col("tool") == "execute_python",
                          pl.col("trial_key").str.starts_with("openai:"))
    assert python.height == 10 and python["success"].all()
    tool_msgs = threads["messages"].filter(pl.col("role") == "tool")["content"]
    assert tool_msgs.str.contains(r"\d+ True True").sum() == 10  # the cells ran, as uid != 0
    scores = {}
    for name, (root, _) in outs.items():
        storage.write_json(storage.join(root, "runs", f"run-{name}", "trials", "manifests.json"),
                           [manifest])
        score_run(f"run-{name}", root)
        scores[name] = pl.read_parquet(
            storage.join(root, "runs", f"run-{name}", "score", "scores.parquet")
        ).select("trial_key", "verdict", "reason").sort("trial_key")
    assert scores["threads"].equals(scores["dask"])
    assert set(scores["dask"]["verdict"]) == {"correct", "incorrect"}


def test_dask_runs_batches_in_worker_processes(prefect_harness, monkeypatch):
    """The mapped batches of a flow with the EnvTaskRunner run in other processes under
    ``QUERYLAB_TASK_RUNNER=dask`` and in this one by default."""
    import os

    from prefect import flow, task

    from tasks.core.task_runners import EnvTaskRunner

    @task
    def where(i: int) -> tuple[int, str | None]:
        return os.getpid(), os.environ.get("QL_DASK_PROBE")

    @flow(task_runner=EnvTaskRunner(2))
    def probe() -> list:
        return [f.result() for f in where.map(range(4))]

    monkeypatch.setenv("QL_DASK_PROBE", "from-the-environment")
    monkeypatch.setenv("QUERYLAB_TASK_RUNNER", "dask")
    monkeypatch.setenv("QUERYLAB_DASK_WORKERS", "2")
    pids = probe()
    assert os.getpid() not in {p for p, _ in pids} and {e for _, e in pids} == {
        "from-the-environment"}
    monkeypatch.delenv("QUERYLAB_TASK_RUNNER")
    assert {p for p, _ in probe()} == {os.getpid()}


@pytest.mark.parametrize("value", ["ray", "dask:", "dask://"])
def test_a_bad_task_runner_is_one_clear_error(value, monkeypatch):
    from tasks.core.task_runners import EnvTaskRunner, TaskRunnerConfigError

    monkeypatch.setenv("QUERYLAB_TASK_RUNNER", value)
    with pytest.raises(TaskRunnerConfigError, match="QUERYLAB_TASK_RUNNER"):
        EnvTaskRunner().duplicate()
