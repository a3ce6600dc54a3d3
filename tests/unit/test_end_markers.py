"""End markers end a lossy stage as soon as every source has said it sent everything: under
loss a step takes the time of its packets, not its deadline, and computes the same result.

Two ranks on loopback (127.0.0.1 only) lose 20% of their datagrams, end markers included, to
a seeded drop mask at the receiver: the same positions are lost in every run."""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from harness.collectives.deadline import Deadline
from harness.collectives.end_markers import END_COPIES, LATE_END_COPIES
from harness.collectives.lossy import LossyCollective
from harness.transport import header as hdr
from harness.transport.dropmask import DropMask
from tests.unit.test_transport_hostile import make_pair

# floor = ceiling: a stage that waits for its deadline waits exactly this. 2 s, not 0.5: in
# a full suite on 2 cores the run without markers once rebuilt other means than the run
# with them, most likely a rank held back past 0.5 s, its packets late (late is lost)
# (1 failure in the suite of 2026-12-03; alone it passed 5 of 5)
DEADLINE_S = 2.0


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
            results.append(xs)
            stats.append(step_both(collectives, xs))
        for c in collectives:
            c.finish()  # (the last step's timed late markers)
        counters = [t.counters.to_dict() for t in transports]
    finally:
        for t in transports:
            t.close()
    return results, stats, counters


def step_both(collectives, xs) -> list:
    """One all-reduce step of both ranks, each in its own thread; their StepStats."""
    out = [None, None]

    def rank_step(k):
        out[k] = collectives[k].allreduce(xs[k])

    threads = [threading.Thread(target=rank_step, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_under_loss_end_markers_end_stages_long_before_the_deadline():
    results, stats, counters = run(end_copies=4, steps=3)
    missing = sum(s.reduce_missing + s.broadcast_missing for step in stats for s in step)
    assert missing > 0  # packets were lost in these steps ...
    for step in stats:
        for s in step:  # ... yet no stage waited for its deadline
            assert not s.reduce_deadline_hit and not s.broadcast_deadline_hit, s
            assert s.seconds < DEADLINE_S / 2, s
    # 3 steps x (2 stages x 4 copies + twice 4 late copies of the broadcast's) to the one
    # peer; the mask lost some of those received
    assert all(c["ends_sent"] == 48 for c in counters), counters
    assert all(0 < c["ends_received"] <= 48 for c in counters), counters
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


def test_copies_of_an_end_marker_in_one_batch_get_the_verdict_of_the_first():
    """The batched receiver judges one copy of each marker and counts the others alike:
    3 copies of a marker the collective takes, 2 of one it finds misfit, 2 foreign."""
    from collections import Counter

    from harness.transport import header as hdr
    from harness.transport.verdicts import END, MALFORMED

    store, (rx, tx) = make_pair()
    try:
        def marker(count: int, nonce: int) -> bytes:
            return hdr.pack(hdr.STAGE_REDUCE_END, 1, nonce, 0, 0, 0, count, count, 0)

        good, misfit = marker(5, rx.nonce), marker(6, rx.nonce)
        foreign = marker(5, rx.nonce ^ 1)
        for datagram in [good] * 3 + [misfit] * 2 + [foreign] * 2:
            tx.sock.sendto(datagram, rx.endpoints[0])
        judged = []

        def handle(head, payload):
            judged.append(head.count)
            return END if head.count == 5 else MALFORMED

        rx.receive_until(time.monotonic() + 0.5, lambda: False, handle,
                         lambda data, rows: Counter())
        assert sorted(judged) == [5, 6]  # one look at each distinct marker
        c = rx.counters
        assert (c.ends_received, c.malformed, c.foreign) == (3, 2, 2)
    finally:
        rx.close()
        tx.close()


EVERY_COPY = 1 << 16  # (copy numbers are 16 bits)


def tail_burst(stage: int, copies_lost: int = END_COPIES):
    """A drop mask that loses, in step 0, rank 1's last packet of `stage` to rank 0 and its
    end markers numbered below `copies_lost` (END_COPIES: those sent right after it): a
    burst that takes the tail of a stream."""

    class TailBurst(DropMask):
        def drops(self, head):
            if head.source != 1 or head.step != 0:
                return False
            if head.stage == stage:
                return head.index == head.count - 1
            return head.stage == hdr.END_OF[stage] and head.copy < copies_lost

    return TailBurst(0, 0.0)


def one_step_with(mask):
    store, transports = make_pair(drop_mask=mask)
    try:
        collectives = [LossyCollective(t, store, deadline=Deadline(floor_s=DEADLINE_S,
                                                                   ceiling_s=DEADLINE_S))
                       for t in transports]
        return step_both(collectives, [torch.ones(20_000) * (k + 1) for k in (0, 1)])[0]
    finally:
        for t in transports:
            t.close()


def test_a_lost_reduce_tail_ends_when_its_source_broadcasts():
    """All end markers of rank 1's reduce packets are lost with its last packet; rank 1's
    broadcast, which it sends only after all its reduce packets, tells rank 0 the same."""
    stats = one_step_with(tail_burst(hdr.STAGE_REDUCE))
    assert stats.reduce_missing == 1
    assert not stats.reduce_deadline_hit and stats.seconds < DEADLINE_S / 2, stats


def test_a_lost_broadcast_tail_ends_with_the_late_end_markers():
    """All end markers right after rank 1's broadcast are lost with its last packet; the
    copies rank 1 sends again later end rank 0's wait."""
    stats = one_step_with(tail_burst(hdr.STAGE_BROADCAST))
    assert stats.broadcast_missing == 1
    assert not stats.broadcast_deadline_hit and stats.seconds < DEADLINE_S / 2, stats


def test_late_end_markers_are_new_transmissions_not_replays():
    """The broadcast's late end markers are numbered after its first ones, the timed ones
    after those (0-7, 8-11, 12-15). Numbered alike, a drop mask (which gives a copy its
    original's verdict) lost them exactly where it had lost the first ones, so they never
    ended a wait: with seed 11 at 20%, all four of a step's broadcast markers to rank 0 were
    lost, and its late ones with them."""
    received = []

    class Logging(DropMask):
        def drops(self, head):
            if head.stage == hdr.STAGE_BROADCAST_END:
                received.append(head.copy)
            return super().drops(head)

    store, transports = make_pair(drop_mask=Logging(11, 0.0))
    try:
        collectives = [LossyCollective(t, store) for t in transports]
        step_both(collectives, [torch.ones(20_000) * (k + 1) for k in (0, 1)])
        for c in collectives:
            c.finish()  # (the timed late copies, sent from the next step or here)
        time.sleep(0.2)
        for t in transports:  # (what came after the step: read, then dropped as stale)
            t.receive_until(time.monotonic() + 0.1, lambda: False, lambda h, p: "stale")
    finally:
        for t in transports:
            t.close()
    assert sorted(set(received)) == list(range(END_COPIES + 2 * LATE_END_COPIES)), received


def test_a_burst_that_outlasts_the_sources_step_ends_with_the_timed_late_markers():
    """A burst on rank 1's path to rank 0 takes the tail of its step-0 broadcast, the end
    markers right after it and the late copies rank 1 sends as it leaves the step (its own
    broadcast stage ended at once: it had everything). The copies rank 1 sends
    LATE_END_AFTER_S after its broadcast, from its next step, end rank 0's wait. Before,
    the late copies went only as rank 1 left its step, inside the burst, and rank 0 waited
    out its deadline (under `collective-bench`'s 10% burst loss: 27 of 400 rank-steps, a
    p99 of 135-241 ms on a p50 of 15)."""
    from harness.collectives.end_markers import LATE_END_AFTER_S
    from harness.reproduce.loopback import on_every_rank

    store, transports = make_pair(
        drop_mask=tail_burst(hdr.STAGE_BROADCAST, END_COPIES + LATE_END_COPIES))
    try:
        def work(rank):
            collective = LossyCollective(transports[rank], store, align_every=0,
                                         deadline=Deadline(floor_s=DEADLINE_S,
                                                           ceiling_s=DEADLINE_S))
            return [collective.allreduce(torch.ones(20_000) * (rank + 1)) for _ in range(3)]

        stats = on_every_rank(2, work)
    finally:
        for t in transports:
            t.close()
    first = stats[0][0]
    assert first.broadcast_missing == 1, first
    assert not first.broadcast_deadline_hit, first
    assert LATE_END_AFTER_S <= first.seconds < DEADLINE_S / 2, first


def test_a_broadcast_whose_every_marker_is_lost_costs_its_own_budget_only():
    """Rank 1's broadcast tail and every end marker of it, the late copies too, are lost to
    rank 0: rank 0's broadcast stage ends at its deadline. That deadline is the broadcast's
    own budget (FLOOR_S here). Before, it also carried what the reduce stage had left of
    its budget, for an owner still in its reduce, which waits for it as a silent source
    now: a lost tail cost twice FLOOR_S (under `collective-bench`'s 10% burst loss,
    broadcast budgets of 45-300 ms on a p50 of 15)."""
    FLOOR_S = 1.0

    store, transports = make_pair(drop_mask=tail_burst(hdr.STAGE_BROADCAST, EVERY_COPY))
    try:
        collectives = [LossyCollective(t, store, deadline=Deadline(floor_s=FLOOR_S,
                                                                   ceiling_s=2 * FLOOR_S))
                       for t in transports]
        stats = step_both(collectives, [torch.ones(20_000) * (k + 1) for k in (0, 1)])[0]
    finally:
        for t in transports:
            t.close()
    assert stats.broadcast_missing == 1 and stats.broadcast_deadline_hit, stats
    assert FLOOR_S <= stats.seconds < 1.6 * FLOOR_S, stats


def test_a_rank_computing_between_steps_still_sends_its_timed_late_markers_on_time():
    """As above, but rank 1 computes between its steps (here: sleeps 1.5 s), as a training
    rank does its forward and backward pass. The timed late markers fall due LATE_END_AFTER_S
    after its broadcast, while it computes: its collective's background sender sends them
    then, and rank 0's wait ends with them. Before, they went only when rank 1 came to its
    next step, after the compute, and rank 0 waited out its deadline (1 s here)."""
    from harness.collectives.end_markers import LATE_END_AFTER_S
    from harness.reproduce.loopback import on_every_rank

    FLOOR_S, COMPUTE_S = 1.0, 1.5
    store, transports = make_pair(
        drop_mask=tail_burst(hdr.STAGE_BROADCAST, END_COPIES + LATE_END_COPIES))
    try:
        def work(rank):
            collective = LossyCollective(transports[rank], store, align_every=0,
                                         background_late_ends=True,
                                         deadline=Deadline(floor_s=FLOOR_S,
                                                           ceiling_s=FLOOR_S))
            stats = []
            for _ in range(2):
                stats.append(collective.allreduce(torch.ones(20_000) * (rank + 1)))
                if rank == 1:
                    time.sleep(COMPUTE_S)
            collective.finish()
            return stats, collective

        results = on_every_rank(2, work)
        ends_sent = transports[1].counters.ends_sent
    finally:
        for t in transports:
            t.close()
    first = results[0][0][0]
    assert first.broadcast_missing == 1, first
    assert not first.broadcast_deadline_hit, first
    assert LATE_END_AFTER_S <= first.seconds < FLOOR_S / 2, first
    # 2 steps x (2 stages x 8 + twice 4 late) to the one peer: each set sent once, by
    # whichever of the step or the background sender came first
    assert ends_sent == 2 * (2 * END_COPIES + 2 * LATE_END_COPIES), ends_sent
    # finish() stopped the background sender
    assert not results[1][1].background_sender_alive


def test_the_background_sender_sends_nothing_once_the_transport_closed(monkeypatch):
    """A background sender left running (a rank that failed before finish()) must not send
    on a closed socket: its descriptor number may be another socket's by then, here one
    bound where rank 0's datagrams to rank 1 go. The timed set is made due 0.3 s after the
    broadcast, so it is still to go at the close."""
    import os
    import socket

    from harness.collectives import end_markers

    monkeypatch.setattr(end_markers, "LATE_END_AFTER_S", 0.3)
    store, transports = make_pair()
    try:
        collectives = [LossyCollective(t, store, background_late_ends=True)
                       for t in transports]
        step_both(collectives, [torch.ones(20_000) * (k + 1) for k in (0, 1)])
        descriptor, peer = transports[0].sock.fileno(), transports[0].endpoints[1]
    finally:
        for t in transports:
            t.close()
    # 2 stages x 8 markers and the first late set of 4 went; the timed set had not
    sent = [t.counters.ends_sent for t in transports]
    assert sent == [2 * END_COPIES + LATE_END_COPIES] * 2, sent
    # rank 0's old descriptor number now names a socket at rank 1's old endpoint
    reused = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    reused.bind(peer)
    reused.setblocking(False)
    duplicated = reused.fileno() != descriptor  # (it usually takes the lowest free one)
    if duplicated:
        try:
            os.fstat(descriptor)
            raise AssertionError(f"descriptor {descriptor} taken by something else")
        except OSError:
            os.dup2(reused.fileno(), descriptor)
    try:
        time.sleep(0.5)  # (the timed set fell due after the close)
        for c in collectives:
            c.finish()  # on a closed transport: stops the sender, sends nothing, raises nothing
            assert not c.background_sender_alive
        try:
            got = reused.recv(65536)
        except BlockingIOError:
            got = None
    finally:
        if duplicated:
            os.close(descriptor)
        reused.close()
    assert got is None, "a datagram went out on the closed transport's descriptor"
    assert [t.counters.ends_sent for t in transports] == sent


def test_a_failing_background_sender_is_raised_at_the_ranks_next_step(monkeypatch):
    """A send that fails in the background sender (here: the kernel refuses it) is not
    lost in its thread: the rank's next step, or finish(), raises it, naming it."""
    import pytest

    from harness.collectives import end_markers

    monkeypatch.setattr(end_markers, "LATE_END_AFTER_S", 0.3)  # (the timed set still to go ...)
    store, transports = make_pair()
    try:
        collectives = [LossyCollective(t, store, background_late_ends=True)
                       for t in transports]
        step_both(collectives, [torch.ones(20_000) * (k + 1) for k in (0, 1)])

        def refused(*args, **kwargs):
            raise OSError("sendmmsg: No buffer space available")

        monkeypatch.setattr(transports[0], "send_end", refused)  # (... when sends fail)
        time.sleep(0.5)  # the background sender tried it
        assert not collectives[0].background_sender_alive
        with pytest.raises(RuntimeError, match="background sender of late end markers "
                                               "failed: sendmmsg: No buffer space"):
            collectives[0].allreduce(torch.ones(20_000))
        collectives[0].finish()  # (raised once: nothing more to say)
        collectives[1].finish()
    finally:
        for t in transports:
            t.close()
