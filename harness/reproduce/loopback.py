"""n ranks in one process: threads, each with its own UDP transport on 127.0.0.1, meeting in
an in-memory store. The reproduction rows run the real collective this way: the same
packets, estimators and deadlines as on a cluster, with loss from a seeded drop mask
applied at each receiver, so a row's randomness is the seed's and nothing else's."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from datetime import timedelta

from harness.scale.memory import on_every_rank  # (one implementation, the many-rank mode's)
from harness.transport.dropmask import DropMask
from harness.transport.udp import UdpTransport


class MemoryStore:
    """The TCPStore calls the transport and the collective make, on a dictionary."""

    def __init__(self):
        self.data, self.cond = {}, threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.data[key] = value.encode() if isinstance(value, str) else value
            self.cond.notify_all()

    def get(self, key):
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.data, timeout=60):
                raise TimeoutError(key)
            return self.data[key]

    def add(self, key, amount):
        with self.cond:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            self.cond.notify_all()
            return value

    def wait(self, keys, timeout=timedelta(seconds=60)):
        with self.cond:
            if not self.cond.wait_for(lambda: all(k in self.data for k in keys),
                                      timeout=timeout.total_seconds()):
                raise TimeoutError(keys)

    def check(self, keys):
        with self.cond:
            return all(k in self.data for k in keys)

    def delete_key(self, key):
        with self.cond:
            self.data.pop(key, None)


@contextmanager
def transports(world: int, drop_rate: float = 0.0, seed: int = 0, mtu: int = 1500,
               drop_mask: DropMask | None = None, **options):
    """(store, one UdpTransport per rank), closed on the way out. drop_rate > 0: each
    receiver drops datagrams by its own seeded mask (independent per link); drop_mask: this
    mask instead (each transport takes its own receiver's copy)."""
    store = MemoryStore()
    mask = drop_mask or (DropMask(seed, drop_rate) if drop_rate > 0 else None)
    made = on_every_rank(world, lambda rank: UdpTransport(
        rank, world, "127.0.0.1", store, mtu=mtu, drop_mask=mask, **options))
    try:
        yield store, made
    finally:
        for t in made:
            t.close()


def numel_for(world: int, events_per_shard: int, per_packet: int) -> int:
    """A tensor size whose every shard has about `events_per_shard` (rank, packet) pairs
    that can be lost: small worlds get more packets per shard, so they are measured as
    tightly as large ones (which cost more per step)."""
    return world * -(-events_per_shard // (world - 1)) * per_packet
