"""DAB-style answer validators: is the ground truth present in an agent's free-text answer?

Scorer-side code only (:mod:`tasks.scoring.stage`): validators read the ground truth, which the
trial side never sees. Each validator kind is one class registered with
:func:`tasks.scoring.registry.validator` (``number`` and ``items`` here, ``dab_script`` in
:mod:`tasks.scoring.dab_validator`); adding a kind is one decorated class in one file.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from tasks.scoring.registry import Validator, get_validator, validator, validator_kinds

#: A number as written: digits with thousands separators only in groups of three
#: (``9,090,303,780``; ``1,24`` is two numbers, 1 and 24, never 124), an optional fraction and
#: exponent, a ``-`` or ``−`` sign.
_NUMBER = re.compile(
    r"(?<![\w.])[-−]?(?:\d{1,3}(?:,\d{3})+(?![\d])|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
#: Distinct candidate numbers a ``number`` answer may hold (numbers that are not in the
#: question) before it counts as a list of guesses; a validator's ``max_candidates`` overrides.
DEFAULT_MAX_CANDIDATES = 3


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
    """Every number written in ``text`` (thousands separators in groups of three:
    ``9,090,303,780``; ``1,24`` reads as 1 and 24)."""
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


def canonical_text(s: str) -> str:
    """``s`` as the validators compare it: NFKD-decomposed (full-width and compatibility forms
    folded, accented letters split into letter + mark), then every combining mark and format
    character (zero-width spaces and joiners, bidi controls) removed, then NFC — so matching is
    accent-insensitive ("Café" = "Cafe") and invisible characters count for nothing. Without
    this a mark that is not a word character but case-folds to one (U+0345) made "Facebookͅ"
    a whole word to one check and no word to the other, and a mark that composes with some
    letters only (U+0307: "Applė" but "Facebook̇") hid every option but one (QA adversary)."""
    text = unicodedata.normalize("NFKD", str(s))
    kept = "".join(c for c in text if unicodedata.category(c) not in ("Mn", "Me", "Cf"))
    return unicodedata.normalize("NFC", kept)


def item_in(item: str, text: str, case_sensitive: bool = False) -> bool:
    """Whether ``item`` appears in ``text`` as whole words (not inside a longer word: ``GOOG``
    is not in ``GOOGL``), whitespace-insensitively, and case-insensitively unless
    ``case_sensitive`` (for an item that is also an everyday word, e.g. the sub-category
    ``Tables`` in "I could not read the tables"); both compared as :func:`canonical_text`."""
    return _words_in(canonical_text(item), canonical_text(text), case_sensitive)


def _words_in(item: str, text: str, case_sensitive: bool = False) -> bool:
    """:func:`item_in` of an ``item`` and a ``text`` already in :func:`canonical_text` form."""
    words = item.split()
    if not words:
        return False
    pattern = r"(?<!\w)" + r"\s+".join(re.escape(w) for w in words) + r"(?!\w)"
    return re.search(pattern, text, 0 if case_sensitive else re.IGNORECASE) is not None


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


def candidate_numbers(answer: str, question: str | None = None) -> list[float]:
    """The distinct numbers of ``answer`` that are not written in ``question`` (a year or a
    count the question names is context, not a candidate answer), in order of appearance."""
    asked = set(numbers_in(question or ""))
    out: list[float] = []
    for x in numbers_in(answer):
        if x not in asked and x not in out:
            out.append(x)
    return out


def _options_named(answer: str, truth: list, options: list) -> list[str]:
    """The ``options`` (other than the ground-truth items) that ``answer`` names, as whole
    words, case- and whitespace-insensitively — by :func:`item_in`, the matcher the items
    check uses, so no text can be an item to one and no option to the other."""
    text = canonical_text(answer)  # once, not once per option
    wanted = {normalise(canonical_text(t)) for t in truth}
    named = []
    for opt in options:
        canon = canonical_text(opt)
        o = normalise(canon)
        if o and o not in wanted and _words_in(canon, text):
            named.append(str(opt))
    return named


def shotgun_reason(answer: str | None, truth: Any, validator: dict,
                   question: str | None = None) -> str | None:
    """Why ``answer`` is a list of guesses rather than an answer, or None: a ``number`` answer
    with more than ``max_candidates`` (default :data:`DEFAULT_MAX_CANDIDATES`) distinct
    numbers that the question does not contain; an ``items`` answer (with ``options``: the
    values the question chooses among) naming an option that is not in the ground truth."""
    if not answer:
        return None
    kind = validator.get("kind")
    if kind == "number":
        limit = validator.get("max_candidates")
        limit = DEFAULT_MAX_CANDIDATES if limit is None else int(limit)
        cands = candidate_numbers(answer, question)
        if len(cands) > limit:
            return (f"the answer lists {len(cands)} candidate numbers ({_short(cands, 5)}); at "
                    f"most {limit} not in the question are accepted: a list of guesses is not "
                    "an answer")
    elif kind == "items" and validator.get("options") and isinstance(truth, list | tuple):
        extra = _options_named(answer, list(truth), list(validator["options"]))
        if extra:
            return (f"the answer also names {len(extra)} other option(s) ({_short(extra, 5)}): "
                    "listing the options is not an answer")
    return None


def check_number(answer: str, truth: Any, validator: dict, question: str | None = None) -> Verdict:
    """``{"kind": "number", "decimals": d, "tolerance": t|None, "max_candidates": m|None}``:
    some number in the answer lies within :func:`number_tolerance` of ``truth``, and the answer
    is not a list of guesses (:func:`shotgun_reason`: at most ``m`` distinct numbers that the
    ``question`` does not contain)."""
    target, tol = float(truth), number_tolerance(truth, validator)
    found = numbers_in(answer)
    shotgun = shotgun_reason(answer, truth, validator, question)
    if shotgun:
        return Verdict(False, shotgun)
    hit = next((x for x in found if abs(x - target) <= tol), None)
    if hit is not None:
        return Verdict(True, f"{hit:g} is within {tol:.3g} of {target:g}")
    if not found:
        return Verdict(False, f"no number in the answer (expected {target:g} ± {tol:.3g})")
    return Verdict(False, f"no number within {tol:.3g} of {target:g}; the answer has {_short(found)}")


def check_items(answer: str, truth: Any, validator: dict, question: str | None = None) -> Verdict:
    """``{"kind": "items", "options": [...]|None, "case_sensitive": bool}``: every item of
    ``truth`` (a list of strings) appears in the answer as whole words (:func:`item_in`),
    whitespace-insensitively and, unless ``case_sensitive``, case-insensitively; with ``options`` (the
    values the question chooses among, from the spec's ``options`` / ``options_sql``) the
    answer must also name no option outside the ground truth, so listing every option fails."""
    exact = bool(validator.get("case_sensitive"))
    missing = [item for item in truth if not item_in(item, answer, exact)]
    if missing:
        return Verdict(False, f"{len(missing)} of {len(truth)} items missing: {_short(missing)}")
    shotgun = shotgun_reason(answer, truth, validator, question)
    if shotgun:
        return Verdict(False, f"all {len(truth)} items present, but {shotgun}")
    return Verdict(True, f"all {len(truth)} items present")


@validator("number")
class NumberValidator(Validator):
    """:func:`check_number`."""

    def check(self, answer, truth, spec, question=None) -> Verdict:
        return check_number(answer, truth, spec, question)


@validator("items")
class ItemsValidator(Validator):
    """:func:`check_items`."""

    def check(self, answer, truth, spec, question=None) -> Verdict:
        return check_items(answer, truth, spec, question)


def check_answer(answer: str | None, truth: Any, validator: dict,
                 question: str | None = None) -> Verdict:
    """Judge ``answer`` against ``truth`` with a spec validator (a ``ValidatorSpec`` dump, see
    :mod:`tasks.scoring.registry`); ``question`` (the query's text) tells the numbers it names apart from
    candidate answers. A missing answer is never correct. Raises ValueError for an unknown
    validator kind."""
    kind = validator.get("kind")
    judge = get_validator(kind)
    if judge is None:
        raise ValueError(f"unknown validator kind {kind!r}; known: {validator_kinds()}")
    if answer is None:
        return Verdict(False, "no answer")
    return judge.check(answer, truth, validator, question)


def is_correct(answer: str | None, truth: Any, validator: dict,
               question: str | None = None) -> bool:
    """``check_answer(...).ok``: True when the answer passes the validator."""
    return check_answer(answer, truth, validator, question).ok
