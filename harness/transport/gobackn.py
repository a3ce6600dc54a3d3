"""Go-back-N, the way RoCE RC behaves without PFC: what roce-rc semantics runs on UDP.

Sender, per destination: every datagram gets the next packet sequence number and is kept
until acknowledged (as the send it went in: Burst). A NAK(psn) from the receiver means "a
gap before psn arrived": send again everything from psn on. No progress for the
retransmission timeout (the NAK itself may be lost) does the same from the oldest
unacknowledged packet, and doubles the timeout.

Receiver, per source: only the expected psn is accepted; a later one is dropped and answered
by one NAK per gap; an earlier one is a duplicate. A cumulative ACK goes back for every batch
the receiver reads (GoBackN._serve_batch) and whenever it goes idle. The compiled core
takes a batch's datagrams in order (native.in_order); tests/reference/gobackn_receiver.py
is the reference the tests hold it against.

GoBackN is RC's endpoint on a UDP transport, which it reaches through one declared joint
(RcWire: what the transport lends it, and nothing else). A service thread owns the socket,
as a NIC does
the acknowledging and retransmitting while the rank computes or waits elsewhere, and hands
the units delivered in order over through a queue. The decisions (ACK, NAK, when to send
again) are Python's, per batch; the per-datagram work (screen, in_order, building and sealing
sends) is the compiled core's.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.transport import header as hdr
from harness.transport import native

RC_TICK_S = 0.002  # how often a waiting RC endpoint checks its timers

RTO_INITIAL_S = 0.02
RTO_MAX_S = 1.0


@dataclass
class Burst:
    """The datagrams of one send (GoBackN.send): packet i of them is
    x[starts[i]:ends[i]], index index_first + i of `count`, its datagrams (fragments)
    psns packet_psn[i] on (packet_psn[-1]: one past the last). Kept, as that description
    and not as datagrams, to be sent again from any psn on by the compiled sender."""

    packet_psn: np.ndarray
    stage: int
    step: int
    bucket: int
    shard: int
    x: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    count: int
    index_first: int = 0
    copy: int = 0  # sent again this many times: each time a new copy number, as a new
    #                transmission (a drop mask draws afresh for it)

    @property
    def psn_first(self) -> int:
        return int(self.packet_psn[0])

    @property
    def psn_end(self) -> int:
        return int(self.packet_psn[-1])

    def position(self, psn: int) -> tuple[int, int]:
        """(packet, fragment) of the datagram with this psn."""
        packet = int(np.searchsorted(self.packet_psn, psn, side="right")) - 1
        return packet, psn - int(self.packet_psn[packet])


@dataclass
class SendFlow:
    next_psn: int = 0
    acked: int = 0  # every psn before it acknowledged
    bursts: deque = field(default_factory=deque)  # the sends not yet wholly acknowledged
    rto_s: float = RTO_INITIAL_S
    last_progress: float = field(default_factory=time.monotonic)

    @property
    def unacked(self) -> int:
        """How many datagrams sent to this peer are not acknowledged yet."""
        return self.next_psn - self.acked

    def sent(self, burst: Burst) -> None:
        self.bursts.append(burst)
        self.next_psn = burst.psn_end

    def in_window(self, psn: int) -> bool:
        """Could a receiver say this psn? Only one this sender has sent up to (an ACK or
        NAK beyond next_psn acknowledges what was never sent: forged or broken)."""
        return 0 <= psn <= self.next_psn

    def ack(self, upto: int) -> bool:
        """Everything before `upto` arrived. True if that was news."""
        if upto <= self.acked:
            return False
        self.acked = upto
        while self.bursts and self.bursts[0].psn_end <= upto:
            self.bursts.popleft()
        self.rto_s = RTO_INITIAL_S
        self.last_progress = time.monotonic()
        return True

    def from_psn(self, psn: int) -> list[tuple[Burst, int]]:
        """What to send again from `psn` on: each send holding unacknowledged datagrams
        from there, with the psn to start it at."""
        psn = max(psn, self.acked)
        return [(b, max(psn, b.psn_first)) for b in self.bursts if b.psn_end > psn]

    def timed_out(self, now: float) -> bool:
        return bool(self.unacked) and now - self.last_progress > self.rto_s

    def backoff(self, now: float) -> None:
        self.rto_s = min(self.rto_s * 2, RTO_MAX_S)
        self.last_progress = now


def fragments_of(floats, fragment_floats: int):
    """Datagrams a unit of `floats` values is cut into (an int, or per unit for an array):
    one, or as many fragments of fragment_floats as it takes. The compiled sender cuts by
    the same rule (_wire.c, Sender.send)."""
    return np.maximum(1, -(-floats // fragment_floats))


@dataclass(frozen=True)
class RcWire:
    """What go-back-N uses of its UDP transport (UdpTransport.rc_wire builds it), and nothing
    else: who this rank is, the counters both keep, the socket's receiver and poller, the
    compiled senders (the transport's, for first sends; the service thread's own, for
    sending again) and the transport's screening, counting and sealing."""

    rank: int
    world: int
    nonce: int
    fragment_floats: int
    counters: Any               # the transport's (its Counters): retransmitted, timeouts, ...
    auth: Any                   # the job key's sealing (None: unsealed)
    drop_mask: Any              # the transport's drop mask (None: none)
    receiver: Any               # native.BatchReceiver on the transport's socket
    poller: Any                 # select.poll of that socket
    addresses: list             # each rank's native sockaddr
    first_sender: Any           # native.Sender the transport sends with
    spare_sender: Any           # native.Sender of the service thread's own
    counted: Callable           # (native.Sent) -> None: a send counted as the transport's
    send_control: Callable      # (dest, head) -> None: a control datagram, sealed and sent
    screen: Callable            # (n) -> each received row's class (native.DATA, OTHER, ...)
    unmasked: Callable          # (rows) -> the rows the drop mask keeps
    take_control: Callable      # (size, view) -> None: an ACK or NAK, to on_control
    count: Callable             # (verdict, n) -> None: a verdict counted


class GoBackN:
    """RC semantics on a UDP transport's wire `t` (RcWire): its send flows and their
    retransmissions, its receiver's in-order state and answers, and the service thread that
    runs them. Lock order: `lock` (the flows) is taken inside the transport's use_lock,
    never around it."""

    def __init__(self, t: RcWire):
        self.t = t
        world, rx = t.world, t.receiver
        self.flows = [SendFlow() for _ in range(world)]
        self.controls_sent = [0] * world  # ACKs and NAKs, per peer (see _control)
        # the receiver, per source: the next psn in order (native.in_order moves it on),
        # what the last ACK to it said, the psn of the last NAK (one per gap)
        self.expected = np.zeros(world, np.int64)
        self.acked = np.zeros(world, np.int64)
        self.nak_sent_for = np.full(world, -1, np.int64)
        # what in_order writes for a batch: its rows delivered, per source the duplicates
        # and the highest psn beyond a gap
        self._in_order_rows = np.empty(rx.batch, np.int64)
        self._duplicates_of = np.zeros(world, np.int64)
        self._gap_max = np.zeros(world, np.int64)
        # the width of a delivered datagram's row (a header and one fragment)
        self._delivered_width = -(-(hdr.HEADER_BYTES + 4 * t.fragment_floats) // 64) * 64
        # the service thread sends again while the rank sends: its own compiled sender
        self.tx_again = t.spare_sender
        self.lock = threading.Lock()
        self.all_acked = threading.Condition(self.lock)  # notified when nothing is unacked
        self.delivered: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.service = threading.Thread(target=self._service_loop, daemon=True,
                                        name=f"rc-rank{t.rank}")
        self.service.start()

    def stop(self) -> None:
        self.stopping.set()
        self.service.join(5)

    # ---- sending ------------------------------------------------------------------------

    def send(self, dest, stage, step, bucket, shard, x, starts, ends,
             index_first: int = 0, count: int | None = None) -> None:
        """Every datagram (fragment) of these packets takes the next psn of the flow to
        `dest`, and the send is kept (a Burst: what it sent, not the datagrams) until
        acknowledged; then the compiled core builds, seals and sends them all at once, with
        those psns (_resend sends them again from any psn on)."""
        t, flow = self.t, self.flows[dest]
        count = len(starts) if count is None else count
        datagrams = fragments_of(ends - starts, t.fragment_floats)
        with self.lock:  # (the service thread resends and acknowledges meanwhile)
            psn_first = flow.next_psn
            packet_psn = psn_first + np.concatenate(([0], np.cumsum(datagrams)))
            flow.sent(Burst(packet_psn, stage, step, bucket, shard, x, starts, ends, count,
                            index_first))
            total = flow.next_psn - psn_first
            seq_first = t.auth.reserve(total) if t.auth is not None else 0
        t.counted(t.first_sender.send(
            to=t.addresses[dest], dest=dest, mac=t.auth.mac if t.auth else None,
            seq_first=seq_first, stage=stage, step=step, bucket=bucket, shard=shard, x=x,
            starts=starts, ends=ends, count=count, fragment_floats=t.fragment_floats,
            psn_first=psn_first, index_first=index_first))

    def _resend(self, dest: int, flow: SendFlow, psn: int) -> None:
        """Send everything unacknowledged from `psn` on again, by the compiled sender, one
        call per send it first went in: each datagram as it went (fragment, index, psn), as
        a new transmission (the send's copy number one more, freshly sealed)."""
        t, auth = self.t, self.t.auth
        for burst, first in flow.from_psn(psn):
            packet, fragment = burst.position(first)
            burst.copy = (burst.copy + 1) & 0xFFFF
            total = burst.psn_end - first
            sent = self.tx_again.send(
                to=t.addresses[dest], dest=dest, mac=auth.mac if auth else None,
                seq_first=auth.reserve(total) if auth else 0, stage=burst.stage,
                step=burst.step, bucket=burst.bucket, shard=burst.shard, x=burst.x,
                starts=burst.starts[packet:], ends=burst.ends[packet:], count=burst.count,
                fragment_floats=t.fragment_floats, psn_first=first,
                index_first=burst.index_first + packet, first_fragment=fragment,
                copy=burst.copy)
            t.counted(sent)
            t.counters.retransmitted += sent.data

    def _control(self, dest: int, stage: int, psn: int) -> None:
        """An ACK or NAK to `dest`. Each is a new transmission, numbered (copy) by how many
        went to `dest` before: the drop mask draws afresh for it, as a network loses each
        packet on its own (with one number for all, a mask that dropped one ACK of a flow
        would drop every later one, and the flow would stall for good)."""
        t = self.t
        copy = self.controls_sent[dest]
        self.controls_sent[dest] = (copy + 1) & 0xFFFF
        head = hdr.pack(stage, t.rank, t.nonce, 0, 0, 0, 0, 0, 0, psn=psn, copy=copy,
                        dest=dest)
        t.send_control(dest, head)

    # ---- receiving ----------------------------------------------------------------------

    def receive(self, deadline: float, done: Callable[[], bool], handle_batch) -> None:
        """What the service thread delivered, in order, a batch at a time, to handle_batch
        (the collective's: fragments reassembled and applied by the compiled core)."""
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                block = self.delivered.get(timeout=remaining)
            except queue.Empty:
                return
            for verdict, count in handle_batch(block, np.arange(len(block))).items():
                self.t.count(verdict, count)

    def flush(self, deadline: float) -> bool:
        """Wait until every datagram this rank sent was acknowledged, or the deadline."""
        with self.all_acked:  # (woken by the ACK that acknowledges the last of it)
            return self.all_acked.wait_for(self._nothing_unacked,
                                           max(0.0, deadline - time.monotonic()))

    def _nothing_unacked(self) -> bool:
        return not any(flow.unacked for flow in self.flows)

    def in_window(self, head: hdr.Header) -> bool:
        """Could this ACK or NAK be an answer to what we sent (flow.in_window)?"""
        return self.flows[head.source].in_window(head.psn)

    def on_control(self, head: hdr.Header) -> None:
        """An ACK or NAK that passed the screen (called with `lock` held, from a batch)."""
        flow = self.flows[head.source]
        flow.ack(head.psn)  # (a NAK for psn also acknowledges everything before it)
        if head.stage == hdr.STAGE_NAK:
            self._resend(head.source, flow, head.psn)
        if not flow.unacked and self._nothing_unacked():
            self.all_acked.notify_all()

    def _service_loop(self) -> None:
        """Read the socket a batch at a time, answer with ACKs and NAKs, retransmit, hand
        units over."""
        rx, poller = self.t.receiver, self.t.poller
        while not self.stopping.is_set():
            try:
                n = rx.receive()
            except OSError:
                return  # closed
            if n == 0:
                with self.lock:
                    self._acknowledge_all()
                    self._check_timers()
                poller.poll(RC_TICK_S * 1000)
                continue
            with self.lock:
                self._serve_batch(n)

    def _serve_batch(self, n: int) -> None:
        """A received batch, screened by the compiled core (this job's, its source's tag,
        addressed here). ACKs and NAKs go to the send flows one by one (the wire's
        take_control); the data datagrams the drop mask keeps are taken in order by the
        compiled core (native.in_order) and those it delivers go to the collective as one
        batch. Then the answers, per source: a NAK for a gap still open (one per gap), and
        one cumulative ACK for everything newly in order (not one every few datagrams: each
        is a sealed datagram and a system call), or again for duplicates (the sender resent
        what we have: our ACK was lost)."""
        t = self.t
        rx, c = t.receiver, t.counters
        classes = t.screen(n)
        for row in np.flatnonzero(classes == native.OTHER).tolist():
            view = memoryview(rx.data[row])
            if view[hdr.STAGE_OFFSET] in (hdr.STAGE_ACK, hdr.STAGE_NAK):
                t.take_control(int(rx.sizes[row]), view)
            else:
                c.malformed += 1  # an RC peer sends data, ACKs and NAKs, nothing else
        rows = np.flatnonzero(classes == native.DATA)
        if len(rows) and t.drop_mask is not None:
            rows = t.unmasked(rows)
        c.bytes_received += hdr.payload_bytes(rx.sizes[rows])  # (retransmitted copies too)
        if not len(rows):
            self._acknowledge_all()
            return
        duplicates, gap_max, expected = self._duplicates_of, self._gap_max, self.expected
        duplicates.fill(0)
        gap_max.fill(-1)
        k = native.in_order(rx.data, rows, expected=expected, delivered=self._in_order_rows,
                            duplicates=duplicates, gap_max=gap_max)
        if k:  # a copy (the buffer is read into again), a header and a fragment wide
            self.delivered.put(rx.data[self._in_order_rows[:k], :self._delivered_width])
        c.duplicates += int(duplicates.sum())
        again = duplicates > 0
        for source in np.flatnonzero(gap_max >= expected).tolist():
            if self.nak_sent_for[source] != expected[source]:
                psn = int(expected[source])
                self._control(source, hdr.STAGE_NAK, psn)
                self.nak_sent_for[source] = self.acked[source] = psn  # (a NAK acks too)
                again[source] = False
                c.naks_sent += 1
        self._acknowledge_all(again)

    def _acknowledge_all(self, again: np.ndarray | None = None) -> None:
        """A cumulative ACK to every source whose flow moved on since the last one, and to
        those in `again`."""
        owed = self.expected != self.acked
        if again is not None:
            owed |= again
        for source in np.flatnonzero(owed).tolist():
            self._control(source, hdr.STAGE_ACK, int(self.expected[source]))
        np.copyto(self.acked, self.expected)

    def _check_timers(self) -> None:
        now = time.monotonic()
        for dest, flow in enumerate(self.flows):
            if flow.timed_out(now):
                self._resend(dest, flow, flow.acked)
                self.t.counters.timeouts += 1
                flow.backoff(now)
