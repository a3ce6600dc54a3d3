"""End markers end a lossy stage as soon as every source has said it sent everything: under
loss a step takes the time of its packets, not its deadline, and computes the same result.

Two ranks on loopback (127.0.0.1 only) lose 20% of their datagrams, end markers included, to
a seeded drop mask at the receiver: the same positions are lost in every run."""

from __future__ import annotations

import threading

import numpy as np
import torch

from harness.collectives.deadline import Deadline
from harness.collectives.lossy import LossyCollective
from harness.transport.dropmask import DropMask
from tests.unit.test_transport_hostile import make_pair

DEADLINE_S = 0.5  # floor = ceiling: a stage that waits for its deadline waits exactly this


def run(end_copies: int, steps: int, seed: int = 11):
    store, transports = make_pair(drop_mask=DropMask(seed, 0.2))
    results, stats = [], []
    try:
        collectives = [LossyCollective(t, store, end_copies=end_copies,
                                       deadline=Deadline(floor_s=DEADLINE_S,
                                                         ceiling_s=DEADLINE_S))
                       for t in transports]
        for step in range(steps):
            xs = [torch.from_numpy(np.random.default_rng(step * 2 + k).standard_normal(
                20_000).astype(np.float32)) for k in (0, 1)]
            out = [None, None]
            threads = [threading.Thread(target=rank_step, args=(collectives, k, xs[k], out))
                       for k in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            results.append(xs)
            stats.append(out)
        counters = [t.counters.to_dict() for t in transports]
    finally:
        for t in transports:
            t.close()
    return results, stats, counters


def rank_step(collectives, k, x, out):
    out[k] = collectives[k].allreduce(x)


def test_under_loss_end_markers_end_stages_long_before_the_deadline():
    results, stats, counters = run(end_copies=4, steps=3)
    missing = sum(s.reduce_missing + s.broadcast_missing for step in stats for s in step)
    assert missing > 0  # packets were lost in these steps ...
    for step in stats:
        for s in step:  # ... yet no stage waited for its deadline
            assert not s.reduce_deadline_hit and not s.broadcast_deadline_hit, s
            assert s.seconds < DEADLINE_S / 2, s
    # 3 steps x 2 stages x 4 copies to the one peer; the mask lost some of those received
    assert all(c["ends_sent"] == 24 for c in counters), counters
    assert all(0 < c["ends_received"] <= 24 for c in counters), counters
    assert all(c["late"] == 0 for c in counters), counters  # nothing came after its stage


def test_without_end_markers_the_same_loss_waits_out_the_deadline_for_the_same_result():
    with_markers, _, _ = run(end_copies=4, steps=1)
    without, stats, counters = run(end_copies=0, steps=1)
    # the mask lost the same data packets: the rebuilt means are identical, bit for bit
    for a, b in zip(with_markers[0], without[0], strict=True):
        assert torch.equal(a, b)
    assert any(s.reduce_deadline_hit or s.broadcast_deadline_hit for s in stats[0])
    assert max(s.seconds for s in stats[0]) >= DEADLINE_S
    assert all(c["ends_sent"] == 0 for c in counters)
