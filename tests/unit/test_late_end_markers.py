"""The late end markers' clock and thread, held exactly (harness/collectives/end_markers.py,
#71): a set falls due at its time, not after; finish waits no longer than the last set's
due time; the background sender is a daemon named for its rank."""

from __future__ import annotations

import threading

from harness.collectives import end_markers
from harness.transport import header as hdr


class _Transport:
    closed = False

    def __init__(self):
        self.sent = []

    def send_end(self, dest, stage, step, bucket, source, count, copies, first_copy):
        self.sent.append((dest, stage, step, bucket, source, count, copies, first_copy))


class _Layout:
    def packets(self, rank):
        return 3


def test_a_set_is_sent_at_its_due_time_and_the_next_due_is_returned(monkeypatch):
    transport = _Transport()
    sender = end_markers.LateEndSender(transport, 0, 2, threading.Condition(), False)
    sender.schedule(10.0, _Layout(), step=4, bucket=1)
    sender.schedule(20.0, _Layout(), step=5, bucket=1)
    due = 10.0 + end_markers.LATE_END_AFTER_S
    monkeypatch.setattr(end_markers.time, "monotonic", lambda: due)
    assert sender.send_due() == 20.0 + end_markers.LATE_END_AFTER_S
    assert transport.sent == [(1, hdr.STAGE_BROADCAST, 4, 1, 0, 3, end_markers.LATE_END_COPIES,
                               end_markers.TIMED_END_FIRST_COPY)]
    monkeypatch.setattr(end_markers.time, "monotonic", lambda: 1e9)
    assert sender.send_due() == float("inf")


def test_finish_waits_only_until_the_last_set_is_due(monkeypatch):
    slept = []
    monkeypatch.setattr(end_markers.time, "sleep", slept.append)
    monkeypatch.setattr(end_markers.time, "monotonic", lambda: 100.0)
    transport = _Transport()
    sender = end_markers.LateEndSender(transport, 1, 3, threading.Condition(), False)
    sender.schedule(50.0, _Layout(), step=1, bucket=0)   # overdue: no wait
    sender.finish()
    assert slept == [0.0] and len(transport.sent) == 2
    sender.schedule(99.995, _Layout(), step=2, bucket=0)  # due in 7 ms
    sender.finish()
    assert abs(slept[-1] - (99.995 + end_markers.LATE_END_AFTER_S - 100.0)) < 1e-9


def test_the_background_sender_is_a_daemon_named_for_its_rank():
    turn = threading.Condition()
    sender = end_markers.LateEndSender(_Transport(), 3, 4, turn, True)
    try:
        assert sender.alive and sender._thread.daemon
        assert sender._thread.name == "late-ends-rank3"
    finally:
        sender.finish()
    assert not sender.alive
