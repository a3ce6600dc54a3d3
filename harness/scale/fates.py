"""Which packets of the many-rank mode arrive: a Fate answers, per receiver, source, step,
stage and shard, a boolean per packet.

    BernoulliFate(seed, rate)          random loss, drawn a stage at a time (fast)
    SeededFate(DropMask(seed, rate))   the transport's own seeded mask (dropmask.py): the
                                       same identities, so the same seed drops the same
                                       packets as a run over the UDP transport with
                                       LOSSBED_DROP_MASK=SEED:RATE (what the replay test
                                       holds the two to)
    GilbertElliottFate(p, r, ...)      bursty loss per link (source -> receiver), the
                                       profile's Gilbert-Elliott process drawn per packet
                                       in the order a link carries them
    NoLoss()                           every packet arrives (the lossless references)
"""

from __future__ import annotations

import numpy as np

from harness.transport.dropmask import DropMask
from harness.transport.header import STAGE_REDUCE, Header
from testbed import checks


class Fate:
    """arrivals(receiver, step, stage, sends): for each source s, a boolean per packet of
    the sends[s] it sends this receiver in that stage (0: none). A stage's packets of source
    s are those of one shard: the receiver's own in the reduce, the source's in the
    broadcast."""

    def arrivals(self, receiver: int, step: int, stage: int,
                 sends: list[int]) -> list[np.ndarray]:
        return [self.arrived(receiver, s, step, stage,
                             receiver if stage == STAGE_REDUCE else s, n)
                for s, n in enumerate(sends)]

    def arrived(self, receiver: int, source: int, step: int, stage: int, shard: int,
                packets: int) -> np.ndarray:
        raise NotImplementedError


class NoLoss(Fate):
    def arrivals(self, receiver, step, stage, sends):
        return [np.ones(n, dtype=bool) for n in sends]


class BernoulliFate(Fate):
    """Each packet lost with probability `rate`, independently per link and packet: one
    draw per receiver, step and stage from a generator seeded by them (the same seed drops
    the same packets in every variant that sends them). The fast fate of the many-rank mode;
    SeededFate gives the transport's own identities instead."""

    def __init__(self, seed: int, rate: float):
        checks.loss_fraction("the drop rate", rate)  # (the one rule of a loss fraction)
        self.seed, self.rate = seed, rate

    def arrivals(self, receiver, step, stage, sends):
        most = max(sends, default=0)
        draws = np.random.default_rng([self.seed, receiver, step, stage]).random(
            (len(sends), most))
        return [draws[s, :n] >= self.rate for s, n in enumerate(sends)]


class SeededFate(Fate):
    """The receivers' seeded drop mask: packet i of a (source, step, stage, shard) has the
    identity the UDP transport gives it (fragment 0, first copy). Each receiver keeps its own
    copy of the mask (its counts are its own), as each transport does."""

    def __init__(self, mask: DropMask, world: int):
        self.masks = [mask.for_receiver(r) for r in range(world)]

    def arrived(self, receiver: int, source: int, step: int, stage: int, shard: int,
                packets: int) -> np.ndarray:
        mask = self.masks[receiver]
        return np.array([not mask.drops(_identity(source, step, stage, shard, i))
                         for i in range(packets)], dtype=bool)


class GilbertElliottFate(Fate):
    """Gilbert-Elliott loss on every link (source -> receiver) of its own: good -> bad with
    probability p, bad -> good with r, a packet lost with 1 - k in good and 1 - h in bad
    (netem's `loss gemodel p r 1-h 1-k`), drawn packet by packet in the order the link
    carries them (a step's reduce, then its broadcast). Seeded per link."""

    def __init__(self, world: int, p: float, r: float, h: float = 0.0, k: float = 1.0,
                 seed: int = 0):
        for name, v in (("p", p), ("r", r), ("h", h), ("k", k)):
            if not 0 <= v <= 1:
                raise ValueError(f"Gilbert-Elliott {name}={v} is not a probability")
        self.p, self.r, self.h, self.k = p, r, h, k
        self.rngs = {(s, d): np.random.default_rng([seed, s, d]) for s in range(world)
                     for d in range(world) if s != d}
        self.bad = dict.fromkeys(self.rngs, False)

    def arrived(self, receiver: int, source: int, step: int, stage: int, shard: int,
                packets: int) -> np.ndarray:
        if not packets:
            return np.ones(0, dtype=bool)
        link = (source, receiver)
        rng, bad = self.rngs[link], self.bad[link]
        draws = rng.random((packets, 2))
        out = np.empty(packets, dtype=bool)
        for i in range(packets):
            bad = (draws[i, 0] >= self.r) if bad else (draws[i, 0] < self.p)
            out[i] = draws[i, 1] < (self.h if bad else self.k)
        self.bad[link] = bad
        return out

    @property
    def stationary_loss(self) -> float:
        """The long-run fraction lost: π_bad (1 - h) + π_good (1 - k)."""
        if self.p + self.r == 0:
            return 1 - self.k
        bad = self.p / (self.p + self.r)
        return bad * (1 - self.h) + (1 - bad) * (1 - self.k)


def _identity(source: int, step: int, stage: int, shard: int, index: int) -> Header:
    """The header fields DropMask.position reads, the rest zero."""
    return Header(magic=0, version=0, stage=stage, source=source, nonce=0, step=step, bucket=0,
                  shard=shard, fragment=0, fragments=1, index=index, count=0, length=0, psn=0,
                  copy=0, dest=0, seq=0, tag=b"")
