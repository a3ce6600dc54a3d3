"""Hostile input costs bounded state, and every refused datagram is counted under its
reason: message sizes, reassembly state, RC acknowledgements, the drop mask on control
datagrams, and packets kept for a coming step. Loopback ranks only (127.0.0.1).

Each test fails on the code before these bounds (named in its docstring)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from harness.collectives.lossy import LossyCollective
from harness.reproduce.loopback import on_every_rank
from harness.transport import header as hdr
from harness.transport.dropmask import DropMask
from harness.transport.semantics import MAX_MESSAGE_BYTES, Semantics
from testbed.errors import UsageError
from tests.unit.test_transport_hostile import make_pair


def test_a_message_size_is_bounded():
    """Before: roce-uc:BYTES took any size, and a receiver reassembled messages of it."""
    assert Semantics.parse(f"roce-uc:{MAX_MESSAGE_BYTES}").message_bytes == MAX_MESSAGE_BYTES
    with pytest.raises(UsageError, match="--transport.*over the"):
        Semantics.parse(f"roce-uc:{MAX_MESSAGE_BYTES + 4}")


def wait_for(condition, seconds: float = 3.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_an_ack_beyond_what_was_sent_is_refused_and_counted():
    """RC: an ACK for psn 10**6 when nothing was sent acknowledges what never went. Before,
    it was taken (and would have acknowledged every datagram in flight)."""
    _, (t0, t1) = make_pair(semantics=Semantics.parse("roce-rc"))
    try:
        t1.sock.sendto(hdr.pack(hdr.STAGE_ACK, 1, t0.nonce, 0, 0, 0, 0, 0, 0, psn=10**6),
                       t0.endpoints[0])
        assert wait_for(lambda: t0.counters.malformed == 1)
        # an ACK within the window (everything up to what was sent) is fine
        t1.sock.sendto(hdr.pack(hdr.STAGE_ACK, 1, t0.nonce, 0, 0, 0, 0, 0, 0, psn=0),
                       t0.endpoints[0])
        time.sleep(0.1)
        assert t0.counters.malformed == 1
    finally:
        t0.close()
        t1.close()


def test_control_datagrams_cross_the_drop_mask_like_data():
    """Before, ACKs and NAKs were handled ahead of the drop mask: the emulated network lost
    data but never an acknowledgement."""
    _, (t0, t1) = make_pair(semantics=Semantics.parse("roce-rc"),
                            drop_mask=DropMask(3, 0.999))
    try:
        for _ in range(5):
            t1.sock.sendto(hdr.pack(hdr.STAGE_ACK, 1, t0.nonce, 0, 0, 0, 0, 0, 0, psn=0),
                           t0.endpoints[0])
        assert wait_for(lambda: t0.counters.masked == 5)
    finally:
        t0.close()
        t1.close()


def first_fragment(t, step: int, index: int) -> bytes:
    fragment = 4 * t.fragment_floats
    return hdr.pack(hdr.STAGE_REDUCE, 1, t.nonce, step, 0, 0, index, 10**6, fragment,
                    fragment=0, fragments=2) + bytes(fragment)


def test_fragments_of_steps_that_cannot_be_used_start_no_message():
    """UC: first fragments for far-future steps are refused (future), not kept. Before,
    4096 of them (MAX_PARTIAL_MESSAGES) filled the reassembly table for good, and every
    genuine message after them was refused."""
    _, (t0, t1) = make_pair(semantics=Semantics.parse("roce-uc:8192"))
    try:
        for index in range(50):
            t1.sock.sendto(first_fragment(t0, 10**6, index), t0.endpoints[0])
        t0.receive_until(time.monotonic() + 0.3, lambda: False, lambda h, p: "applied")
        assert t0.counters.future == 50 and not t0._partial
        # one within the window starts a message, which the step boundary then forgets
        t1.sock.sendto(first_fragment(t0, 0, 0), t0.endpoints[0])
        t0.receive_until(time.monotonic() + 0.3, lambda: False, lambda h, p: "applied")
        assert len(t0._partial) == 1
        for _ in range(3):
            t0.next_step()
        assert not t0._partial and t0.counters.messages_incomplete == 1
        assert t0._partial_of == [0, 0]
    finally:
        t0.close()
        t1.close()


def test_a_kept_packet_that_is_not_finite_is_counted_when_its_step_comes():
    """A sealed-looking packet of the next step with a NaN is kept (early), and at its step
    refused as non-finite, and counted. Before, the replay of kept packets counted only
    those applied and end markers: the NaN vanished from the counters."""
    store, (t0, t1) = make_pair()
    try:
        c0, c1 = LossyCollective(t0, store), LossyCollective(t1, store)
        numel = 3000
        poisoned = np.full(numel, np.nan, np.float32)
        starts, ends = (a.copy() for a in c1.buffers.size(numel)[0].packet_arrays(0))
        # rank 1's reduce packets of step 1, with NaN values, before step 0 starts
        t1.send_packets(0, hdr.STAGE_REDUCE, 1, 0, 0, poisoned, starts, ends)
        xs = [torch.ones(numel), torch.ones(numel)]
        for _ in range(2):
            on_every_rank(2, lambda rank: (c0, c1)[rank].allreduce(xs[rank]))
        assert t0.counters.early == len(starts) == t0.counters.nonfinite
        assert torch.equal(xs[0], torch.ones(numel)) and t0.counters.missing == 0
    finally:
        t0.close()
        t1.close()


def test_packets_kept_early_are_applied_in_one_call_of_the_core():
    """The packets of a step that came during the one before are applied at its start in
    one call of the compiled core (per stage), not one call each: a rank that fell behind
    catches up at the core's speed. The result is exact, the copies sent again at that step
    are duplicates. On the old code: one call per kept packet."""
    import harness.transport.native as native

    store, (t0, t1) = make_pair()
    try:
        c0, c1 = LossyCollective(t0, store), LossyCollective(t1, store)
        numel = 3000
        xs = [torch.ones(numel), torch.full((numel,), 3.0)]
        starts, ends = (a.copy() for a in c1.buffers.size(numel)[0].packet_arrays(0))
        # rank 1's genuine reduce packets of step 1, before step 0 starts
        t1.send_packets(0, hdr.STAGE_REDUCE, 1, 0, 0, xs[1].numpy().copy(), starts, ends)
        on_every_rank(2, lambda rank: (c0, c1)[rank].allreduce(xs[rank]))
        assert t0.counters.early == len(starts) > 1
        rows_per_call = []
        real_apply = native.apply

        def recording_apply(data, rows, **fields):
            rows_per_call.append(len(rows))
            return real_apply(data, rows, **fields)

        native.apply = recording_apply
        try:
            xs = [torch.ones(numel), torch.full((numel,), 3.0)]
            on_every_rank(2, lambda rank: (c0, c1)[rank].allreduce(xs[rank]))
        finally:
            native.apply = real_apply
        assert rows_per_call[:2] == [len(starts)] * 2  # the kept ones, both stages' calls
        assert torch.equal(xs[0], torch.full((numel,), 2.0)) and t0.counters.missing == 0
        assert t0.counters.duplicates >= len(starts)
    finally:
        t0.close()
        t1.close()
