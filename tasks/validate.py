"""DAB-style answer validators: is the ground truth present in an agent's free-text answer?

Scorer-side code only (:mod:`tasks.scoring`): validators read the ground truth, which the
trial side never sees. Each validator kind is a function ``(answer, truth, validator) ->
Verdict`` registered in :data:`VALIDATORS`; adding a kind is one function and one entry.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_NUMBER = re.compile(r"(?<![\w.])[-−]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Verdict:
    """A validator's judgement of one answer: ``ok`` and a one-line ``reason`` a person can
    check (what was found or missing). ``errored``: the validator itself failed (a DAB
    ``validate.py`` that raised or hung) — no verdict at all, ``ok`` is False and ``reason``
    holds the traceback; the score stage records it as ``errored``, not ``incorrect``."""

    ok: bool
    reason: str
    errored: bool = False


def numbers_in(text: str) -> list[float]:
    """Every number written in ``text`` (thousands separators allowed: ``9,090,303,780``)."""
    out = []
    for m in _NUMBER.finditer(text or ""):
        raw = m.group().replace(",", "").replace("−", "-")
        try:
            out.append(float(raw))
        except ValueError:
            continue
    return out


def normalise(s: str) -> str:
    """Case-folded text with runs of whitespace collapsed to one space (how ``items`` compare)."""
    return " ".join(str(s).casefold().split())


def number_tolerance(truth: float, validator: dict) -> float:
    """Absolute tolerance of a ``number`` validator: ``tolerance`` when given, else half a unit
    of the stated rounding (``0.5 * 10**-decimals``), plus 1e-9 relative slack."""
    tol = validator.get("tolerance")
    if tol is None:
        tol = 0.5 * 10 ** -int(validator.get("decimals", 2))
    return float(tol) + 1e-9 * max(1.0, abs(float(truth)))


def _short(values: list, limit: int = 8) -> str:
    shown = ", ".join(f"{v:g}" if isinstance(v, float) else repr(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def check_number(answer: str, truth: Any, validator: dict) -> Verdict:
    """``{"kind": "number", "decimals": d, "tolerance": t|None}``: some number in the answer lies
    within :func:`number_tolerance` of ``truth``."""
    target, tol = float(truth), number_tolerance(truth, validator)
    found = numbers_in(answer)
    hit = next((x for x in found if abs(x - target) <= tol), None)
    if hit is not None:
        return Verdict(True, f"{hit:g} is within {tol:.3g} of {target:g}")
    if not found:
        return Verdict(False, f"no number in the answer (expected {target:g} ± {tol:.3g})")
    return Verdict(False, f"no number within {tol:.3g} of {target:g}; the answer has {_short(found)}")


def check_items(answer: str, truth: Any, validator: dict) -> Verdict:
    """``{"kind": "items"}``: every item of ``truth`` (a list of strings) appears in the answer,
    compared case- and whitespace-insensitively."""
    text = normalise(answer)
    missing = [item for item in truth if normalise(item) not in text]
    if missing:
        return Verdict(False, f"{len(missing)} of {len(truth)} items missing: {_short(missing)}")
    return Verdict(True, f"all {len(truth)} items present")


def check_dab_script(answer: str, truth: Any, validator: dict) -> Verdict:
    """``{"kind": "dab_script", "script": <uri>, "folder": <uri>, "support": <uri>}`` (older
    imports: ``"search_path": [...]``; optional ``"timeout_s"``, default
    :data:`tasks.dab_import.VALIDATE_TIMEOUT_S`): an imported DAB query's own ``validate.py``, run in the
    validators' sandbox with its query folder as its directory (see
    :func:`tasks.dab_import.run_validate_script`); its reason is kept. A script that raises,
    hangs or returns no ``(is_valid, reason)`` pair gives an errored Verdict."""
    from tasks.dab_import import VALIDATE_TIMEOUT_S, run_validate_script

    ok, reason = run_validate_script(validator["script"], answer, validator.get("search_path", []),
                                     timeout_s=float(validator.get("timeout_s",
                                                                   VALIDATE_TIMEOUT_S)),
                                     folder=validator.get("folder"),
                                     support=validator.get("support"))
    if ok is None:  # the script gave no verdict: errored, with its traceback
        return Verdict(False, f"validate.py errored: {reason}", errored=True)
    return Verdict(bool(ok), f"validate.py: {reason}" if reason else "validate.py")


#: Validator kind → function. Unknown kinds raise ValueError in :func:`check_answer`.
VALIDATORS: dict[str, Callable[[str, Any, dict], Verdict]] = {
    "number": check_number,
    "items": check_items,
    "dab_script": check_dab_script,
}


def check_answer(answer: str | None, truth: Any, validator: dict) -> Verdict:
    """Judge ``answer`` against ``truth`` with a spec validator (a ``ValidatorSpec`` dump, see
    :data:`VALIDATORS`). A missing answer is never correct. Raises ValueError for an unknown
    validator kind."""
    kind = validator.get("kind")
    fn = VALIDATORS.get(kind)
    if fn is None:
        raise ValueError(f"unknown validator kind {kind!r}; known: {sorted(VALIDATORS)}")
    if answer is None:
        return Verdict(False, "no answer")
    return fn(answer, truth, validator)


def is_correct(answer: str | None, truth: Any, validator: dict) -> bool:
    """``check_answer(...).ok``: True when the answer passes the validator."""
    return check_answer(answer, truth, validator).ok
