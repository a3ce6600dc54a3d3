"""From a measurement to a verdict on a claim.

A claim here says that a measured quantity equals a prediction. The measurement comes with a
95% interval, and the claim with a tolerance: the smallest deviation from the prediction
that would matter (the effect the claim is about). The verdict is an equivalence test:

    holds            the whole interval lies within prediction ± tolerance
    does not hold    the whole interval lies outside it
    inconclusive     the interval reaches across its edge: it is wider than the effect,
                     and more trials would be needed to say either

So a precise measurement of an irrelevant deviation still holds, and a noisy measurement
near the prediction is not called a success.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"


@dataclass(frozen=True)
class Check:
    """One measured quantity against its prediction."""
    quantity: str       # what was measured, in words
    measured: float
    half_width: float   # of its 95% interval
    predicted: float
    tolerance: float    # the deviation from the prediction that matters
    trials: int         # independent trials (or seeds) behind the interval
    # why the measurement is not of what the claim is about (e.g. the collectives fell
    # behind and missed far more than the network lost): no verdict either way
    disturbed: str | None = None

    @property
    def verdict(self) -> str:
        if self.disturbed or not (math.isfinite(self.measured)
                                  and math.isfinite(self.half_width)):
            return INCONCLUSIVE
        distance = abs(self.measured - self.predicted)
        if distance + self.half_width <= self.tolerance:
            return HOLDS
        if distance - self.half_width > self.tolerance:
            return FAILS
        return INCONCLUSIVE

    def to_dict(self) -> dict:
        return {**asdict(self), "verdict": self.verdict}


def combine(checks: list[Check]) -> str:
    """A claim made of several checks: it holds if all hold, does not hold if any does not,
    and is inconclusive otherwise."""
    verdicts = {c.verdict for c in checks}
    if FAILS in verdicts:
        return FAILS
    if verdicts == {HOLDS}:
        return HOLDS
    return INCONCLUSIVE


def claim(row: str, paper: str, statement: str, prediction: str, checks: list[Check],
          **detail) -> dict:
    """One line of the reproduction table: a claim, what it was held against, what was
    measured (the check furthest from its prediction stands for the rest), the verdict."""
    worst = max(checks, key=lambda c: (abs(c.measured - c.predicted) + c.half_width
                                       if math.isfinite(c.half_width) else math.inf))
    return {"row": row, "paper": paper, "claim": statement, "prediction": prediction,
            "verdict": combine(checks), "measured": worst.to_dict(),
            "checks": [c.to_dict() for c in checks], **detail}
