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
import threading

__all__ = ["ENTRY_POINT_GROUP", "check_unclaimed", "load_entry_points"]

log = logging.getLogger(__name__)

#: setuptools entry-point group whose modules register agent kinds, validators and engines.
ENTRY_POINT_GROUP = "querylab"

_loaded = False
#: ``loading``: this thread is importing the plugins (a plugin asking a registry while it is
#: imported is not re-entered).
_this_thread = threading.local()
_warned: set[str] = set()
_warned_lock = threading.Lock()


def entry_points(group: str) -> list:
    """The entry points of ``group`` installed in this environment
    (:func:`importlib.metadata.entry_points`, imported here: ~30 ms a process pays only when a
    registry is asked)."""
    from importlib.metadata import entry_points as installed

    return list(installed(group=group))


def load_entry_points() -> None:
    """Import every module of the :data:`ENTRY_POINT_GROUP` entry-point group, once per
    process. A plugin that fails to import is logged once (``querylab plugin <name>
    (<module>) failed to load: ...``) and skipped: its names stay unknown, which the
    registries' errors then say.

    No lock of ours is held while a plugin is imported (one would deadlock against the
    import system's lock of a plugin another thread is importing, when that plugin asks a
    registry as it is imported). Until one thread has finished, every thread asking imports
    the plugins itself: a plugin another thread is importing makes it wait on the import
    system's lock of that module, so no thread sees a registry without the plugins."""
    global _loaded
    if _loaded or getattr(_this_thread, "loading", False):
        return
    _this_thread.loading = True
    try:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()
            except Exception as exc:  # a broken plugin must not break the built-ins
                with _warned_lock:
                    first = ep.value not in _warned
                    _warned.add(ep.value)
                if first:
                    log.warning("querylab plugin %s (%s) failed to load: %s",
                                ep.name, ep.value, exc)
        _loaded = True
    finally:
        _this_thread.loading = False


def check_unclaimed(known: type | None, cls: type, noun: str, name: str) -> None:
    """Raise ValueError ``<noun> '<name>' is already registered (<module>.<class>)`` when
    ``known`` (the class registered under ``name``, or None) is another class than ``cls``."""
    if known is None:
        return
    if (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"{noun} {name!r} is already registered "
                         f"({known.__module__}.{known.__qualname__})")
