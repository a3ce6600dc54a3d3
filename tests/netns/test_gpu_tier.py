"""The hardware tier's one command (tests/hardware/tier.py, `make test-gpu`) on a machine
without a GPU: the core is checked, the doctor says why the GPU steps cannot run, they are
reported as not run, the exit code is 3, the last line is the JSON summary, and the cluster it
made is gone. (On a GPU host the same command runs every step: the issue note has its table.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from testbed.clusters import netns as netns_cluster
from tests.helpers import REPO, with_repo_on_path

pytestmark = pytest.mark.netns


def _tier(*args: str) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "tests.hardware.tier", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": with_repo_on_path()})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_the_tier_says_so_and_exits_3(tmp_path):
    before = set(netns_cluster.leftover_clusters())
    result = _tier("--only", "core,doctor,hook,train,nccl,coverage", "--out", str(tmp_path))
    assert result.returncode == 3, result.stdout + result.stderr[-2000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    rows = {r["step"]: r for r in summary["rows"]}
    assert rows["core"]["result"] == "passed"
    assert rows["doctor"]["result"] == "failed" and "GPUs: 0" in rows["doctor"]["detail"]
    for step in ("hook", "train", "nccl", "coverage"):
        assert rows[step]["result"] == "not run" and "not a GPU host" in rows[step]["detail"]
    assert "step" in result.stdout and "not run" in result.stdout  # the table
    assert json.loads((tmp_path / "tier.json").read_text()) == summary
    assert set(netns_cluster.leftover_clusters()) == before, "the tier left a cluster behind"


def test_an_unknown_step_is_refused_naming_the_choices(tmp_path):
    result = _tier("--only", "core,warp", "--out", str(tmp_path))
    assert result.returncode == 2 and "warp" in result.stderr and "nccl" in result.stderr
