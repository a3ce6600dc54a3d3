"""Which packets the many-rank mode delivers (harness/scale/fates.py): each fate's loss rate,
independence per link, bursts where the process has them, and the same answer for the same
seed (#58)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.scale.fates import BernoulliFate, GilbertElliottFate, NoLoss, SeededFate
from harness.transport.dropmask import DropMask
from harness.transport.header import STAGE_BROADCAST, STAGE_REDUCE


def _lost(fate, world=4, steps=300, packets=50):
    """Per link (source -> receiver), the packets lost over the steps, in link order."""
    out = {}
    for step in range(steps):
        for receiver in range(world):
            for stage in (STAGE_REDUCE, STAGE_BROADCAST):
                sends = [0 if s == receiver else packets for s in range(world)]
                for source, arrived in enumerate(fate.arrivals(receiver, step, stage, sends)):
                    assert len(arrived) == sends[source]
                    if source != receiver:
                        out.setdefault((source, receiver), []).extend(~arrived)
    return {link: np.array(v) for link, v in out.items()}


def _mean_burst(lost: np.ndarray) -> float:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], lost.astype(int), [0]])))
    runs = edges[1::2] - edges[::2]
    return float(runs.mean()) if len(runs) else 0.0


@pytest.mark.parametrize("fate", [BernoulliFate(3, 0.1), SeededFate(DropMask(3, 0.1), 4)])
def test_random_loss_is_the_rate_independent_per_link_and_seeded(fate):
    lost = _lost(fate, steps=100 if isinstance(fate, SeededFate) else 300)
    every = np.concatenate(list(lost.values()))
    assert abs(every.mean() - 0.1) < 0.01
    assert all(abs(v.mean() - 0.1) < 0.03 for v in lost.values())
    assert _mean_burst(every) < 1.3                    # no bursts: 1 / (1 - p) = 1.11
    a, b = lost[(0, 1)], lost[(2, 1)]
    assert (a & b).mean() < 0.02                       # two links lose independently (0.01)
    again = type(fate)(3, 0.1) if isinstance(fate, BernoulliFate) else SeededFate(
        DropMask(3, 0.1), 4)
    assert np.array_equal(_lost(again, steps=5)[(0, 1)], _lost(fate, steps=5)[(0, 1)])


def test_gilbert_elliott_loses_its_stationary_rate_in_bursts_per_link():
    fate = GilbertElliottFate(4, p=0.02, r=0.18, h=0.0, k=1.0, seed=5)  # bad: all lost
    assert fate.stationary_loss == pytest.approx(0.1)
    lost = _lost(fate)
    every = np.concatenate(list(lost.values()))
    assert abs(every.mean() - 0.1) < 0.02
    assert 4.0 < _mean_burst(lost[(0, 1)]) < 7.0       # 1 / r = 5.6 packets a burst
    with pytest.raises(ValueError, match="not a probability"):
        GilbertElliottFate(4, p=1.5, r=0.1)


def test_no_loss_delivers_everything():
    assert all(a.all() for a in NoLoss().arrivals(0, 0, STAGE_REDUCE, [0, 5, 5]))
