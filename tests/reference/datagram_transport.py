"""The datagram-at-a-time paths of the UDP transport: the reference the tests hold the
compiled, batched ones (harness/transport/udp.py) against on the same inputs. Not used in
production.

    send()            one unit cut into fragments by Python, each sealed and sent with its
                      own sendmsg (RC: one packet through go-back-N's compiled send)
    receive_until()   without a handle_batch: recvfrom one datagram at a time, the
                      screening chain, fragments copied aside until their message is whole
                      (_reassemble), then `handle` unit by unit; RC's delivered blocks
                      likewise, unit by unit
"""

from __future__ import annotations

import time

import numpy as np

from harness.transport import header as hdr
from harness.transport.early import EARLY_WINDOW_STEPS
from harness.transport.gobackn import fragments_of
from harness.transport.udp import UdpTransport

# Messages being reassembled at once, at most: each holds up to one message's bytes. Beyond
# it a fragment that would start another is dropped (counted future).
MAX_PARTIAL_MESSAGES = 4096
_ONE_START = np.zeros(1, np.int64)  # a send of one packet, from x's start (RC's send)


class DatagramTransport(UdpTransport):
    """UdpTransport with the datagram-at-a-time paths beside its own (which it keeps: a
    test of the batched path on it runs the production code)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.buffer = bytearray(65536)
        self.view = memoryview(self.buffer)
        self._partial: dict[tuple, list] = {}  # messages being reassembled
        self._partial_of = [0] * self.world  # ... of them per source
        self._reassembling = False  # in a datagram-at-a-time receive (see _hand_on)

    def next_step(self) -> int:
        step = super().next_step()
        # Messages of steps two behind can never complete any more, and none beyond the
        # early window is kept for later: count and forget them.
        stale = [k for k in self._partial if not step - 1 <= k[1] <= step + EARLY_WINDOW_STEPS]
        self.counters.messages_incomplete += len(stale)
        for key in stale:
            self._forget_partial(key)
        return step

    # ---- sending ------------------------------------------------------------------------

    def send(self, dest: int, stage: int, step: int, bucket: int, shard: int, index: int,
             count: int, payload: memoryview) -> None:
        """One unit (packet or message) to `dest`, cut into datagrams as the semantics say,
        datagram by datagram; RC's as a send of one packet (its resends need a Burst)."""
        if self.rc is not None:
            x = np.frombuffer(payload, np.float32)
            self.rc.send(dest, stage, step, bucket, shard, x, _ONE_START,
                         np.array([len(x)], np.int64), index_first=index, count=count)
            return
        size = 4 * self.fragment_floats
        fragments = int(fragments_of(len(payload) // 4, self.fragment_floats))
        for fragment in range(fragments):
            part = payload[fragment * size:(fragment + 1) * size]
            head = self._seal(hdr.pack(stage, self.rank, self.nonce, step, bucket, shard,
                                       index, count, len(part), fragment, fragments, 0, 0,
                                       dest), part)
            self._transmit(dest, head, part)

    # ---- receiving ----------------------------------------------------------------------

    def receive_until(self, deadline, done, handle, handle_batch=None) -> None:
        if handle_batch is not None:
            super().receive_until(deadline, done, handle, handle_batch)
            return
        self._reassembling = True
        try:
            if self.rc is not None:
                self._receive_delivered_units(deadline, done, handle)
            else:
                self._receive_datagrams(deadline, done, handle)
        finally:
            self._reassembling = False

    def _receive_datagrams(self, deadline, done, handle) -> None:
        sock, buffer, poller = self.sock, self.buffer, self._poller
        while not done():
            try:
                size, sender = sock.recvfrom_into(buffer)
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not poller.poll(remaining * 1000):
                    return
                continue
            self._datagram(size, sender, handle, self.view)

    def _receive_delivered_units(self, deadline, done, handle) -> None:
        """RC: what the service thread delivered, in order, unit by unit, messages
        reassembled here."""
        import queue

        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                block = self.rc.delivered.get(timeout=remaining)
            except queue.Empty:
                return
            for row in block:
                head = hdr.unpack(row)
                self._hand_on(head, memoryview(row)[hdr.HEADER_BYTES:
                                                    hdr.HEADER_BYTES + head.length], handle)

    def _hand_on(self, head: hdr.Header, payload: memoryview, handle) -> str | None:
        """In a datagram-at-a-time receive: a fragment waits in _reassemble until its
        message is whole (None meanwhile). Elsewhere: the production path."""
        if not self._reassembling:
            return super()._hand_on(head, payload, handle)
        if head.stage in hdr.STAGE_NAMES:  # a data datagram, as the production path counts
            self.counters.bytes_received += len(payload)
        if head.fragments > 1:
            whole = self._reassemble(head, payload)
            if whole is None:
                return None
            head, payload = whole
        verdict = handle(head, payload)
        self._count(verdict)
        return verdict

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
        # handed on as a unit of one datagram (a header that says fragments > 1 is a raw
        # fragment, which Step.handle takes from the batched path)
        whole = head._replace(length=entry[2], fragment=0, fragments=1)
        return whole, memoryview(entry[0])[:entry[2]]

    def _forget_partial(self, key: tuple) -> None:
        del self._partial[key]
        self._partial_of[key[0]] -= 1
