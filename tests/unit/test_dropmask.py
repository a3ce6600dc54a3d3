"""The seeded drop mask: the same seed drops the same packet positions in every variant."""

from __future__ import annotations

import time

import numpy as np
import torch

from harness.collectives.deadline import Deadline
from harness.collectives.lossy import LossyCollective
from harness.collectives.step import Step
from harness.reproduce.loopback import on_every_rank
from harness.transport.dropmask import DropMask
from harness.transport.semantics import Semantics
from tests.reference.numpy_apply import reference_one
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
            on_every_rank(2, lambda r, xs=xs: collectives[r].allreduce(xs[r]))
        drain(transports, collectives)
        return [(t.drop_mask.dropped_count, t.drop_mask.dropped_digest) for t in transports]
    finally:
        for t in transports:
            t.close()


def drain(transports, collectives) -> None:
    """Send the last step's timed late end markers (LossyCollective.finish), then read what
    is still queued (its late end markers, the copies that came after a stage was over), so
    that the masks have judged every datagram sent: a receiver reads a batch at a time, and
    how much of the last step's tail is in its last batch depends on timing."""
    for c in collectives:
        c.finish()
    time.sleep(0.2)
    for t in transports:
        t.receive_until(time.monotonic() + 0.1, lambda: False, lambda h, p: "stale")


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


def _masked_run(batched: bool, steps: int = 4, seed: int = 7, rate: float = 0.2,
                semantics: str = "udp"):
    """Two loopback ranks, a drop mask, `steps` all-reduces of seeded values, received
    through the batched path (the compiled core applies the packets the mask keeps) or the
    datagram-at-a-time path (the numpy reference): results, counters, the masks' records and
    how many times the compiled core applied a batch."""
    import harness.transport.native as native

    store, transports = make_pair(drop_mask=DropMask(seed, rate), key=b"k" * 32,
                                  semantics=Semantics.parse(semantics))
    applied = []
    real_apply = native.apply

    def counting_apply(*args, **fields):
        applied.append(1)
        return real_apply(*args, **fields)

    real_one = Step._one
    try:
        for t in transports:
            if not batched:  # no handle_batch: every datagram through _datagram and _apply
                t.receive_until = (lambda deadline, done, handle, handle_batch=None, t=t:
                                   type(t).receive_until(t, deadline, done, handle, None))
        if not batched:  # ... and each unit through the numpy reference, not the core
            Step._one = reference_one
        native.apply = counting_apply
        # a floor of 1 s: under a full suite's load a stalled sender thread must not make a
        # packet late in one run and not the other (stages end on end markers, not on this)
        collectives = [LossyCollective(t, store, deadline=Deadline(floor_s=1.0, ceiling_s=5.0))
                       for t in transports]
        results = []
        for step in range(steps):
            xs = [torch.from_numpy(np.random.default_rng((step, k)).standard_normal(
                20_000).astype(np.float32)) for k in (0, 1)]
            on_every_rank(2, lambda r, xs=xs: collectives[r].allreduce(xs[r]))
            results.append([x.numpy().copy() for x in xs])
        drain(transports, collectives)
        counters = [t.counters.to_dict() for t in transports]
        masks = [(t.drop_mask.dropped_count, t.drop_mask.dropped_digest) for t in transports]
        return results, counters, masks, len(applied)
    finally:
        native.apply, Step._one = real_apply, real_one
        for t in transports:
            t.close()


COMPARED = ("packets_received", "missing", "masked", "duplicates", "unauthenticated",
            "foreign", "malformed", "nonfinite")


def assert_same_run(batched, reference) -> None:
    """Two _masked_run results: the compiled core did the applying in the first and not in
    the second; results to the bit, the COMPARED counters and the masks' records equal."""
    assert batched[3] > 0 and reference[3] == 0
    for step_b, step_r in zip(batched[0], reference[0], strict=True):
        for b, r in zip(step_b, step_r, strict=True):
            np.testing.assert_array_equal(b, r)
    assert [{k: c[k] for k in COMPARED} for c in batched[1]] == \
        [{k: c[k] for k in COMPARED} for c in reference[1]]
    assert batched[2] == reference[2]


def test_the_masked_batched_path_matches_the_datagram_reference():
    """With a drop mask the batched path (screen, mask, apply in the compiled core) keeps
    and applies exactly what the datagram-at-a-time reference does: the same results to the
    bit, the same counters, the same dropped packets. Mutation caught (the old code): a mask
    sent every datagram through Python, and the compiled core applied nothing (0 batches);
    a mask decided after apply, or not at all, changes the results and counters."""
    batched = _masked_run(batched=True)
    reference = _masked_run(batched=False)
    assert_same_run(batched, reference)
    # copies of the last step's end markers that came after its stages were over: read
    # ahead with the step's last batch (ends_received) or left for the drain (late)
    assert [c["ends_received"] + c["late"] for c in batched[1]] == \
        [c["ends_received"] + c["late"] for c in reference[1]]
    assert sum(c["masked"] for c in batched[1]) > 0


def test_uc_messages_in_the_compiled_core_match_the_datagram_reference():
    """RoCE UC under a drop mask (which loses fragments): the compiled core (fragments
    screened, masked and reassembled in one call per batch) against the reference
    (_datagram, _reassemble, _apply): the same results to the bit, the same messages
    received and missing, the same datagrams masked. On the old code UC went datagram by
    datagram through Python, and the compiled core applied nothing (0 batches)."""
    batched = _masked_run(batched=True, rate=0.02, semantics="roce-uc:16384")
    reference = _masked_run(batched=False, rate=0.02, semantics="roce-uc:16384")
    assert_same_run(batched, reference)
    # messages lost whole: fragments masked, the rest of their message never applied
    assert all(c["missing"] > 0 and c["messages_incomplete"] > 0 for c in batched[1])
