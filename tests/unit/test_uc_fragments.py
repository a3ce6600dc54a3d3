"""RoCE UC messages in the compiled core: the sender cuts them into fragments (each its own
datagram, header and tag; UDP GSO sends many at once), and apply() reassembles them in a
staging area sized by the receiver's own layout, applying a message only when it is whole.
Held against the datagram-at-a-time reference on the same inputs
(tests/reference/datagram_transport.py): its send (the sender), its _reassemble with
Step.handle (the receiver).

Mutations these tests catch (each tried by hand on the C source):
- a fragment applied before its message is whole, or a partial message applied ->
  test_compiled_reassembly_matches_the_reference (targets differ)
- the last fragment of a message read at full length, a fragment at the wrong offset ->
  the same test
- a duplicate fragment counted towards its message -> test_a_duplicate_fragment_...
"""

from __future__ import annotations

import socket
import types
from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.collectives.layout import Layout
from harness.collectives.step import Step
from harness.transport import header as hdr
from harness.transport.early import EarlyStash
from harness.transport.semantics import Semantics
from harness.transport.verdicts import EARLY, HELD, Counters
from tests.reference.datagram_transport import DatagramTransport
from tests.reference.numpy_apply import reference_one
from tests.unit.test_native_core import KEY
from tests.unit.test_transport_hostile import make_pair

MESSAGE, FRAGMENT = 12, 5  # floats: a full message is 3 fragments (5, 5, 2)
SLOT = hdr.HEADER_BYTES + 4 * FRAGMENT + 8
STEP, BUCKET, NONCE = 3, 1, 9


def raw_datagrams(sock: socket.socket) -> list[bytes]:
    out = []
    sock.setblocking(False)
    while True:
        try:
            out.append(sock.recv(65536))
        except BlockingIOError:
            return out


def test_the_compiled_sender_cuts_messages_as_the_reference_does():
    """The same messages through the compiled sender (send_packets, UDP GSO on) and the
    reference (send, one datagram at a time): the same datagrams, field for field and byte
    for byte but seq and tag, each sealed so that the receiver's key checks it, and the
    compiled one sent them several to a system call. On the old code UC messages never
    reached the compiled sender (0 segmented sends)."""
    _, (t0, t1) = make_pair(semantics=Semantics.parse("roce-uc:16384"), key=KEY,
                            segmentation=True)
    try:
        per_message = t1.per_packet  # 4096 floats, in fragments of 350 at MTU 1500
        assert t1.fragment_floats < per_message
        x = np.random.default_rng(1).standard_normal(3 * per_message - 100).astype(np.float32)
        starts = np.array([0, per_message, 2 * per_message], np.int64)
        ends = np.array([per_message, 2 * per_message, len(x)], np.int64)
        t1.send_packets(0, hdr.STAGE_REDUCE, 5, 2, 0, x, starts, ends, end_copies=2)
        compiled = raw_datagrams(t0.sock)
        view = memoryview(x).cast("B")
        for index in range(3):
            t1.send(0, hdr.STAGE_REDUCE, 5, 2, 0, index, 3,
                    view[4 * int(starts[index]):4 * int(ends[index])])
        t1.send_end(0, hdr.STAGE_REDUCE, 5, 2, 0, 3, copies=2)
        reference = raw_datagrams(t0.sock)
    finally:
        t0.close()
        t1.close()
    fragments = -(-per_message // t1.fragment_floats)
    assert len(compiled) == len(reference) == 3 * fragments + 2
    for a, b in zip(compiled, reference, strict=True):
        assert a[:hdr.SEQ_OFFSET] == b[:hdr.SEQ_OFFSET] and a[hdr.HEADER_BYTES:] == \
            b[hdr.HEADER_BYTES:]
        assert t0.auth.check(a, len(a)) and t0.auth.check(b, len(b))
    heads = [hdr.unpack(d) for d in compiled[:fragments]]
    assert [h.fragment for h in heads] == list(range(fragments))
    assert {h.fragments for h in heads} == {fragments}
    assert t1.counters.segmented_sends > 0  # GSO: many fragments a system call
    assert len({hdr.unpack(d).seq for d in compiled}) == len(compiled)  # no nonce twice


# ---- the receiver: compiled reassembly against the reference -----------------------------

def make_state(world: int, numel: int, seed: int, staged: bool) -> Step:
    layout = Layout(numel, world, MESSAGE)
    rng = np.random.default_rng(seed)
    contribution = rng.standard_normal(numel).astype(np.float32)
    shared = rng.standard_normal(numel).astype(np.float32)
    start, end = layout.shard_bounds(0)
    staging = (np.full((world - 1) * layout.packets(0) * MESSAGE, np.nan, np.float32),
               np.full(sum(layout.packets(j) for j in range(1, world)) * MESSAGE, np.nan,
                       np.float32))
    return Step(layout, STEP, BUCKET, 0, contribution, shared,
                 np.empty(end - start, np.float32), fragment_floats=FRAGMENT,
                 staging=staging if staged else None)


def reference_receiver(world: int):
    """DatagramTransport._reassemble on an object with just what it reads: the reference."""
    ref = types.SimpleNamespace(
        fragment_floats=FRAGMENT, max_fragments=-(-MESSAGE // FRAGMENT), world=world,
        counters=Counters(), _partial={}, _partial_of=[0] * world, _step=STEP + 1)
    ref._forget_partial = lambda key: DatagramTransport._forget_partial(ref, key)
    return ref


def fragments_of(layout: Layout, stage: int, source: int, index: int, values: np.ndarray,
                 step: int = STEP) -> list[bytes]:
    shard = 0 if stage == hdr.STAGE_REDUCE else source
    count = layout.packets(shard)
    pieces = max(1, -(-len(values) // FRAGMENT))
    out = []
    for f in range(pieces):
        part = values[f * FRAGMENT:(f + 1) * FRAGMENT]
        out.append(hdr.pack(stage, source, NONCE, step, BUCKET, shard, index, count,
                            4 * len(part), fragment=f, fragments=pieces, dest=0)
                   + part.tobytes())
    return out


FATES = ["whole", "whole", "whole", "partial", "nan", "late", "early", "absent"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=st.integers(2, 4), numel=st.integers(1, 150), seed=st.integers(0, 2**32 - 1),
       fates=st.lists(st.sampled_from(FATES), min_size=1, max_size=40),
       accept=st.booleans())
def test_compiled_reassembly_matches_the_reference(world, numel, seed, fates, accept):
    """Every message of both stages of a step, each with a fate: whole, missing one or more
    of its fragments (lost whole), a NaN in one fragment, of the step before or the one
    after, or not sent; all fragments shuffled into one batch. The compiled core (one
    handle_batch call) and the reference (_reassemble then Step.handle, datagram by
    datagram) end with the same targets to the bit, the same messages received and
    pending, the same verdict counts, and the same messages left incomplete."""
    rng = np.random.default_rng(seed)
    c_state, r_state = make_state(world, numel, seed, True), make_state(world, numel, seed,
                                                                        False)
    c_state.accept_reduce = r_state.accept_reduce = accept
    # the reference applies a whole message with numpy (_apply), not through the core
    r_state._one = lambda head, payload, stash: reference_one(r_state, head, payload, stash)
    layout = c_state.layout
    messages = [(hdr.STAGE_REDUCE, s, i) for s in range(1, world)
                for i in range(layout.packets(0))]
    messages += [(hdr.STAGE_BROADCAST, s, i) for s in range(1, world)
                 for i in range(layout.packets(s))]
    datagrams = []
    for k, (stage, source, index) in enumerate(messages):
        fate = fates[k % len(fates)]
        shard = 0 if stage == hdr.STAGE_REDUCE else source
        start, end = layout.packet_bounds(shard, index)
        values = rng.standard_normal(end - start).astype(np.float32)
        if fate == "absent":
            continue
        if fate == "nan":
            values[int(rng.integers(len(values)))] = np.nan
        step = {"late": STEP - 1, "early": STEP + 1}.get(fate, STEP)
        parts = fragments_of(layout, stage, source, index, values, step)
        if fate == "partial":
            if len(parts) == 1:
                continue  # one datagram: lost is absent
            keep = rng.permutation(len(parts))[:int(rng.integers(1, len(parts)))]
            parts = [parts[j] for j in sorted(keep)]
        datagrams += parts
    datagrams = [datagrams[j] for j in rng.permutation(len(datagrams))]
    if not datagrams:
        return
    data = np.zeros((len(datagrams), SLOT), np.uint8)
    for row, d in enumerate(datagrams):
        data[row, :len(d)] = np.frombuffer(d, np.uint8)
    compiled = c_state.handle_batch(data, np.arange(len(datagrams), dtype=np.int64),
                                    EarlyStash())
    ref, reference, stash = reference_receiver(world), Counter(), EarlyStash()
    for d in datagrams:
        head, payload = hdr.unpack(d), memoryview(d)[hdr.HEADER_BYTES:]
        if head.fragments > 1:
            whole = DatagramTransport._reassemble(ref, head, payload)
            if whole is None:
                continue
            head, payload = whole
        reference[r_state.handle(head, payload, stash)] += 1
    compiled.pop(HELD, None)
    assert +compiled == +reference
    assert ref.counters.malformed == ref.counters.duplicates == 0
    for a, b in ((c_state.reduce, r_state.reduce), (c_state.bcast, r_state.bcast)):
        np.testing.assert_array_equal(a.target.view(np.uint32), b.target.view(np.uint32))
        np.testing.assert_array_equal(a.got, b.got)
        np.testing.assert_array_equal(a.pending, b.pending)
        assert a.left == b.left
        assert np.all(a.ended >= b.ended)  # (a genuine fragment tells as much as a message)
    assert c_state.late_stages == r_state.late_stages
    partial_here = sum(1 for key in ref._partial if key[1] == STEP)
    assert c_state.incomplete_messages() == partial_here


def test_a_duplicate_fragment_is_counted_and_its_message_applied_once():
    """A fragment twice (before and after its message is whole): counted duplicate each
    time, the message applied once, and nothing of the copies reaches the target."""
    state = make_state(2, 24, 3, True)
    layout = state.layout
    start, end = layout.packet_bounds(0, 0)
    values = np.arange(end - start, dtype=np.float32) + 1
    parts = fragments_of(layout, hdr.STAGE_REDUCE, 1, 0, values)
    order = [parts[0], parts[0], parts[1], parts[2], parts[1]]
    data = np.zeros((len(order), SLOT), np.uint8)
    for row, d in enumerate(order):
        data[row, :len(d)] = np.frombuffer(d, np.uint8)
    before = state.reduce.target.copy()
    verdicts = state.handle_batch(data, np.arange(len(order), dtype=np.int64), EarlyStash())
    assert verdicts == Counter({"applied": 1, "duplicate": 2})
    np.testing.assert_array_equal(state.reduce.target[start:end], before[start:end] + values)
    assert state.incomplete_messages() == 0


def test_fragments_that_disagree_with_the_layout_are_malformed_and_start_nothing():
    """A fragment count, fragment number or length other than the receiver's own layout
    gives (whatever the header claims) is refused per datagram: no staging is touched."""
    state = make_state(2, 24, 3, True)
    layout = state.layout
    values = np.ones(MESSAGE, np.float32)
    good = fragments_of(layout, hdr.STAGE_REDUCE, 1, 0, values)[0]
    bad = []
    for fragment, fragments, length in ((0, 65535, 4 * FRAGMENT), (3, 3, 8),
                                        (0, 3, 4 * FRAGMENT - 4), (1, 2, 4 * FRAGMENT)):
        head = hdr.HEADER.unpack(good[:hdr.HEADER_BYTES])
        fields = list(head)
        fields[8], fields[9], fields[12] = fragment, fragments, length
        bad.append(hdr.HEADER.pack(*fields) + bytes(length))
    data = np.zeros((len(bad), SLOT), np.uint8)
    for row, d in enumerate(bad):
        data[row, :len(d)] = np.frombuffer(d, np.uint8)
    verdicts = state.handle_batch(data, np.arange(len(bad), dtype=np.int64), EarlyStash())
    assert verdicts == Counter({"malformed": 4})
    assert not state.reduce.frag_count.any() and not state.reduce.frag_got.any()


def test_fragments_of_the_next_step_are_kept_and_make_their_message_there():
    """Fragments that come a step early wait in the early stash (the message counted early
    once, by its first fragment) and are reassembled when their step comes."""
    layout = Layout(24, 2, MESSAGE)
    values = np.arange(MESSAGE, dtype=np.float32)
    parts = fragments_of(layout, hdr.STAGE_REDUCE, 1, 0, values, step=STEP + 1)
    now = make_state(2, 24, 3, True)
    stash = EarlyStash()
    verdicts = [now.handle(hdr.unpack(d), memoryview(d)[hdr.HEADER_BYTES:], stash)
                for d in parts]
    assert verdicts == [EARLY, HELD, HELD] and len(stash) == 3
    later = make_state(2, 24, 3, True)
    later.step = STEP + 1
    before = later.reduce.target.copy()
    replayed = [later.handle(h, memoryview(p), EarlyStash()) for h, p in stash]
    assert replayed == [HELD, HELD, "applied"]
    np.testing.assert_array_equal(later.reduce.target[:MESSAGE], before[:MESSAGE] + values)


def test_the_staging_area_is_sized_by_the_layout_not_by_the_wire():
    """The receiver's reassembly state for a step: a message's floats for every message it
    expects and a flag per fragment a message of its layout can have, whatever datagrams
    claim."""
    state = make_state(3, 150, 1, True)
    for st_ in (state.reduce, state.bcast):
        assert st_.staging.size == st_.expected.sum() * MESSAGE
        assert st_.frag_got.shape == (*st_.got.shape, -(-MESSAGE // FRAGMENT))
