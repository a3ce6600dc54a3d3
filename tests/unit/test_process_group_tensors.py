"""Every reliable exchange outside DDP goes through harness/collectives/process_group.py,
which puts tensors where the process group needs them: the rank's GPU under NCCL, the CPU
under gloo. Here: the gloo path gives exact results in a world of one; under NCCL the device
is the current GPU; and no other module hands a tensor to torch.distributed itself."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from harness.collectives import process_group


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_under_gloo_tensors_stay_on_the_cpu_and_come_back_exact(world_of_one):
    assert process_group.device() == torch.device("cpu")
    x = torch.arange(5, dtype=torch.float32)
    assert process_group.all_reduce_(x) is x and torch.equal(x, torch.arange(5.0))
    assert torch.equal(process_group.broadcast_(x, src=0), torch.arange(5.0))
    gathered = process_group.all_gather(torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert len(gathered) == 1 and gathered[0].dtype == torch.float64
    assert torch.equal(gathered[0], torch.tensor([1.0, 2.0], dtype=torch.float64))


def test_under_nccl_the_device_is_the_ranks_current_gpu(monkeypatch):
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert process_group.device() == torch.device("cuda", 3)


# DDP's buckets (harness/collectives/reliable.py, the DDP hooks) are already on the model's
# device: only tensors lossbed makes itself must take the helper.
DIRECT_CALLS_ALLOWED = {"harness/collectives/process_group.py",
                        "harness/collectives/reliable.py"}
TENSOR_CALLS = {"all_reduce", "broadcast", "all_gather", "reduce", "gather", "scatter",
                "reduce_scatter", "send", "recv"}


