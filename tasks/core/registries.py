"""One rule for every registry (agent kinds, validators, engines): a name belongs to one class;
and one way in for plugins: the modules of the ``querylab`` entry-point group.

Registering the same class again (a module imported twice, ``importlib.reload``) is allowed;
another class under a taken name — a plugin trying to replace a built-in, say — is refused.
A class is "the same" when its module *and* qualified name match, so a plugin class that
happens to share a built-in's class name cannot take its place.

A plugin module (an agent kind, a validator, an engine: whatever it decorates) is declared in
its package's ``pyproject.toml`` under ``[project.entry-points.querylab]`` and imported by
:func:`load_entry_points` the first time any registry is asked for a name.
"""

from __future__ import annotations

import logging
import sys
import threading

__all__ = ["ENTRY_POINT_GROUP", "check_unclaimed", "load_entry_points"]

log = logging.getLogger(__name__)

#: setuptools entry-point group whose modules register agent kinds, validators and engines.
ENTRY_POINT_GROUP = "querylab"

_loaded = False
#: ``loading``: this thread is importing the plugins (a plugin asking a registry while it is
#: imported is not re-entered).
_this_thread = threading.local()
#: entry point (``module[:attr]``) -> ``"ok"``, ``"failed"`` or the ident of the thread
#: importing it now; guarded by ``_changed``, which is notified when an import ends.
_state: dict[str, object] = {}
_changed = threading.Condition(threading.Lock())
#: Seconds a thread waits for another thread's import of a plugin before importing it itself
#: (through the import system's lock of the module): bounded, because that other thread may be
#: waiting for a module this thread is importing (a plugin imported directly that asks a
#: registry as it is imported).
WAIT_S = 2.0


def entry_points(group: str) -> list:
    """The entry points of ``group`` installed in this environment
    (:func:`importlib.metadata.entry_points`, imported here: only where a registry is asked)."""
    from importlib.metadata import entry_points as installed

    return list(installed(group=group))


def load_entry_points() -> None:
    """Import every module of the :data:`ENTRY_POINT_GROUP` entry-point group, once per
    process. A plugin that fails to import is logged once (``querylab plugin <name>
    (<module>) failed to load: ...``), imported once (threads asking meanwhile wait for that
    import, then skip it) and skipped: its names stay unknown, which the registries' errors
    then say.

    Threads asking at once (a Dask worker's) import each plugin once: one imports it, the
    others wait for that import to end (at most :data:`WAIT_S`, then they import it through
    the import system's lock of the module, which waits for it or returns the module being
    imported when that thread is waiting for this one). No lock is held while a plugin is
    imported, so a plugin that asks a registry as it is imported, by another thread, cannot
    deadlock the lookup. The plugins count as loaded only once every one has finished
    importing (or failed), so a lookup made by a plugin as it is imported does not make other
    threads skip that plugin."""
    global _loaded
    if _loaded or getattr(_this_thread, "loading", False):
        return
    _this_thread.loading = True
    try:
        done = [_load_one(ep) for ep in entry_points(group=ENTRY_POINT_GROUP)]
        _loaded = all(done)
    finally:
        _this_thread.loading = False


def _load_one(ep) -> bool:
    """Import entry point ``ep`` unless it is imported or failed already; whether it has now
    (ok or failed: False while it is still being imported)."""
    key, me = ep.value, threading.get_ident()
    with _changed:
        claimed = _changed.wait_for(
            lambda: _state.get(key) in (None, "ok", "failed"), timeout=WAIT_S)
        if claimed:
            if _state.get(key) in ("ok", "failed"):
                return True
            _state[key] = me
    outcome = None
    try:
        ep.load()
        if not _initializing(ep.module):
            outcome = "ok"
    except Exception as exc:  # a broken plugin must not break the built-ins
        if type(exc).__name__ != "_DeadlockError":  # (that: another thread imports it)
            outcome = "failed"
            with _changed:
                first = _state.get(key) != "failed"
                _state[key] = outcome  # (before the warning: a waiting thread may log too)
            if first:
                log.warning("querylab plugin %s (%s) failed to load: %s", ep.name, ep.value, exc)
    with _changed:
        if outcome is not None:
            _state[key] = outcome
        elif _state.get(key) == me:
            del _state[key]
        _changed.notify_all()
    return outcome is not None


def _initializing(module: str) -> bool:
    """Whether ``module`` is still being imported (by this thread, further up its stack, or by
    another thread)."""
    mod = sys.modules.get(module)
    return mod is None or bool(getattr(getattr(mod, "__spec__", None), "_initializing", False))


def check_unclaimed(known: type | None, cls: type, noun: str, name: str) -> None:
    """Raise ValueError ``<noun> '<name>' is already registered (<module>.<class>)`` when
    ``known`` (the class registered under ``name``, or None) is another class than ``cls``."""
    if known is None:
        return
    if (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"{noun} {name!r} is already registered "
                         f"({known.__module__}.{known.__qualname__})")
