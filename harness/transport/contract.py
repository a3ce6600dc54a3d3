"""The Transport contract: what the lossy collectives (harness/collectives/lossy.py) need from
a datagram path. Two implement it: UDP with the loss semantics of RoCE's queue pairs emulated
(harness/transport/udp.py: plain datagrams, UD, UC, RC go-back-N) and real RDMA queue pairs
(harness/verbs/transport.py). Both exchange their endpoints the same way
(transport/endpoints.py) and count in one vocabulary (transport/verdicts.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from harness.transport import header as hdr
from harness.transport.early import EarlyStash
from harness.transport.semantics import Semantics
from harness.transport.verdicts import Counters


@runtime_checkable
class Transport(Protocol):
    rank: int
    """This rank's number, 0 .. world - 1."""
    world: int
    """How many ranks exchange datagrams."""
    semantics: Semantics
    """The loss semantics: plain datagrams, UD (one datagram a message), UC (a message lost
    whole if any of its packets is), RC (go-back-N: nothing lost, only late)."""
    per_packet: int
    """float32 values one unit (a datagram, or a message of UC/RC) carries: the collective
    cuts tensors into units of this size and rebuilds them unit by unit."""
    fragment_floats: int
    """Values of one datagram where a unit is cut into several (UC/RC over UDP), else
    per_packet."""
    batched: bool
    """Whether received units reach the collective a batch at a time (receive_until's
    handle_batch) rather than one at a time."""
    counters: Counters
    """What was sent, received, missing, late, refused: the verdicts' vocabulary. The
    transport counts what it sent and received; its collective adds what each step missed
    (`missing`, `messages_incomplete`): one record of the rank's traffic, read by both."""
    stash: EarlyStash
    """Units of coming steps that arrived early, kept for them (bounded by the layout);
    a step's handlers add to it, and the step takes what is there when it starts
    (take_stash)."""
    use_lock: threading.RLock
    """Held by whoever uses the transport: a collective's step for its whole length, and a
    background sender for each send it makes between steps. close() takes it too."""
    closed: bool
    """True once close() ran: nothing may be sent any more (the socket's descriptor number
    may already be another's)."""

    def take_stash(self) -> EarlyStash:
        """The units kept for coming steps so far, for the step that starts now to replay;
        the transport keeps those that come from now on in a new stash."""
        ...

    @property
    def authenticated(self) -> bool:
        """Whether datagrams are sealed with the launch's key (MAC) and checked on arrival."""

    def next_step(self) -> int:
        """The number of the next collective step; every rank numbers steps alike."""

    def send_packets(self, dest: int, stage: int, step: int, bucket: int, shard: int,
                     x: np.ndarray, starts: np.ndarray, ends: np.ndarray, end_copies: int = 0,
                     *, indexes: np.ndarray | None = None, count: int | None = None) -> None:
        """Every unit of one shard to `dest`: unit i carries x[starts[i]:ends[i]], then
        `end_copies` end markers on the same path. Some units of a shard: `indexes` says
        which (unit i is the shard's indexes[i]) and `count` how many the shard has (the end
        markers say it); the markers may then follow no unit."""

    def send_end(self, dest: int, stage: int, step: int, bucket: int, shard: int, count: int,
                 copies: int, first_copy: int = 0) -> None:
        """`copies` end markers telling `dest` that all `count` units of the shard went out
        (numbered from first_copy: copies sent later are new transmissions)."""

    def receive_until(self, deadline: float, done: Callable[[], bool],
                      handle: Callable[[hdr.Header, memoryview], str],
                      handle_batch: Callable | None = None) -> None:
        """Hand every screened unit of this job (sealed by its source, addressed here, not
        stale) to `handle` (or batches to handle_batch) until done() or the deadline
        (time.monotonic()); each handler's verdict is counted."""

    def flush(self, deadline: float) -> bool:
        """Wait until everything sent was acknowledged (RC), or the deadline; True at once
        for the unreliable semantics."""

    def device_counters(self) -> dict[str, int]:
        """What the device counted during the run (an RDMA NIC's port counters); {} where
        the kernel's socket is the device."""

    def close(self) -> None:
        """Give the socket or queue pairs back; safe to call twice."""
