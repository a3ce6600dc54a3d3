"""A seeded, replayable drop mask applied at the receiver.

Host tc cannot see hardware RoCE traffic, so on real RDMA NICs loss is emulated here: a
datagram is dropped when a hash of (seed, its identity) falls below the rate. The identity
is the receiver, source, step, stage, shard, packet index, fragment and copy (which
transmission of that packet it is: an end marker's copy, an RC retransmission, the n-th ACK
or NAK to a peer), never the payload. The receiver is in it because one broadcast packet
goes to every rank with the same header: without it every replica lost the same packets at
once, where loss on separate links (netem's, and the papers' model) is independent per
receiver. The decision is independent of the values carried, the same seed drops the same
packets in every variant that sends them, and a duplicate or replayed copy of a datagram
gets the verdict of the original (it has the original's identity). With a key (the default)
a forged datagram never gets this far (auth.py); unsealed (--unsealed), anyone who can send
on the network can forge one with any identity, and the mask gives it that identity's
verdict.
"""

from __future__ import annotations

import copy
import hashlib
import struct

from harness.transport.header import Header
from testbed import checks
from testbed.errors import UsageError

_KEY = struct.Struct("<QHHIBHIHH")
RECENT_STEPS = 8  # how far back a copy of a dropped packet is recognised as one


class DropMask:
    def __init__(self, seed: int, rate: float, receiver: int = 0):
        checks.loss_fraction("the drop rate", rate)  # (the one rule of a loss fraction)
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed {seed} must be in [0, 2^64)")
        self.seed, self.rate, self.receiver = seed, rate, receiver
        self.threshold = int(rate * 2**64)
        # What was dropped: how many packets, and an order-free digest of their identities
        # (two runs dropped the same packets when both agree). A copy of a packet already
        # dropped counts once: the identities dropped in recent steps are kept for that.
        self.dropped_count = 0
        self.dropped_digest = 0
        self._recent: dict[int, set] = {}  # step -> identities dropped in it

    def for_receiver(self, rank: int) -> DropMask:
        """A fresh copy of this mask (its class, seed and rate, nothing dropped yet) that
        decides for what `rank` receives: each transport takes its own. A subclass with
        mutable state of its own overrides this to give each copy a fresh one."""
        mask = copy.copy(self)
        mask.receiver = rank
        mask.dropped_count, mask.dropped_digest, mask._recent = 0, 0, {}
        return mask

    def position(self, head: Header) -> tuple:
        return (self.receiver, head.source, head.step, head.stage, head.shard, head.index,
                head.fragment, head.copy)

    def drops(self, head: Header) -> bool:
        digest = hashlib.blake2b(_KEY.pack(self.seed & (2**64 - 1), *self.position(head)),
                                 digest_size=8).digest()
        drop = int.from_bytes(digest, "little") < self.threshold
        if drop and self._first_drop(head):
            self.dropped_count += 1
            self.dropped_digest = (self.dropped_digest + int.from_bytes(
                hashlib.blake2b(digest + self.seed.to_bytes(8, "little"),
                                digest_size=8).digest(), "little")) % 2**64
        return drop


    def _first_drop(self, head: Header) -> bool:
        """True the first time this identity is dropped (within RECENT_STEPS steps)."""
        seen = self._recent.get(head.step)
        if seen is None:
            seen = self._recent[head.step] = set()
            for old in [s for s in self._recent if s < head.step - RECENT_STEPS]:
                del self._recent[old]
        identity = self.position(head)
        if identity in seen:
            return False
        seen.add(identity)
        return True


def parse_drop_mask(text: str | None) -> DropMask | None:
    """LOSSBED_DROP_MASK / --drop-mask: SEED:RATE, or nothing for no mask. The controller
    parses it before anything is applied (harness.launch.check_environment)."""
    if not text:
        return None
    seed, sep, rate = text.partition(":")
    try:
        if not sep:
            raise ValueError("no ':'")
        return DropMask(int(seed), float(rate))
    except (ValueError, OverflowError, UsageError) as err:
        why = err.problem if isinstance(err, UsageError) else err
        raise UsageError("LOSSBED_DROP_MASK", f"{text!r} is not SEED:RATE ({why})",
                         "Write e.g. LOSSBED_DROP_MASK=7:0.1 (seed 7, 10% of datagrams)") \
            from None
