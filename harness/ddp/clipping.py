"""Gradient clipping as DDP means it (#66): by the 2-norm of the reduced gradient, the one
every rank's optimizer steps with, not of a rank's own. Under bounded_drift a rank's .grad
stays local (its owners get the reduced gradient, a shard each), so clip_grad_norm_ in the
script would clip something else; the wrapper clips instead (bounded_drift(...,
clip_grad_norm=MAX)): each owner's shard of the reduced gradient is scaled as
torch.nn.utils.clip_grad_norm_ scales the whole, the total norm summed reliably from every
owner's squared shard norm (one float a step). Under rps no rank holds a reduced gradient:
rps(..., clip_grad_norm=MAX) reduces the mean gradient reliably for its norm (clip_local).
Under lossy_gradients the script's own clip_grad_norm_ sees the reduced gradient already."""

from __future__ import annotations

import math

import torch

EPS = 1e-6  # what clip_grad_norm_ adds to the norm before dividing


def sum_over_ranks(value: float) -> float:
    """The sum of `value` over every rank: a reliable all-reduce over the default process
    group (the job's own), in float64; a job of one process: the value."""
    import torch.distributed as dist

    from harness.collectives import process_group

    if not dist.is_available() or not dist.is_initialized():
        return value
    return float(process_group.all_reduce_(torch.tensor([value], dtype=torch.float64)).item())


def check_max_norm(max_norm) -> None:
    if max_norm is not None and not (isinstance(max_norm, int | float)
                                     and math.isfinite(max_norm) and max_norm > 0):
        raise ValueError(f"clip_grad_norm={max_norm!r}: give the largest 2-norm of the "
                         "reduced gradient, a positive number (as clip_grad_norm_'s max_norm)")


def clip_shard(shard: torch.Tensor, max_norm: float,
               sum_over=sum_over_ranks) -> tuple[torch.Tensor, float]:
    """This owner's shard of the reduced gradient, scaled by min(1, max_norm / (total norm +
    EPS)), and the total norm (every rank calls it once a step: the sum is collective)."""
    total = math.sqrt(sum_over(float(shard.double().pow(2).sum())))
    return shard * min(1.0, max_norm / (total + EPS)), total


def mean_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The mean of `tensor` over every rank, reliably (the default process group); a job
    of one process: the tensor."""
    import torch.distributed as dist

    from harness.collectives import process_group

    if not dist.is_available() or not dist.is_initialized():
        return tensor
    return process_group.all_reduce_(tensor.clone()) / dist.get_world_size()


def clip_local(grads: list[torch.Tensor], max_norm: float,
               mean_over=mean_over_ranks) -> float:
    """rps: no rank holds the reduced gradient (RPS averages models), so the norm
    clip_grad_norm_ would see under DDP is the norm of the ranks' mean gradient, reduced
    reliably for it (the whole gradient, every step clipping is asked for: the price of
    DDP's meaning there). Each rank's own gradient is scaled by that clip's coefficient:
    lossless under SGD, the average of the steps is DDP's clipped step. The norm."""
    flat = torch.cat([g.reshape(-1).float() for g in grads])
    total = float(mean_over(flat).double().norm())
    coef = min(1.0, max_norm / (total + EPS))
    for g in grads:
        g.mul_(coef)
    return total

