"""``@task`` without importing Prefect until a flow uses the task.

Commands that only read artifacts (``querylab report``, ``status``, ``view``, ``runs``,
``models``, ``datasets list``) import task modules but never run a flow; importing Prefect
costs ~1 s and starting its server far more. A function decorated with :func:`task` is a
:class:`LazyTask`: ``.fn`` is the plain function (what those commands and the tests call), and
everything a flow does with a Prefect task — calling it, ``.map``, ``.submit``,
``.with_options`` — builds the real ``prefect.Task`` on first use and delegates to it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any


class LazyTask:
    """A Prefect task created on first use. ``fn``: the undecorated function; ``options``: the
    keyword arguments for ``prefect.task``."""

    def __init__(self, fn: Callable, options: dict[str, Any]):
        self.fn = fn
        self.options = options
        self._task = None
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)
        # The module attribute named after ``fn`` is this LazyTask, so pickle (Dask ships
        # tasks to worker processes by reference) finds the function as ``<name>.fn``.
        fn.__qualname__ = f"{fn.__qualname__}.fn"

    @property
    def prefect_task(self):
        """The real ``prefect.Task`` (imports Prefect the first time)."""
        if self._task is None:
            with self._lock:
                if self._task is None:
                    from prefect import task

                    self._task = task(**self.options)(self.fn)
        return self._task

    def __call__(self, *args, **kwargs):
        return self.prefect_task(*args, **kwargs)

    def __reduce__(self):
        # pickled by reference (a Dask worker imports the module), never with its lock
        return _import_attribute, (self.fn.__module__, self.__qualname__)

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("fn", "options", "_task", "_lock"):
            raise AttributeError(name)
        return getattr(self.prefect_task, name)


def _import_attribute(module: str, qualname: str) -> Any:
    """``module.qualname`` (dotted), importing ``module``: how a pickled LazyTask comes back."""
    import importlib

    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def task(**options: Any) -> Callable[[Callable], LazyTask]:
    """Decorator: ``@task(name=..., persist_result=False, ...)`` with ``prefect.task``'s
    options, creating the Prefect task lazily (see the module docstring)."""

    def wrap(fn: Callable) -> LazyTask:
        return LazyTask(fn, options)

    return wrap


def run_tags(run_id: str, agents: list[str] | None = None,
             datasets: list[str] | None = None) -> list[str]:
    """The Prefect tags of a querylab flow run: ``querylab``, ``run:<id>``, ``agent:<name>``
    for each agent and ``dataset:<name>`` for each dataset (in that order, no duplicates)."""
    tags = ["querylab", f"run:{run_id}"]
    tags += [f"agent:{a}" for a in agents or []]
    tags += [f"dataset:{d}" for d in datasets or []]
    return list(dict.fromkeys(tags))


def label_flow_run(tags: list[str], name: str | None = None) -> None:
    """Add ``tags`` to the current Prefect flow run (and rename it to ``name`` when given), so
    the UI shows the querylab run id, agents and datasets even for runs a deployment created.
    Outside a flow run, or when the API cannot be reached, it does nothing (labels never fail a
    run)."""
    import logging

    try:
        from prefect.client.orchestration import get_client
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        if ctx is None or ctx.flow_run is None:
            return
        run = ctx.flow_run
        with get_client(sync_client=True) as client:
            merged = list(dict.fromkeys([*(run.tags or []), *tags]))
            if merged != list(run.tags or []):
                client.update_flow_run(run.id, tags=merged)
                run.tags = merged
            if name and run.name != name:
                client.set_flow_run_name(run.id, name)
                run.name = name
    except Exception as exc:  # noqa: BLE001 - labels are bookkeeping
        logging.getLogger("querylab").debug("could not label the flow run: %s", exc)
