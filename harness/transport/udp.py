"""The UDP datagram transport of the lossy collectives.

One socket per rank, bound to the host's address on the emulated link. Packets carry a
fixed header (header.py) and a payload sized to the link MTU. The loss semantics
(semantics.py) decide the unit of loss: a datagram (udp, roce-ud), a whole multi-datagram
message (roce-uc), or nothing at all at the price of go-back-N retransmission (roce-rc,
gobackn.py). Without RC there is no retransmission: a receiver waits until everything it
expects arrived or its deadline passed, and the collective rebuilds what is missing. A
link's rate is the profile's (netem `rate_mbit`), not the sender's.

Every datagram's work is the compiled core's (native.py, _wire.c), one call per batch:
sends are built, sealed and sent from the tensor's memory (sendmmsg, or UDP GSO), receives
come a batch at a time (recvmmsg) and are screened (this job's, sealed by their source,
addressed here) before the collective applies them. What the screen leaves for Python (end
markers, ACKs and NAKs, bad lengths) goes through the one screening chain (screening.py),
one at a time. Every datagram that is not for this job, not sealed with its source's key
(auth.py: derived from the job key given to the ranks at launch, never over the network),
addressed to another rank, or that does not fit what is expected, is dropped and counted
under its reason, never applied. Endpoints, salts and the job's nonce are exchanged through
the rendezvous store (endpoints.py). An optional seeded drop mask (dropmask.py) loses
datagrams at the receiver, replayably, where the kernel cannot (hardware RoCE): it decides
on each screened datagram's header between the core's screen and its apply.

The datagram-at-a-time paths the tests hold these against are
tests/reference/datagram_transport.py.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Callable

import numpy as np

from harness.transport import endpoints, native
from harness.transport import header as hdr
from harness.transport.auth import PacketAuth
from harness.transport.dropmask import DropMask
from harness.transport.early import EarlyStash
from harness.transport.gobackn import GoBackN, RcWire, fragments_of
from harness.transport.screening import screen
from harness.transport.semantics import Semantics
from harness.transport.verdicts import MALFORMED, Counters, count_verdict

log = logging.getLogger(__name__)

# SO_*BUFFORCE let root go past net.core.[rw]mem_max; others get the plain options, capped
SO_RCVBUFFORCE, SO_SNDBUFFORCE = 33, 32
BUFFER_OPTIONS = ((SO_RCVBUFFORCE, socket.SO_RCVBUF), (SO_SNDBUFFORCE, socket.SO_SNDBUF))
DEFAULT_BUFFER_BYTES = 64 << 20

_NO_VALUES = np.zeros(0, np.float32)  # what end markers alone carry (send_end)
_NO_PACKETS = np.zeros(0, np.int64)

__all__ = ["UdpTransport", "fragments_of"]


class UdpTransport:
    """segmentation=True lets batched sends hand the kernel up to ~64 KB at a time, cut
    into MTU-sized datagrams by UDP GSO after the sender's own hooks. Every datagram still
    carries its own header. Say so only when the impairment sits at receivers' ingress
    (launch.segmentation_faithful decides it from the profile): an impairment at the sender's egress
    would see the uncut send and lose up to 64 KB of packets as one."""

    def __init__(self, rank: int, world: int, address: str, store, *, mtu: int = 1500,
                 port: int = 0, buffer_bytes: int = DEFAULT_BUFFER_BYTES,
                 key_prefix: str = "lossbed/udp", semantics: Semantics | None = None,
                 drop_mask: DropMask | None = None, segmentation: bool = False,
                 key: bytes | None = None):
        self.rank, self.world, self.mtu = rank, world, mtu
        # The job key (auth.py): without one (a transport made outside a launch) datagrams
        # go unsealed and are taken on their nonce and source address alone.
        self.auth = PacketAuth(key, rank, key_prefix) if key is not None else None
        self.semantics = semantics or Semantics()
        self.fragment_floats = self.semantics.fragment_floats(mtu)
        self.per_packet = self.semantics.slot_floats(mtu)  # what the collective rebuilds
        # the most datagrams one unit is cut into (a message claiming more is malformed)
        self.max_fragments = -(-self.per_packet // self.fragment_floats)
        # this rank's own verdicts (one mask may be handed to every rank of a process)
        self.drop_mask = drop_mask.for_receiver(rank) if drop_mask is not None else None
        self.counters = Counters()
        # Held by whoever uses the transport from a step, and by a collective's background
        # sender (end_markers.LateEndSender) for each send between steps: the sender, the
        # MAC's nonces and the counters are one thread's at a time. close() takes it too, so
        # nothing sends on a socket once closed (its descriptor number may be another
        # socket's by then).
        self.use_lock = threading.RLock()
        self.closed = False
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
        self._step = 0
        self.stash = EarlyStash()  # packets of coming steps that came early, kept for them
        # Endpoints, salts and the nonce, through the rendezvous store
        host, bound_port = self.sock.getsockname()
        self.nonce, published = endpoints.exchange(store, key_prefix, rank, world,
                                                   [host, bound_port], self.auth)
        self.endpoints: list[tuple[str, int]] = [(h, int(p)) for h, p in published]
        self.sources = {ep: r for r, ep in enumerate(self.endpoints)}
        # Received packets reach the collective a batch at a time (handle_batch), UC and RC
        # fragments reassembled there by the compiled core (step.Stage holds their staging
        # area). RC's come from its service thread, in order.
        self.batched = True
        self._rx = native.BatchReceiver(self.sock, slot_bytes=max(mtu, 2048))
        # Segmentation: the kernel cuts one send into many datagrams (UDP GSO), which
        # saves most of the sender's per-datagram work. Only where the impairment sees
        # the cut datagrams (at the receiver's ingress): see the class's docstring.
        self.segment_bytes = hdr.HEADER_BYTES + 4 * min(self.fragment_floats, self.per_packet)
        self.segments_asked = (native.enable_segmentation(self.sock, self.segment_bytes)
                               if segmentation else 1)
        self._tx = native.Sender(self.sock.fileno(), rank, self.nonce, self.segment_bytes,
                                 self.segments_asked)
        self._sockaddrs = [native.sockaddr_in(h, p) for h, p in self.endpoints]
        self._peer_address = np.array([native.ipv4(h) for h, _ in self.endpoints], np.uint32)
        self._peer_port = np.array([p for _, p in self.endpoints], dtype=np.uint16)
        # RC: go-back-N's flows and the service thread that runs them (gobackn.py)
        self.rc = GoBackN(rc_wire(self)) if self.semantics.reliable else None
        sending = f"UDP GSO, {self.segments} datagrams a send" if self.segments > 1 else "sendmmsg"
        log.info("rank %d: UDP transport on %s:%d, MTU %d, %s (%d floats per unit), nonce %x, "
                 "%s, %s", rank, host, bound_port, mtu, self.semantics, self.per_packet,
                 self.nonce, sending,
                 "authenticated" if self.auth else "NOT authenticated (no job key)")

    @property
    def segments(self) -> int:  # datagrams one send may carry (1: no GSO, or it was refused)
        return self._tx.segments

    @property
    def authenticated(self) -> bool:
        return self.auth is not None

    def take_stash(self) -> EarlyStash:
        """The units kept for coming steps (the contract's take_stash)."""
        stash, self.stash = self.stash, EarlyStash()
        return stash

    def close(self) -> None:
        if self.rc is not None:
            self.rc.stop()
        with self.use_lock:
            self.closed = True
            self.sock.close()

    def next_step(self) -> int:
        """The next collective step's number (the same on every rank: one order of calls)."""
        step = self._step
        self._step += 1
        return step

    # ---- sending ------------------------------------------------------------------------

    def send_packets(self, dest: int, stage: int, step: int, bucket: int, shard: int,
                     x: np.ndarray, starts: np.ndarray, ends: np.ndarray, end_copies: int = 0,
                     *, indexes: np.ndarray | None = None, count: int | None = None) -> None:
        """All packets of one shard (or those `indexes` names, of `count`: contract.py) to
        `dest` at once: packet i carries x[starts[i]:ends[i]] (float32), sent straight from
        x's memory. Then `end_copies` end markers (see send_end), in the same system call."""
        n = len(starts) if count is None else count
        if self.rc is not None:
            if indexes is not None:
                raise ValueError("indexes: RC sends a shard's packets by runs, not by index")
            self.rc.send(dest, stage, step, bucket, shard, x, starts, ends)
            if n and end_copies:
                self.send_end(dest, stage, step, bucket, shard, n, end_copies)
            return
        self._send_batch(dest, stage, step, bucket, shard, x, starts, ends, n,
                         end_copies if n else 0, 0, indexes)

    def send_end(self, dest: int, stage: int, step: int, bucket: int, shard: int, count: int,
                 copies: int, first_copy: int = 0) -> None:
        """Tell `dest` that all `count` packets of `shard` for `stage` went out: `copies`
        end markers (header only), after the data on the same path, numbered from
        first_copy (markers sent again later are new transmissions, not replays)."""
        self._send_batch(dest, stage, step, bucket, shard, _NO_VALUES, _NO_PACKETS,
                         _NO_PACKETS, count, copies, first_copy)  # all in one system call

    def _send_batch(self, dest, stage, step, bucket, shard, x, starts, ends, count, copies,
                    first_copy, indexes=None) -> None:
        """The packets and `copies` end markers, built, sealed and sent in one compiled call."""
        total = self._datagrams(starts, ends) + copies
        auth = self.auth
        self._sent(self._tx.send(
            to=self._sockaddrs[dest], dest=dest, mac=auth.mac if auth else None,
            seq_first=auth.reserve(total) if auth else 0, stage=stage, step=step,
            bucket=bucket, shard=shard, x=x, starts=starts, ends=ends, indexes=indexes,
            count=count, copies=copies, first_copy=first_copy,
            fragment_floats=self.fragment_floats))

    def _sent(self, sent: native.Sent) -> None:
        """Count what one call of the compiled sender sent."""
        if sent.refused:
            log.warning("rank %d: UDP segmentation refused by the route: sending datagram "
                        "by datagram from now on", self.rank)
        c = self.counters
        c.segmented_sends += sent.segmented
        c.packets_sent += sent.data
        c.ends_sent += sent.ends
        c.bytes_sent += sent.nbytes

    def _datagrams(self, starts: np.ndarray, ends: np.ndarray) -> int:
        """How many datagrams these packets go in: one each, or (UC, RC) one per fragment."""
        if self.max_fragments == 1:
            return len(starts)
        return int(fragments_of(ends - starts, self.fragment_floats).sum())

    def _seal(self, head: bytes, payload) -> bytes:
        """The header with its seq and tag (unchanged without a job key)."""
        return head if self.auth is None else self.auth.seal(head, payload)

    def _transmit(self, dest: int, head: bytes, payload) -> None:
        """One datagram from Python (RC's ACKs and NAKs)."""
        while True:
            try:
                self.sock.sendmsg([head, payload], [], 0, self.endpoints[dest])
                break
            except BlockingIOError:
                # The send buffer is full: wait for room rather than lose the datagram here.
                select.select([], [self.sock], [], 0.01)
            except OSError as err:
                log.debug("rank %d: send to %d failed: %s", self.rank, dest, err)
                return
        self.counters.packets_sent += 1
        self.counters.bytes_sent += len(payload)

    # ---- receiving ----------------------------------------------------------------------

    def receive_until(self, deadline: float, done: Callable[[], bool],
                      handle: Callable[[hdr.Header, memoryview], str],
                      handle_batch: Callable) -> None:
        """Feed the units of this job to the collective until `done()` or the deadline
        (time.monotonic()). handle_batch(data, rows) takes many data packets at once,
        screened (this job's, sealed by their source, addressed here): the receive buffer
        `data` (one datagram a row) and the row of each packet in it; it returns how many
        packets got each verdict. `handle` takes the others (end markers) one at a time and
        says what it did with each, for the counters."""
        if self.rc is not None:
            self.rc.receive(deadline, done, handle_batch)
            return
        rx, poller = self._rx, self._poller
        while not done():
            n = rx.receive()
            if n == 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not poller.poll(remaining * 1000):
                    return
                continue
            self._batch(n, handle, handle_batch)

    def _batch(self, n: int, handle, handle_batch) -> None:
        """Screen a batch in the compiled core (this job's, its source's tag, addressed
        here); data packets and UC fragments go to handle_batch, everything else valid (end
        markers, control, bad lengths) through _datagram, one at a time. A drop mask decides
        on the data datagrams here, after the screen and before they are applied: where
        _datagram decides on the others."""
        rx = self._rx
        classes = self._screen(n)
        rows = np.flatnonzero(classes == native.DATA)
        if len(rows) and self.drop_mask is not None:
            rows = self._unmasked(rows)
        if len(rows):
            self.counters.bytes_received += hdr.payload_bytes(rx.sizes[rows])
            for verdict, count in handle_batch(rx.data, rows).items():
                self._count(verdict, count)
        others = np.flatnonzero(classes == native.OTHER).tolist()
        if not others:
            return
        if self.drop_mask is not None:
            # each copy of an end marker is its own transmission, with its own verdict
            for row in others:
                self._datagram(int(rx.sizes[row]), None, handle,
                               memoryview(rx.data[row]), checked=True)
            return
        # End markers come in identical copies (several usually in one batch): the first of
        # each goes through _datagram, the others get the verdict it got.
        first, copies = [], {}  # (what a marker says: its header up to the copy number)
        for row in others:
            head = rx.data[row]
            if (rx.sizes[row] == hdr.HEADER_BYTES
                    and head[hdr.STAGE_OFFSET] >= hdr.STAGE_REDUCE_END
                    and head[hdr.FRAGMENTS_OFFSET:hdr.FRAGMENTS_OFFSET + 2].tobytes()
                    == b"\0\1"):
                seen = copies.setdefault(head[:hdr.DEST_OFFSET - 2].tobytes(), [row, 0])
                seen[1] += 1
            else:
                first.append(row)
        extra = {row: times - 1 for row, times in copies.values()}
        for row in sorted(first + list(extra)):
            verdict = self._datagram(int(rx.sizes[row]), None, handle,
                                     memoryview(rx.data[row]), checked=True)
            if extra.get(row) and verdict is not None:
                self._count(verdict, extra[row])

    def _unmasked(self, rows: np.ndarray) -> np.ndarray:
        """The rows of screened data packets that the drop mask keeps; the others are
        counted masked. The mask decides on each packet's header (DropMask.drops: its one
        definition, the same call the datagram path makes), in the order they came."""
        data, drops = self._rx.data, self.drop_mask.drops
        kept = np.fromiter((not drops(hdr.unpack(data[row])) for row in rows.tolist()),
                           dtype=bool, count=len(rows))
        self.counters.masked += len(rows) - int(np.count_nonzero(kept))
        return rows[kept]

    def device_counters(self) -> dict[str, int]:
        return {}  # the kernel's socket is the device: its drops are in /proc/net/snmp

    def flush(self, deadline: float) -> bool:
        """RC: wait until every datagram this rank sent was acknowledged, or the deadline."""
        return True if self.rc is None else self.rc.flush(deadline)

    def _screen(self, n: int) -> np.ndarray:
        """The compiled core's verdict on the n datagrams of a received batch, what it
        refused counted: the class of each row (native.DATA and OTHER: this job's, sealed
        by its source, addressed here)."""
        rx, c = self._rx, self.counters
        refused = native.screen(rx, n, rank=self.rank, world=self.world, nonce=self.nonce,
                                macs=self.auth.macs if self.auth is not None else None,
                                peer_address=self._peer_address, peer_port=self._peer_port)
        c.foreign += refused.foreign
        c.unauthenticated += refused.unauthenticated
        c.misdirected += refused.misdirected
        c.truncated += refused.truncated
        return rx.classes[:n]

    def _datagram(self, size: int, sender, handle, view: memoryview,
                  checked: bool = False) -> str | None:
        """Check one datagram (the screening chain), hand it on, count it; returns the
        verdict counted (None for RC control). checked: screened by the compiled core
        (this job's, from the endpoint of the source it names, its tag good: sender
        unused)."""
        c = self.counters
        head = hdr.unpack(view[:size])
        from_source = (head is not None and head.source < self.world
                       and head.source != self.rank and self.sources.get(sender) == head.source)
        refused = screen(head, view, size, rank=self.rank, nonce=self.nonce,
                         from_source=from_source, auth=self.auth, drop_mask=self.drop_mask,
                         counters=c, checked=checked)
        if refused is not None:
            return refused
        if head.stage in (hdr.STAGE_ACK, hdr.STAGE_NAK):
            if self.rc is None or not self.rc.in_window(head):
                c.malformed += 1
                return MALFORMED
            self.rc.on_control(head)
            return None
        return self._hand_on(head, view[hdr.HEADER_BYTES:size], handle)

    def _hand_on(self, head: hdr.Header, payload: memoryview, handle) -> str:
        """A unit to `handle`, counted. Fragments of messages all come through the batched
        path (the compiled core takes them): one here is malformed (its fragment number is
        not below its count, or a marker that claims to be cut)."""
        if head.fragments != 1:
            self.counters.malformed += 1
            return MALFORMED
        self.counters.bytes_received += len(payload) if head.stage in hdr.STAGE_NAMES else 0
        verdict = handle(head, payload)
        self._count(verdict)
        return verdict

    def _count(self, verdict: str, count: int = 1) -> None:
        count_verdict(self.counters, verdict, count)


def rc_wire(t: UdpTransport) -> RcWire:
    """What go-back-N may use of transport `t` (RC semantics), and nothing else."""
    return RcWire(
        rank=t.rank, world=t.world, nonce=t.nonce, fragment_floats=t.fragment_floats,
        counters=t.counters, auth=t.auth, drop_mask=t.drop_mask, receiver=t._rx,
        poller=t._poller, addresses=t._sockaddrs, first_sender=t._tx,
        spare_sender=native.Sender(t.sock.fileno(), t.rank, t.nonce, t.segment_bytes,
                                   t.segments_asked),
        counted=t._sent, send_control=lambda dest, head: t._transmit(dest, t._seal(head, b""), b""),
        screen=t._screen, unmasked=t._unmasked,
        take_control=lambda size, view: t._datagram(size, None, None, view, checked=True),
        count=t._count)
