"""The seeded drop mask: the same seed drops the same packet positions in every variant."""

from __future__ import annotations

import threading

import numpy as np
import torch

from harness.collectives.lossy import LossyCollective
from harness.transport.dropmask import DropMask
from harness.transport.semantics import Semantics
from tests.unit.test_transport_hostile import make_pair


def run_variant(estimator: str, seed: int, semantics: str = "udp", steps: int = 4,
                data_seed: int = 0, key: bytes | None = None, before_step=None):
    """(how many, which) datagrams each rank's mask dropped, over `steps` all-reduces of
    random values drawn from `data_seed`. key: the job key of both transports;
    before_step(transports, step) runs before each all-reduce."""
    store, transports = make_pair(semantics=Semantics.parse(semantics),
                                  drop_mask=DropMask(seed, 0.2), key=key)
    try:
        collectives = [LossyCollective(t, store, estimator=estimator) for t in transports]
        for step in range(steps):
            if before_step is not None:
                before_step(transports, step)
            xs = [torch.from_numpy(np.random.default_rng(
                (data_seed, step * 2 + k)).standard_normal(20_000).astype(np.float32))
                for k in (0, 1)]
            threads = [threading.Thread(target=c.allreduce, args=(x,))
                       for c, x in zip(collectives, xs, strict=True)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        return [(t.drop_mask.dropped_count, t.drop_mask.dropped_digest) for t in transports]
    finally:
        for t in transports:
            t.close()


def test_same_seed_drops_the_same_positions_in_two_variants():
    a = run_variant("zero_fill", seed=7)
    b = run_variant("received_mean", seed=7)
    assert a == b
    dropped = sum(count for count, _ in a)
    # 4 steps x 2 ranks x (28 reduce + 28 broadcast packets + 2 x 8 end markers received)
    # = 576 datagrams at 20%: 115 expected, sd 9.6; the bounds are 4 sd.
    assert 77 < dropped < 154
    assert run_variant("zero_fill", seed=8) != a  # another seed, another pattern


def test_mask_is_independent_of_the_payload():
    """The same collective over other values (another payload in every datagram) loses
    exactly the same positions."""
    a = run_variant("received_mean", seed=7, data_seed=0)
    b = run_variant("received_mean", seed=7, data_seed=1)
    assert a == b and sum(count for count, _ in a) > 0


def test_a_copy_gets_the_verdict_of_its_original_and_a_retransmission_a_new_draw():
    """The verdict is a function of the packet's identity: a duplicate or a replayed copy
    (same identity) is dropped exactly when the original was, and counted once; an RC
    retransmission (copy + 1) is a new draw, or a dropped packet would be lost forever."""
    from harness.transport import header as hdr

    def transmission(copy: int):
        return hdr.unpack(hdr.pack(0, 1, 99, 5, 0, 2, 3, 10, 8, copy=copy) + bytes(8))

    mask = DropMask(3, 0.5)
    first = [mask.drops(transmission(k)) for k in range(40)]
    assert 5 < sum(first) < 35  # 40 fair draws: outside this about once in 700,000
    assert [mask.drops(transmission(k)) for k in range(40)] == first  # copies again
    assert mask.dropped_count == sum(first)


def test_receivers_of_one_broadcast_packet_lose_it_independently():
    """An owner's broadcast packet has one identity at every receiver. A mask that ignored
    the receiver dropped it at all of them at once: every replica missed the same packets,
    which is not independent loss per link (what netem does, and what both papers assume).
    Two receivers with the same seed must agree only as often as independent draws do."""
    from harness.transport import header as hdr

    def broadcast_packet(index: int):
        return hdr.unpack(hdr.pack(hdr.STAGE_BROADCAST, 0, 99, 5, 0, 0, index, 10, 8)
                          + bytes(8))

    rate, packets = 0.5, 2000
    masks = [DropMask(11, rate, receiver=r) for r in (1, 2)]
    verdicts = np.array([[m.drops(broadcast_packet(i)) for i in range(packets)]
                         for m in masks])
    agree = float((verdicts[0] == verdicts[1]).mean())
    # independent draws agree with probability p^2 + (1-p)^2 = 0.5 (sd 0.011 over 2000)
    assert abs(agree - 0.5) < 0.05, agree
    # and each receiver replays its own verdicts: the mask is still a function of identity
    again = DropMask(11, rate, receiver=1)
    assert [again.drops(broadcast_packet(i)) for i in range(packets)] == verdicts[0].tolist()
