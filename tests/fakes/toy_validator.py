"""A toy validator kind, registered from outside ``tasks/`` (tests/test_registry.py): an answer
is correct when it is ``"toy yes"`` (case-insensitive), whatever the ground truth."""

from __future__ import annotations

from tasks.scoring.registry import Validator, validator
from tasks.scoring.validate import Verdict


@validator("toy_yes")
class ToyYesValidator(Validator):
    """Correct iff the answer is ``toy yes``; the reason names what was seen."""

    def check(self, answer, truth, spec, question=None):
        ok = answer.strip().casefold() == "toy yes"
        return Verdict(ok, f"toy validator saw {answer.strip()!r}")
