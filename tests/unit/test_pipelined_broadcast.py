"""The two stages pipelined (#67, part 2; harness/collectives/pipeline.py): an owner
broadcasts the packets of its shard that every peer has delivered while the rest of its
reduce stage still comes. What it must not change: the result, to the bit, at no loss and
under a seeded loss; where it cannot hold, it is off. Ranks are threads on loopback."""

from __future__ import annotations

import time

import numpy as np
import pytest

from harness.collectives.lossy import LossyCollective
from harness.reproduce.loopback import on_every_rank, transports
from harness.transport import header as hdr
from harness.transport.dropmask import DropMask
from harness.transport.semantics import Semantics
from harness.transport.verdicts import APPLIED, END
from tests.unit.test_transport_hostile import make_pair

NUMEL = 3 * 40 * 365 + 17  # 3 shards of ~40 packets at MTU 1500, the last ones short


def run(world: int, estimator: str, pipelined: bool, drop: float, steps: int = 3):
    """Every rank's results of `steps` all-reduces of seeded values, and how many packets
    each rank broadcast before its reduce stage ended."""
    mask = DropMask(11, drop) if drop else None
    with transports(world, drop_mask=mask, segmentation=True) as (store, made):
        collectives = [LossyCollective(t, store, estimator=estimator, pipelined=pipelined)
                       for t in made]
        results = []
        for step in range(steps):
            # eighths: their float32 sums are exact, so the order packets arrive in (a
            # thread's timing) cannot round them apart
            xs = [(np.random.default_rng((step, r)).integers(-4000, 4000, NUMEL) / 8)
                  .astype(np.float32) for r in range(world)]
            on_every_rank(world, lambda r, xs=xs: collectives[r].allreduce(xs[r]))
            results.append(xs)
        for c in collectives:
            c.finish()
        early = [c.totals["broadcast_early_packets"] for c in collectives]
        missing = [t.counters.missing for t in made]
        return results, early, missing


@pytest.mark.parametrize("estimator", ["zero_fill", "received_mean"])
@pytest.mark.parametrize("drop", [0.0, 0.1])
def test_the_pipelined_broadcast_gives_the_same_result_to_the_bit(estimator, drop):
    """3 ranks: every rank's result of every step is the unpipelined run's, bit for bit.
    Under a seeded 10% loss the same packets are lost in both (the mask draws on a packet's
    identity, which the pipeline keeps), so the same slots keep a rank's own value."""
    before, early_before, missing_before = run(3, estimator, pipelined=False, drop=drop)
    after, early_after, missing_after = run(3, estimator, pipelined=True, drop=drop)
    assert early_before == [0, 0, 0]
    assert sum(early_after) > 0  # whole packets did go out during the reduce stage
    assert missing_after == missing_before
    if drop:
        assert sum(missing_after) > 0
    for step_before, step_after in zip(before, after, strict=True):
        for a, b in zip(step_before, step_after, strict=True):
            assert a.tobytes() == b.tobytes()


def test_it_is_off_where_a_value_could_change():
    """rescale's estimate of a whole packet depends on the loss rate this very stage is
    changing; one lossy stage sends the other over torch.distributed; UC over UDP cuts
    packets into fragments; RC's go-back-N sends by runs."""
    with transports(2) as (store, made):
        t = made[0]
        assert LossyCollective(t, store).pipelined
        assert not LossyCollective(t, store, pipelined=False).pipelined
        assert not LossyCollective(t, store, estimator="rescale").pipelined
        assert not LossyCollective(t, store, lossy_stage="reduce").pipelined
    for semantics, pipelined in (("roce-ud", True), ("roce-uc", False), ("roce-rc", False)):
        store, pair = make_pair(semantics=Semantics.parse(semantics))
        try:
            assert LossyCollective(pair[0], store).pipelined is pipelined, semantics
        finally:
            for t in pair:
                t.close()


def test_parameter_mode_is_never_pipelined():
    """The owner's optimizer steps its whole shard once (sharded_update): nothing of the
    shard may leave before it has."""
    import torch

    with transports(2, segmentation=True) as (store, made):
        collectives = [LossyCollective(t, store) for t in made]
        grads = [torch.ones(NUMEL) * (r + 1) for r in range(2)]
        params = [torch.zeros(NUMEL) for _ in range(2)]

        def step_fn(r):
            def apply(start, end, mean_grad):
                params[r][start:end] -= mean_grad
            return apply

        on_every_rank(2, lambda r: collectives[r].sharded_update(grads[r], params[r],
                                                                 step_fn(r)))
        assert [c.totals["broadcast_early_packets"] for c in collectives] == [0, 0]
        assert all(bool((p == -1.5).all()) for p in params)


def test_a_send_by_index_says_each_packets_index_and_the_shards_count():
    """The compiled sender's indexes: packet i says indexes[i] of `count`; end markers may
    follow no packet; indexes that do not fit are refused by name."""
    store, (rx, tx) = make_pair()
    try:
        per = tx.per_packet
        x = (np.arange(10 * per) // per).astype(np.float32)  # packet k holds the value k
        indexes = np.array([1, 4, 7], np.int64)
        starts, ends = indexes * per, indexes * per + per
        tx.send_packets(0, hdr.STAGE_BROADCAST, 0, 0, 1, x, starts, ends, indexes=indexes,
                        count=10)
        tx.send_packets(0, hdr.STAGE_BROADCAST, 0, 0, 1, x, starts[:0], ends[:0], 2,
                        indexes=indexes[:0], count=10)
        seen, ends_seen = [], []

        def handle(head, payload):
            if head.stage == hdr.STAGE_BROADCAST_END:
                ends_seen.append((head.index, head.count))
                return END
            values = np.frombuffer(payload, np.float32)
            seen.append((head.index, head.count, bool((values == head.index).all())))
            return APPLIED

        rx.receive_until(time.monotonic() + 10, lambda: len(ends_seen) == 2, handle)
        assert seen == [(1, 10, True), (4, 10, True), (7, 10, True)]
        assert ends_seen == [(10, 10), (10, 10)]
        for bad in (indexes[:2], np.array([1, -1, 7], np.int64),
                    np.array([1, 2**32, 7], np.int64)):
            with pytest.raises(ValueError, match="indexes"):
                tx.send_packets(0, hdr.STAGE_BROADCAST, 0, 0, 1, x, starts, ends,
                                indexes=bad, count=10)
    finally:
        rx.close()
        tx.close()
