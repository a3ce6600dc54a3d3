"""The chaos check's twin at the loss's own scale (harness/bench/stability.py): a reliable
run in which one step's gradient loses what a lossy step can lose.

At one step (the end of the warm-up, the first at the peak rate: where a lost update moves
the model most), after the gradients are aggregated, a fraction of them is zeroed in blocks
of one datagram's payload, as zero_fill would rebuild a step whose datagrams were lost at
that rate. It is the largest change one lossy step makes (the received-mean estimators of
the lossy variants rebuild most of it), so a regime that keeps its final perplexity under
it is not chaotic at the scale of the loss. The blocks are drawn from the run's seed alone:
every rank zeroes the same ones, and the replicas stay equal.
"""

from __future__ import annotations

import torch

# apart from the model's and the data's seeds: the twin's blocks are not their draws
DROP_SEED_OFFSET = 7_777_777


def step_of(steps: int, warmup: int | None) -> int:
    """The step the twin's gradient loses its blocks at: the warm-up's last (0-based)."""
    from harness.train import schedule

    return min(steps - 1, schedule.warmup_steps(steps, warmup) - 1)


@torch.no_grad()
def drop_blocks(parameters, fraction: float, block: int, seed: int) -> int:
    """Zero `fraction` of the gradients' blocks of `block` elements (the parameters in
    order, as one flat vector); the number of blocks zeroed."""
    grads = [p.grad for p in parameters if p.grad is not None]
    total = sum(g.numel() for g in grads)
    blocks = -(-total // block)
    gen = torch.Generator().manual_seed(seed + DROP_SEED_OFFSET)
    lost = torch.rand(blocks, generator=gen) < fraction
    keep = (~lost).repeat_interleave(block)[:total]
    offset = 0
    for g in grads:
        g.mul_(keep[offset:offset + g.numel()].view_as(g).to(g.dtype))
        offset += g.numel()
    return int(lost.sum())
