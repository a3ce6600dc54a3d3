"""harness.api under plain torchrun (#56, item 4), two ranks on loopback: the script's own
process is left as it was (no gc.freeze, no sys.excepthook, no atexit, nothing of lossbed's
on stdout) and its metrics go to the metrics folder when it calls lossbed.finish(); a step
is an optimizer step, however many micro-batches gradient accumulation (ddp.no_sync) adds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness import rank_protocol
from tests.helpers import REPO, with_repo_on_path

pytestmark = [pytest.mark.slow]

STEPS, MICRO = 6, 3

SCRIPT = f"""
import atexit, gc, json, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import harness.api as lossbed

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 1))
hook_before, callbacks_before = sys.excepthook, atexit._ncallbacks()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
if sys.argv[1] == "rps":
    optimizer = lossbed.rps(model, optimizer)
else:
    lossbed.lossy_gradients(model, "unbiased")
data = torch.Generator().manual_seed(rank)
for step in range({STEPS}):
    for micro in range({MICRO}):  # gradient accumulation: the last micro-batch reduces
        x = torch.randn(8, 16, generator=data)
        if micro < {MICRO} - 1:
            with model.no_sync():
                model(x).pow(2).mean().backward()
        else:
            model(x).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
facts = dict(frozen=gc.get_freeze_count(), excepthook_kept=sys.excepthook is hook_before,
             atexit_added=atexit._ncallbacks() - callbacks_before)
lossbed.finish()
with open(f"facts{{rank}}.json", "w") as f:  # (the ranks' stdout lines may interleave)
    json.dump(facts, f)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("scheme", ["unbiased", "rps"])
def test_plain_torchrun_changes_nothing_process_wide_and_counts_optimizer_steps(tmp_path,
                                                                               scheme):
    (tmp_path / "job.py").write_text(SCRIPT)
    metrics = tmp_path / "metrics"
    env = {**os.environ, "PYTHONPATH": with_repo_on_path(), "LOSSBED_KEY": "ab" * 32,
           "LOSSBED_METRICS_DIR": str(metrics), "OMP_NUM_THREADS": "1",
           "TMPDIR": str(tmp_path)}  # (torchrun's agent leaves its log folder there)
    env.pop(rank_protocol.JOB, None)  # (not launched by lossbed)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "job.py", scheme], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert not [line for line in lines if rank_protocol.read_mark(line)], lines  # quiet
    facts = [json.loads((tmp_path / f"facts{rank}.json").read_text()) for rank in (0, 1)]
    assert facts == [{"frozen": 0, "excepthook_kept": True, "atexit_added": 0}] * 2
    for rank in (0, 1):
        written = json.loads((metrics / f"rank{rank}.json").read_text())
        assert written["steps"] == STEPS, (scheme, written["steps"])  # not STEPS * MICRO


def _llm_example(tmp_path, *args: str) -> dict[int, str]:
    """examples/llm_training.py on two ranks over loopback (lossless): rank 0's loss of
    each step it ran, as printed."""
    env = {**os.environ, "PYTHONPATH": with_repo_on_path(), "LOSSBED_KEY": "cd" * 32,
           "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    env.pop(rank_protocol.JOB, None)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(REPO / "examples/llm_training.py"),
                           "--scheme", "bounded_drift", "--steps", "6", *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {int(line.split()[1]): line.split()[3] for line in done.stdout.splitlines()
            if line.startswith("step ")}


def test_the_llm_example_resumes_from_each_ranks_checkpoint_as_if_uninterrupted(tmp_path):
    """bounded_drift's optimizer state is sharded (each rank saves its own): stopped after
    3 steps and resumed from the checkpoints, the next steps' losses are the uninterrupted
    run's, to the printed digit."""
    uninterrupted = _llm_example(tmp_path)
    stopped = _llm_example(tmp_path, "--checkpoint", "ckpt", "--stop-at", "3")
    resumed = _llm_example(tmp_path, "--checkpoint", "ckpt")
    assert sorted(stopped) == [0, 1, 2] and sorted(resumed) == [3, 4, 5]
    assert {**stopped, **resumed} == uninterrupted
