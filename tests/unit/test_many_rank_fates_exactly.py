"""Each fate of the many-rank mode against a plain re-telling of its process, packet by
packet (harness/scale/fates.py, #71): the Bernoulli draws from the generator seeded by
(seed, receiver, step, stage), the seeded mask with the transport's own identities, the
Gilbert-Elliott chain per link with its state carried from call to call; and the edges of
every rate each fate takes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.scale import fates
from harness.transport.dropmask import DropMask
from harness.transport.header import STAGE_BROADCAST, STAGE_REDUCE, Header
from testbed.errors import UsageError


class _Recording(fates.Fate):
    def __init__(self):
        self.asked = []

    def arrived(self, receiver, source, step, stage, shard, packets):
        self.asked.append((receiver, source, step, stage, shard, packets))
        return np.ones(packets, dtype=bool)


def test_a_stage_asks_for_the_receivers_shard_in_the_reduce_and_the_sources_in_the_broadcast():
    fate = _Recording()
    fate.arrivals(1, 7, STAGE_REDUCE, [2, 0, 3])
    fate.arrivals(1, 7, STAGE_BROADCAST, [2, 0, 3])
    assert fate.asked == [(1, 0, 7, STAGE_REDUCE, 1, 2), (1, 1, 7, STAGE_REDUCE, 1, 0),
                          (1, 2, 7, STAGE_REDUCE, 1, 3), (1, 0, 7, STAGE_BROADCAST, 0, 2),
                          (1, 1, 7, STAGE_BROADCAST, 1, 0), (1, 2, 7, STAGE_BROADCAST, 2, 3)]
    with pytest.raises(NotImplementedError):
        fates.Fate().arrived(0, 1, 0, STAGE_REDUCE, 0, 1)


def test_no_loss_delivers_booleans():
    got = fates.NoLoss().arrivals(0, 0, STAGE_REDUCE, [0, 3])
    assert [a.dtype for a in got] == [np.bool_, np.bool_] and [list(a) for a in got] == [
        [], [True, True, True]]


def test_bernoulli_is_one_seeded_draw_per_receiver_step_and_stage():
    fate = fates.BernoulliFate(11, 0.3)
    sends = [4, 0, 6]
    draws = np.random.default_rng([11, 2, 5, STAGE_BROADCAST]).random((3, 6))
    got = fate.arrivals(2, 5, STAGE_BROADCAST, sends)
    want = [draws[0, :4] >= 0.3, draws[1, :0] >= 0.3, draws[2, :6] >= 0.3]
    assert [list(g) for g in got] == [list(w) for w in want]
    assert fate.arrivals(2, 5, STAGE_BROADCAST, []) == []


def test_bernoulli_takes_a_rate_in_0_to_1():
    assert all(a.all() for a in fates.BernoulliFate(1, 0.0).arrivals(0, 0, 0, [50, 50]))
    for rate in (1.0, 1.5, -0.1, math.nan):
        with pytest.raises(UsageError) as refused:  # the one rule (testbed/checks.py)
            fates.BernoulliFate(1, rate)
        assert (refused.value.field, refused.value.problem) == (
            "the drop rate", f"{rate:g} is not a fraction in [0, 1)")


def test_the_seeded_fate_is_the_transports_mask_on_its_identities():
    world, seed, rate = 3, 7, 0.4
    fate = fates.SeededFate(DropMask(seed, rate), world)
    got = fate.arrivals(1, 9, STAGE_REDUCE, [5, 0, 5]) + fate.arrivals(
        1, 9, STAGE_BROADCAST, [5, 0, 5])
    mask = DropMask(seed, rate).for_receiver(1)

    def kept(source, stage, shard, i):
        return not mask.drops(Header(
            magic=0x4C42, version=9, stage=stage, source=source, nonce=123, step=9, bucket=3,
            shard=shard, fragment=0, fragments=1, index=i, count=5, length=64, psn=1,
            copy=0, dest=1, seq=2, tag=b"x"))

    want = [[kept(s, STAGE_REDUCE, 1, i) for i in range(n)] for s, n in enumerate([5, 0, 5])]
    want += [[kept(s, STAGE_BROADCAST, s, i) for i in range(n)]
             for s, n in enumerate([5, 0, 5])]
    assert [g.dtype for g in got] == [np.bool_] * 6
    assert [list(g) for g in got] == want
    assert sum(not k for w in want for k in w) > 0  # the mask dropped some


def _chain(seed, source, receiver, p, r, h, k, calls):
    """The Gilbert-Elliott process as its docstring tells it, on the link's own generator."""
    rng = np.random.default_rng([seed, source, receiver])
    bad, out = False, []
    for packets in calls:
        if not packets:
            out.append([])
            continue
        draws = rng.random((packets, 2))
        got = []
        for i in range(packets):
            bad = (draws[i, 0] >= r) if bad else (draws[i, 0] < p)
            got.append(bool(draws[i, 1] < (h if bad else k)))
        out.append(got)
    return out


def test_gilbert_elliott_is_its_chain_per_link_carried_across_calls():
    p, r, h, k = 0.2, 0.3, 0.1, 0.95
    fate = fates.GilbertElliottFate(3, p, r, h, k, seed=4)
    calls = [6, 0, 9, 4]
    for source, receiver in ((0, 1), (2, 1), (1, 0)):
        got = [fate.arrived(receiver, source, step, STAGE_REDUCE, receiver, n)
               for step, n in enumerate(calls)]
        assert [g.dtype for g in got] == [np.bool_] * 4
        assert [list(g) for g in got] == _chain(4, source, receiver, p, r, h, k, calls)
    # the defaults: seed 0, no loss in good (k = 1), all lost in bad (h = 0)
    plain = fates.GilbertElliottFate(2, p, r)
    assert list(plain.arrived(1, 0, 0, STAGE_REDUCE, 1, 30)) == _chain(0, 0, 1, p, r, 0.0, 1.0,
                                                                       [30])[0]
    again = fates.GilbertElliottFate(3, p, r, h, k, seed=4)
    assert list(again.arrived(1, 0, 0, STAGE_REDUCE, 1, 6)) == _chain(4, 0, 1, p, r, h, k,
                                                                      [6])[0]


def test_gilbert_elliott_starts_good_and_stays_where_its_rates_keep_it():
    never_bad = fates.GilbertElliottFate(2, p=0.0, r=0.0, h=0.0, k=1.0)
    assert never_bad.arrived(1, 0, 0, STAGE_REDUCE, 1, 40).all()
    stuck_bad = fates.GilbertElliottFate(2, p=1.0, r=0.0, h=0.0, k=1.0)
    assert not stuck_bad.arrived(1, 0, 0, STAGE_REDUCE, 1, 40).any()
    assert not stuck_bad.arrived(1, 0, 1, STAGE_REDUCE, 1, 40).any()


@pytest.mark.parametrize("name", ["p", "r", "h", "k"])
def test_gilbert_elliott_refuses_a_rate_that_is_not_a_probability(name):
    for value in (-0.1, 1.5):
        rates = {"p": 0.1, "r": 0.5, "h": 0.0, "k": 1.0, name: value}
        with pytest.raises(ValueError) as refused:
            fates.GilbertElliottFate(2, **rates)
        assert str(refused.value) == f"Gilbert-Elliott {name}={value} is not a probability"
    fates.GilbertElliottFate(2, **{"p": 0.1, "r": 0.5, "h": 0.0, "k": 1.0, name: 0.0})
    fates.GilbertElliottFate(2, **{"p": 0.1, "r": 0.5, "h": 0.0, "k": 1.0, name: 1.0})


def test_the_stationary_loss():
    assert fates.GilbertElliottFate(2, 0.1, 0.3, 0.2, 0.9).stationary_loss == pytest.approx(
        0.25 * 0.8 + 0.75 * 0.1)
    assert fates.GilbertElliottFate(2, 0.0, 0.0, 0.2, 0.9).stationary_loss == pytest.approx(
        0.1)
