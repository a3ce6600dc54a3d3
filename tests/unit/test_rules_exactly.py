"""The rules' remaining edges and words, exactly (#71): the input rules' messages and
bounds (testbed/checks.py), the statistics' edges (testbed/stats.py), the question's whole
text, the chaos check's record and lines (harness/bench/stability.py) and the estimators
writing where they are told (harness/collectives/rebuild.py)."""

from __future__ import annotations

import argparse
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest

from harness.bench import stability
from harness.bench.question import question
from harness.bench.spec import BenchSpec
from harness.collectives import rebuild
from harness.metrics import verdict
from testbed import checks, stats
from testbed.errors import UsageError


def _refusal(call) -> tuple[str, str, str]:
    with pytest.raises(UsageError) as refused:
        call()
    return refused.value.field, refused.value.problem, refused.value.fix


# ---- testbed/checks.py ---------------------------------------------------------------------


def test_a_loss_rate_refusal_says_what_was_wrong_and_the_fraction_to_write():
    assert _refusal(lambda: checks.loss_fraction("--loss", 10)) == (
        "--loss", "10 is not a fraction in [0, 1)",
        "--loss is a fraction: --loss 0.1 means 10%; for 10% write --loss 0.1")
    assert _refusal(lambda: checks.loss_fraction("--loss", 1.0)) == (
        "--loss", "1 is not a fraction in [0, 1)",
        "--loss is a fraction: --loss 0.1 means 10%; for 1% write --loss 0.01")
    assert _refusal(lambda: checks.loss_fraction("--loss", 150)) == (
        "--loss", "150 is not a fraction in [0, 1)", "--loss is a fraction: --loss 0.1 means 10%")
    assert _refusal(lambda: checks.loss_fraction("--loss", -0.5)) == (
        "--loss", "-0.5 is not a fraction in [0, 1)", "--loss is a fraction: --loss 0.1 means 10%")
    assert _refusal(lambda: checks.loss_fraction("loss", "0.1")) == (
        "loss", "'0.1' is not a number", "loss is a fraction: loss 0.1 means 10%")


def test_loss_as_typed_a_percent_is_answered_with_its_fraction():
    assert checks.loss_text(" 0.25 ") == 0.25
    with pytest.raises(argparse.ArgumentTypeError) as percent:
        checks.loss_text("10%")
    assert str(percent.value) == ("'10%' is a percent; a loss rate here is a fraction: "
                                  "write 0.1 for 10%")
    with pytest.raises(argparse.ArgumentTypeError) as odd:
        checks.loss_text("ten%")
    assert str(odd.value) == "'ten%' is a percent; a loss rate here is a fraction"
    with pytest.raises(argparse.ArgumentTypeError) as word:
        checks.loss_text("ten")
    assert str(word.value) == ("'ten' is not a number: a loss rate is a fraction, 0.1 "
                               "means 10%")
    with pytest.raises(argparse.ArgumentTypeError, match="write 0.125 for 12.5%"):
        checks.loss_text("12.5%")


def test_a_share_includes_both_ends():
    assert checks.share("--min-coverage", 0.0, "e") is None
    assert checks.share("--min-coverage", 1.0, "e") is None
    assert _refusal(lambda: checks.share("--min-coverage", 1.5, "e.g. 0.9")) == (
        "--min-coverage", "1.5 is not a fraction in [0, 1]", "e.g. 0.9")


def test_seconds_and_rates_name_their_option_and_example():
    assert checks.seconds("--grace-s", 0, 5, "why") is None
    assert checks.seconds("--lease-s", 0.5, 120, "why", positive=True) is None
    assert _refusal(lambda: checks.seconds("--grace-s", -1, 5, "the wait")) == (
        "--grace-s", "-1 is not a number of seconds", "e.g. --grace-s 5: the wait")
    assert _refusal(lambda: checks.seconds("--lease-s", math.inf, 120, "w", positive=True)) == (
        "--lease-s", "inf is not a positive number of seconds", "e.g. --lease-s 120: w")
    assert checks.positive_rate("--lr", 1e-9, 0.1) is None
    for bad in (0.0, -1.0, math.nan, math.inf):
        assert _refusal(lambda bad=bad: checks.positive_rate("--lr", bad, 0.1)) == (
            "--lr", f"{bad} is not a positive learning rate", "e.g. --lr 0.1")


def test_a_count_below_its_least_names_the_option_as_typed():
    args = SimpleNamespace(hosts=1, many_ranks=8)
    assert checks.at_least(args, ("many_ranks", 2)) is None
    assert _refusal(lambda: checks.at_least(args, ("many_ranks", 2), ("hosts", 2))) == (
        "--hosts", "1 is too small", "Give 2 or more")
    args.many_ranks = 1
    assert _refusal(lambda: checks.at_least(args, ("many_ranks", 2)))[0] == "--many-ranks"


def test_a_name_stays_a_name_and_a_home_path_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert checks.user_name_or_path("random-loss") == "random-loss"
    assert checks.user_name_or_path("~/x") == str(tmp_path / "home" / "x")
    assert checks.user_name_or_path("~nosuchuser") == str(tmp_path / "~nosuchuser")
    assert checks.user_name_or_path("~") == str(tmp_path / "home")
    assert checks.user_name_or_path("p.yml") == str(tmp_path / "p.yml")
    (tmp_path / "here").write_text("")
    assert checks.user_name_or_path("here") == os.path.join(str(tmp_path), "here")


# ---- testbed/stats.py ----------------------------------------------------------------------


def test_the_markov_inflation_at_its_edges():
    assert stats.markov_inflation(0.5, 0.5) == 1.0               # rho 0: independent
    assert stats.markov_inflation(0.1, 0.1) == pytest.approx(1.8 / 0.2)
    assert stats.markov_inflation(1.0, 1.0) == 1.0               # rho -1: alternating
    assert stats.markov_inflation(0.0, 0.0) == 1.0               # rho 1: no mixing
    assert stats.markov_inflation(0.0, -0.5) == 1.0              # rho 1.5: not a chain
    assert stats.markov_inflation(1.0, 1.5) == 1.0               # rho -1.5: not a chain
    assert stats.markov_inflation(0.9, 0.9) == 1.0               # anti-correlated: at least 1


def test_the_sigma_distance():
    assert stats.sigma_distance(5, 0, 0.1) == 0.0
    assert stats.sigma_distance(0, 1, 0.1) == pytest.approx(0.1 / math.sqrt(0.09))
    assert stats.sigma_distance(150, 1000, 0.1, inflation=4.0) == pytest.approx(
        0.05 / math.sqrt(0.09 * 4 / 1000))
    assert stats.sigma_distance(1, 1000, 0.0) == pytest.approx(0.001 / math.sqrt(1e-300 / 1000))


def test_the_intervals_at_their_edges():
    assert stats.t95(1) == stats.t_quantile(1) and stats.t95(2) == stats.t_quantile(1)
    assert stats.t95(3) == stats.t_quantile(2)
    mean, half = stats.mean_interval([1, 2])
    assert isinstance(mean, float) and mean == 1.5 and half == pytest.approx(
        stats.t_quantile(1) * 0.5)
    assert stats.mean_interval([])[1] == math.inf and math.isnan(stats.mean_interval([])[0])
    assert stats.mean_interval([7]) == (7.0, math.inf)
    slope, slope_half = stats.slope_interval([0, 1, 2], [0, 2, 4])
    assert slope == pytest.approx(2.0) and slope_half == pytest.approx(0.0, abs=1e-9)
    assert math.isnan(stats.slope_interval([0, 1], [0, 2])[0])


def test_the_wilson_interval_at_its_edges():
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)
    one = stats.wilson_interval(1, 1)
    assert one[0] == pytest.approx(1 / (1 + 1.959963984540054 ** 2)) and one[1] == 1.0
    assert stats.wilson_interval(2, 4, inflation=2.0) == stats.wilson_interval(1, 2)
    assert stats.wilson_interval(3, 3, inflation=10.0) == stats.wilson_interval(1, 1)
    low, high = stats.wilson_interval(50, 100)
    assert low == pytest.approx(0.4038, abs=1e-4) and high == pytest.approx(0.5962, abs=1e-4)


# ---- harness/bench/question.py -------------------------------------------------------------


def test_the_whole_question_text():
    spec = BenchSpec.make(losses=[0.0, 0.1, 0.05], variants=["reliable", "unbiased_drift"], seeds=1,
                          band_pct=0.8)
    asked = question(spec)
    test = verdict.test_text(0.8)
    rule = ("fixed sample: 1 seed(s), one look after all of them (no interim looks, no early "
            "stop: the level is spent once)")
    assert asked == {
        "text": (f"at 10%, 5% (random-loss), is each lossy variant's final held-out "
                 f"perplexity within ±0.8% of the same seed's lossless run (unbiased_drift "
                 f"against reliable)? regime {spec.regime_text}; seed 2 (confirmatory: none "
                 f"of the pilot seeds 0, 1 that chose the defaults), one loss realisation "
                 f"each; test: {test}; stopping rule: {rule}"),
        "regime": spec.regime, "band_pct": 0.8, "test": test, "seeds": 1, "seed_list": [2],
        "pilot_seeds": [0, 1], "pilot_seeds_used": [], "losses": [0.1, 0.05],
        "stopping_rule": rule}
    lossless = question(BenchSpec.make(losses=[0.0], variants=["reliable"], seeds=2))
    assert lossless["text"].startswith("at no loss (random-loss)") and (
        "(no lossy variant)" in lossless["text"]) and lossless["losses"] == []


# ---- harness/bench/stability.py ------------------------------------------------------------


def _pair(seed, ref_ppl, twin_ppl, config=None, variant="reliable"):
    return ({"variant": variant, "seed": seed, "ppl": ref_ppl},
            {"variant": variant, "seed": seed, "ppl": twin_ppl, **(
                {"config": config} if config is not None else {})})


def test_a_references_check_is_recorded_whole():
    pairs = [_pair(3, 10.0, 10.01, {"drop_once": 0.05}), _pair(2, 20.0, 20.0, {}),
             (None, {"seed": 4, "ppl": 1.0}), ({"seed": 5, "ppl": 1.0, "variant": "x"}, None)]
    got = stability.check(pairs)
    deltas = [0.0, (10.01 / 10.0 - 1) * 100]
    mean, half = stats.mean_interval(deltas)
    assert got == {"reference": "reliable", "seeds": [2, 3],
                   "perturbation": "one step with 10% of its gradient's datagram blocks zeroed",
                   "ppl_references": [20.0, 10.0], "ppl_twins": [20.0, 10.01],
                   "deltas_pct": deltas, "delta_pct": mean, "delta_ci95": half,
                   "tolerance_pct": 0.2, "stable": abs(mean) + half <= 0.2}
    # the perturbation is the first (by seed) twin's drop, 10% where it names none
    assert stability.check([_pair(2, 10.0, 10.0, {"drop_once": 0.05})])["perturbation"] == (
        "one step with 5% of its gradient's datagram blocks zeroed")
    assert stability.check([_pair(2, 10.0, 10.0)])["delta_ci95"] is None
    assert stability.check([(None, None)]) is None


def test_the_lines_a_bench_prints_for_its_references():
    stable = {"reference": "reliable", "seeds": [2, 3], "deltas_pct": [0.001, -0.002],
              "delta_pct": -0.0005, "delta_ci95": 0.019, "tolerance_pct": 0.2,
              "stable": True, "perturbation": "one step"}
    chaotic = dict(stable, reference="reliable/sgd", stable=False, delta_ci95=None)
    assert stability.text({"reliable": stable, "reliable/sgd": chaotic},
                          {"reliable": ["unbiased_drift", "rps/adamw"]}) == [
        "regime stability of reliable (judges unbiased_drift, rps/adamw): its twins (one "
        "step) moved ppl by -0.001 ± 0.019% (tolerance ±0.2%) over seeds (seed 2 +0.001%, "
        "seed 3 -0.002%): stable",
        "regime stability of reliable/sgd: its twins (one step) moved ppl by -0.001 (one "
        "seed: no interval)% (tolerance ±0.2%) over seeds (seed 2 +0.001%, seed 3 -0.002%): "
        "CHAOTIC or undecided: its rows' verdicts withheld"]
    assert stability.text({}) == ["regime stability: not checked (no twin run; --stability "
                                  "runs them): no Δppl gets a verdict"]


# ---- harness/collectives/rebuild.py --------------------------------------------------------


@pytest.mark.parametrize("estimator", rebuild.ESTIMATORS)
def test_each_estimator_writes_into_the_buffer_it_is_given(estimator):
    total = np.array([6.0, 9.0], np.float32)
    own = np.array([1.0, 2.0], np.float32)
    count = np.array([2.0, 3.0], np.float32)
    want = {"zero_fill": total / 3, "received_mean": total / count,
            "rescale": (own + (total - own) / 0.5) / 3}[estimator]
    out = np.zeros(2, np.float32)
    got = rebuild.rebuild(estimator, total, count, own, 3, 0.5, out=out)
    assert got is out and np.allclose(out, want)
    in_place = total.copy()
    assert rebuild.rebuild(estimator, in_place, count, own, 3, 0.5, out=in_place) is in_place
    assert np.allclose(in_place, want)


def test_an_unknown_estimator_names_the_known_ones():
    with pytest.raises(ValueError) as refused:
        rebuild.rebuild("median", np.zeros(1), np.ones(1), np.zeros(1), 2, 0.1)
    assert str(refused.value) == ("unknown estimator 'median': use one of zero_fill, "
                                  "received_mean, rescale")


def test_a_loss_of_100_is_not_read_as_a_percent():
    assert _refusal(lambda: checks.loss_fraction("--loss", 100)) == (
        "--loss", "100 is not a fraction in [0, 1)", "--loss is a fraction: --loss 0.1 means 10%")
    assert _refusal(lambda: checks.loss_fraction("--loss", 99.5))[2].endswith(
        "; for 99.5% write --loss 0.995")


def test_the_question_on_pilot_seeds_and_of_several_variants():
    spec = BenchSpec.make(variants=["reliable", "unbiased_drift", "rps"], seeds=2, first_seed=1)
    text = question(spec)["text"]
    assert ("seeds 1-2 (pilot seeds 1 among them: not a confirmation of the choices they "
            "made), one loss realisation each") in text
    assert "(unbiased_drift against reliable; rps against reliable/sgd)?" in text


def test_an_option_left_out_gives_the_rule_nothing_and_a_zero_is_given():
    assert checks.given(None) == ()
    assert checks.given(0) == (0,) and checks.given(0.1) == (0.1,)  # (0 is --loss 0: given)
    assert _refusal(lambda: checks.loss_fraction("--loss", *checks.given(1.5)))[0] == "--loss"
