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
from typing import NamedTuple

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
FOREIGN, UNAUTHENTICATED, MISDIRECTED, TRUNCATED, DATA, OTHER = (
    _wire.CLS_FOREIGN, _wire.CLS_UNAUTHENTICATED, _wire.CLS_MISDIRECTED, _wire.CLS_TRUNCATED,
    _wire.CLS_DATA, _wire.CLS_OTHER)


# ---- sending --------------------------------------------------------------------------------

class Sent(NamedTuple):
    """What one call of the compiled sender sent."""

    data: int          # data datagrams (fragments counted one each)
    ends: int          # end markers
    nbytes: int        # payload bytes of the data datagrams
    segmented: int     # sends the kernel cut into several datagrams (UDP GSO)
    refused: bool      # the route refused segmentation: datagram by datagram from now on


class Sender:
    """One rank's compiled sender on socket `fd`: builds every datagram's header, seals it
    (with a Mac) and sends a shard's packets from the tensor's memory in as few system calls
    as it can (sendmmsg; UDP GSO in sends of up to `segments` datagrams of segment_bytes)."""

    def __init__(self, fd: int, rank: int, nonce: int, segment_bytes: int, segments: int):
        self._sender = _wire.Sender(fd, rank, nonce, segment_bytes, segments)

    @property
    def segments(self) -> int:
        """Datagrams one send may carry (falls to 1 when the route refuses segmentation)."""
        return self._sender.segments

    def plan(self, payload_lengths: np.ndarray) -> list[int]:
        """How packets with these payload lengths (int64) would be grouped into sends."""
        return self._sender.plan(payload_lengths)

    def send(self, *, to: bytes, dest: int, mac, seq_first: int, stage: int, step: int,
             bucket: int, shard: int, x: np.ndarray, starts: np.ndarray, ends: np.ndarray,
             count: int, copies: int = 0, first_copy: int = 0, fragment_floats: int = 0,
             psn_first: int = -1, index_first: int = 0, first_fragment: int = 0,
             copy: int = 0, indexes: np.ndarray | None = None) -> Sent:
        """Packets x[starts[i]:ends[i]] (float32; int64 bounds) of `shard` to rank `dest` at
        `to` (sockaddr_in), each index index_first + i of `count`, then `copies` end
        markers numbered from first_copy. fragment_floats > 0 cuts packets longer than
        that into fragments (UC, RC messages). mac: the sender's Mac (None: unsealed), with
        one seq per datagram reserved from seq_first. RC (psn_first >= 0): data datagram k
        carries psn psn_first + k; a resend starts at first_fragment of its first packet
        and carries `copy`. indexes (int64, one per packet): packet i says indexes[i]
        instead of index_first + i (packets of a shard that are not consecutive)."""
        return Sent(*self._sender.send(
            to, dest, mac, seq_first, stage, step, bucket & 0xFFFF, shard, x, starts, ends,
            count, hdr.END_OF[stage], copies, first_copy, fragment_floats, psn_first,
            index_first, first_fragment, copy, indexes))


# ---- receiving ------------------------------------------------------------------------------

class Screened(NamedTuple):
    """What the screen of a received batch refused, by reason (the rest: DATA or OTHER)."""

    foreign: int
    unauthenticated: int
    misdirected: int
    truncated: int


def screen(rx: BatchReceiver, n: int, *, rank: int, world: int, nonce: int, macs,
           peer_address: np.ndarray, peer_port: np.ndarray) -> Screened:
    """Classify the first n datagrams of `rx` into rx.classes: this job's (nonce, a source
    other than `rank` whose published endpoint, peer_address/peer_port by rank, sent it),
    sealed with its source's key (macs: a Mac per rank, None for oneself; None: no key),
    addressed to `rank`; then DATA (a data packet or fragment: apply checks the rest) or
    OTHER (end markers, control, bad lengths: the screening chain's, one at a time)."""
    return Screened(*_wire.screen(rx.data, rx.slot_bytes, rx.sizes, rx.addrs, rx.ports, n,
                                  rank, world, nonce, macs, peer_address, peer_port,
                                  rx.classes))


class Fragments(NamedTuple):
    """Where a stage's messages cut into fragments (UC, RC) are reassembled: message i of
    source s at staging[staging_base[s] + i * per_packet]; which fragments came (got: uint8,
    world x packets x most fragments) and how many (count: int32, world x packets)."""

    fragment_floats: int
    staging: np.ndarray
    staging_base: np.ndarray
    got: np.ndarray
    count: np.ndarray


class Applied(NamedTuple):
    """The verdicts of one apply() call, and where the others went."""

    applied: int
    duplicates: int
    malformed: int
    nonfinite: int
    stale: int
    others: int    # rows for the caller's slow path (another step or bucket, ...), in leftover
    held: int      # fragments kept until their message is whole


def apply(data: np.ndarray, rows: np.ndarray, *, step: int, bucket: int, stage: int,
          owner: int, expected: np.ndarray, last_floats: np.ndarray, base: np.ndarray,
          per_packet: int, target: np.ndarray, got: np.ndarray, pending: np.ndarray,
          ended: np.ndarray | None, add: bool, accept: bool, leftover: np.ndarray,
          fragments: Fragments | None = None) -> Applied:
    """Check the data datagrams data[rows[i]] of one stage of step `step` against what it
    expects, and apply those that fit to `target` (float32): added (reduce: `add`) or
    written. Per source (int64): `expected` packets, the last with last_floats values, packet
    i at base + i * per_packet; `got` (bool, world x packets) and `pending` say what came
    already. owner: the shard every packet must name (-1: its source's, as a broadcast's
    does). ended: where a broadcast packet marks its source's reduce stage over (None: not
    inferred). accept=False: the stage is over, its packets are stale. The rows of
    another step or bucket, or not for this stage, are written to `leftover`."""
    more = () if fragments is None else tuple(fragments)
    return Applied(*_wire.apply(
        data, data.shape[1], rows, step, bucket & 0xFFFF, stage, owner, expected, last_floats,
        base, per_packet, target, got, got.shape[1], pending, ended, add, accept, leftover,
        *more))


def in_order(data: np.ndarray, rows: np.ndarray, *, expected: np.ndarray,
             delivered: np.ndarray, duplicates: np.ndarray, gap_max: np.ndarray) -> int:
    """RC's receiver (go-back-N): of the screened data datagrams data[rows[i]], in the order
    they came, those with their source's next psn (`expected`, int64 per source, moved on)
    are written to `delivered` in order; per source, earlier psns are counted in
    `duplicates` and the highest psn beyond a gap goes to `gap_max`. How many rows were
    delivered."""
    return _wire.in_order(data, data.shape[1], rows, expected, delivered, duplicates, gap_max)

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
