"""The rules that decide a result, held at their edges (#71): a rule changed on purpose (the
coverage threshold to 0.5, the loss rule to accept 1.0, "does not hold" on the mean alone)
fails a test here, with the exact planted values."""

from __future__ import annotations

import math

import pytest

from harness.metrics import verdict
from testbed import checks, profiles
from testbed.errors import UsageError
from testbed.impair import coverage


def _coverage(impaired: int, total: int = 1000, least=coverage.DEFAULT_MIN_COVERAGE):
    host = coverage.HostCoverage(host="h1", direction="ingress", impaired_bytes=impaired,
                                 impaired_packets=impaired, total_bytes=total,
                                 total_packets=total, elsewhere={"eth9": total - impaired})
    return coverage.Coverage(hosts=[host], min_coverage=least)


def test_the_coverage_threshold_is_90_percent_and_85_is_not_enough():
    assert coverage.DEFAULT_MIN_COVERAGE == 0.9
    lossy = profiles.load("random-loss")
    assert _coverage(900).enough and _coverage(900).no_result(lossy) is None  # at 0.9
    assert _coverage(1000).enough
    short = _coverage(850)
    assert not short.enough
    assert short.no_result(lossy).startswith(
        "only 85.0% of the hosts' 1.0 kB crossed the impairment (at least 90% needed)")
    assert not _coverage(899).enough  # just under
    # no traffic measured nothing; a clean profile is recorded, never judged
    assert not _coverage(0, total=0).enough
    assert _coverage(0).no_result(profiles.load("clean")) is None


@pytest.mark.parametrize("fraction", [0, 0.0, 1e-9, 0.5, 0.999999])
def test_the_loss_rule_takes_a_fraction_from_0_up_to_but_not_1(fraction):
    checks.loss_fraction("--loss", fraction)  # no refusal


@pytest.mark.parametrize(("value", "says"), [
    (1.0, "1 is not a fraction in [0, 1)"),
    (1.5, "1.5 is not a fraction in [0, 1)"),
    (-0.1, "-0.1 is not a fraction in [0, 1)"),
    (math.nan, "nan is not a fraction in [0, 1)"),
    (math.inf, "inf is not a fraction in [0, 1)"),
    ("0.1", "'0.1' is not a number"),
])
def test_the_loss_rule_refuses_1_and_above_below_0_and_nan(value, says):
    with pytest.raises(UsageError) as err:
        checks.loss_fraction("--loss", value)
    assert err.value.field == "--loss" and err.value.problem == says


@pytest.mark.parametrize(("mean", "half", "expected"), [
    # the mean outside the band, the interval reaching back inside it: no verdict (a rule
    # that called "does not hold" on the mean alone passed every other case)
    (1.0, 0.3, verdict.INCONCLUSIVE),     # 0.7..1.3 across +0.8
    (-1.0, 0.25, verdict.INCONCLUSIVE),   # -1.25..-0.75 across -0.8
    (0.81, 0.02, verdict.INCONCLUSIVE),   # 0.79..0.83: across, just
    (0.9, 0.09, verdict.FAILS),           # 0.81..0.99: wholly outside
    (0.79, 0.0, verdict.HOLDS),           # at the edge, no spread: inside
    (0.8, 0.0, verdict.HOLDS),            # exactly on the edge counts as inside
])
def test_a_delta_straddling_the_band_is_inconclusive_not_a_failure(mean, half, expected):
    assert verdict.delta_ppl(mean, half, 4, 0.8).verdict == expected


def test_every_reason_for_withholding_is_said_in_full():
    """The reasons a row gets no verdict, word for word (mutants of their texts survived)."""
    from harness.bench import withholding

    assert withholding.by_the_regime(None) == (
        "regime unchecked: no chaos check was run (no twin)")
    assert withholding.by_the_regime(None, "reliable/sgd") == (
        "regime unchecked: no chaos check of reliable/sgd was run (no twin)")
    unstable = {"stable": False, "perturbation": "one lossy step", "delta_pct": 0.3,
                "delta_ci95": 0.1, "tolerance_pct": 0.2}
    assert withholding.by_the_regime(unstable, "reliable") == (
        "regime unstable: the twins of reliable (one lossy step) moved lossless perplexity "
        "by +0.300 ± 0.100% (tolerance ±0.2%)")
    assert withholding.by_the_regime({**unstable, "stable": True}) is None
    assert withholding.by_the_runs({"disturbed": [2, 3]}) == (
        "disturbed: in the runs of seeds [2, 3] the collectives missed far more than the "
        "network lost")
    assert withholding.by_the_runs({"reference_missed_packets": [4]}) == (
        "references late: the lossless references of seeds [4] missed packets: not the "
        "lossless model")
    assert withholding.by_the_runs({"disturbed": [], "reference_missed_packets": []}) is None


@pytest.mark.parametrize(("numel", "world", "bounds"), [
    (10, 3, [(0, 4), (4, 7), (7, 10)]),      # the first numel % world shards one longer
    (9, 3, [(0, 3), (3, 6), (6, 9)]),
    (2, 4, [(0, 1), (1, 2), (2, 2), (2, 2)]),  # fewer elements than ranks: empty shards
    (11, 4, [(0, 3), (3, 6), (6, 9), (9, 11)]),
])
def test_the_shards_tile_the_tensor_in_rank_order(numel, world, bounds):
    from harness.collectives.layout import Layout

    layout = Layout(numel, world, per_packet=2)
    assert [layout.shard_bounds(r) for r in range(world)] == bounds
    # packets cut each shard in order, per_packet values each, the last one short
    start, end = bounds[0]
    assert [layout.packet_bounds(0, i) for i in range(layout.packets(0))] == [
        (s, min(s + 2, end)) for s in range(start, end, 2)]
