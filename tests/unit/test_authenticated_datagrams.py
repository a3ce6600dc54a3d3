"""Authenticated datagrams (harness.transport.auth): with the job's key, a datagram that a
peer did not seal is counted and dropped before anything looks at it, however right its
nonce, source address and fields are; what a peer did seal is still checked against the
layout (fragment counts) and its values (NaN, infinity) before it is applied.

Two ranks in threads on loopback (127.0.0.1 only); forgeries go out from rank 1's own
socket, the perfect spoof of its address and port.
"""

from __future__ import annotations

import os
import struct
import threading
import time

import numpy as np
import pytest
import torch

from harness.collectives.deadline import Deadline
from harness.collectives.lossy import LossyCollective
from harness.transport import auth, native
from harness.transport import header as hdr
from harness.transport.semantics import Semantics
from tests.unit.test_transport_hostile import NUMEL, make_pair

KEY = bytes(range(32))
PER_PACKET = hdr.payload_floats(1500)


def forged(kind: str, nonce: int, step: int) -> bytes:
    """A datagram as rank 1 would send it to rank 0 in `step`, right in every field, but
    not sealed with the key (seq and tag made up)."""
    values = {"poison": 1.0, "nan": float("nan"), "inf": float("inf")}
    if kind == "end":  # "I sent you all 5": would end rank 0's wait at once
        head = hdr.pack(hdr.STAGE_REDUCE_END, 1, nonce, step, 0, 0, 5, 5, 0)
        payload = b""
    elif kind == "bomb":  # one of 65535 fragments: a 94 MB reassembly buffer
        head = hdr.pack(hdr.STAGE_REDUCE, 1, nonce, step, 0, 0, 0, 5, 4 * PER_PACKET,
                        fragment=0, fragments=65535)
        payload = bytes(4 * PER_PACKET)
    else:
        shift = 1 if kind == "early" else 0  # held for the next step: displaces nothing
        head = hdr.pack(hdr.STAGE_REDUCE, 1, nonce, step + shift, 0, 0, 0, 5,
                        4 * PER_PACKET)
        payload = struct.pack("<f", values.get(kind, 1.0)) * PER_PACKET
    return head[:hdr.SEQ_OFFSET] + os.urandom(8 + hdr.TAG_BYTES) + payload


def one_step_under_attack(t0, t1, store, send_during):
    """A warm-up step, then one all-reduce during which send_during(step) runs while rank 0
    waits for rank 1. Returns (rank 0's and 1's results, the exact mean, counter deltas)."""
    rng = np.random.default_rng(5)
    # No step alignment: rank 0 is receiving, not waiting in the store, when they come; and
    # deadlines long enough for rank 1 to start late
    c0, c1 = (LossyCollective(t, store, align_every=0, deadline=Deadline(2.0, 2.0))
              for t in (t0, t1))
    x0 = torch.from_numpy(rng.standard_normal(NUMEL).astype(np.float32))
    x1 = torch.from_numpy(rng.standard_normal(NUMEL).astype(np.float32))
    warm = [threading.Thread(target=c.allreduce, args=(x.clone(),))
            for c, x in ((c0, x0), (c1, x1))]
    for t in warm:
        t.start()
    for t in warm:
        t.join()
    before = t0.counters.to_dict()
    y0, y1 = x0.clone(), x1.clone()
    rank0 = threading.Thread(target=c0.allreduce, args=(y0,))
    rank0.start()
    time.sleep(0.02)
    send_during(1)
    time.sleep(0.05)  # rank 0 takes the forgeries before rank 1's genuine packets come
    c1.allreduce(y1)
    rank0.join(10)
    assert not rank0.is_alive()
    after = t0.counters.to_dict()
    return y0, y1, (x0 + x1) / 2, {k: after[k] - before[k] for k in after}


def test_forgeries_with_the_right_nonce_and_a_spoofed_source_change_nothing():
    store, (t0, t1) = make_pair(key=KEY)
    kinds = ["poison", "early", "nan", "inf", "end", "bomb"] * 5
    try:
        assert t0.authenticated and t1.authenticated

        def attack(step):
            for kind in kinds:
                t1.sock.sendto(forged(kind, t0.nonce, step), t0.endpoints[0])

        y0, y1, exact, delta = one_step_under_attack(t0, t1, store, attack)
    finally:
        t0.close()
        t1.close()
    assert torch.allclose(y0, exact, atol=1e-6) and torch.allclose(y1, exact, atol=1e-6)
    assert delta["unauthenticated"] == len(kinds), delta
    assert delta["missing"] == 0 and delta["early"] == 0 and delta["malformed"] == 0, delta


@pytest.mark.parametrize("kind", ["end", "poison"])
def test_without_the_key_the_same_forgeries_would_be_applied(kind):
    """The control: the transport as it was (no key) takes a forged end marker (delivered
    data then counts as lost) and poison (the result changes): the test above would fail
    without authentication."""
    store, (t0, t1) = make_pair()
    try:
        def attack(step):
            datagram = forged(kind, t0.nonce, step)  # what a keyless sender makes:
            unsealed = datagram[:hdr.SEQ_OFFSET] + bytes(8 + hdr.TAG_BYTES)  # seq, tag 0
            t1.sock.sendto(unsealed + datagram[hdr.HEADER_BYTES:], t0.endpoints[0])

        y0, _, exact, delta = one_step_under_attack(t0, t1, store, attack)
    finally:
        t0.close()
        t1.close()
    if kind == "end":
        assert delta["missing"] > 0, {k: v for k, v in delta.items() if v}
    else:
        assert not torch.allclose(y0, exact, atol=1e-6)


def tampered(genuine: bytes, field: str, value) -> bytes:
    """A genuine sealed datagram with one header field changed and its tag kept."""
    fields = list(hdr.HEADER.unpack(genuine[:hdr.HEADER_BYTES]))
    fields[hdr.Header._fields.index(field)] = value
    return hdr.HEADER.pack(*fields) + genuine[hdr.HEADER_BYTES:]


# field, its new value from the genuine one, the counter that refuses it. Each new value
# would be taken (and the poison applied) if the tag did not cover that field: a later
# index, another shard, the next step, another count, a shorter length, the broadcast
# stage, another destination. (source -> 0 is rank 0 itself: refused as foreign before
# any key is looked up; with two ranks no other source exists.)
TAMPERS = [("seq", lambda v: v + 1, "unauthenticated"), ("source", lambda v: 0, "foreign"),
           ("step", lambda v: v + 1, "unauthenticated"),
           ("shard", lambda v: 1, "unauthenticated"), ("index", lambda v: 1, "unauthenticated"),
           ("count", lambda v: v + 1, "unauthenticated"),
           ("length", lambda v: v - 4, "unauthenticated"),
           ("stage", lambda v: hdr.STAGE_BROADCAST, "unauthenticated"),
           ("dest", lambda v: 1, "unauthenticated")]


@pytest.mark.parametrize(("field", "change", "counter"), TAMPERS,
                         ids=[t[0] for t in TAMPERS])
def test_a_genuine_datagram_with_any_one_field_changed_is_refused(field, change, counter):
    """rank 1's own sealed datagram of poison (1e6 in every value), one header field
    changed, the tag kept: refused, counted, and the result is the exact mean. Mutation
    caught: a MAC that leaves that field out (the poison is then applied)."""
    store, (t0, t1) = make_pair(key=KEY)
    try:
        def attack(step):
            payload = struct.pack("<f", 1e6) * PER_PACKET
            head = hdr.pack(hdr.STAGE_REDUCE, 1, t0.nonce, step, 0, 0, 0, 5, 4 * PER_PACKET)
            genuine = t1.auth.seal(head, payload) + payload
            value = change(getattr(hdr.unpack(genuine), field))
            t1.sock.sendto(tampered(genuine, field, value), t0.endpoints[0])

        y0, y1, exact, delta = one_step_under_attack(t0, t1, store, attack)
    finally:
        t0.close()
        t1.close()
    assert torch.allclose(y0, exact, atol=1e-6) and torch.allclose(y1, exact, atol=1e-6)
    assert delta[counter] == 1, {k: v for k, v in delta.items() if v}


def test_a_datagram_sealed_with_another_key_is_refused():
    """Everything right but the key (a job that reused this one's nonce, a guessed key):
    mutation caught, a check that takes any well-formed tag."""
    store, (t0, t1) = make_pair(key=KEY)
    other = auth.PacketAuth(bytes(32), 1, t1.auth.purpose, salt=t1.auth.salt)  # key alone
    try:
        def attack(step):
            payload = struct.pack("<f", 1e6) * PER_PACKET
            head = hdr.pack(hdr.STAGE_REDUCE, 1, t0.nonce, step, 0, 0, 0, 5, 4 * PER_PACKET)
            t1.sock.sendto(other.seal(head, payload) + payload, t0.endpoints[0])

        y0, _, exact, delta = one_step_under_attack(t0, t1, store, attack)
    finally:
        t0.close()
        t1.close()
    assert torch.allclose(y0, exact, atol=1e-6)
    assert delta["unauthenticated"] == 1, {k: v for k, v in delta.items() if v}


def test_two_launches_with_one_job_key_never_sign_with_the_same_key_and_nonce():
    """Two transports of the same job key, rank and name (a rerun of `python -m
    harness.verbs.collective --key`): each draws its own salt, so the same header, seq and
    payload get different tags (mutation caught: a key derived from the job key and name
    alone, which gives GHASH's key away when seq restarts at 0)."""
    first, second = (auth.PacketAuth(KEY, 1, "udp") for _ in range(2))
    assert first.salt != second.salt
    head = hdr.pack(hdr.STAGE_REDUCE, 1, 7, 0, 0, 0, 0, 5, 4 * PER_PACKET)
    payload = bytes(4 * PER_PACKET)
    a, b = first.seal(head, payload), second.seal(head, payload)
    assert a[hdr.SEQ_OFFSET:hdr.TAG_OFFSET] == b[hdr.SEQ_OFFSET:hdr.TAG_OFFSET]  # same seq
    assert a[hdr.TAG_OFFSET:] != b[hdr.TAG_OFFSET:]


def test_a_forged_fragment_bomb_never_reaches_reassembly():
    """UC semantics (where fragments are reassembled, in the compiled core's apply): a
    forged first fragment of 65535 is refused by its tag before reassembly sees it
    (mutation caught: reassembly before the check; the UDP test above cannot tell, UDP
    never reassembles)."""
    store, (t0, t1) = make_pair(key=KEY, semantics=Semantics.parse("roce-uc:16384"))
    seen = []
    real_apply = native.apply

    def recording_apply(data, rows, **fields):
        for row in rows.tolist():  # the fragment count of every datagram reassembly sees
            seen.append(int.from_bytes(bytes(data[row, 26:28]), "big"))
        return real_apply(data, rows, **fields)

    native.apply = recording_apply
    try:
        def attack(step):
            head = hdr.pack(hdr.STAGE_REDUCE, 1, t0.nonce, step, 0, 0, 0, 1,
                            4 * t0.fragment_floats, fragment=0, fragments=65535)
            datagram = head[:hdr.SEQ_OFFSET] + os.urandom(8 + hdr.TAG_BYTES)
            for _ in range(20):
                t1.sock.sendto(datagram + bytes(4 * t0.fragment_floats), t0.endpoints[0])

        y0, _, exact, delta = one_step_under_attack(t0, t1, store, attack)
    finally:
        native.apply = real_apply
        t0.close()
        t1.close()
    assert torch.allclose(y0, exact, atol=1e-6)
    assert delta["unauthenticated"] == 20 and 65535 not in seen, delta
    assert any(1 < f <= t0.max_fragments for f in seen), "the genuine fragments went " \
        "through the compiled reassembly (the hook is in place)"
    assert delta["messages_incomplete"] == 0 and delta["missing"] == 0, delta


def test_sealed_values_that_are_not_finite_are_counted_and_never_applied():
    """A packet the peer did seal can still carry NaN (a link that corrupts, a peer whose
    gradients blew up): it is counted and the genuine packet that follows is applied."""
    store, (t0, t1) = make_pair(key=KEY)
    try:
        def corrupted(step):
            head = hdr.pack(hdr.STAGE_REDUCE, 1, t0.nonce, step, 0, 0, 0, 5, 4 * PER_PACKET)
            payload = struct.pack("<f", float("nan")) * PER_PACKET
            t1.sock.sendto(t1.auth.seal(head, payload) + payload, t0.endpoints[0])

        y0, _, exact, delta = one_step_under_attack(t0, t1, store, corrupted)
    finally:
        t0.close()
        t1.close()
    assert torch.allclose(y0, exact, atol=1e-6)
    assert delta["nonfinite"] == 1 and delta["unauthenticated"] == 0, delta


def test_a_fragment_count_from_the_wire_never_sizes_a_buffer():
    store, (t0, t1) = make_pair(key=KEY, semantics=Semantics.parse("roce-uc:16384"))
    try:
        assert t0.max_fragments == -(-t0.per_packet // t0.fragment_floats)
        for fragments in (65535, t0.max_fragments + 1):
            head = hdr.unpack(hdr.pack(hdr.STAGE_REDUCE, 1, t0.nonce, 0, 0, 0, 0, 1,
                                       4 * t0.fragment_floats, fragment=0,
                                       fragments=fragments))
            assert t0._reassemble(head, memoryview(bytes(4 * t0.fragment_floats))) is None
        assert t0.counters.malformed == 2 and not t0._partial
    finally:
        t0.close()
        t1.close()


def test_the_key_comes_from_the_launch_environment():
    from harness.rank_protocol import RankEnv

    told = RankEnv.from_env({"LOSSBED_KEY": "ab" * 32})
    assert auth.job_key(told.key) == bytes([0xAB]) * 32
    with pytest.raises(ValueError, match="LOSSBED_KEY"):
        auth.job_key(RankEnv.from_env({"LOSSBED_KEY": "not hex"}).key)
    assert auth.job_key(RankEnv.from_env({}).key) is None
    assert auth.new_key() != auth.new_key() and len(bytes.fromhex(auth.new_key())) == 32


def test_every_launch_gives_its_ranks_a_fresh_key(monkeypatch):
    """The controller's launch puts a new key in every rank's environment (the same for all
    ranks of the launch), and nowhere else."""
    from harness import launch

    seen = []

    class Host:
        name, address, ifname, project, gpus = "h", "10.0.0.1", "eth0", ".", 0

        def popen(self, argv, env=None, **kwargs):
            seen.append(env.get("LOSSBED_KEY"))
            raise RuntimeError("stop here")

    class Cluster:
        name, kind, mtu, hosts = "c1", "netns", 1500, [Host(), Host()]
        shares_this_machine = True

        def rank_python(self, host) -> str:
            return "python3"

    for _ in range(2):
        with pytest.raises(RuntimeError, match="stop here"):
            launch.run(Cluster(), "harness.train.worker", [])
    assert len(seen) == 2 and seen[0] != seen[1]
    assert all(len(bytes.fromhex(k)) == 32 for k in seen)
    # a launch whose profiles all say the network is isolated gives no key, even one the
    # controller's own environment happens to hold
    monkeypatch.setenv("LOSSBED_KEY", "ab" * 32)
    with pytest.raises(RuntimeError, match="stop here"):
        launch.run(Cluster(), "harness.train.worker", [], authenticate=False)
    assert seen[-1] is None


class SendsTwice:
    """A transport's sender that sends every batch twice: the same sealed datagrams (one
    seq), as a network that duplicates would deliver them."""

    def __init__(self, sender):
        self.sender = sender

    def send(self, **fields):
        first = self.sender.send(**fields)
        self.sender.send(**fields)
        return first


def replayed_mask_run(seed: int, copies_in_flight: bool):
    """(dropped count, digest) per rank over 3 all-reduces under a seeded drop mask
    (test_dropmask.run_variant); with copies_in_flight every datagram goes out twice and
    forged copies arrive too."""
    from tests.unit.test_dropmask import run_variant

    def copies(transports, step):
        if step == 0:  # every send twice, from now on
            for t in transports:
                t._tx = SendsTwice(t._tx)
        for kind in ("poison", "end"):
            transports[1].sock.sendto(forged(kind, transports[0].nonce, step),
                                      transports[0].endpoints[0])
        # and forged copies whose identities no genuine packet has (copy 100-199): were the
        # mask to see them before the tag check, about one in ten would be dropped and
        # change the count (the poison above shares a genuine packet's identity, so the
        # mask's verdict on it is the original's and could not tell)
        for copy in range(100, 200):
            head = hdr.pack(hdr.STAGE_REDUCE, 1, transports[0].nonce, step, 0, 0, 0, 5,
                            4 * PER_PACKET, copy=copy)
            transports[1].sock.sendto(head[:hdr.SEQ_OFFSET] + os.urandom(8 + hdr.TAG_BYTES)
                                      + bytes(4 * PER_PACKET), transports[0].endpoints[0])

    return run_variant("received_mean", seed, steps=3, key=KEY,
                       before_step=copies if copies_in_flight else None)


def test_the_drop_mask_replays_with_duplicated_and_spoofed_copies_in_flight():
    plain = replayed_mask_run(7, copies_in_flight=False)
    assert sum(count for count, _ in plain) > 0
    assert replayed_mask_run(7, copies_in_flight=True) == plain
