"""Training on CUDA tensors: the hook's pinned staging buffers, the sharded optimizer and
RPS with parameters on the GPU. Two ranks share one GPU (gloo takes CUDA tensors; NCCL would
want a GPU per rank). Skipped where there is no GPU; the numbers go in the issue note when
they have been run on one."""

from __future__ import annotations

import math

import pytest
import torch

from harness.train import run
from harness.train.config import TrainConfig
from testbed import clusters
from testbed.clusters import netns as netns_cluster
from tests.helpers import unique_name, untrained_ppl

pytestmark = [
    pytest.mark.hardware, pytest.mark.netns, pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)"),
]


@pytest.fixture(scope="module")
def cluster():
    c = netns_cluster.up(netns_cluster.ClusterSpec(hosts=2, name=unique_name()))
    yield c
    clusters.down(c.name)


@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.parametrize("variant", ["reliable", "unbiased", "unbiased_drift", "rps"])
def test_cuda_training_under_loss(cluster, tmp_path, preset, variant):
    cfg = TrainConfig(variant=variant, preset=preset, steps=30, batch=8, seq_len=64,
                      device="cuda", log_every=1000)
    rec = run.train(cluster, cfg, "random-loss", ["loss_pct=10"], tmp_path, echo=print)
    print(f"CUDA {preset} {variant}: ppl {rec['ppl']:.3f}, {rec['tokens_per_s']:.0f} tok/s, "
          f"step p50 {rec['step_ms']['p50']:.1f} ms")
    assert math.isfinite(rec["ppl"]) and rec["ppl"] < untrained_ppl(cfg)
