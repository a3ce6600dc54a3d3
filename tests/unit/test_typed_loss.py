"""A loss rate travels typed from the command line to the profile (issue #44, part 3): a
fraction and its seed reach one call, Profile.with_loss, which sets it where one number can
say it and refuses, with the reason, a profile whose loss it cannot set. Before, the bench
wrote `loss_pct=10.0` as --set text: `--profile clean --loss 0.1` became 10% random loss and
an asymmetric profile's hosts kept their own rates while the record said 10%."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.bench.spec import BenchSpec
from testbed import profiles
from testbed.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


def test_a_loss_fraction_becomes_the_profiles_rate_and_seed_and_nothing_else():
    base = profiles.load("burst-loss")
    lossy = profiles.load("burst-loss", loss=0.1, loss_seed=7)
    assert lossy.impairment.loss.loss_pct == 10.0
    assert lossy.impairment.seed == 7
    assert lossy.impairment.loss.stationary_loss() == pytest.approx(0.1)
    # the burst's shape and everything else stay the profile's
    assert lossy.impairment.loss.mean_burst_packets == base.impairment.loss.mean_burst_packets
    assert lossy.impairment.loss.max_burst_ms == base.impairment.loss.max_burst_ms
    assert lossy.model_dump(exclude={"impairment"}) == base.model_dump(exclude={"impairment"})
    # without a seed, the profile's own (none here)
    assert profiles.load("random-loss", loss=0.3).impairment.seed is None
    # --set overrides apply first, the typed loss after them
    wan = profiles.load("wan", ["delay_ms=3"], loss=0.05)
    assert (wan.impairment.delay_ms, wan.impairment.loss.loss_pct) == (3.0, 5.0)


@pytest.mark.parametrize(("name", "says"), [
    ("clean", ["no loss model", "random-loss"]),
    ("asymmetric", ["h1->h2", "h2->h1", "h3", "without --loss"]),
    ("four-state", ["four_state", "transition rates"]),
])
def test_a_profile_whose_loss_one_rate_cannot_set_is_refused_with_the_reason(name, says):
    with pytest.raises(profiles.ProfileError) as err:
        profiles.load(name, loss=0.1)
    text = str(err.value)
    assert name in text and "0.1" in text
    for words in says:
        assert words in text


def test_a_gilbert_model_given_by_its_rates_is_refused(tmp_path):
    path = tmp_path / "by-rates.yaml"
    path.write_text("impairment:\n  loss: {model: gilbert_elliott, p_pct: 1, r_pct: 10}\n")
    with pytest.raises(profiles.ProfileError, match="transition rates"):
        profiles.load(str(path), loss=0.1)


@pytest.mark.parametrize("loss", [1.0, -0.1, float("nan")])
def test_with_loss_takes_a_fraction_by_the_one_rule(loss):
    with pytest.raises(UsageError, match="is not a fraction in \\[0, 1\\)"):
        profiles.load("random-loss").with_loss(loss)


def test_with_loss_leaves_no_loss_to_without_loss():
    with pytest.raises(ValueError, match="without_loss"):
        profiles.load("random-loss").with_loss(0.0)


@pytest.mark.parametrize("profile", ["clean", "asymmetric", "four-state"])
def test_the_bench_refuses_them_before_anything_is_built(profile):
    with pytest.raises(UsageError) as err:  # (as the spec is made)
        BenchSpec.make(losses=[0.1], profile=profile, steps=2, seeds=1)
    assert profile in str(err.value)


def test_every_bench_run_carries_its_loss_seed_and_isolation_typed():
    spec = BenchSpec.make(losses=[0.0, 0.1], profile="burst-loss", steps=2, seeds=2,
                          speed_steps=2, isolated=True)
    runs = [case.train_run() for case in spec.cases()]
    lossy = [r for r in runs if r.loss > 0]
    assert lossy and all(r.sets == () for r in runs)  # no value as text
    for r in lossy:
        profile = r.load_profile()
        assert (profile.name, profile.impairment.loss.loss_pct) == ("burst-loss", 10.0)
        assert profile.impairment.seed == r.loss_seed and profile.isolated
    for r in runs:
        if r.loss == 0:  # the lossless runs stay on clean, isolated like the others
            assert (r.profile, r.loss_seed) == ("clean", None) and r.load_profile().isolated
    # runs of one (profile, loss, seed) share one plan; other seeds another
    assert len({r.network for r in lossy}) == len({r.loss_seed for r in lossy})


