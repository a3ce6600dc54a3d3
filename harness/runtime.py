"""A rank's start-up, the torchrun way: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the
environment, a TCPStore for rendezvous, a gloo process group (the reliable baseline and
resyncs), and lossbed's UDP transport bound to the host's address on the emulated link
(LOSSBED_ADDRESS; LOSSBED_MTU)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from harness.transport.udp import UdpTransport

log = logging.getLogger(__name__)


@dataclass
class Rank:
    rank: int
    world: int
    store: object
    transport: UdpTransport

    def close(self, linger_s: float = 30.0) -> None:
        """Leave in order: rank 0 hosts the store, so it goes last. Otherwise a rank still
        tearing down its process group finds the store gone, and C++ aborts the process."""
        import time

        self.transport.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        try:
            if self.rank != 0:
                self.store.add("lossbed/exited", 1)
                return
            deadline = time.monotonic() + linger_s
            while int(self.store.add("lossbed/exited", 0)) < self.world - 1:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.01)
        except Exception:
            pass  # a rank that died: nothing to wait for


def _env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        raise SystemExit(f"{name} is not set: launch ranks with lossbed (or torchrun "
                         "conventions: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")
    return value


def start(timeout_s: float = 60.0, rate_mbit: float = 0.0) -> Rank:
    rank, world = int(_env("RANK")), int(_env("WORLD_SIZE"))
    master, port = _env("MASTER_ADDR"), int(_env("MASTER_PORT"))
    store = dist.TCPStore(master, port, world, is_master=(rank == 0),
                          timeout=timedelta(seconds=timeout_s))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    transport = UdpTransport(rank, world, _env("LOSSBED_ADDRESS", master), store,
                             mtu=int(_env("LOSSBED_MTU", "1500")), rate_mbit=rate_mbit)
    return Rank(rank, world, store, transport)
