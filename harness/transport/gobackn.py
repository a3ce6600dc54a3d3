"""Go-back-N, the way RoCE RC behaves without PFC: what roce-rc semantics runs on UDP.

Sender, per destination: every datagram gets the next packet sequence number and is kept
until acknowledged. A NAK(psn) from the receiver means "a gap before psn arrived": send
again everything from psn on. No progress for the retransmission timeout (the NAK itself
may be lost) does the same from the oldest unacknowledged packet, and doubles the timeout.

Receiver, per source: only the expected psn is accepted; a later one is dropped and answered
by one NAK per gap; an earlier one is a duplicate. A cumulative ACK goes back for every batch
the receiver reads (UdpTransport._serve_batch) and whenever it goes idle. The compiled core
takes a batch's datagrams in order (native.in_order); ReceiveFlow below is the reference the
tests hold it against.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

RTO_INITIAL_S = 0.02
RTO_MAX_S = 1.0


@dataclass
class SendFlow:
    next_psn: int = 0
    unacked: OrderedDict = field(default_factory=OrderedDict)  # psn -> (header, payload)
    rto_s: float = RTO_INITIAL_S
    last_progress: float = field(default_factory=time.monotonic)

    def sent(self, psn: int, head: bytes, payload: memoryview) -> None:
        self.unacked[psn] = (head, payload)

    def in_window(self, psn: int) -> bool:
        """Could a receiver say this psn? Only one this sender has sent up to (an ACK or
        NAK beyond next_psn acknowledges what was never sent: forged or broken)."""
        return 0 <= psn <= self.next_psn

    def ack(self, upto: int) -> bool:
        """Everything before `upto` arrived. True if that was news."""
        progressed = False
        while self.unacked and next(iter(self.unacked)) < upto:
            self.unacked.popitem(last=False)
            progressed = True
        if progressed:
            self.rto_s = RTO_INITIAL_S
            self.last_progress = time.monotonic()
        return progressed

    def from_psn(self, psn: int) -> list[int]:
        """The unacknowledged psns from `psn` on."""
        return [p for p in self.unacked if p >= psn]

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
