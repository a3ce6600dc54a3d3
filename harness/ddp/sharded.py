"""Parameter mode (arXiv 2507.07114's bounded-drift broadcasts) as an optimizer wrapper.

    optimizer = ShardedOptimizer(model, torch.optim.AdamW, collective, lr=3e-4)
    loss.backward(); optimizer.step(); optimizer.zero_grad()

Like ZeRO stage 1, each rank owns one contiguous shard of the flattened parameters and the
inner optimizer's state for that shard only. step(): the gradients are reduced to their
owners over the lossy transport, each owner runs the inner optimizer on its shard, and the
owners broadcast their parameters; a rank that misses a packet keeps its stale parameters
there. resync_every=K makes every K-th step end with a reliable broadcast (drift 0).

The inner optimizer sees one flat parameter (the shard): any torch optimizer works, with
one set of hyper-parameters for all of it (per-parameter groups are not kept).
"""

from __future__ import annotations

import time

import torch

from harness.collectives.layout import Layout
from harness.collectives.lossy import LossyCollective
from harness.metrics.hdr import Histogram


class ShardedOptimizer:
    def __init__(self, model: torch.nn.Module, optimizer_class, collective: LossyCollective,
                 resync_every: int = 0, **optimizer_kwargs):
        if resync_every < 0:
            raise ValueError("resync_every must be >= 0 (0: never)")
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.collective = collective
        self.resync_every = resync_every
        numel = sum(p.numel() for p in self.params)
        # The flat copies live on the CPU, where the UDP transport reads and writes them.
        self.flat_params = torch.cat([p.detach().reshape(-1).float().cpu()
                                      for p in self.params])
        self.flat_grads = torch.zeros(numel, dtype=torch.float32)
        start, end = Layout(numel, collective.world,
                            collective.transport.per_packet).shard_bounds(collective.rank)
        self.shard = (start, end)
        self.shard_param = torch.nn.Parameter(self.flat_params[start:end].clone())
        self.inner = optimizer_class([self.shard_param], **optimizer_kwargs)
        self.steps = 0
        self.collective_us = Histogram()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def _owner_step(self, start: int, end: int, mean_grad: torch.Tensor) -> None:
        self.shard_param.grad = mean_grad
        self.inner.step()
        self.flat_params[start:end] = self.shard_param.detach()

    @torch.no_grad()
    def step(self) -> None:
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                self.flat_grads[offset:offset + n] = 0
            else:
                self.flat_grads[offset:offset + n] = p.grad.reshape(-1)
            offset += n
        started = time.perf_counter()
        self.collective.sharded_update(self.flat_grads, self.flat_params, self._owner_step)
        self.steps += 1
        if self.resync_every and self.steps % self.resync_every == 0:
            self.collective.resync(self.flat_params)
        self.collective_us.record((time.perf_counter() - started) * 1e6)
        offset = 0
        for p in self.params:
            n = p.numel()
            p.copy_(self.flat_params[offset:offset + n].view_as(p))
            offset += n
