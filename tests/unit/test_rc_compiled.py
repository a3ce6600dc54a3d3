"""RoCE RC semantics through the compiled core: its sends built, sealed and sent by the
compiled sender with the psns go-back-N gives them (kept for resending), its service
thread reading batches screened by the compiled core and taking them in order there
(native.in_order, held against tests/reference/gobackn_receiver.py), its units reaching
the collective a batch at a time. The go-back-N decisions (ACK, NAK, resend, timeout) stay
in Python. Loopback ranks only (127.0.0.1)."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import time

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.collectives import lossy
from harness.collectives.lossy import LossyCollective
from harness.collectives.step import Step
from harness.reproduce.loopback import on_every_rank
from harness.transport import gobackn, native
from harness.transport import header as hdr
from harness.transport.dropmask import DropMask
from harness.transport.semantics import Semantics
from harness.transport.udp import UdpTransport
from tests.reference import numpy_apply
from tests.reference.gobackn_receiver import ReceiveFlow
from tests.unit.test_native_core import KEY
from tests.unit.test_transport_hostile import make_pair
from tests.unit.test_uc_fragments import raw_datagrams


class CountingSender:
    """A transport's compiled sender, its calls counted."""

    def __init__(self, real, calls: list):
        self.real, self.calls, self.segments = real, calls, real.segments

    def send(self, **fields):
        self.calls.append(fields)
        return self.real.send(**fields)


@contextlib.contextmanager
def rc_sending_to_a_sink():
    """Two RC ranks on loopback, (t0, t1, sink, calls): rank 1 sends to `sink`, a plain
    socket, in rank 0's place, its service thread stopped (nothing resent behind the test's
    back) and the calls of its compiled senders counted in `calls`."""
    _, (t0, t1) = make_pair(semantics=Semantics.parse("roce-rc:16384"), key=KEY)
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    calls = []
    try:
        t1.rc.stopping.set()
        t1.rc.service.join(5)
        t1.endpoints[0] = sink.getsockname()
        t1._sockaddrs[0] = native.sockaddr_in(*sink.getsockname())
        t1._tx = CountingSender(t1._tx, calls)
        t1.rc.t = dataclasses.replace(t1.rc.t, first_sender=t1._tx)  # (the wire lends it)
        t1.rc.tx_again = CountingSender(t1.rc.tx_again, calls)
        yield t0, t1, sink, calls
    finally:
        sink.close()
        t0.close()
        t1.close()


def datagrams_by_the_rule(t1, x, starts, ends, psn_first, copy=0) -> list[bytes]:
    """What RC must send for these packets (step 4, bucket 1, shard 0, to rank 0), by the
    rule of fragments_of and header.pack, datagram by datagram, seq and tag left 0."""
    out, psn, size = [], psn_first, t1.fragment_floats
    for index, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        fragments = int(gobackn.fragments_of(end - start, size))
        for fragment in range(fragments):
            part = x[start + fragment * size:min(end, start + (fragment + 1) * size)].tobytes()
            out.append(hdr.pack(hdr.STAGE_REDUCE, 1, t1.nonce, 4, 1, 0, index, len(starts),
                                len(part), fragment, fragments, psn, copy, 0) + part)
            psn += 1
    return out


def assert_same_but_seal(got: list[bytes], want: list[bytes], auth) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a[:hdr.SEQ_OFFSET] == b[:hdr.SEQ_OFFSET]
        assert a[hdr.HEADER_BYTES:] == b[hdr.HEADER_BYTES:]
        assert auth.check(a, len(a))


def test_rc_sends_are_the_datagrams_of_the_rule_with_the_flows_psns():
    """RC's sends, a batch of messages (send_packets) and one message at a time (send),
    through the compiled sender, one call each: the datagrams that fragments_of and
    header.pack say, psns running on from one call to the next. On the old code `send`
    went datagram by datagram (1 compiled call for the three sends)."""
    with rc_sending_to_a_sink() as (t0, t1, sink, calls):
        per_message = t1.per_packet
        x = np.random.default_rng(2).standard_normal(2 * per_message - 7).astype(np.float32)
        starts = np.array([0, per_message], np.int64)
        ends = np.array([per_message, len(x)], np.int64)
        t1.send_packets(0, hdr.STAGE_REDUCE, 4, 1, 0, x, starts, ends)
        batched = raw_datagrams(sink)
        view = memoryview(x).cast("B")
        for index in range(2):
            t1.send(0, hdr.STAGE_REDUCE, 4, 1, 0, index, 2,
                    view[4 * int(starts[index]):4 * int(ends[index])])
        one_by_one = raw_datagrams(sink)
    assert len(calls) == 3
    n = 2 * -(-per_message // t1.fragment_floats)
    assert_same_but_seal(batched, datagrams_by_the_rule(t1, x, starts, ends, 0), t0.auth)
    assert_same_but_seal(one_by_one, datagrams_by_the_rule(t1, x, starts, ends, n), t0.auth)


def test_go_back_n_resends_from_the_nak_through_the_compiled_sender():
    """A NAK for psn p: everything from p on sent again by the compiled sender, one call
    per send it came from, each datagram as it went first (fragment, index, psn) but its
    copy number (one more: a new transmission) and its seal; what came before p counted
    acknowledged. A timeout sends everything unacknowledged again, copy 2. On the old code
    resends went datagram by datagram from Python (no compiled call)."""
    with rc_sending_to_a_sink() as (t0, t1, sink, calls):
        per_message = t1.per_packet
        x = np.random.default_rng(3).standard_normal(3 * per_message - 5).astype(np.float32)
        starts = np.array([0, per_message, 2 * per_message], np.int64)
        ends = np.array([per_message, 2 * per_message, len(x)], np.int64)
        t1.send_packets(0, hdr.STAGE_REDUCE, 4, 1, 0, x, starts[:2], ends[:2])
        t1.send_packets(0, hdr.STAGE_REDUCE, 4, 1, 0, x, starts, ends)
        first = raw_datagrams(sink)
        calls.clear()
        fragments = -(-per_message // t1.fragment_floats)  # of a message (12)
        p = fragments + 1  # the second fragment of the second message of the first send
        nak = hdr.unpack(hdr.pack(hdr.STAGE_NAK, 0, t1.nonce, 0, 0, 0, 0, 0, 0, psn=p,
                                  dest=1))
        with t1.rc.lock:
            t1.rc.on_control(nak)
        again = raw_datagrams(sink)
        resends = len(calls)
        flow = t1.rc.flows[0]
        acked_after_nak, unacked_after_nak = flow.acked, flow.unacked
        with t1.rc.lock:
            flow.last_progress -= 10
            t1.rc._check_timers()
        timed_out = raw_datagrams(sink)
    want = (datagrams_by_the_rule(t1, x, starts[:2], ends[:2], 0, copy=1)[p:]
            + datagrams_by_the_rule(t1, x, starts, ends, 2 * fragments, copy=1))
    assert resends == 2 and len(first) == 5 * fragments
    assert_same_but_seal(again, want, t0.auth)
    assert acked_after_nak == p and unacked_after_nak == len(first) - p
    assert_same_but_seal(timed_out, [d[:44] + b"\0\2" + d[46:] for d in want], t0.auth)


def exact_rc_allreduces(mask: DropMask, steps: int, numel: int) -> list:
    """Two loopback ranks, RC (16 KiB messages), sealed, under `mask`: `steps` all-reduces
    of seeded values, each checked exact; the ranks' counters."""
    store, transports = make_pair(semantics=Semantics.parse("roce-rc:16384"), key=KEY,
                                  drop_mask=mask)
    try:
        collectives = [LossyCollective(t, store) for t in transports]
        for step in range(steps):
            xs = [torch.from_numpy(np.random.default_rng((step, k)).standard_normal(
                numel).astype(np.float32)) for k in (0, 1)]
            exact = (xs[0] + xs[1]) / 2
            on_every_rank(2, lambda r, xs=xs: collectives[r].allreduce(xs[r]))
            for x in xs:
                torch.testing.assert_close(x, exact, rtol=0, atol=1e-6)
        return [t.counters for t in transports]
    finally:
        for t in transports:
            t.close()


def test_rc_through_the_compiled_core_delivers_everything_under_a_drop_mask(monkeypatch):
    """Two loopback ranks, RC, a 10% drop mask (data, ACKs and NAKs alike): every
    all-reduce exact, losses made good by resends, and the service threads read their
    sockets through the compiled core's screen (on the old code: datagram by datagram,
    0 screened batches)."""
    screened = []
    real_screen = native.screen

    def counting_screen(*args, **fields):
        screened.append(1)
        return real_screen(*args, **fields)

    monkeypatch.setattr(native, "screen", counting_screen)
    counters = exact_rc_allreduces(DropMask(5, 0.1), steps=3, numel=20_000)
    assert all(c.masked > 0 and c.retransmitted > 0 for c in counters)
    assert all(c.missing == 0 and c.unauthenticated == 0 for c in counters)
    assert len(screened) > 0


class FirstTransmissionOfControlLost(DropMask):
    """A network that loses the first transmission of every ACK and NAK (and nothing
    else): a receiver must get through by sending it again, as a new datagram."""

    def drops(self, head) -> bool:
        return head.stage in (hdr.STAGE_ACK, hdr.STAGE_NAK) and head.copy == 0


def test_every_ack_and_nak_is_a_new_transmission_with_its_own_verdict(monkeypatch):
    """An ACK or NAK sent again (the receiver's answer to a resend) is another packet on
    the network: the drop mask draws for it afresh. Before, every control datagram of a
    flow had one identity (copy 0, no step or index), so a mask that dropped one dropped
    them all: a seed could stall an RC flow for good (here: RankLost at the stage
    timeout)."""
    monkeypatch.setattr(lossy, "RC_STAGE_TIMEOUT_S", 5.0)
    store, transports = make_pair(semantics=Semantics.parse("roce-rc:16384"), key=KEY,
                                  drop_mask=FirstTransmissionOfControlLost(1, 0.5))
    try:
        collectives = [LossyCollective(t, store) for t in transports]
        xs = [torch.full((20_000,), float(k)) for k in (1, 3)]
        on_every_rank(2, lambda r: collectives[r].allreduce(xs[r]))
        counters = [t.counters for t in transports]
    finally:
        for t in transports:
            t.close()
    assert all(torch.equal(x, torch.full((20_000,), 2.0)) for x in xs)
    assert all(c.masked > 0 and c.missing == 0 for c in counters)


def test_rc_messages_are_applied_by_the_compiled_core():
    """The units RC's service thread delivers (whole messages, in order) are checked and
    applied by the compiled core's apply, one call each, not by the numpy reference
    (tests/reference/numpy_apply.py), whose pass per 64 KiB message cost a quarter of an RC
    all-reduce's time on loopback (py-spy)."""
    applied, referenced = [], []
    real_apply, real_reference = native.apply, numpy_apply.apply

    def counting_apply(*args, **fields):
        applied.append(1)
        return real_apply(*args, **fields)

    def counting_reference(self, *args):
        referenced.append(1)
        return real_reference(self, *args)

    native.apply, numpy_apply.apply = counting_apply, counting_reference
    store, transports = make_pair(semantics=Semantics.parse("roce-rc:16384"), key=KEY)
    try:
        collectives = [LossyCollective(t, store) for t in transports]
        xs = [torch.full((20_000,), float(k)) for k in (1, 3)]
        on_every_rank(2, lambda r: collectives[r].allreduce(xs[r]))
    finally:
        native.apply, numpy_apply.apply = real_apply, real_reference
        for t in transports:
            t.close()
    assert all(torch.equal(x, torch.full((20_000,), 2.0)) for x in xs)
    assert applied and not referenced


def test_a_receiver_acknowledges_a_batch_once():
    """RC: one cumulative ACK per source for a batch it read, not one every 16 (ACK_EVERY, then)
    datagrams (each ACK is a sealed datagram and a system call in Python). 64 in-order
    datagrams in one batch: one ACK, for all 64. On the old code: 4 (every 16), and no
    _serve_batch."""
    _, (t0, t1) = make_pair(semantics=Semantics.parse("roce-rc:16384"), key=KEY)
    try:
        t0.rc.stopping.set()  # this test reads t0's socket itself
        t0.rc.service.join(5)
        t1.rc.flows[0].rto_s = 60.0  # no resend while t0 is not reading
        x = np.zeros(64 * t1.fragment_floats, np.float32)
        starts = np.arange(64, dtype=np.int64) * t1.fragment_floats
        t1.send_packets(0, hdr.STAGE_REDUCE, 0, 0, 0, x, starts, starts + t1.fragment_floats)
        time.sleep(0.2)
        n = t0._rx.receive()
        assert n == 64
        t0.rc._serve_batch(n)
        assert t0.rc.controls_sent[1] == 1 and t0.rc.expected[1] == 64
        deadline = time.monotonic() + 2  # ... and that one ACK released all 64 at t1
        while t1.rc.flows[0].unacked and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not t1.rc.flows[0].unacked
    finally:
        t0.close()
        t1.close()


def psn_rows(stream: list[tuple[int, int]], slot: int = 128) -> np.ndarray:
    """A receive buffer with one header a row: (source, psn) each, nothing else set."""
    data = np.zeros((max(1, len(stream)), slot), np.uint8)
    for row, (source, psn) in enumerate(stream):
        head = hdr.pack(hdr.STAGE_REDUCE, source, 1, 0, 0, 0, 0, 1, 0, psn=psn)
        data[row, :hdr.HEADER_BYTES] = np.frombuffer(head, np.uint8)
    return data


def reference_in_order(flows: list[ReceiveFlow], stream, rows) -> tuple:
    """ReceiveFlow, datagram by datagram: the rows delivered, in order, and per
    source the duplicates and the highest psn refused as beyond a gap (-1: none)."""
    delivered, duplicates, gap_max = [], [0] * len(flows), [-1] * len(flows)
    for row in rows:
        source, psn = stream[row]
        verdict = flows[source].accept(psn)
        if verdict == "deliver":
            delivered.append(row)
        elif verdict == "duplicate":
            duplicates[source] += 1
        else:
            gap_max[source] = max(gap_max[source], psn)
    return delivered, duplicates, gap_max


@settings(max_examples=300, deadline=None)
@given(stream=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10)), max_size=120),
       cut=st.integers(0, 120), every_other=st.booleans())
def test_in_order_takes_what_go_back_n_takes(stream, cut, every_other):
    """The compiled go-back-N receiver and the reference, on the same datagrams in two
    batches (state carried from one to the next; some rows not given to it): the same
    rows delivered in the same order, the same next psn per source, the same duplicates
    and gaps. On the old code there was no native.in_order (RC took datagrams one by one
    in Python)."""
    data = psn_rows(stream)
    flows = [ReceiveFlow() for _ in range(4)]
    expected = np.zeros(4, np.int64)
    step = 2 if every_other else 1
    for rows in (np.arange(0, min(cut, len(stream)), step, dtype=np.int64),
                 np.arange(min(cut, len(stream)), len(stream), dtype=np.int64)):
        want = reference_in_order(flows, stream, rows.tolist())
        delivered = np.full(len(rows), -1, np.int64)
        duplicates, gap_max = np.zeros(4, np.int64), np.full(4, -1, np.int64)
        k = native.in_order(data, rows, expected=expected, delivered=delivered,
                            duplicates=duplicates, gap_max=gap_max)
        assert delivered[:k].tolist() == want[0]
        assert duplicates.tolist() == want[1] and gap_max.tolist() == want[2]
        assert expected.tolist() == [f.expected for f in flows]


def test_in_order_refuses_buffers_that_do_not_fit():
    """Rows outside the buffer and outputs shorter than the rows are refused, never read
    or written; a source the flows do not have is taken by none of them."""
    data = psn_rows([(1, 0), (9, 0)])
    expected, duplicates, gap_max = (np.zeros(4, np.int64), np.zeros(4, np.int64),
                                     np.full(4, -1, np.int64))
    for rows, out in ((np.array([2], np.int64), np.zeros(1, np.int64)),
                      (np.array([-1], np.int64), np.zeros(1, np.int64)),
                      (np.array([0, 1], np.int64), np.zeros(1, np.int64))):
        try:
            native.in_order(data, rows, expected=expected, delivered=out,
                            duplicates=duplicates, gap_max=gap_max)
        except ValueError:
            continue
        raise AssertionError(f"rows {rows} with {len(out)} outputs were taken")
    out = np.zeros(2, np.int64)
    assert native.in_order(data, np.array([0, 1], np.int64), expected=expected,
                           delivered=out, duplicates=duplicates, gap_max=gap_max) == 1
    assert out[0] == 0 and expected.tolist() == [0, 1, 0, 0]
    assert not duplicates.any() and (gap_max == -1).all()


def test_rc_data_reaches_the_collective_a_batch_at_a_time(monkeypatch):
    """RC's service thread takes a batch's data datagrams in order in the compiled core
    and hands the delivered ones to the collective as one batch (handle_batch: applied
    and reassembled by the compiled core, as UC's are); only ACKs and NAKs go through
    _datagram one at a time. On the old code every data datagram went through _datagram
    and _reassemble, and the collective took whole messages one at a time."""
    passed, batches = [], []
    real_datagram, real_batch = UdpTransport._datagram, Step.handle_batch

    def counting_datagram(self, size, sender, handle, view, *args, **kwargs):
        passed.append(hdr.unpack(view[:size]).stage)
        return real_datagram(self, size, sender, handle, view, *args, **kwargs)

    def counting_batch(self, data, rows, stash):
        batches.append(len(rows))
        return real_batch(self, data, rows, stash)

    monkeypatch.setattr(UdpTransport, "_datagram", counting_datagram)
    monkeypatch.setattr(Step, "handle_batch", counting_batch)
    counters = exact_rc_allreduces(DropMask(3, 0.05), steps=2, numel=30_000)
    assert all(c.masked > 0 and c.retransmitted > 0 and c.missing == 0 for c in counters)
    assert passed and set(passed) <= {hdr.STAGE_ACK, hdr.STAGE_NAK}
    # 2 steps x 2 ranks x 2 stages of a 15,000-float shard: 4 messages of 12, 12, 12 and 8
    # fragments a stage, 352 in all (packets kept early for the next step come twice),
    # in far fewer calls than that
    assert sum(batches) >= 352 and len(batches) < sum(batches) // 4


def test_flush_returns_when_the_last_ack_comes_not_at_the_next_tick(monkeypatch):
    """A rank leaves an RC step once its peers acknowledged everything (flush): it must
    leave when the last ACK comes, not when a polling tick next looks (the tick is 2 ms,
    on a 16 ms all-reduce). With a 1 s tick: on the old code flush slept it out (>= 1 s)."""
    monkeypatch.setattr(gobackn, "RC_TICK_S", 1.0)
    _, (t0, t1) = make_pair(semantics=Semantics.parse("roce-rc:16384"), key=KEY)
    try:
        x = np.zeros(4 * t1.fragment_floats, np.float32)
        starts = np.arange(4, dtype=np.int64) * t1.fragment_floats
        t1.send_packets(0, hdr.STAGE_REDUCE, 0, 0, 0, x, starts, starts + t1.fragment_floats)
        started = time.monotonic()
        assert t1.flush(started + 5)
        waited = time.monotonic() - started
    finally:
        t0.close()
        t1.close()
    assert waited < 0.5
