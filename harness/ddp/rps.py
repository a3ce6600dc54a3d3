"""RPS training (arXiv 1810.07766): a local optimizer step, then lossy model averaging.

    optimizer = RPSOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), rps)

step() runs the user's optimizer on the local gradients, then averages the model over the
ranks the RPS way (each block averaged by its server from the blocks that arrived; a worker
that misses part of the average keeps its own values there).

What is returned is a torch.optim.Optimizer that is the user's optimizer with the averaging
after its step: the same param_groups and state (the same objects), so an LR scheduler,
GradScaler, zero_grad and state_dict/load_state_dict work as on the optimizer itself.
"""

from __future__ import annotations

import time

import torch

from harness.collectives.rps import RPS
from harness.ddp import amp, clipping
from harness.ddp.sharded import check_wrappable, refuse_closure
from harness.metrics.hdr import Histogram


class RPSOptimizer(torch.optim.Optimizer):
    # GradScaler hands the step to it, skip or not: the ranks agree on skips (ddp/amp.py)
    _step_supports_amp_scaling = True

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rps: RPS,
                 scaler=None, agree=amp.any_rank, clip_grad_norm: float | None = None,
                 mean_over=clipping.mean_over_ranks):
        check_wrappable(optimizer, "rps")
        clipping.check_max_norm(clip_grad_norm)
        # DDP's clipping: by the ranks' mean gradient's norm (harness/ddp/clipping.py)
        self.clip_grad_norm, self.mean_over = clip_grad_norm, mean_over
        self.last_grad_norm: float | None = None
        self.scaler, self.agree = scaler, agree
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self.inner = optimizer
        self._share()
        self.rps = rps
        # the whole model is averaged (what the optimizer does not train is equal already)
        self.model_params = [p for p in model.parameters() if p.requires_grad]
        self.flat = torch.zeros(sum(p.numel() for p in self.model_params),
                                dtype=torch.float32)
        self.collective_us = Histogram()

    def _share(self) -> None:
        """The user's optimizer's own groups and state: nothing to keep in step."""
        self.param_groups = self.inner.param_groups
        self.state = self.inner.state

    def add_param_group(self, param_group: dict) -> None:
        inner = getattr(self, "inner", None)
        if inner is None:  # (the base class adds the first ones: the same dicts)
            super().add_param_group(param_group)
        else:
            inner.add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None) -> None:
        refuse_closure(closure, "rps")
        params = [p for group in self.param_groups for p in group["params"]]
        if not amp.agreed_step(self, params, self.scaler, self.agree):
            return  # (every rank skips it: no averaging)
        if self.clip_grad_norm is not None:
            # (every rank the same list, in order: a gradient not made is zeros)
            grads = [p.grad if p.grad is not None else torch.zeros_like(p)
                     for p in self.model_params]
            self.last_grad_norm = clipping.clip_local(grads, self.clip_grad_norm,
                                                      self.mean_over)
        self.inner.step()
        offset = 0
        for p in self.model_params:
            self.flat[offset:offset + p.numel()] = p.reshape(-1)
            offset += p.numel()
        started = time.perf_counter()
        self.rps.average(self.flat)
        self.collective_us.record((time.perf_counter() - started) * 1e6)
        offset = 0
        for p in self.model_params:
            p.copy_(self.flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def lossy_collective(self):
        return self.rps.collective

    def replica_drift(self, mean_over_ranks=None) -> float:
        """How far this rank's model is from the ranks' mean model (RPS's replicas differ
        where packets were lost): ||mine - mean|| / ||mean||, the mean reliable (every rank
        calls it: a collective)."""
        from harness.collectives import process_group

        mine = torch.cat([p.detach().reshape(-1).float().cpu() for p in self.model_params])
        if mean_over_ranks is None:
            import torch.distributed as dist

            mean = process_group.all_reduce_(mine.clone()) / dist.get_world_size()
        else:
            mean = mean_over_ranks(mine)
        return float((mine - mean).norm() / mean.norm().clamp_min(1e-12))

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.inner.load_state_dict(state_dict)
        self._share()  # (loading makes new group dicts)
