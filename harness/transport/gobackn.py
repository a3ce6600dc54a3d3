"""Go-back-N, the way RoCE RC behaves without PFC: what roce-rc semantics runs on UDP.

Sender, per destination: every datagram gets the next packet sequence number and is kept
until acknowledged (as the send it went in: Burst). A NAK(psn) from the receiver means "a
gap before psn arrived": send again everything from psn on. No progress for the
retransmission timeout (the NAK itself may be lost) does the same from the oldest
unacknowledged packet, and doubles the timeout.

Receiver, per source: only the expected psn is accepted; a later one is dropped and answered
by one NAK per gap; an earlier one is a duplicate. A cumulative ACK goes back for every batch
the receiver reads (UdpTransport._serve_batch) and whenever it goes idle. The compiled core
takes a batch's datagrams in order (native.in_order); ReceiveFlow below is the reference the
tests hold it against.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

RTO_INITIAL_S = 0.02
RTO_MAX_S = 1.0


@dataclass
class Burst:
    """The datagrams of one send (UdpTransport._send_reliable): packet i of them is
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


@dataclass
class ReceiveFlow:
    """One source's flow at the receiver, datagram by datagram (the reference)."""

    expected: int = 0

    def accept(self, psn: int) -> str:
        """"deliver", "duplicate" or "gap" for an arriving psn."""
        if psn == self.expected:
            self.expected += 1
            return "deliver"
        if psn < self.expected:
            return "duplicate"
        return "gap"
