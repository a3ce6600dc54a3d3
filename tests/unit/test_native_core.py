"""The compiled data plane (harness/transport/_wire.c) against its references, on the same
inputs: its GMAC against the cryptography package's AES-GCM, its apply() against the numpy
code that did the same work before (tests/reference/numpy_apply.py), and the
protocol rules it enforces (destination, per-transport keys) on loopback ranks
(127.0.0.1 only).

Mutations these tests catch (each was tried by hand on the C source):
- the tag not covering the payload, or the destination -> test_gmac_...
- a duplicate applied twice, a NaN applied, a short last packet read at full length, a
  packet of the wrong shard or count applied, a stale packet applied after the rebuild ->
  test_apply_matches_the_numpy_reference
- no destination check -> test_a_redirected_genuine_datagram_...
- the salt left out of the key -> test_two_transports_with_one_job_key_...
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.collectives.layout import Layout
from harness.collectives.step import Step
from harness.reproduce.loopback import MemoryStore, on_every_rank
from harness.transport import auth, native
from harness.transport import header as hdr
from harness.transport.early import EarlyStash
from harness.transport.udp import UdpTransport
from harness.transport.verdicts import APPLIED, END
from tests.reference.numpy_apply import reference_handle_batch

KEY = bytes(range(32))


# ---- the MAC ---------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=16, max_size=16), st.integers(0, 0xFFFF), st.integers(0, 2**64 - 1),
       st.binary(max_size=9000), st.integers(0, 0xFFFF))
def test_gmac_matches_the_reference_aes_gcm(key, source, seq, payload, dest):
    head = bytearray(hdr.pack(hdr.STAGE_REDUCE, source, 7, 1, 2, 3, 4, 5, len(payload),
                              dest=dest))
    head[hdr.SEQ_OFFSET:hdr.TAG_OFFSET] = seq.to_bytes(8, "big")
    nonce = source.to_bytes(4, "big") + seq.to_bytes(8, "big")
    expected = AESGCM(key).encrypt(nonce, b"", bytes(head) + payload)  # tag field zero
    mac = native.Mac(key)
    assert mac.tag(bytes(head) + payload) == expected
    sealed = bytes(head[:hdr.TAG_OFFSET]) + expected + payload
    assert mac.check(sealed, len(sealed))
    # any change to what the tag covers, the destination included, is found
    for offset in (hdr.DEST_OFFSET, 0, hdr.SEQ_OFFSET, len(sealed) - 1):
        changed = bytearray(sealed)
        changed[offset] ^= 1
        assert not mac.check(bytes(changed), len(changed))


# ---- apply() against the reference -----------------------------------------------------

PER_PACKET = 5  # floats per packet: small, so that layouts have many short last packets
SLOT = 128


def make_state(world: int, rank: int, numel: int, seed: int) -> Step:
    layout = Layout(numel, world, PER_PACKET)
    rng = np.random.default_rng(seed)
    contribution = rng.standard_normal(numel).astype(np.float32)
    shared = rng.standard_normal(numel).astype(np.float32)
    start, end = layout.shard_bounds(rank)
    return Step(layout, 3, 1, rank, contribution, shared, np.empty(end - start, np.float32))


mutation = st.sampled_from(["none", "none", "none", "duplicate", "nan", "inf", "shard",
                            "count", "index", "length", "step_late", "step_early", "bucket",
                            "own_source"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=st.integers(2, 5), numel=st.integers(1, 90), seed=st.integers(0, 2**32 - 1),
       mutations=st.lists(mutation, min_size=1, max_size=60), accept=st.booleans())
def test_apply_matches_the_numpy_reference(world, numel, seed, mutations, accept):
    rank = 0
    rng = np.random.default_rng(seed)
    c_state, ref_state = (make_state(world, rank, numel, seed) for _ in range(2))
    c_state.accept_reduce = ref_state.accept_reduce = accept
    layout = c_state.layout
    packets = []  # (stage, source, index)
    for source in range(1, world):
        packets += [(hdr.STAGE_REDUCE, source, i) for i in range(layout.packets(rank))]
        packets += [(hdr.STAGE_BROADCAST, source, i) for i in range(layout.packets(source))]
    if not packets:
        return
    # each packet at most once (two different payloads for one slot only a forger makes,
    # and which of them stands is the reference's numpy's choice); copies: "duplicate"
    order = rng.permutation(len(packets))
    mutations = mutations[:len(packets)]
    data = np.zeros((len(mutations) * 2, SLOT), np.uint8)
    rows = []
    for row, kind in enumerate(mutations):
        stage, source, index = packets[int(order[row])]
        shard = rank if stage == hdr.STAGE_REDUCE else source
        count = layout.packets(shard)
        start, end = layout.packet_bounds(shard, index)
        values = rng.standard_normal(end - start).astype(np.float32)
        step, bucket = 3, 1
        if kind == "nan":
            values[int(rng.integers(len(values)))] = np.nan
        elif kind == "inf":
            values[-1] = -np.inf
        elif kind == "shard":
            shard = (shard + 1) % world
        elif kind == "count":
            count += 1
        elif kind == "index":
            index = count + int(rng.integers(0, 3))
        elif kind == "length":
            values = values[:-1] if len(values) > 1 else np.zeros(2, np.float32)
        elif kind == "step_late":
            step = 2
        elif kind == "step_early":
            step = 4
        elif kind == "bucket":
            bucket = 2
        elif kind == "own_source":  # (a source outside the job never gets here: screen)
            source = rank
        head = hdr.pack(stage, source, 9, step, bucket, shard, index, count,
                        4 * len(values))
        datagram = head + values.tobytes()
        data[row, :len(datagram)] = np.frombuffer(datagram, np.uint8)
        rows.append(row)
        if kind == "duplicate":  # the same datagram again, in the same batch
            data[len(mutations) + row] = data[row]
            rows.append(len(mutations) + row)
    rows = np.array(rows, dtype=np.int64)
    got_c = c_state.handle_batch(data, rows, c_stash := EarlyStash())
    got_ref = reference_handle_batch(ref_state, data, rows, ref_stash := EarlyStash())
    assert +got_c == +got_ref
    for a, b in ((c_state.reduce, ref_state.reduce), (c_state.bcast, ref_state.bcast)):
        np.testing.assert_array_equal(a.target.view(np.uint32), b.target.view(np.uint32))
        np.testing.assert_array_equal(a.got, b.got)
        np.testing.assert_array_equal(a.pending, b.pending)
        np.testing.assert_array_equal(a.ended, b.ended)
        assert a.left == b.left
    assert c_state.late_stages == ref_state.late_stages
    assert len(c_stash) == len(ref_stash)


def test_apply_refuses_a_layout_that_does_not_fit_its_own_buffers():
    state = make_state(3, 0, 40, 1)
    st_ = state.bcast
    with pytest.raises(ValueError, match="layout does not fit"):
        native.apply(np.zeros((1, SLOT), np.uint8), np.zeros(0, np.int64), step=3, bucket=1,
                     stage=hdr.STAGE_BROADCAST, owner=-1, expected=st_.expected,
                     last_floats=st_.last_floats, base=st_.base + 10**6,
                     per_packet=PER_PACKET, target=st_.target, got=st_.got,
                     pending=st_.pending, ended=None, add=False, accept=True,
                     leftover=np.zeros(0, np.int64))


# ---- the protocol rules ----------------------------------------------------------------

def ranks(world: int, key: bytes | None = KEY, prefix: str = "lossbed/udp", store=None):
    store = store or MemoryStore()
    return store, on_every_rank(world, lambda rank: UdpTransport(
        rank, world, "127.0.0.1", store, key=key, key_prefix=prefix))


def raw_receive(transport, timeout_s: float = 2.0) -> bytes:
    """The next datagram on a transport's socket, as it came (taken before the transport)."""
    transport.sock.setblocking(True)
    transport.sock.settimeout(timeout_s)
    try:
        return transport.sock.recv(65536)
    finally:
        transport.sock.setblocking(False)


def receive_all(transport, seconds: float = 0.3) -> list:
    seen = []

    def handle(head, payload):
        seen.append(head)
        return END if head.stage in hdr.DATA_STAGE_OF_END else APPLIED

    def handle_batch(data, rows):
        seen.extend(hdr.unpack(data[r]) for r in rows.tolist())
        return Counter({APPLIED: len(rows)})

    transport.receive_until(time.monotonic() + seconds, lambda: False, handle, handle_batch)
    return seen


@pytest.mark.parametrize("what", ["end marker", "data"])
def test_a_redirected_genuine_datagram_is_refused_and_counted(what):
    """Rank 1's genuine datagram for rank 2, copied unchanged to rank 0 (from rank 1's own
    address, as an on-path attacker would send it): rank 0 refuses it (misdirected), and
    nothing reaches the collective. Without the destination in the signed header rank 0
    took such an end marker as the end of rank 1's packets to it, and turned data that came
    after it into "lost"."""
    _, (t0, t1, t2) = ranks(3)
    try:
        x = np.arange(4 * t1.per_packet, dtype=np.float32)
        if what == "data":
            t1.send_packets(2, hdr.STAGE_REDUCE, 0, 0, 2, x, np.array([0]),
                            np.array([t1.per_packet]))
        else:
            t1.send_end(2, hdr.STAGE_REDUCE, 0, 0, 2, 3, copies=1)
        genuine = raw_receive(t2)
        assert hdr.unpack(genuine).dest == 2
        t1.sock.sendto(genuine, t0.endpoints[0])
        assert receive_all(t0) == []
        assert t0.counters.misdirected == 1
        assert t0.counters.unauthenticated == t0.counters.foreign == 0
        # the same datagram, sent to the rank it was made for, is taken
        t1.sock.sendto(genuine, t2.endpoints[2])
        assert [h.dest for h in receive_all(t2)] == [2] and t2.counters.misdirected == 0
    finally:
        for t in (t0, t1, t2):
            t.close()


def test_two_transports_with_one_job_key_never_repeat_a_nonce():
    """Two launches (or reruns) with the same job key and transport name: each transport's
    first datagram has seq 0 from the same source, the same nonce, so only their keys keep
    GHASH's key from being given away. Each draws its own salt, so their keys differ, their
    tags for the same datagram differ, and one launch's datagram is refused by the other's
    receivers. The control: without the salt the two keys are one."""
    _, first = ranks(2)
    _, second = ranks(2)
    try:
        sent = []
        for t0, t1 in (first, second):
            t1.send_end(0, hdr.STAGE_REDUCE, 0, 0, 0, 1, copies=1)
            sent.append(raw_receive(t0))
        heads = [hdr.unpack(d) for d in sent]
        assert [(h.source, h.seq) for h in heads] == [(1, 0), (1, 0)]  # one nonce
        assert first[1].auth.salt != second[1].auth.salt
        keys = [auth.transport_key(KEY, "lossbed/udp", t.auth.salt)
                for t in (first[1], second[1])]
        assert keys[0] != keys[1]
        assert sent[0][hdr.TAG_OFFSET:] != sent[1][hdr.TAG_OFFSET:]
        assert first[0].auth.check(sent[0], len(sent[0]))
        assert not first[0].auth.check(sent[1], len(sent[1]))
        # control: the key without a salt is the same for both
        assert auth.transport_key(KEY, "lossbed/udp", b"") == auth.transport_key(
            KEY, "lossbed/udp", b"")
    finally:
        for t in (*first, *second):
            t.close()


def test_a_peer_that_publishes_no_salt_is_refused_with_a_clear_error():
    """A keyed rank meeting one that runs without the key (or another version) stops at
    setup, naming the peer, instead of refusing every datagram for the whole run."""
    store = MemoryStore()

    def make(rank):
        return UdpTransport(rank, 2, "127.0.0.1", store, key=KEY if rank == 0 else None)

    with pytest.raises(Exception, match="rank 1 published no valid salt"):
        on_every_rank(2, make)


def test_every_transport_draws_a_fresh_salt():
    salts = {auth.PacketAuth(KEY, 0, "x").salt for _ in range(50)}
    assert len(salts) == 50 and all(len(s) == auth.SALT_BYTES for s in salts)
