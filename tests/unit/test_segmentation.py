"""UDP segmentation offload: one send, cut by the kernel into datagrams that each carry
their own header. Two ranks on loopback (127.0.0.1 only).

That the impairment then sees every datagram, and loses them one by one, is shown under
real kernel loss in tests/distributed/test_segmentation_loss.py."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
import torch

from harness import launch
from harness.collectives.lossy import LossyCollective
from harness.transport import header as hdr
from harness.transport import native
from harness.transport.verdicts import APPLIED, END
from testbed import profiles
from tests.unit.test_transport_hostile import make_pair


def grouping(payloads: list[int], segments: int = 7, segment_bytes: int = 144):
    """(first packet of each send, packets in it) as the compiled sender groups them."""
    sender = native.Sender(-1, 0, 0, segment_bytes, segments)
    packets = sender.plan(np.array(payloads, dtype=np.int64))
    return np.cumsum([0, *packets[:-1]]).tolist(), packets


def test_full_packets_go_in_sends_of_up_to_segments_and_a_short_one_ends_its_send():
    full = 144 - hdr.HEADER_BYTES
    assert grouping([full] * 20) == ([0, 7, 14], [7, 7, 6])
    # the kernel cuts at every segment: a short packet can only be the last of its send
    assert grouping([full] * 9 + [40] + [full] * 3 + [12]) == ([0, 7, 10], [7, 3, 4])
    assert grouping([0] * 3) == ([0, 1, 2], [1, 1, 1])  # end markers: one datagram each
    # a shard and its end markers in one call: the first marker may end the last send
    assert grouping([full] * 9 + [0] * 3) == ([0, 7, 10, 11], [7, 3, 1, 1])
    assert grouping([full] * 8 + [40] + [0] * 2) == ([0, 7, 9, 10], [7, 2, 1, 1])
    assert grouping([full] * 5, segments=1) == ([0, 1, 2, 3, 4], [1] * 5)


def test_segments_per_send_fit_one_ipv4_datagram():
    for mtu in (1500, 9000):
        segment = hdr.HEADER_BYTES + 4 * hdr.payload_floats(mtu)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            segments = native.enable_segmentation(sock, segment)
        finally:
            sock.close()
        assert 1 < segments <= native.MAX_GSO_SEGMENTS
        assert segments * segment <= native.MAX_UDP_PAYLOAD < (segments + 1) * segment \
            or segments == native.MAX_GSO_SEGMENTS


def send_and_receive(packets: int, **options):
    """Rank 1 sends one shard of `packets` packets (packet k holds the value k) and end
    markers to rank 0, which records what arrived."""
    store, (rx, tx) = make_pair(**options)
    try:
        per = tx.per_packet
        numel = per * packets - per // 2  # the last packet is short
        x = (np.arange(numel) // per).astype(np.float32)
        starts = np.arange(packets) * per
        ends = np.minimum(starts + per, numel)
        tx.send_packets(0, hdr.STAGE_REDUCE, 0, 0, 0, x, starts, ends)
        tx.send_end(0, hdr.STAGE_REDUCE, 0, 0, 0, packets, copies=2)
        got, intact, ended = set(), 0, False

        def handle(head, payload):
            nonlocal intact, ended
            if head.stage == hdr.STAGE_REDUCE_END:
                ended = True
                return END
            values = np.frombuffer(payload, dtype=np.float32)
            expected = (ends[head.index] - starts[head.index])
            intact += len(values) == expected and bool((values == head.index).all())
            got.add(head.index)
            return APPLIED

        rx.receive_until(time.monotonic() + 10, lambda: ended, handle)
        return got, intact, tx.counters, rx.counters
    finally:
        rx.close()
        tx.close()


def test_a_segmented_send_arrives_as_datagrams_with_their_own_headers():
    got, intact, sent, received = send_and_receive(100, segmentation=True)
    assert got == set(range(100)) and intact == 100
    # 100 packets at MTU 1500 in sends of up to 44 segments: 3 sends were cut by the kernel
    assert sent.segmented_sends == 3
    assert sent.packets_sent == received.packets_received == 100
    assert received.malformed == received.foreign == 0
    # the payload bytes, counted the same way on both ends (bytes_received was declared
    # and always 0 before #66)
    assert received.bytes_received == sent.bytes_sent > 0


def test_without_segmentation_nothing_is_cut():
    got, intact, sent, _ = send_and_receive(100)
    assert got == set(range(100)) and intact == 100
    assert sent.segmented_sends == 0


SO_NO_CHECK = 11  # socket(7): no UDP checksums, with which the kernel refuses UDP GSO


def test_a_route_that_refuses_segmentation_falls_back_to_single_datagrams(caplog):
    """A socket that sends without UDP checksums cannot segment (the kernel answers a cut
    send with EINVAL, as it answers EIO on a route whose device cannot checksum): the
    compiled sender sends that send and everything after it one datagram at a time, says so
    once, and loses nothing to the refusal."""
    store, (rx, tx) = make_pair(segmentation=True)
    try:
        assert tx.segments > 1
        tx.sock.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
        per = tx.per_packet
        x = np.repeat(np.arange(100, dtype=np.float32), per)
        starts = np.arange(100) * per
        with caplog.at_level("WARNING", logger="harness.transport.udp"):
            tx.send_packets(0, hdr.STAGE_REDUCE, 0, 0, 0, x, starts, starts + per, 2)
            tx.send_packets(0, hdr.STAGE_REDUCE, 0, 0, 0, x, starts, starts + per, 2)
        got = []

        def handle(head, payload):
            if head.stage == hdr.STAGE_REDUCE_END:
                return END
            got.append(head.index)
            return APPLIED

        rx.receive_until(time.monotonic() + 5, lambda: len(got) >= 200, handle)
        assert sorted(got) == sorted(list(range(100)) * 2)
        assert tx.counters.segmented_sends == 0 and tx.counters.packets_sent == 200
        assert tx.segments == 1 and tx._tx.segments == 1
        assert [r.message for r in caplog.records].count(
            "rank 1: UDP segmentation refused by the route: sending datagram by datagram "
            "from now on") == 1
    finally:
        rx.close()
        tx.close()


def test_the_lossy_allreduce_with_segmentation_equals_the_exact_mean():
    store, transports = make_pair(segmentation=True)
    try:
        collectives = [LossyCollective(t, store) for t in transports]
        xs = [torch.from_numpy(np.random.default_rng(k).standard_normal(50_001)
                               .astype(np.float32)) for k in (0, 1)]
        mean = (xs[0] + xs[1]) / 2
        threads = [threading.Thread(target=collectives[k].allreduce, args=(xs[k],))
                   for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for x in xs:
            torch.testing.assert_close(x, mean, rtol=0, atol=1e-6)
        assert all(t.counters.segmented_sends > 0 for t in transports)
        assert all(t.counters.missing == 0 for t in transports)
    finally:
        for t in transports:
            t.close()


@pytest.mark.parametrize("direction,allowed", [("ingress", True), ("egress", False),
                                               ("both", False)])
def test_segmentation_only_where_the_impairment_sees_the_cut_datagrams(direction, allowed):
    profile = profiles.load("random-loss", [f"direction={direction}"])
    assert launch.rank_settings(profile) == {"segmentation": allowed}
    assert launch.segmentation_faithful(profile) is allowed
