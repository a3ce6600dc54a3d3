"""RPS training (arXiv 1810.07766): a local optimizer step, then lossy model averaging.

    optimizer = RPSOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), rps)

step() runs the wrapped optimizer on the local gradients, then averages the model over the
ranks the RPS way (each block averaged by its server from the blocks that arrived; a worker
that misses part of the average keeps its own values there).
"""

from __future__ import annotations

import time

import torch

from harness.collectives.rps import RPS
from harness.metrics.hdr import Histogram


class RPSOptimizer:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rps: RPS):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.inner = optimizer
        self.rps = rps
        self.flat = torch.zeros(sum(p.numel() for p in self.params), dtype=torch.float32)
        self.collective_us = Histogram()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        self.inner.step()
        offset = 0
        for p in self.params:
            self.flat[offset:offset + p.numel()] = p.reshape(-1)
            offset += p.numel()
        started = time.perf_counter()
        self.rps.average(self.flat)
        self.collective_us.record((time.perf_counter() - started) * 1e6)
        offset = 0
        for p in self.params:
            p.copy_(self.flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
