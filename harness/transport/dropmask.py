"""A seeded, replayable drop mask applied at the receiver.

Host tc cannot see hardware RoCE traffic, so on real RDMA NICs loss is emulated here: a
datagram is dropped when a hash of (seed, its position) falls below the rate. The position
is source, step, stage, shard, packet index and fragment (and, for retransmissions, how
many times this receiver has seen that position), never the payload: the decision is
independent of the values carried, and the same seed drops the same positions in every
variant that sends them.
"""

from __future__ import annotations

import hashlib
import struct

from harness.transport.header import Header
from testbed.errors import UsageError

_KEY = struct.Struct("<QHIBHIHI")


class DropMask:
    def __init__(self, seed: int, rate: float):
        if not 0 <= rate < 1:
            raise ValueError(f"drop rate {rate} must be in [0, 1)")
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed {seed} must be in [0, 2^64)")
        self.seed, self.rate = seed, rate
        self.threshold = int(rate * 2**64)
        self.attempts: dict[tuple, int] = {}  # per step: the transports clear it each step
        # What was dropped, in constant memory: how many, and an order-free digest of the
        # positions (two runs dropped the same positions when both agree)
        self.dropped_count = 0
        self.dropped_digest = 0

    def position(self, head: Header) -> tuple:
        return (head.source, head.step, head.stage, head.shard, head.index, head.fragment)

    def drops(self, head: Header) -> bool:
        pos = self.position(head)
        attempt = self.attempts.get(pos, 0)
        self.attempts[pos] = attempt + 1
        digest = hashlib.blake2b(_KEY.pack(self.seed & (2**64 - 1), *pos[:1], pos[1], pos[2],
                                           pos[3], pos[4], pos[5], attempt),
                                 digest_size=8).digest()
        drop = int.from_bytes(digest, "little") < self.threshold
        if drop:
            self.dropped_count += 1
            self.dropped_digest = (self.dropped_digest + int.from_bytes(
                hashlib.blake2b(digest + self.seed.to_bytes(8, "little"),
                                digest_size=8).digest(), "little")) % 2**64
        return drop


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
    except (ValueError, OverflowError) as err:
        raise UsageError("LOSSBED_DROP_MASK", f"{text!r} is not SEED:RATE ({err})",
                         "Write e.g. LOSSBED_DROP_MASK=7:0.1 (seed 7, 10% of datagrams)") \
            from None
