"""DAB-style answer validators: is the ground truth present in an agent's free-text answer?"""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"(?<![\w.])[-−]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


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


def _norm(s: str) -> str:
    return " ".join(str(s).casefold().split())


def is_correct(answer: str | None, truth: Any, validator: dict) -> bool:
    """Check an answer against the ground truth with a spec validator.

    ``validator`` is a ``ValidatorSpec`` dump: ``{"kind": "number", "decimals": d,
    "tolerance": t|None}`` — some number in the answer lies within ``t`` (default
    ``0.5 * 10**-d``, i.e. the stated rounding, plus 1e-9 relative slack) of ``truth``; or
    ``{"kind": "items"}`` — every item of ``truth`` (a list of strings) appears in the answer,
    compared case- and whitespace-insensitively; or ``{"kind": "dab_script", ...}`` — an
    imported DAB query's ``validate.py`` run in a sandboxed subprocess. A missing answer is
    never correct.
    """
    if answer is None:
        return False
    if validator["kind"] == "number":
        tol = validator.get("tolerance")
        if tol is None:
            tol = 0.5 * 10 ** -int(validator.get("decimals", 2))
        tol += 1e-9 * max(1.0, abs(float(truth)))
        return any(abs(x - float(truth)) <= tol for x in numbers_in(answer))
    if validator["kind"] == "items":
        text = _norm(answer)
        return all(_norm(item) in text for item in truth)
    if validator["kind"] == "dab_script":  # an imported DAB query's own validate.py, sandboxed
        from tasks.dab_import import is_correct_dab

        return is_correct_dab(answer, validator)
    raise ValueError(f"unknown validator kind {validator['kind']!r}")
