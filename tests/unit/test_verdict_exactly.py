"""The verdict's checks built exactly (harness/metrics/verdict.py, #71): every field of a
Δppl check, a trend's one-sided check and the weaker bound beside it, from planted
differences whose means and intervals are computed here by hand; and which check stands
for a claim."""

from __future__ import annotations

import math

import pytest
from scipy.stats import t

from harness.metrics import verdict


def test_a_delta_ppl_check_carries_every_field():
    got = verdict.delta_ppl(0.3, 0.2, 4, 0.8)
    assert got == verdict.Check("Δppl %", 0.3, 0.2, 0.0, 0.8, 4, None)
    assert got.verdict == verdict.HOLDS
    withheld = verdict.delta_ppl(0.3, None, 1, 0.5, what="Δ", withheld="regime unchecked")
    assert withheld == verdict.Check("Δ [regime unchecked]", 0.3, math.inf, 0.0, 0.5, 1,
                                     "regime unchecked")
    none = verdict.delta_ppl(None, None, 0, 0.8)
    assert math.isnan(none.measured) and none.half_width == math.inf
    assert none.quantity == "Δppl %" and none.verdict == verdict.INCONCLUSIVE


def test_a_decrease_from_paired_differences():
    diffs = [-1.0, -2.0, -3.0]
    mean, sd = -2.0, 1.0
    bound = float(t.ppf(0.95, 2)) * sd / math.sqrt(3)
    got = verdict.decrease("Δ(64) - Δ(4)", diffs)
    assert got == verdict.Decrease("Δ(64) - Δ(4)", mean, pytest.approx(bound), 0.0, 0.0, 3,
                                   None)
    assert got.verdict == verdict.HOLDS
    two = verdict.decrease("d", [1.0, 3.0], disturbed="late")
    assert two == verdict.Decrease("d", 2.0, pytest.approx(float(t.ppf(0.95, 1)) * math.sqrt(2)
                                                           / math.sqrt(2)), 0.0, 0.0, 2, "late")
    assert math.isfinite(two.half_width)


def test_one_or_no_difference_decides_no_trend():
    one = verdict.decrease("d", [-5.0], disturbed="x")
    assert one == verdict.Decrease("d", -5.0, math.inf, 0.0, 0.0, 1, "x")
    assert one.verdict == verdict.INCONCLUSIVE
    none = verdict.decrease("d", [])
    assert (none.quantity, none.half_width, none.predicted, none.tolerance, none.trials,
            none.disturbed) == ("d", math.inf, 0.0, 0.0, 0, None)
    assert math.isnan(none.measured)
    assert none.to_dict()["test"] == verdict.DECREASE_TEST


def test_the_weaker_bound_counts_a_decrease_as_no_growth():
    grew = verdict.bounded_growth("Δ(64) - Δ(4)", [0.1, 0.3], 0.5, disturbed="d")
    half = float(t.ppf(0.975, 1)) * math.sqrt(0.02) / math.sqrt(2)
    assert grew == verdict.Check("Δ(64) - Δ(4), a decrease counted as 0", pytest.approx(0.2),
                                 pytest.approx(half), 0.0, 0.5, 2, "d")
    shrank = verdict.bounded_growth("g", [-0.3, -0.1], 0.5)
    assert shrank.measured == 0.0 and shrank.quantity == "g, a decrease counted as 0"
    nothing = verdict.bounded_growth("g", [], 0.5)
    assert math.isnan(nothing.measured) and nothing.half_width == math.inf
    assert nothing.trials == 0 and nothing.verdict == verdict.INCONCLUSIVE


def test_the_check_furthest_from_its_prediction_stands_for_the_claim():
    near = verdict.Check("near", 0.1, 0.1, 0.0, 1.0, 4)
    far = verdict.Check("far", 0.5, 0.2, 0.0, 1.0, 4)
    wide = verdict.Check("wide", 0.0, 0.6, 0.0, 1.0, 4)        # 0 + 0.6 < 0.5 + 0.2
    opposite = verdict.Check("opposite", -0.6, 0.05, 0.0, 1.0, 4)  # |-0.6| + 0.05 = 0.65
    got = verdict.claim("1a", "paper", "states", "predicts", [near, wide, far, opposite],
                        extra=1)
    assert got["measured"] == far.to_dict()
    assert (got["row"], got["paper"], got["claim"], got["prediction"], got["extra"]) == (
        "1a", "paper", "states", "predicts", 1)
    assert got["checks"] == [c.to_dict() for c in (near, wide, far, opposite)]
    unbounded = verdict.Check("one seed", 0.0, math.inf, 0.0, 1.0, 1)
    assert verdict.claim("1b", "p", "s", "q", [far, unbounded])["measured"]["quantity"] == (
        "one seed")
    shifted = verdict.Check("shifted", 2.0, 0.1, 2.05, 1.0, 4)  # 0.05 + 0.1 < 0.1 + 0.1
    assert verdict.claim("1c", "p", "s", "q", [shifted, near])["measured"]["quantity"] == (
        "near")
