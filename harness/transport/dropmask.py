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

_KEY = struct.Struct("<QHIBHIHI")


class DropMask:
    def __init__(self, seed: int, rate: float):
        if not 0 <= rate < 1:
            raise ValueError(f"drop rate {rate} must be in [0, 1)")
        self.seed, self.rate = seed, rate
        self.threshold = int(rate * 2**64)
        self.attempts: dict[tuple, int] = {}
        self.dropped: list[tuple] = []

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
            self.dropped.append(pos + (attempt,))
        return drop


def parse_drop_mask(text: str | None) -> DropMask | None:
    """LOSSBED_DROP_MASK / --drop-mask: SEED:RATE, or nothing for no mask."""
    if not text:
        return None
    seed, _, rate = text.partition(":")
    try:
        return DropMask(int(seed), float(rate))
    except ValueError:
        raise SystemExit(f"drop mask {text!r}: write SEED:RATE, e.g. 7:0.1") from None
