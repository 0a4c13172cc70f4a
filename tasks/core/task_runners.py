"""Where mapped batches run: Prefect's thread pool (default) or a Dask cluster.

``QUERYLAB_TASK_RUNNER`` chooses, when a flow run starts (so the same flows, deployments and
CLI commands run either way):

- unset / ``threads``: Prefect's ``ThreadPoolTaskRunner`` in the flow's process (its size:
  ``PREFECT_TASKS_RUNNER_THREAD_POOL_MAX_WORKERS``, unbounded by default; the trials stage
  bounds its trials itself, :mod:`tasks.core.concurrency`);
- ``dask``: ``prefect-dask``'s ``DaskTaskRunner`` on a temporary ``distributed.LocalCluster``
  of worker *processes* (``QUERYLAB_DASK_WORKERS``, default the number of CPUs;
  ``QUERYLAB_DASK_THREADS_PER_WORKER`` batches at once per worker, default enough for the
  trials stage's ``max_trials``: a batch runs its trials on threads of its own), started
  and stopped with the flow run;
- ``dask://host:8786`` (or ``tcp://...``): the scheduler of an existing cluster (its workers
  must run querylab's code and environment: see ``docs/operations.md``).

Settings reach Dask workers through the environment, never through task parameters: a
``LocalCluster``'s workers inherit the flow process's environment (``QUERYLAB_*``, ``AWS_*``,
API keys), a remote cluster's workers need it set where they are started. Each worker process
opens its own databases, query workers and ``execute_python`` sandbox on its first batch
(they are per process), so the sandbox's requirements — Linux, root or user namespaces,
writable cgroups — apply to every worker machine.
"""

from __future__ import annotations

import os
from typing import Any

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner
from tasks.core.settings import Settings, SettingsError

#: The environment variable that chooses the task runner.
TASK_RUNNER_ENV = Settings.env_names("task_runner")[0]


class TaskRunnerConfigError(ValueError):
    """``QUERYLAB_TASK_RUNNER`` (or a Dask setting) has a value querylab cannot use."""


def _setting(name: str, env: dict[str, str] | None) -> Any:
    """:meth:`Settings.read` of ``name`` now, a bad value a TaskRunnerConfigError."""
    try:
        return Settings.read(name, env)
    except SettingsError as exc:
        raise TaskRunnerConfigError(str(exc)) from None


def task_runner_spec(env: dict[str, str] | None = None) -> dict[str, Any]:
    """What ``QUERYLAB_TASK_RUNNER`` asks for: ``{"kind": "threads"}``, ``{"kind": "dask",
    "address": None, "n_workers": N, "threads_per_worker": T}`` (a local cluster) or
    ``{"kind": "dask", "address": "tcp://host:8786"}``. TaskRunnerConfigError for anything
    else."""
    runner = _setting("task_runner", env)
    if runner == "threads":
        return {"kind": "threads"}
    if runner == "dask":
        workers = _setting("dask_workers", env)
        threads = _setting("dask_threads_per_worker", env)
        return {
            "kind": "dask", "address": None,
            "n_workers": workers if workers is not None else os.cpu_count() or 1,
            "threads_per_worker": threads if threads is not None else 1,
        }
    return {"kind": "dask", "address": runner}


def make_task_runner(
    concurrency: int | None = None, env: dict[str, str] | None = None
) -> TaskRunner:
    """A new task runner as :func:`task_runner_spec` describes (DaskTaskRunner imported only
    when asked for; TaskRunnerConfigError when ``prefect-dask`` is missing).

    ``concurrency``: tasks the flow wants running at once (the trials stage's
    ``max_trials``): the thread pool's size, and a local cluster's threads per worker
    (``ceil(concurrency / workers)``) unless ``QUERYLAB_DASK_THREADS_PER_WORKER`` is set.
    None: Prefect's default pool size, one thread per local Dask worker."""
    spec = task_runner_spec(env)
    if spec["kind"] == "threads":
        return ThreadPoolTaskRunner(max_workers=concurrency)
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError as exc:  # pragma: no cover - prefect-dask is a dependency
        raise TaskRunnerConfigError(
            f"{TASK_RUNNER_ENV}=dask needs prefect-dask: pip install prefect-dask ({exc})"
        ) from None
    if spec["address"]:
        return DaskTaskRunner(address=spec["address"])
    threads = spec["threads_per_worker"]
    if concurrency and _setting("dask_threads_per_worker", env) is None:
        threads = max(1, -(-int(concurrency) // spec["n_workers"]))
    return DaskTaskRunner(
        cluster_class="distributed.LocalCluster",
        cluster_kwargs={
            "n_workers": spec["n_workers"],
            "threads_per_worker": threads,
            "processes": True,
            "dashboard_address": None,
        },
    )


class EnvTaskRunner(TaskRunner):
    """The task runner of querylab's mapping flows: a placeholder that Prefect duplicates at
    the start of each flow run into the runner ``QUERYLAB_TASK_RUNNER`` asks for *then*
    (:func:`make_task_runner` with ``concurrency``), so the choice follows the environment of
    the process that runs the flow, not of the one that imported it. It never runs a task
    itself."""

    def __init__(self, concurrency: int | None = None):
        super().__init__()
        self.concurrency = concurrency

    def duplicate(self) -> TaskRunner:  # type: ignore[override]
        return make_task_runner(self.concurrency)

    def submit(self, task, parameters, wait_for=None, dependencies=None):  # noqa: D102
        raise RuntimeError("EnvTaskRunner only chooses a task runner; use duplicate()")
