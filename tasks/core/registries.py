"""One rule for every registry (agent kinds, validators, engines): a name belongs to one class.

Registering the same class again (a module imported twice, ``importlib.reload``) is allowed;
another class under a taken name — a plugin trying to replace a built-in, say — is refused.
A class is "the same" when its module *and* qualified name match, so a plugin class that
happens to share a built-in's class name cannot take its place.
"""

from __future__ import annotations

__all__ = ["check_unclaimed"]


def check_unclaimed(known: type | None, cls: type, noun: str, name: str) -> None:
    """Raise ValueError ``<noun> '<name>' is already registered (<module>.<class>)`` when
    ``known`` (the class registered under ``name``, or None) is another class than ``cls``."""
    if known is None:
        return
    if (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"{noun} {name!r} is already registered "
                         f"({known.__module__}.{known.__qualname__})")
