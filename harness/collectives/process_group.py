"""torch.distributed calls on tensors that live on the CPU, wherever the process group wants
them: NCCL takes only CUDA tensors (on the rank's current GPU), gloo takes CPU ones. Every
reliable exchange lossbed makes outside DDP (the lossy collective's reliable stages, the
evaluation's gathers) goes through here, so the same code runs under either backend."""

from __future__ import annotations

import torch
import torch.distributed as dist


def device() -> torch.device:
    """Where the default process group needs tensors: the rank's GPU under NCCL, else CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_(tensor: torch.Tensor) -> torch.Tensor:
    """In place: the sum over ranks."""
    on = tensor.to(device())
    dist.all_reduce(on)
    if on is not tensor:
        tensor.copy_(on)
    return tensor


def broadcast_(tensor: torch.Tensor, src: int) -> torch.Tensor:
    """In place: rank src's values on every rank."""
    on = tensor.to(device())
    dist.broadcast(on, src=src)
    if on is not tensor:
        tensor.copy_(on)
    return tensor


def all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's tensor (same shape and dtype on every rank), on the CPU, in rank order."""
    on = tensor.to(device())
    gathered = [torch.zeros_like(on) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, on)
    return [g.cpu() for g in gathered]
