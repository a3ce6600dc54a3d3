"""How a flat tensor is cut: into one shard per rank (rank j owns shard j), and each shard
into MTU-sized packets. Pure arithmetic, the same on every rank."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Layout:
    numel: int
    world: int
    per_packet: int  # float32 values per packet

    def shard_bounds(self, shard: int) -> tuple[int, int]:
        """[start, end) of a shard; shards differ in size by at most one element, and can be
        empty when the tensor has fewer elements than there are ranks."""
        base, extra = divmod(self.numel, self.world)
        start = shard * base + min(shard, extra)
        return start, start + base + (1 if shard < extra else 0)

    def shard_size(self, shard: int) -> int:
        start, end = self.shard_bounds(shard)
        return end - start

    def packets(self, shard: int) -> int:
        return len(self._packet_table[shard])

    def packet_bounds(self, shard: int, index: int) -> tuple[int, int]:
        """[start, end) in the flat tensor of packet `index` of `shard`."""
        return self._packet_table[shard][index]

    def packet_arrays(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """Starts and ends of all packets of a shard, as arrays (for batched sending)."""
        return self._packet_arrays[shard]

    @cached_property
    def _packet_arrays(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(np.array([s for s, _ in table], dtype=np.int64).reshape(-1),
                 np.array([e for _, e in table], dtype=np.int64).reshape(-1))
                for table in self._packet_table]

    @cached_property
    def _packet_table(self) -> list[list[tuple[int, int]]]:
        # computed once per layout: the receive path looks packets up thousands of times
        table = []
        for shard in range(self.world):
            start, end = self.shard_bounds(shard)
            table.append([(first, min(first + self.per_packet, end))
                          for first in range(start, end, self.per_packet)])
        return table
