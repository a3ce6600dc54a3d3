"""The blaster (harness/bench/_blaster.c): the wire's own limit that
tests/benchmarks/bench_wire.py holds the collective against, a module of its own beside the
data plane's core."""

from __future__ import annotations

import socket
import time

import pytest

from harness.bench import _blaster
from harness.transport import header as hdr
from harness.transport import native


@pytest.mark.parametrize("segments", [1, 4])
@pytest.mark.parametrize("sealed", [False, True])
def test_the_blaster_sends_and_drains_and_checks_what_it_receives(segments, sealed):
    """On loopback: what one blaster sends to itself arrives and, sealed, checks; a
    datagram sealed with another key is counted refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    datagram = 1472
    try:
        if segments > 1:
            assert native.enable_segmentation(sock, datagram) > 1
        me = [native.sockaddr_in("127.0.0.1", sock.getsockname()[1])]
        key = bytes(16) if sealed else None
        sent, received, payload_bytes, refused, seconds = _blaster.blast(
            sock.fileno(), me, 0, datagram, segments, key, 0.2)
        assert sent > 0 and 0 < received <= sent and refused == 0
        assert payload_bytes == received * (datagram - hdr.HEADER_BYTES)
        assert 0.2 <= seconds < 1.0
        if sealed:  # one sealed with another key: refused, not counted received
            other = native.Mac(bytes(range(16)))
            head = bytearray(hdr.pack(0, 0, 0, 0, 0, 0, 0, 0, 0))
            sock.sendto(head[:hdr.TAG_OFFSET] + other.tag(bytes(head)),
                        sock.getsockname())
            time.sleep(0.05)
            drained = _blaster.blast(sock.fileno(), me, 0, datagram, 1, key, 0.0)
            assert drained[0] == 0 and drained[3] == 1
    finally:
        sock.close()


def test_the_mac_cost_times_sealing_and_checking():
    seal_s, check_s = _blaster.mac_cost(bytes(16), 1472, 2000)
    assert 0 < seal_s < 5 and 0 < check_s < 5
    with pytest.raises(ValueError, match="16 bytes"):
        _blaster.mac_cost(bytes(8), 1472, 10)
