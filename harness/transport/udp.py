"""The UDP datagram transport of the lossy collectives.

One socket per rank, bound to the host's address on the emulated link. Packets carry a
fixed header (header.py) and a payload sized to the link MTU. The loss semantics
(semantics.py) decide the unit of loss: a datagram (udp, roce-ud), a whole multi-datagram
message (roce-uc), or nothing at all at the price of go-back-N retransmission (roce-rc).
Without RC there is no retransmission: a receiver waits until everything it expects arrived
or its deadline passed, and the collective rebuilds what is missing. Sending is zero-copy
(the header and a view of the tensor go out in one sendmsg, or many in one sendmmsg);
receiving goes into one preallocated buffer. A link's rate is the profile's (netem
`rate_mbit`), not the sender's.

Endpoints (with each transport's salt: auth.py) and the job's nonce are exchanged through
torch.distributed's TCPStore. Every datagram that is not for this job (wrong magic, nonce,
source), that is not sealed with its source's key (auth.py: derived from the job key given
to the ranks at launch, never over the network), that was addressed to another rank, or
that does not fit what is expected (bad length, stage, shard, index, fragments; stale or
future step; values that are not finite), is dropped and counted under its reason, never
applied. The per-datagram work of every semantics (cutting UC and RC messages into
fragments and reassembling them, RC's taking datagrams in order and its resends included) is
compiled code (native.py, _wire.c), called once per batch; RC's go-back-N decisions (ACK,
NAK, when to send again) are Python's, in a service thread, per batch. `send` (but RC's)
and the datagram-at-a-time receive (no handle_batch) are the reference the tests hold the
compiled paths against. An optional seeded drop
mask (dropmask.py) loses datagrams at the receiver, replayably, where the kernel cannot
(hardware RoCE): in the batched path it decides on each screened datagram's header between
the core's screen and its apply.
"""

from __future__ import annotations

import logging
import queue
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
from harness.transport.early import EARLY_WINDOW_STEPS, EarlyStash
from harness.transport.gobackn import Burst, SendFlow
from harness.transport.screening import screen
from harness.transport.semantics import Semantics
from harness.transport.verdicts import MALFORMED, Counters, count_verdict

log = logging.getLogger(__name__)

# SO_*BUFFORCE let root go past net.core.[rw]mem_max; others get the plain options, capped
SO_RCVBUFFORCE, SO_SNDBUFFORCE = 33, 32
BUFFER_OPTIONS = ((SO_RCVBUFFORCE, socket.SO_RCVBUF), (SO_SNDBUFFORCE, socket.SO_SNDBUF))
DEFAULT_BUFFER_BYTES = 64 << 20
RC_TICK_S = 0.002  # how often a waiting RC endpoint checks its timers
# Messages being reassembled at once by the datagram-at-a-time reference (_reassemble), at
# most: each holds up to one message's bytes.
# Beyond it a fragment that would start another is dropped (counted future).
MAX_PARTIAL_MESSAGES = 4096

_NO_VALUES = np.zeros(0, np.float32)  # what end markers alone carry (send_end)
_NO_PACKETS = np.zeros(0, np.int64)
_ONE_START = np.zeros(1, np.int64)  # a send of one packet, from x's start (RC's send)


def fragments_of(floats, fragment_floats: int):
    """Datagrams a unit of `floats` values is cut into (an int, or per unit for an array):
    one, or as many fragments of fragment_floats as it takes. The compiled sender cuts by
    the same rule (_wire.c, Sender.send)."""
    return np.maximum(1, -(-floats // fragment_floats))


class UdpTransport:
    """segmentation=True lets batched sends hand the kernel up to ~64 KB at a time, cut
    into MTU-sized datagrams by UDP GSO after the sender's own hooks. Every datagram still
    carries its own header. Say so only when the impairment sits at receivers' ingress
    (launch.transport_env decides it from the profile): an impairment at the sender's egress
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
        # sender (end_markers.LateEndSender) for each send between steps:
        # the sender, the MAC's nonces and the counters are one thread's at a time. close()
        # takes it too, so nothing sends on a socket once closed (its descriptor number may
        # be another socket's by then).
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
        self.buffer = bytearray(65536)
        self.view = memoryview(self.buffer)
        self._step = 0
        self.stash = EarlyStash()  # packets of coming steps that came early, kept for them
        self._partial: dict[tuple, list] = {}  # messages being reassembled (_reassemble)
        self._partial_of = [0] * world  # ... of them per source
        self._send_flows = [SendFlow() for _ in range(world)]
        self._controls_sent = [0] * world  # ACKs and NAKs, per peer (see _control)
        # Endpoints, salts and the nonce, through the rendezvous store
        host, bound_port = self.sock.getsockname()
        self.nonce, published = endpoints.exchange(store, key_prefix, rank, world,
                                                   [host, bound_port], self.auth)
        self.endpoints: list[tuple[str, int]] = [(h, int(p)) for h, p in published]
        self.sources = {ep: r for r, ep in enumerate(self.endpoints)}
        # batched: received packets reach the collective a batch at a time (handle_batch),
        # UC and RC fragments reassembled there by the compiled core (step.Stage holds
        # their staging area). RC's come from its service thread, in order.
        self.batched = True
        # Every semantics sends and receives through the compiled core: RC too, whose
        # service thread reads batches (recvmmsg, screen), takes them in order
        # (native.in_order) and answers; its sends take their psns from the flow in Python
        # (go-back-N's decisions are policy, and stay there).
        self._rx = native.BatchReceiver(self.sock, slot_bytes=max(mtu, 2048))
        if self.semantics.reliable:
            # RC's receiver, per source: the next psn in order (native.in_order moves it
            # on), what the last ACK to it said, the psn of the last NAK (one per gap)
            self._expected = np.zeros(world, np.int64)
            self._acked = np.zeros(world, np.int64)
            self._nak_sent_for = np.full(world, -1, np.int64)
            # what in_order writes for a batch: its rows delivered, per source the
            # duplicates and the highest psn beyond a gap
            self._in_order_rows = np.empty(self._rx.batch, np.int64)
            self._duplicates_of = np.zeros(world, np.int64)
            self._gap_max = np.zeros(world, np.int64)
            # the width of a delivered datagram's row (a header and one fragment)
            self._delivered_width = -(-(hdr.HEADER_BYTES + 4 * self.fragment_floats) // 64) * 64
        # Segmentation: the kernel cuts one send into many datagrams (UDP GSO), which
        # saves most of the sender's per-datagram work. Only where the impairment sees
        # the cut datagrams (at the receiver's ingress): see UdpTransport's docstring.
        # Chosen once, here, and logged below.
        segment = hdr.HEADER_BYTES + 4 * min(self.fragment_floats, self.per_packet)
        segments = native.enable_segmentation(self.sock, segment) if segmentation else 1
        self._tx = native.Sender(self.sock.fileno(), rank, self.nonce, segment, segments)
        # RC's service thread sends again (go-back-N) while the rank sends: its own sender
        self._tx_again = (native.Sender(self.sock.fileno(), rank, self.nonce, segment,
                                        segments) if self.semantics.reliable else None)
        self._sockaddrs = [native.sockaddr_in(h, p) for h, p in self.endpoints]
        self._peer_address = np.array([native.ipv4(h) for h, _ in self.endpoints],
                                      dtype=np.uint32)
        self._peer_port = np.array([p for _, p in self.endpoints], dtype=np.uint16)
        if self.semantics.reliable:
            # RC: acknowledgements and retransmissions must go on while the rank computes or
            # waits elsewhere, as a NIC does them: a thread owns the socket and hands the
            # delivered units over through a queue.
            self._lock = threading.Lock()
            # notified when an ACK leaves nothing unacknowledged (flush waits on it)
            self._all_acked = threading.Condition(self._lock)
            self._delivered: queue.Queue = queue.Queue()
            self._stopping = threading.Event()
            self._service = threading.Thread(target=self._service_loop, daemon=True,
                                             name=f"rc-rank{rank}")
            self._service.start()
        sending = (f"UDP GSO, {self.segments} datagrams a send" if self.segments > 1
                   else "sendmmsg")
        log.info("rank %d: UDP transport on %s:%d, MTU %d, %s (%d floats per unit), nonce %x, "
                 "%s, %s", rank, host, bound_port, mtu, self.semantics, self.per_packet,
                 self.nonce, sending,
                 "authenticated" if self.auth else "NOT authenticated (no job key)")

    @property
    def segments(self) -> int:
        """Datagrams one send may carry (1: no UDP GSO); the sender's own count, which
        falls to 1 if the route refuses segmentation."""
        return self._tx.segments

    @property
    def authenticated(self) -> bool:
        return self.auth is not None

    def close(self) -> None:
        if self.semantics.reliable:
            self._stopping.set()
            self._service.join(5)
        with self.use_lock:
            self.closed = True
            self.sock.close()

    def next_step(self) -> int:
        """The number of the next collective step: every rank calls collectives in the same
        order, so the numbers agree across ranks."""
        step = self._step
        self._step += 1
        # Messages of steps two behind can never complete any more, and none beyond the
        # early window is kept for later (see _reassemble): count and forget them.
        stale = [k for k in self._partial if not step - 1 <= k[1] <= step + EARLY_WINDOW_STEPS]
        self.counters.messages_incomplete += len(stale)
        for key in stale:
            self._forget_partial(key)
        return step

    # ---- sending ------------------------------------------------------------------------

    def send(self, dest: int, stage: int, step: int, bucket: int, shard: int, index: int,
             count: int, payload: memoryview) -> None:
        """One unit (packet or message) to `dest`, cut into datagrams as the semantics say:
        datagram by datagram from Python (the reference the compiled sender is held
        against), but RC's, which go as a send of one packet (its resends need a Burst)."""
        if self.semantics.reliable:
            x = np.frombuffer(payload, np.float32)
            self._send_reliable(dest, stage, step, bucket, shard, x, _ONE_START,
                                np.array([len(x)], np.int64), index_first=index, count=count)
            return
        size = 4 * self.fragment_floats
        fragments = int(fragments_of(len(payload) // 4, self.fragment_floats))
        for fragment in range(fragments):
            part = payload[fragment * size:(fragment + 1) * size]
            head = self._seal(self._pack(dest, stage, step, bucket, shard, fragment,
                                         fragments, index, count, len(part), 0), part)
            self._transmit(dest, head, part)

    def send_packets(self, dest: int, stage: int, step: int, bucket: int, shard: int,
                     x: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                     end_copies: int = 0) -> None:
        """All packets of one shard to `dest` at once (batched transports):
        packet i carries x[starts[i]:ends[i]] (float32), sent straight from x's memory.
        Then `end_copies` end markers (see send_end), in the same system call."""
        n = len(starts)
        if self.semantics.reliable:
            self._send_reliable(dest, stage, step, bucket, shard, x, starts, ends)
            if n and end_copies:
                self.send_end(dest, stage, step, bucket, shard, n, end_copies)
            return
        self._send_batch(dest, stage, step, bucket, shard, x, starts, ends, n,
                         end_copies if n else 0, 0)

    def _send_reliable(self, dest, stage, step, bucket, shard, x, starts, ends,
                       index_first: int = 0, count: int | None = None) -> None:
        """RC: every datagram (fragment) of these packets takes the next psn of the flow to
        `dest`, and the send is kept (a Burst: what it sent, not the datagrams) until
        acknowledged; then the compiled core builds, seals and sends them all at once, with
        those psns (_resend sends them again from any psn on)."""
        flow = self._send_flows[dest]
        count = len(starts) if count is None else count
        datagrams = fragments_of(ends - starts, self.fragment_floats)
        with self._lock:  # (the service thread resends and acknowledges meanwhile)
            psn_first = flow.next_psn
            packet_psn = psn_first + np.concatenate(([0], np.cumsum(datagrams)))
            flow.sent(Burst(packet_psn, stage, step, bucket, shard, x, starts, ends, count,
                            index_first))
            total = flow.next_psn - psn_first
            seq_first = self.auth.reserve(total) if self.auth is not None else 0
        data, _, nbytes, segmented, refused = self._tx.send(
            self._sockaddrs[dest], dest, self.auth.mac if self.auth else None, seq_first,
            stage, step, bucket & 0xFFFF, shard, x, starts, ends, count, hdr.END_OF[stage], 0,
            0, self.fragment_floats, psn_first, index_first)
        self._sent(data, 0, nbytes, segmented, refused)

    def _send_batch(self, dest, stage, step, bucket, shard, x, starts, ends, count, copies,
                    first_copy) -> None:
        """Packets x[starts[i]:ends[i]] and `copies` end markers, built, sealed and sent by
        the compiled core in one call."""
        total = self._datagrams(starts, ends) + copies
        auth = self.auth
        data, ends_went, nbytes, segmented, refused = self._tx.send(
            self._sockaddrs[dest], dest, auth.mac if auth else None,
            auth.reserve(total) if auth else 0, stage, step, bucket & 0xFFFF, shard, x,
            starts, ends, count, hdr.END_OF[stage], copies, first_copy, self.fragment_floats)
        self._sent(data, ends_went, nbytes, segmented, refused)

    def _sent(self, data: int, ends_went: int, nbytes: int, segmented: int,
              refused: bool) -> None:
        """Count what one call of the compiled sender sent."""
        if refused:
            log.warning("rank %d: UDP segmentation refused by the route: sending datagram "
                        "by datagram from now on", self.rank)
        c = self.counters
        c.segmented_sends += segmented
        c.packets_sent += data
        c.ends_sent += ends_went
        c.bytes_sent += nbytes

    def _datagrams(self, starts: np.ndarray, ends: np.ndarray) -> int:
        """How many datagrams these packets go in: one each, or (UC, RC) one per fragment."""
        if self.max_fragments == 1:
            return len(starts)
        return int(fragments_of(ends - starts, self.fragment_floats).sum())

    def send_end(self, dest: int, stage: int, step: int, bucket: int, shard: int, count: int,
                 copies: int, first_copy: int = 0) -> None:
        """Tell `dest` that all `count` packets of `shard` for `stage` went out: `copies`
        end markers (header only), after the data on the same path, numbered from
        first_copy (markers sent again later are new transmissions, not replays)."""
        self._send_batch(dest, stage, step, bucket, shard, _NO_VALUES, _NO_PACKETS,
                         _NO_PACKETS, count, copies, first_copy)  # all in one system call

    def _pack(self, dest, stage, step, bucket, shard, fragment, fragments, index, count,
              length, psn, copy=0) -> bytes:
        return hdr.pack(stage, self.rank, self.nonce, step, bucket, shard, index, count, length,
                        fragment, fragments, psn, copy, dest)

    def _seal(self, head: bytes, payload) -> bytes:
        """The header with its seq and tag (unchanged without a job key)."""
        return head if self.auth is None else self.auth.seal(head, payload)

    def _resend(self, dest: int, flow: SendFlow, psn: int) -> None:
        """RC: send everything unacknowledged from `psn` on again, by the compiled sender,
        one call per send it first went in: each datagram as it went (fragment, index,
        psn), as a new transmission (the send's copy number one more, freshly sealed)."""
        auth = self.auth
        for burst, first in flow.from_psn(psn):
            packet, fragment = burst.position(first)
            burst.copy = (burst.copy + 1) & 0xFFFF
            total = burst.psn_end - first
            data, _, nbytes, segmented, refused = self._tx_again.send(
                self._sockaddrs[dest], dest, auth.mac if auth else None,
                auth.reserve(total) if auth else 0, burst.stage, burst.step,
                burst.bucket & 0xFFFF, burst.shard, burst.x, burst.starts[packet:],
                burst.ends[packet:], burst.count, hdr.END_OF[burst.stage], 0, 0,
                self.fragment_floats, first, burst.index_first + packet, fragment, burst.copy)
            self._sent(data, 0, nbytes, segmented, refused)
            self.counters.retransmitted += data

    def _transmit(self, dest: int, head: bytes, payload) -> None:
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

    def _control(self, dest: int, stage: int, psn: int) -> None:
        """An ACK or NAK to `dest`. Each is a new transmission, numbered (copy) by how many
        went to `dest` before: the drop mask draws afresh for it, as a network loses each
        packet on its own. (With one number for all, a mask that dropped one ACK of a flow
        dropped every later one: the flow stalled for good.)"""
        copy = self._controls_sent[dest]
        self._controls_sent[dest] = (copy + 1) & 0xFFFF
        head = hdr.pack(stage, self.rank, self.nonce, 0, 0, 0, 0, 0, 0, psn=psn, copy=copy,
                        dest=dest)
        self._transmit(dest, self._seal(head, b""), b"")

    # ---- receiving ----------------------------------------------------------------------

    def receive_until(self, deadline: float, done: Callable[[], bool],
                      handle: Callable[[hdr.Header, memoryview], str],
                      handle_batch: Callable | None = None) -> None:
        """Feed valid units of this job to `handle` until `done()` or the deadline
        (time.monotonic()). `handle` says what it did with each one, for the counters.
        handle_batch(data, rows), where the transport batches, takes many plain data
        packets at once, screened (this job's, sealed by their source, addressed here): the
        receive buffer `data` (one datagram a row) and the row of each packet in it; it
        returns how many packets got each verdict."""
        if self.semantics.reliable:
            self._receive_delivered(deadline, done, handle, handle_batch)
            return
        if handle_batch is not None:
            self._receive_batches(deadline, done, handle, handle_batch)
            return
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
            self._datagram(size, sender, handle, self.view)

    def _receive_batches(self, deadline, done, handle, handle_batch) -> None:
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
        markers, control, bad lengths) through _datagram, one at a time, which counts it
        exactly as the datagram path does. A drop mask decides on the data datagrams here,
        after the screen and before they are applied: where _datagram decides on the
        others."""
        rx = self._rx
        classes = self._screen(n)
        rows = np.flatnonzero(classes == native.DATA)
        if len(rows) and self.drop_mask is not None:
            rows = self._unmasked(rows)
        if len(rows):
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

    def _receive_delivered(self, deadline, done, handle, handle_batch) -> None:
        """RC: what the service thread delivered, in order, a batch at a time: to
        handle_batch (the collective's: fragments reassembled and applied by the compiled
        core), or where the caller has none (tests) to handle, unit by unit, messages
        reassembled here (_reassemble)."""
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                block = self._delivered.get(timeout=remaining)
            except queue.Empty:
                return
            if handle_batch is not None:
                for verdict, count in handle_batch(block, np.arange(len(block))).items():
                    self._count(verdict, count)
                continue
            for row in block:
                head = hdr.unpack(row)
                self._hand_on(head, memoryview(row)[hdr.HEADER_BYTES:
                                                    hdr.HEADER_BYTES + head.length], handle)

    def device_counters(self) -> dict[str, int]:
        return {}  # the kernel's socket is the device: its drops are in /proc/net/snmp

    def flush(self, deadline: float) -> bool:
        """RC: wait until every datagram this rank sent was acknowledged, or the deadline."""
        if not self.semantics.reliable:
            return True
        with self._all_acked:  # (woken by the ACK that acknowledges the last of it)
            return self._all_acked.wait_for(self._nothing_unacked,
                                            max(0.0, deadline - time.monotonic()))

    def _nothing_unacked(self) -> bool:
        return not any(flow.unacked for flow in self._send_flows)

    def _service_loop(self) -> None:
        """RC: read the socket a batch at a time, answer with ACKs and NAKs, retransmit,
        hand units over."""
        rx = self._rx
        while not self._stopping.is_set():
            try:
                n = rx.receive()
            except OSError:
                return  # closed
            if n == 0:
                with self._lock:
                    self._acknowledge_all()
                    self._check_timers()
                self._poller.poll(RC_TICK_S * 1000)
                continue
            with self._lock:
                self._serve_batch(n)

    def _serve_batch(self, n: int) -> None:
        """RC: a received batch, screened by the compiled core (this job's, its source's
        tag, addressed here). ACKs and NAKs go to the send flows one by one (_datagram);
        the data datagrams the drop mask keeps are taken in order by the compiled core
        (native.in_order: go-back-N's receiver) and those it delivers go to the collective
        as one batch. Then the answers, per source: a NAK for a gap still open (one per
        gap), and one cumulative ACK for everything newly in order (not one every few
        datagrams: each is a sealed datagram and a system call), or again for duplicates
        (the sender resent what we have: our ACK was lost)."""
        rx, c = self._rx, self.counters
        classes = self._screen(n)
        for row in np.flatnonzero(classes == native.OTHER).tolist():
            view = memoryview(rx.data[row])
            if view[hdr.STAGE_OFFSET] in (hdr.STAGE_ACK, hdr.STAGE_NAK):
                self._datagram(int(rx.sizes[row]), None, None, view, checked=True)
            else:
                c.malformed += 1  # an RC peer sends data, ACKs and NAKs, nothing else
        rows = np.flatnonzero(classes == native.DATA)
        if len(rows) and self.drop_mask is not None:
            rows = self._unmasked(rows)
        if not len(rows):
            self._acknowledge_all()
            return
        duplicates, gap_max, expected = self._duplicates_of, self._gap_max, self._expected
        duplicates.fill(0)
        gap_max.fill(-1)
        k = native.in_order(rx.data, rx.slot_bytes, rows, expected, self._in_order_rows,
                            duplicates, gap_max)
        if k:  # a copy (the buffer is read into again), a header and a fragment wide
            self._delivered.put(rx.data[self._in_order_rows[:k], :self._delivered_width])
        c.duplicates += int(duplicates.sum())
        again = duplicates > 0
        for source in np.flatnonzero(gap_max >= expected).tolist():
            if self._nak_sent_for[source] != expected[source]:
                psn = int(expected[source])
                self._control(source, hdr.STAGE_NAK, psn)
                self._nak_sent_for[source] = self._acked[source] = psn  # (a NAK acks too)
                again[source] = False
                c.naks_sent += 1
        self._acknowledge_all(again)

    def _screen(self, n: int) -> np.ndarray:
        """The compiled core's verdict on the n datagrams of a received batch, what it
        refused counted: the class of each row (native.DATA and OTHER: this job's, sealed
        by its source, addressed here)."""
        rx, c = self._rx, self.counters
        foreign, forged, misdirected, truncated = native.screen(
            rx.data, rx.slot_bytes, rx.sizes, rx.addrs, rx.ports, n, self.rank, self.world,
            self.nonce, self.auth.macs if self.auth is not None else None,
            self._peer_address, self._peer_port, rx.classes)
        c.foreign += foreign
        c.unauthenticated += forged
        c.misdirected += misdirected
        c.truncated += truncated
        return rx.classes[:n]

    def _datagram(self, size: int, sender, handle, view: memoryview,
                  checked: bool = False) -> str | None:
        """Check one datagram, hand it on, count it; returns the verdict counted (None for
        RC control, and for a fragment of a message not yet whole). checked: screened by
        the compiled core (this job's, from the endpoint of the source it names, its tag
        good: sender unused)."""
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
            if not self._send_flows[head.source].in_window(head.psn):
                c.malformed += 1
                return MALFORMED
            self._on_control(head)
            return None
        return self._hand_on(head, view[hdr.HEADER_BYTES:size], handle)

    def _hand_on(self, head: hdr.Header, payload: memoryview, handle) -> str | None:
        """A datagram's unit to `handle`, counted: a fragment waits in _reassemble until its
        message is whole (None meanwhile)."""
        if head.fragments > 1:
            whole = self._reassemble(head, payload)
            if whole is None:
                return None
            head, payload = whole
        verdict = handle(head, payload)
        self._count(verdict)
        return verdict

    def _count(self, verdict: str, count: int = 1) -> None:
        count_verdict(self.counters, verdict, count)

    def _reassemble(self, head: hdr.Header, payload: memoryview):
        """A message's fragments, copied aside until all are there; then the whole message.
        A message missing any fragment is never handed on (RoCE UC: lost whole)."""
        # The fragment count sizes the buffer: checked against what a unit can be first
        if head.fragment >= head.fragments or head.fragments > self.max_fragments \
                or head.length > 4 * self.fragment_floats:
            self.counters.malformed += 1
            return None
        key = (head.source, head.step, head.stage, head.shard, head.index)
        entry = self._partial.get(key)
        if entry is None:
            # Only steps that can still be used start a message (the current one, the one
            # before, the early window), and each source has its share of the room: a peer
            # (or a replay) cannot fill it for the others.
            if not self._step - 2 <= head.step < self._step + EARLY_WINDOW_STEPS:
                self.counters.future += 1
                return None
            if self._partial_of[head.source] >= MAX_PARTIAL_MESSAGES // self.world:
                self.counters.future += 1
                return None
            self._partial_of[head.source] += 1
            entry = self._partial[key] = [bytearray(4 * self.fragment_floats * head.fragments),
                                          set(), 0, head.fragments]
        if entry[3] != head.fragments:  # fragments of one message disagree on their number
            self.counters.malformed += 1
            return None
        if head.fragment in entry[1]:
            self.counters.duplicates += 1
            return None
        start = head.fragment * 4 * self.fragment_floats
        entry[0][start:start + head.length] = payload
        entry[1].add(head.fragment)
        entry[2] += head.length
        if len(entry[1]) < head.fragments:
            return None
        self._forget_partial(key)
        # handed on as a unit of one datagram: a header that says fragments > 1 is a raw
        # fragment (step.Step.handle takes those from the batched path)
        whole = head._replace(length=entry[2], fragment=0, fragments=1)
        return whole, memoryview(entry[0])[:entry[2]]

    def _forget_partial(self, key: tuple) -> None:
        del self._partial[key]
        self._partial_of[key[0]] -= 1

    def _on_control(self, head: hdr.Header) -> None:
        flow = self._send_flows[head.source]
        flow.ack(head.psn)  # (a NAK for psn also acknowledges everything before it)
        if head.stage == hdr.STAGE_NAK:
            self._resend(head.source, flow, head.psn)
        if not flow.unacked and self._nothing_unacked():
            self._all_acked.notify_all()

    def _acknowledge_all(self, again: np.ndarray | None = None) -> None:
        """RC: a cumulative ACK to every source whose flow moved on since the last one,
        and to those in `again`."""
        owed = self._expected != self._acked
        if again is not None:
            owed |= again
        for source in np.flatnonzero(owed).tolist():
            self._control(source, hdr.STAGE_ACK, int(self._expected[source]))
        np.copyto(self._acked, self._expected)

    def _check_timers(self) -> None:
        now = time.monotonic()
        for dest, flow in enumerate(self._send_flows):
            if flow.timed_out(now):
                self._resend(dest, flow, flow.acked)
                self.counters.timeouts += 1
                flow.backoff(now)
