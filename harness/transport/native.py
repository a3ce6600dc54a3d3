"""The Python face of the compiled data plane (_wire.c): what it is given, and its buffers.

Per datagram there is only work that _wire.c does, one call per batch: build and seal
headers and send them (UDP GSO where the socket has it, sendmmsg otherwise), recvmmsg,
screen (this job's, from the peer it names, that peer's tag, addressed to this rank), and
apply one stage's data packets to the tensor. Python decides everything else once per
batch or stage: layouts, deadlines, estimators, counters, the drop mask.

There is no pure-Python fallback in production: a transport that finds the module missing
stops with the command that builds it. The numpy code of the same rules
(tests/reference/numpy_apply.py) is the reference the tests hold the compiled core against.
"""

from __future__ import annotations

import socket

import numpy as np

from harness.transport import header as hdr

try:
    from harness.transport import _wire
except ImportError as err:  # pragma: no cover - a tree that was never built
    raise ImportError(
        "lossbed's compiled data plane (harness/transport/_wire.c) is not built in this "
        f"tree ({err}). Run `make setup` (or `.venv/bin/pip install -e .`): it compiles it "
        "with the system's C compiler against OpenSSL's libcrypto (Debian: gcc, "
        "python3-dev, libssl-dev)") from None

# _wire.c writes the header itself: it must be header.py's, field for field.
_AGREE = {"HEADER_BYTES": hdr.HEADER_BYTES, "SEQ_OFFSET": hdr.SEQ_OFFSET,
          "TAG_OFFSET": hdr.TAG_OFFSET, "MAGIC": hdr.MAGIC, "VERSION": hdr.VERSION,
          "DEST_OFFSET": hdr.DEST_OFFSET}
_DISAGREE = {k: (getattr(_wire, k), v) for k, v in _AGREE.items() if getattr(_wire, k) != v}
if _DISAGREE:  # pragma: no cover - a stale build
    raise ImportError(f"harness/transport/_wire is stale (compiled, header.py): {_DISAGREE}; "
                      "run `make setup` to rebuild it")

Mac = _wire.Mac
Sender = _wire.Sender
screen = _wire.screen
apply = _wire.apply
in_order = _wire.in_order
blast = _wire.blast
mac_cost = _wire.mac_cost
FOREIGN, UNAUTHENTICATED, MISDIRECTED, TRUNCATED, DATA, OTHER = (
    _wire.CLS_FOREIGN, _wire.CLS_UNAUTHENTICATED, _wire.CLS_MISDIRECTED, _wire.CLS_TRUNCATED,
    _wire.CLS_DATA, _wire.CLS_OTHER)

SOL_UDP, UDP_SEGMENT = 17, 103
MAX_UDP_PAYLOAD = 65507  # one IPv4 datagram
MAX_GSO_SEGMENTS = 64    # UDP_MAX_SEGMENTS of older kernels (6.x allow 128)


def enable_segmentation(sock: socket.socket, segment_bytes: int) -> int:
    """Ask the kernel to cut every send longer than `segment_bytes` into datagrams of
    `segment_bytes` (UDP GSO). Returns how many segments one send may carry; 1 where the
    kernel cannot (then every packet goes as its own datagram)."""
    try:
        sock.setsockopt(SOL_UDP, UDP_SEGMENT, segment_bytes)
    except OSError:
        return 1
    return max(1, min(MAX_GSO_SEGMENTS, MAX_UDP_PAYLOAD // segment_bytes))


def sockaddr_in(address: str, port: int) -> bytes:
    """A struct sockaddr_in (Linux: family in host order, then port and address in network
    order, then 8 bytes of zero), as sendmmsg takes it."""
    return (socket.AF_INET.to_bytes(2, "little") + port.to_bytes(2, "big")
            + socket.inet_aton(address) + bytes(8))


def ipv4(address: str) -> int:
    return int.from_bytes(socket.inet_aton(address), "big")


class BatchReceiver:
    """Up to `batch` datagrams per recvmmsg into rows of one preallocated buffer, with each
    one's size (-1: longer than a row, cut) and sender. Larger batches cost less per
    datagram: the collective's Python work is per batch."""

    def __init__(self, sock: socket.socket, slot_bytes: int, batch: int = 256):
        slot_bytes = -(-slot_bytes // 64) * 64  # rows aligned: payloads are read as float32
        self.batch, self.slot_bytes = batch, slot_bytes
        self.data = np.zeros((batch, slot_bytes), np.uint8)
        self.sizes = np.zeros(batch, np.int64)
        self.addrs = np.zeros(batch, np.uint32)
        self.ports = np.zeros(batch, np.uint16)
        self.classes = np.zeros(batch, np.int8)
        self._rx = _wire.Receiver(sock.fileno(), self.data, slot_bytes, self.sizes,
                                  self.addrs, self.ports)

    def receive(self) -> int:
        """How many datagrams arrived (0: none queued). Rows 0..n-1 of `data` hold them."""
        return self._rx.receive()
