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

Every Δppl lossbed judges (the bench's table, summary.json and report.html, `compare`,
`reproduce`) is judged by `delta_ppl` below: the paired Δppl over seeds, its 95% t-interval,
against ±band around 0 (2507.07114's ±0.8% by default). Its level: a whole 95% interval
inside the band is the two one-sided tests of equivalence at 2.5% each.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
# 2507.07114: at most 0.8% perplexity change at 10% loss (the bench's --band-pct default)
BAND_PCT = 0.8
TEST = ("equivalence: the 95% t-interval of the paired Δppl over seeds inside ±{band:g}% "
        "(two one-sided tests at 2.5% each)")


def test_text(band_pct: float) -> str:
    """What a Δppl verdict tests, in words, for the band it used."""
    return TEST.format(band=band_pct)


def target_half_width(band_pct: float) -> float:
    """The 95% half-width a bench is sized for: half the band, so that a Δppl of 0 decides
    (holds) with room for an effect of up to half the band."""
    return band_pct / 2


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


DECREASE_TEST = ("one-sided: the paired difference's upper 95% bound below 0 (holds: the "
                 "decrease is shown), its lower 95% bound above 0 (does not hold: an "
                 "increase is shown), inconclusive between")


@dataclass(frozen=True)
class Decrease(Check):
    """A trend claim as a paper states it ("the harm shrinks as servers are added"): the
    difference (at the largest n minus at the smallest), paired over seeds, is below 0.
    half_width is the one-sided 95% bound's distance from the mean (Student's t at 95%
    one-sided, k - 1 degrees); predicted and tolerance are 0. A difference whose interval
    reaches 0 shows no trend: inconclusive, never "holds"."""

    @property
    def verdict(self) -> str:
        if self.disturbed or not (math.isfinite(self.measured)
                                  and math.isfinite(self.half_width)):
            return INCONCLUSIVE
        if self.measured + self.half_width < 0:
            return HOLDS
        if self.measured - self.half_width > 0:
            return FAILS
        return INCONCLUSIVE

    def to_dict(self) -> dict:
        return {**super().to_dict(), "test": DECREASE_TEST}


def decrease(quantity: str, differences: list[float],
             disturbed: str | None = None) -> Decrease:
    """The trend check from per-seed paired differences (largest n minus smallest)."""
    from scipy.stats import t

    k = len(differences)
    mean = math.fsum(differences) / k if k else math.nan
    if k < 2:
        return Decrease(quantity, mean, math.inf, 0.0, 0.0, k, disturbed)
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in differences) / (k - 1))
    return Decrease(quantity, mean, float(t.ppf(0.95, k - 1)) * sd / math.sqrt(k), 0.0, 0.0,
                    k, disturbed)


def bounded_growth(quantity: str, differences: list[float], tolerance: float,
                   disturbed: str | None = None) -> Check:
    """The weaker check beside a trend claim: the same paired differences grew by at most
    `tolerance` (a decrease counted as 0), their two-sided 95% interval against it."""
    from testbed.stats import mean_interval

    mean, half = mean_interval(differences) if differences else (math.nan, math.inf)
    return Check(quantity + ", a decrease counted as 0", max(mean, 0.0) if mean == mean
                 else mean, half, 0.0, tolerance, len(differences), disturbed=disturbed)


def paired(smaller: dict, larger: dict) -> list[float]:
    """larger[seed] - smaller[seed] over the seeds both have (dicts of seed -> value)."""
    return [larger[s] - smaller[s] for s in sorted(set(smaller) & set(larger))]


def delta_ppl(mean: float | None, half_width: float | None, seeds: int, band_pct: float,
              what: str = "Δppl %", withheld: str | None = None) -> Check:
    """A Δppl (percent, against its lossless reference) over `seeds` paired seeds with its
    95% half-width (None: one seed, no interval) against ±band_pct; `withheld`: why the runs
    did not measure what the claim is about (no verdict either way)."""
    return Check(what + (f" [{withheld}]" if withheld else ""),
                 math.nan if mean is None else mean,
                 math.inf if half_width is None else half_width, 0.0, band_pct, seeds,
                 disturbed=withheld)


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
