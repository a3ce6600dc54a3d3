"""Parameter mode (arXiv 2507.07114's bounded-drift broadcasts) as a torch optimizer.

    optimizer = torch.optim.AdamW(groups, lr=3e-4)           # your optimizer, your groups
    optimizer = ShardedOptimizer(model, optimizer, collective)
    loss.backward(); optimizer.step(); optimizer.zero_grad()

Like ZeRO stage 1, each rank owns one contiguous shard of the flattened parameters and the
optimizer's state for that shard only. step(): the gradients are reduced to their owners
over the lossy transport, each owner steps its shard, and the owners broadcast their
parameters; a rank that misses a packet keeps its stale parameters there. resync_every=K
makes every K-th step end with a reliable broadcast (drift 0).

What is returned is a torch.optim.Optimizer whose param_groups are the user's (their
parameters, learning rates, weight decays: an LR scheduler or GradScaler works on them as on
the optimizer itself). The flat layout goes group by group, so a rank's shard meets each
group in one piece; the owner steps those pieces with an optimizer of the user's class built
on them, one group per user group, its hyper-parameters copied from the user's groups before
every step. state_dict() is this rank's shard (each rank saves and loads its own, as with
ZeRO); loading another rank's, or another layout's, is refused.
"""

from __future__ import annotations

import inspect
import time

import torch

from harness.collectives.layout import Layout
from harness.ddp import amp, clipping
from harness.metrics.hdr import Histogram

STATE_KEY = "lossbed_bounded_drift"


class SchemeRefusal(TypeError):
    """What a lossy scheme cannot do with the optimizer it was given, and what to do."""


def check_wrappable(optimizer, scheme: str) -> None:
    """An optimizer instance whose step needs no closure (the schemes step once per
    backward; a closure would re-run forward and backward inside a collective)."""
    if isinstance(optimizer, type):
        raise SchemeRefusal(
            f"{scheme} takes your optimizer itself, not its class: "
            f"{scheme}(model, {optimizer.__name__}(model.parameters(), lr=...))")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise SchemeRefusal(f"{scheme} needs a torch.optim.Optimizer, not "
                            f"{type(optimizer).__name__}")
    closure = inspect.signature(type(optimizer).step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise SchemeRefusal(
            f"{type(optimizer).__name__} steps with a closure (forward and backward again, "
            f"several times a step), which {scheme} cannot do: each of its steps is one "
            "collective over the lossy network. Use an optimizer that steps once per backward")


def refuse_closure(closure, scheme: str) -> None:
    if closure is not None:
        raise SchemeRefusal(f"{scheme}'s step takes no closure: call loss.backward() and "
                            "then optimizer.step()")


def _hyper(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


class ShardedOptimizer(torch.optim.Optimizer):
    # GradScaler hands the step to it, skip or not: the ranks agree on skips (ddp/amp.py)
    _step_supports_amp_scaling = True

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 collective, resync_every: int = 0, scaler=None, agree=amp.any_rank,
                 clip_grad_norm: float | None = None, sum_over=clipping.sum_over_ranks):
        check_wrappable(optimizer, "bounded_drift")
        clipping.check_max_norm(clip_grad_norm)
        # clip by the reduced gradient's norm (DDP's meaning; harness/ddp/clipping.py)
        self.clip_grad_norm, self.sum_over = clip_grad_norm, sum_over
        self.last_grad_norm: float | None = None  # the reduced gradient's, before clipping
        if resync_every < 0:
            raise ValueError("resync_every must be >= 0 (0: never)")
        if any(optimizer.state.values()):
            raise SchemeRefusal(
                "bounded_drift got an optimizer that has state already (it has stepped, or "
                "a checkpoint was loaded into it): wrap it fresh, then load the checkpoint "
                "into what bounded_drift returns")
        # the user's groups themselves (the same dicts: what a scheduler writes, step reads)
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self.user_optimizer = optimizer
        self.scaler, self.agree = scaler, agree
        self.collective = collective
        self.resync_every = resync_every
        self.params = [p for g in self.param_groups for p in g["params"]]
        if len({id(p) for p in self.params}) != len(self.params):
            raise SchemeRefusal("a parameter is in two of the optimizer's groups")
        numel = sum(p.numel() for p in self.params)
        # The flat copies live on the CPU, where the UDP transport reads and writes them.
        self.flat_params = torch.zeros(numel, dtype=torch.float32)
        self.flat_grads = torch.zeros(numel, dtype=torch.float32)
        start, end = Layout(numel, collective.world,
                            collective.transport.per_packet).shard_bounds(collective.rank)
        self.shard = (start, end)
        self.numel = numel
        self._load_flat_params()
        # this rank's piece of each group (empty where the shard misses the group)
        self.pieces: list[tuple[int, int]] = []
        inner_groups = []
        offset = 0
        for group in self.param_groups:
            size = sum(p.numel() for p in group["params"])
            lo, hi = max(start, offset), min(end, offset + size)
            lo, hi = (lo, hi) if lo < hi else (start, start)
            self.pieces.append((lo, hi))
            piece = torch.nn.Parameter(self.flat_params[lo:hi].clone())
            inner_groups.append({"params": [piece], **_hyper(group)})
            offset += size
        # built on the pieces, every group with all its settings; the constructor's
        # own arguments from the user's defaults (AdamW's defaults hold one it does not take)
        takes = inspect.signature(type(optimizer).__init__).parameters
        arguments = {k: v for k, v in optimizer.defaults.items() if k in takes}
        try:
            self.inner = type(optimizer)(inner_groups, **arguments)
        except (TypeError, ValueError) as err:
            raise SchemeRefusal(
                f"bounded_drift steps each rank's shard with a {type(optimizer).__name__} "
                f"built on it with your groups' settings, which failed: {err}") from err
        self.steps = 0
        self.collective_us = Histogram()

    def _load_flat_params(self, exact_only: bool = False) -> None:
        """The flat float32 copy from the model. exact_only: from the float32 parameters
        alone (a lower precision's copy is the master: reading it back would round it)."""
        offset = 0
        for p in self.params:
            n = p.numel()
            if not exact_only or p.dtype == torch.float32:
                self.flat_params[offset:offset + n] = p.detach().reshape(-1).float().cpu()
            offset += n

    def add_param_group(self, param_group: dict) -> None:
        if getattr(self, "inner", None) is not None:  # (the base class adds the first ones)
            raise SchemeRefusal("bounded_drift's shards are laid out when it wraps the "
                                "optimizer: add every group before wrapping it")
        super().add_param_group(param_group)

    def _owner_step(self, start: int, end: int, mean_grad: torch.Tensor) -> None:
        if self.clip_grad_norm is not None:
            mean_grad, self.last_grad_norm = clipping.clip_shard(
                mean_grad, self.clip_grad_norm, self.sum_over)
        for (lo, hi), group, inner_group in zip(self.pieces, self.param_groups,
                                                self.inner.param_groups, strict=True):
            piece = inner_group["params"][0]
            piece.grad = mean_grad[lo - start:hi - start]
            inner_group.update(_hyper(group))  # the scheduler's learning rate, and the rest
        self.inner.step()
        for (lo, hi), inner_group in zip(self.pieces, self.inner.param_groups, strict=True):
            self.flat_params[lo:hi] = inner_group["params"][0].detach()

    @torch.no_grad()
    def step(self, closure=None) -> None:
        refuse_closure(closure, "bounded_drift")
        if not amp.agreed_step(self, self.params, self.scaler, self.agree):
            return  # (every rank skips it: no collective)
        # From the model: what a load_state_dict of the model put there counts (in training
        # the model holds what the last step left, stale parts included: no change).
        self._load_flat_params(exact_only=True)
        start, _ = self.shard
        for (lo, hi), inner_group in zip(self.pieces, self.inner.param_groups, strict=True):
            inner_group["params"][0].copy_(self.flat_params[lo:hi])
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

    def lossy_collective(self):
        return self.collective

    def replica_drift(self) -> float:
        """How far this rank's parameters are from the owners' (the model bounded_drift
        bounds them by): ||mine - owners'|| / ||owners'||, the owners' shards fetched
        reliably (every rank calls it: a collective)."""
        owners = self.flat_params.clone()
        self.collective.resync(owners)
        return float((self.flat_params - owners).norm() / owners.norm().clamp_min(1e-12))

    def _layout(self) -> dict:
        return {"rank": self.collective.rank, "world": self.collective.world,
                "numel": self.numel, "shard": list(self.shard),
                "pieces": [list(p) for p in self.pieces]}

    def state_dict(self) -> dict:
        """This rank's: the groups' hyper-parameters, its shard's optimizer state, the step
        count and the layout it belongs to (each rank saves its own)."""
        saved = super().state_dict()  # (the groups; the state lives in the shard's)
        saved[STATE_KEY] = {"layout": self._layout(), "steps": self.steps,
                            "shard": self.inner.state_dict()}
        return saved

    def load_state_dict(self, state_dict: dict) -> None:
        mine = state_dict.get(STATE_KEY) if isinstance(state_dict, dict) else None
        if mine is None:
            raise SchemeRefusal("this state was not saved by bounded_drift's optimizer: "
                                "load it into the optimizer you wrapped before wrapping it, "
                                "or load a state bounded_drift's optimizer saved")
        if mine["layout"] != self._layout():
            raise SchemeRefusal(
                f"this state is rank {mine['layout']['rank']}'s shard of {mine['layout']['world']} "
                f"ranks; this is rank {self.collective.rank} of {self.collective.world}: "
                "each rank saves its own optimizer.state_dict() (e.g. to "
                "optimizer-rank{RANK}.pt) and loads its own, with the same world and model")
        base = {k: v for k, v in state_dict.items() if k != STATE_KEY}
        super().load_state_dict(base)
        self.params = [p for g in self.param_groups for p in g["params"]]
        self.inner.load_state_dict(mine["shard"])
        self.steps = mine["steps"]
        self._load_flat_params()  # (a resume loads the model too: its values, all of them)
