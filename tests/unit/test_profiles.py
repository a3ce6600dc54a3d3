"""Profiles: the shipped library, overrides, and clear errors for bad input."""

from __future__ import annotations

import pytest

from testbed import profiles
from testbed.errors import UsageError
from testbed.profiles.loading import ProfileError
from testbed.profiles.model import Bernoulli, FourState, GilbertElliott, PortRange

SHIPPED = ["asymmetric", "burst-loss", "clean", "four-state", "lab-full", "random-loss", "wan"]


def test_the_library_has_the_promised_profiles_and_all_validate():
    assert set(SHIPPED) <= set(profiles.available())
    for name in profiles.available():
        p = profiles.load(name)
        assert p.name == name
    assert profiles.load("clean").impairment.is_clean()
    assert isinstance(profiles.load("random-loss").impairment.loss, Bernoulli)
    assert isinstance(profiles.load("burst-loss").impairment.loss, GilbertElliott)
    wan = profiles.load("wan").impairment
    assert wan.delay_ms > 0 and wan.jitter_ms > 0 and wan.rate_mbit and wan.loss
    asym = profiles.load("asymmetric")
    assert asym.impairment_for("h1", "h2", at="h2").loss.loss_pct == 5.0
    assert asym.impairment_for("h2", "h1", at="h1").loss.loss_pct == 0.1


def test_set_overrides_reach_the_loss_model_and_add_loss_to_clean():
    assert profiles.load("random-loss", ["loss_pct=10"]).impairment.loss.loss_pct == 10
    burst = profiles.load("burst-loss", ["loss_pct=10"]).impairment.loss
    assert burst.stationary_loss() == pytest.approx(0.10)
    assert burst.mean_burst_length() == pytest.approx(10)
    clean = profiles.load("clean", ["loss_pct=5", "delay_ms=3", "direction=both"])
    assert clean.impairment.loss.loss_pct == 5 and clean.impairment.delay_ms == 3
    assert clean.direction == "both"
    nested = profiles.load("random-loss", ["hosts.h2.loss={model: bernoulli, loss_pct: 7}"])
    assert nested.impairment_for("h1", "h2", at="h2").loss.loss_pct == 7
    assert nested.impairment_for("h1", "h3", at="h3").loss.loss_pct == 1


def test_gilbert_elliott_stationary_values():
    ge = GilbertElliott(p_pct=1, r_pct=20)
    assert ge.stationary_loss() == pytest.approx(0.01 / 0.21)
    assert ge.mean_burst_length() == pytest.approx(5)
    partial = GilbertElliott(p_pct=10, r_pct=10, loss_in_bad_pct=50, loss_in_good_pct=10)
    assert partial.stationary_loss() == pytest.approx(0.5 * 0.5 + 0.5 * 0.1)


def test_four_state_stationary_loss_matches_a_direct_solution():
    # Only 1 <-> 4 moves: state 4 is left at once, so pi4 = p14 * pi1 and all loss is in 4.
    fs = FourState(p13_pct=0, p14_pct=10)
    assert fs.stationary_loss() == pytest.approx(0.1 / 1.1)
    assert fs.mean_burst_length() == pytest.approx(1.0)
    # Only 1 <-> 3: a two-state chain; loss = p13 / (p13 + p31), bursts of 1 / p31.
    two = FourState(p13_pct=2, p31_pct=40, p32_pct=0, p14_pct=0)
    assert two.stationary_loss() == pytest.approx(0.02 / 0.42)
    assert two.mean_burst_length() == pytest.approx(2.5)


@pytest.mark.parametrize("rates", [
    dict(p13_pct=2, p31_pct=40, p32_pct=10, p23_pct=30, p14_pct=0.5),
    dict(p13_pct=1e-6, p31_pct=1e-6, p32_pct=0, p14_pct=0),  # very slow mixing
    dict(p13_pct=5, p31_pct=0, p32_pct=0, p14_pct=1),         # state 3 absorbs: all lost
    dict(p13_pct=0, p14_pct=0),                                # state 1 absorbs: none lost
])
def test_four_state_law_is_stationary_and_the_limit_from_state_one(rates):
    import numpy as np

    fs = FourState(**rates)
    pi = np.array(fs.stationary())
    t = np.array(fs.transition_matrix())
    assert pi.sum() == pytest.approx(1) and (pi >= -1e-12).all()
    assert np.allclose(pi @ t, pi, atol=1e-12)  # stationary
    # and it is where the chain goes from state 1 (netem's start): 2^60 steps of the lazy
    # chain, by repeated squaring
    lazy = (np.eye(4) + t) / 2
    for _ in range(60):
        lazy = lazy @ lazy
        lazy /= lazy.sum(axis=1, keepdims=True)  # keep the rows laws despite rounding
    assert np.allclose(lazy[0], pi, atol=1e-6)


def test_a_slowly_mixing_four_state_chain_is_solved_not_cut_short():
    """The power iteration this replaced stopped after a million steps, unconverged, on a
    chain that mixes over billions of packets."""
    fs = FourState(p13_pct=1e-7, p31_pct=2e-7, p32_pct=0, p14_pct=0)
    assert fs.stationary_loss() == pytest.approx(1 / 3, rel=1e-9)


def _problems(name: str, sets: list[str]) -> str:
    with pytest.raises(ProfileError) as err:
        profiles.load(name, sets)
    return str(err.value)


@pytest.mark.parametrize("sets,expected", [
    (["dealy_ms=5"], ["impairment.dealy_ms", "unknown key", "did you mean delay_ms"]),
    (["delay=5"], ["impairment.delay", "did you mean delay_ms?", "units are part of the name"]),
    (["delay_ms=5ms"], ["impairment.delay_ms", "expected a number, got '5ms'",
                        "unit is in the field name"]),
    (["loss_pct=150"], ["impairment.loss.loss_pct", "less than or equal to 100", "got 150"]),
    (["loss_pct=-1"], ["impairment.loss.loss_pct", "greater than or equal to 0"]),
    (["loss_pct=0", "correlation_pct=20"], ["impairment.loss", "correlation needs loss"]),
    (["delay_ms=-3"], ["impairment.delay_ms", "greater than or equal to 0"]),
    (["match.include=[{protocol: udp, ports: [5100-5000]}]"],
     ["match.include[0].ports[0]", "empty", "5000-5100"]),
    (["match.include=[{protocol: sctp}]"], ["match.include[0].protocol", "'udp' or 'tcp'"]),
    (["reorder_pct=5"], ["reorder_pct needs delay_ms"]),
    (["ecn=true", "impairment.loss=null"], ["ecn needs loss"]),
    (["impairment.loss.p_pct=3"], ["p_pct", "belongs to loss model gilbert_elliott"]),
])
def test_bad_values_name_the_field_path_and_the_fix(sets, expected):
    message = _problems("random-loss", sets)
    assert message.startswith("profile random-loss (")
    for part in expected:
        assert part in message, (part, message)


@pytest.mark.parametrize("loss,expected", [
    ({"model": "gilbert_elliott", "p_pct": 150, "r_pct": 10}, "p_pct"),
    ({"model": "gilbert_elliott", "p_pct": 1, "r_pct": -10}, "r_pct"),
    ({"model": "gilbert_elliott", "p_pct": 1, "r_pct": 10, "loss_in_bad_pct": 101},
     "loss_in_bad_pct"),
    ({"model": "gilbert_elliott", "p_pct": 1}, "give p_pct and r_pct"),
    ({"model": "gilbert_elliott", "loss_pct": 5}, "go together"),
    ({"model": "four_state", "p13_pct": 60, "p14_pct": 60}, "more than 100%"),
])
def test_bad_loss_models(tmp_path, loss, expected):
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"impairment": {"loss": loss}}))
    with pytest.raises(ProfileError, match=expected) as err:
        profiles.load(str(path))
    assert str(path) in str(err.value)


def test_a_file_with_several_problems_reports_all_of_them(tmp_path):
    path = tmp_path / "many.yaml"
    path.write_text("impairment:\n  delay: 10ms\n  jitter_ms: -1\ndirection: sideways\n")
    err = _problems(str(path), [])
    assert "impairment.delay: unknown key" in err
    assert "impairment.jitter_ms: Input should be greater than or equal to 0" in err
    assert "direction: Input should be 'ingress', 'egress' or 'both'" in err


def test_unknown_profile_name_suggests_a_close_one():
    with pytest.raises(UsageError, match="Did you mean random-loss"):
        profiles.load("random_loss")
    with pytest.raises(UsageError, match="not key=value"):
        profiles.load("random-loss", ["loss_pct"])


def test_port_ranges_in_yaml_forms():
    assert PortRange.model_validate("5000-5100").last == 5100
    assert PortRange.model_validate(22).first == 22
    with pytest.raises(ValueError):
        PortRange.model_validate("http")


@pytest.mark.parametrize("override", ["loss_pct=5", "impairment.loss.loss_pct=5",
                                      "p_pct=3", "impairment.loss={model: bernoulli}"])
def test_loss_given_twice_is_refused_not_one_silently_taken(override):
    with pytest.raises(UsageError, match=r"--set.*sets the loss that --loss 0\.1 sets too"):
        profiles.load("random-loss", [override], loss=0.1)
    # each alone, and --loss with what does not set a rate, are fine
    assert profiles.load("random-loss", ["loss_pct=5"]).impairment.loss.loss_pct == 5
    burst = profiles.load("burst-loss", ["mean_burst_packets=4"], loss=0.1)
    assert burst.impairment.loss.stationary_loss() == pytest.approx(0.1)
