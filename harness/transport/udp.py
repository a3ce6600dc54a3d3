"""The UDP datagram transport of the lossy collectives.

One socket per rank, bound to the host's address on the emulated link. Packets carry a
fixed header (header.py) and a payload sized to the link MTU. There is no retransmission:
a receiver waits until everything it expects arrived or its deadline passed, and the
collective rebuilds what is missing. Sending is zero-copy (the header and a view of the
tensor go out in one sendmsg) and paced to a rate; receiving goes into one preallocated
buffer from which the collective copies payloads straight into its tensors.

Endpoints and the job's nonce are exchanged through torch.distributed's TCPStore. Every
datagram that is not for this job (wrong magic, nonce, source), or that does not fit what
is expected (bad length, stage, shard, index; stale or future step), is dropped and counted,
never applied.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from harness.transport import header as hdr

log = logging.getLogger(__name__)

# SO_*BUFFORCE let root go past net.core.[rw]mem_max; others get the plain options, capped
SO_RCVBUFFORCE, SO_SNDBUFFORCE = 33, 32
BUFFER_OPTIONS = ((SO_RCVBUFFORCE, socket.SO_RCVBUF), (SO_SNDBUFFORCE, socket.SO_SNDBUF))
DEFAULT_BUFFER_BYTES = 64 << 20

# What a packet handler says about a packet it was given
APPLIED, DUPLICATE, STALE, FUTURE, MALFORMED = "applied", "duplicate", "stale", "future", \
    "malformed"


@dataclass
class Counters:
    packets_sent: int = 0
    bytes_sent: int = 0
    packets_received: int = 0     # applied
    bytes_received: int = 0
    missing: int = 0              # expected but not there at the deadline
    late: int = 0                 # for a step already finished
    early: int = 0                # for the next step: kept and applied when it starts
    future: int = 0               # too far ahead: dropped
    duplicates: int = 0
    foreign: int = 0              # not lossbed's, wrong nonce, unknown source
    malformed: int = 0            # bad length, stage, shard or index

    def to_dict(self) -> dict:
        return asdict(self)


class TransportError(RuntimeError):
    pass


class UdpTransport:
    def __init__(self, rank: int, world: int, address: str, store, *, mtu: int = 1500,
                 port: int = 0, rate_mbit: float = 0.0, buffer_bytes: int = DEFAULT_BUFFER_BYTES,
                 key_prefix: str = "lossbed/udp"):
        self.rank, self.world, self.mtu = rank, world, mtu
        self.per_packet = hdr.payload_floats(mtu)
        self.rate_bytes_s = rate_mbit * 1e6 / 8 if rate_mbit else 0.0
        self.counters = Counters()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for forced, plain in BUFFER_OPTIONS:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, forced, buffer_bytes)
            except PermissionError:
                self.sock.setsockopt(socket.SOL_SOCKET, plain, buffer_bytes)
        self.sock.bind((address, port))
        self.sock.setblocking(False)
        self._poller = select.poll()
        self._poller.register(self.sock, select.POLLIN)
        self.buffer = bytearray(65536)
        self.view = memoryview(self.buffer)
        self._pace_next = 0.0
        self._step = 0
        self.stash: list = []  # packets of the next step that came early, kept for it
        # Exchange endpoints and the nonce through the rendezvous store.
        host, bound_port = self.sock.getsockname()
        store.set(f"{key_prefix}/ep/{rank}", f"{host}:{bound_port}")
        if rank == 0:
            store.set(f"{key_prefix}/nonce", str(int.from_bytes(os.urandom(8), "big")))
        self.nonce = int(store.get(f"{key_prefix}/nonce"))
        self.endpoints: list[tuple[str, int]] = []
        for peer in range(world):
            text = store.get(f"{key_prefix}/ep/{peer}").decode()
            peer_host, peer_port = text.rsplit(":", 1)
            self.endpoints.append((peer_host, int(peer_port)))
        self.sources = {ep: r for r, ep in enumerate(self.endpoints)}
        log.info("rank %d: UDP transport on %s:%d, MTU %d (%d floats per packet), nonce %x",
                 rank, host, bound_port, mtu, self.per_packet, self.nonce)

    def close(self) -> None:
        self.sock.close()

    def next_step(self) -> int:
        """The number of the next collective step: every rank calls collectives in the same
        order, so the numbers agree across ranks."""
        step = self._step
        self._step += 1
        return step

    # ---- sending ------------------------------------------------------------------------

    def send(self, dest: int, stage: int, step: int, bucket: int, shard: int, index: int,
             count: int, payload: memoryview) -> None:
        head = hdr.HEADER.pack(hdr.MAGIC, hdr.VERSION, stage, self.rank, self.nonce, step,
                               bucket, shard, 0, index, count, len(payload))
        if self.rate_bytes_s:
            self._pace(len(head) + len(payload) + hdr.IPV4_UDP_OVERHEAD)
        try:
            self.sock.sendmsg([head, payload], [], 0, self.endpoints[dest])
        except OSError as err:
            # ENOBUFS/EAGAIN under pressure: the packet is lost like one on the wire
            log.debug("rank %d: send to %d failed: %s", self.rank, dest, err)
            return
        self.counters.packets_sent += 1
        self.counters.bytes_sent += len(payload)

    def _pace(self, nbytes: int) -> None:
        now = time.perf_counter()
        if self._pace_next < now:
            self._pace_next = now
        self._pace_next += nbytes / self.rate_bytes_s
        wait = self._pace_next - now
        if wait > 200e-6:  # sleep in chunks; short gaps are covered by the burst
            time.sleep(wait)

    # ---- receiving ----------------------------------------------------------------------

    def receive_until(self, deadline: float, done: Callable[[], bool],
                      handle: Callable[[hdr.Header, memoryview], str]) -> None:
        """Feed valid packets of this job to `handle` until `done()` or the deadline
        (time.monotonic()). `handle` says what it did with each one, for the counters."""
        c = self.counters
        sock, buffer, poller = self.sock, self.buffer, self._poller
        while not done():
            try:
                size, sender = sock.recvfrom_into(buffer)
            except BlockingIOError:
                # Nothing queued: sleep in poll() until a packet or the deadline. Packets
                # usually come in bursts, so most receives skip this system call.
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not poller.poll(remaining * 1000):
                    return
                continue
            head = hdr.unpack(self.view[:size])
            if head is None or head.nonce != self.nonce or head.source >= self.world \
                    or self.sources.get(sender) != head.source or head.source == self.rank:
                c.foreign += 1
                continue
            if head.length != size - hdr.HEADER_BYTES or head.length % 4:
                c.malformed += 1
                continue
            verdict = handle(head, self.view[hdr.HEADER_BYTES:size])
            if verdict == APPLIED:
                c.packets_received += 1
                c.bytes_received += head.length
            elif verdict == DUPLICATE:
                c.duplicates += 1
            elif verdict == STALE:
                c.late += 1
            elif verdict == FUTURE:
                c.future += 1
            elif verdict == "early":
                c.early += 1
            else:
                c.malformed += 1
