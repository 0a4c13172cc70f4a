"""The validator registry: how the score stage judges an answer against its ground truth.

A validator kind is one class decorated with :func:`validator` whose :meth:`Validator.check`
returns a :class:`tasks.scoring.validate.Verdict`; a dataset spec names it in a query's
``validator: {kind: <name>, ...}``::

    @validator("exact")
    class ExactValidator(Validator):
        def check(self, answer, truth, spec, question=None):
            ok = answer.strip() == str(truth)
            return Verdict(ok, "exact match" if ok else f"expected {truth!r}")

Built-in kinds: ``number`` and ``items`` (:mod:`tasks.scoring.validate`), ``dab_script``
(:mod:`tasks.scoring.dab_validator`). Kinds outside the repository register when their module is
imported or through the ``querylab`` entry-point group
(:func:`tasks.core.registries.load_entry_points`).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import TYPE_CHECKING, Any

from tasks.core.registries import check_unclaimed

if TYPE_CHECKING:
    from tasks.scoring.validate import Verdict

__all__ = ["Validator", "get_validator", "validator", "validator_kinds"]

_VALIDATORS: dict[str, type[Validator]] = {}
#: The modules of the built-in kinds, imported before any other validator registers (so a
#: plugin claiming a built-in name is the one refused, whichever is imported first).
_BUILTIN_MODULES = ("tasks.scoring.validate", "tasks.scoring.dab_validator")


class Validator:
    """One validator kind (``name`` set by :func:`validator`). Subclasses implement
    :meth:`check`; a None answer never reaches it (it is "no answer", incorrect)."""

    name = ""

    def check(self, answer: str, truth: Any, spec: dict, question: str | None = None) -> Verdict:
        """Judge ``answer`` (the agent's text) against ``truth`` (the query's ground truth)
        with ``spec`` (the query's validator dict, ``kind`` included); ``question``: the
        query's text (numbers it names are context, not candidate answers)."""
        raise NotImplementedError


def validator(name: str) -> Callable[[type[Validator]], type[Validator]]:
    """Class decorator registering a :class:`Validator` under ``name``; ValueError when
    another class already has it (the built-ins are registered first)."""

    def register(cls: type[Validator]) -> type[Validator]:
        if cls.__module__ not in _BUILTIN_MODULES:
            _builtins()
        check_unclaimed(_VALIDATORS.get(name), cls, "validator kind", name)
        cls.name = name
        _VALIDATORS[name] = cls
        return cls

    return register


def _builtins() -> None:
    for module in _BUILTIN_MODULES:
        import_module(module)


def _load() -> None:
    _builtins()
    from tasks.core.registries import load_entry_points

    load_entry_points()


def validator_kinds() -> list[str]:
    """The registered validator kinds, sorted."""
    _load()
    return sorted(_VALIDATORS)


def get_validator(kind: str) -> Validator | None:
    """The registered validator ``kind`` (an instance), None when unknown."""
    _load()
    cls = _VALIDATORS.get(kind)
    return cls() if cls is not None else None
