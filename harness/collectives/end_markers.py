"""End markers: how a source tells its receivers that it sent everything of a stage, and
tells them again later, when a burst of loss took the first ones.

A stage ends when every source has delivered everything or said it sent everything. The
first END_COPIES markers follow the data on the same path (any one of them may be lost).
Under burst loss the markers right after the data often share its fate, so a source says it
again for its broadcast: LATE_END_COPIES markers as its own broadcast stage ends (or
LATE_END_AFTER_S after the data if sooner), and as many again LATE_END_AFTER_S after the
data in any case, by when a burst has usually ended. LateEndSender keeps that timed set and
sends it when due: from whatever wait the rank is in, or, while a training rank computes
between steps, from a thread of its own.
"""

from __future__ import annotations

import threading
import time

from harness.collectives.layout import Layout
from harness.transport import header as hdr

# Copies of each end marker. Each rank waits on 2 x (world - 1) sources per step, and a
# source whose copies are all lost costs a deadline: at 10% random loss 4 copies (all lost:
# 1e-4) still cost a deadline in 1 step of 400 on 4 ranks, 8 (1e-8) in 1 of 4 million. They
# are 8 header-only datagrams per shard sent, in one system call.
END_COPIES = 8
LATE_END_COPIES = 4       # copies of the broadcast's end markers sent again, later ...
LATE_END_AFTER_S = 0.012  # ... this long after the broadcast
# The timed set is numbered after the first ones and the first late set: each its own
# transmission, which a drop mask draws afresh for, as a network would.
TIMED_END_FIRST_COPY = END_COPIES + LATE_END_COPIES


class LateEndSender:
    """The late end markers of one rank's broadcasts. `turn` is the transport's use_lock as
    a condition: whoever sends holds it (a step, or the background thread between steps)."""

    def __init__(self, transport, rank: int, world: int, turn: threading.Condition,
                 background: bool):
        self.transport, self.rank, self.world, self.turn = transport, rank, world, turn
        # broadcasts whose timed markers are still to go: (when, layout, step, bucket), in
        # the order they are due
        self._timed: list[tuple[float, Layout, int, int]] = []
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._error: BaseException | None = None
        if background:
            # A training rank computes between steps (forward, backward): the timed markers
            # of its last broadcast fall due then, and a peer whose wait only they can end
            # would wait out its deadline until this rank's next step sent them.
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"late-ends-rank{rank}")
            self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def schedule(self, after: float, layout: Layout, step: int, bucket: int) -> None:
        """The timed set of a broadcast that went out at `after` (time.monotonic())."""
        self._timed.append((after + LATE_END_AFTER_S, layout, step, bucket))

    def send(self, layout: Layout, step: int, bucket: int, first_copy: int) -> None:
        """LATE_END_COPIES markers of this rank's broadcast to every peer, numbered from
        first_copy: a new transmission (a drop mask draws afresh), not a replay."""
        count = layout.packets(self.rank)
        if not count:  # an empty shard: no broadcast, nothing to say about it
            return
        for dest in range(self.world):
            if dest != self.rank:
                self.transport.send_end(dest, hdr.STAGE_BROADCAST, step, bucket, self.rank,
                                        count, LATE_END_COPIES, first_copy=first_copy)

    def send_due(self) -> float:
        """Send the timed markers that are due; when the next ones are (inf: none)."""
        now = time.monotonic()
        while self._timed and self._timed[0][0] <= now:
            _, layout, step, bucket = self._timed.pop(0)
            self.send(layout, step, bucket, TIMED_END_FIRST_COPY)
        return self._timed[0][0] if self._timed else float("inf")

    def step_ended(self) -> None:
        """Wake the background thread: a step's timed set is due later."""
        if self._thread is not None:
            self.turn.notify()

    def finish(self) -> None:
        """Send the timed markers still to go, once due (at most LATE_END_AFTER_S from now):
        after a run's last step, for a peer still waiting for them. Stops the background
        thread; on a closed transport sends nothing."""
        if self._thread is not None:
            with self.turn:
                self._stopping = True
                self.turn.notify()
            self._thread.join()
        with self.turn:
            if self._timed and not self.transport.closed:
                time.sleep(max(0.0, self._timed[-1][0] - time.monotonic()))
                self.send_due()
            self._timed.clear()
        self.raise_error()

    def raise_error(self) -> None:
        """The background thread's failure, raised in the rank's own thread."""
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"rank {self.rank}: the background sender of late end "
                               f"markers failed: {err}") from err

    def _run(self) -> None:
        """Send timed markers as they fall due while no step holds the transport, until
        finish() or the transport closes (checked under its lock, which close() takes:
        nothing goes out on a closed socket)."""
        try:
            with self.turn:
                while not self._stopping and not self.transport.closed:
                    due = self.send_due()
                    self.turn.wait(None if due == float("inf")
                                   else max(0.0, due - time.monotonic()))
        except BaseException as err:  # noqa: BLE001 - raised in the rank's own thread
            self._error = err
