"""The chaos check's twin (harness/train/one_lossy_step.py): one step's gradient loses the
loss rate of its datagram-sized blocks, the same blocks on every rank, at the warm-up's end."""

from __future__ import annotations

import pytest
import torch

from harness.train import one_lossy_step


def _params(sizes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    params = []
    for n in sizes:
        p = torch.nn.Parameter(torch.zeros(n))
        p.grad = torch.randn(n, generator=gen) + 5.0  # no element is 0 by chance
        params.append(p)
    return params


def test_the_fraction_of_blocks_is_zeroed_whole_and_the_rest_kept():
    params = _params([1000, 37, 5000, 3])
    before = torch.cat([p.grad.clone() for p in params])
    lost = one_lossy_step.drop_blocks(params, 0.1, block=50, seed=3)
    after = torch.cat([p.grad for p in params])
    blocks = -(-after.numel() // 50)
    # exactly the blocks the seeded draw names (#71: any fraction from 0 to 20% passed)
    drawn = torch.rand(blocks, generator=torch.Generator().manual_seed(
        3 + one_lossy_step.DROP_SEED_OFFSET)) < 0.1
    assert lost == int(drawn.sum()) > 0
    zero = after == 0
    assert [bool(zero[50 * b]) for b in range(blocks)] == drawn.tolist()
    assert int(zero.sum()) == sum(min(50, after.numel() - 50 * b) for b in range(blocks)
                                  if bool(zero[50 * b]))
    for b in range(blocks):  # a block is lost whole or kept whole, across parameter edges
        chunk = zero[50 * b:50 * (b + 1)]
        assert bool(chunk.all()) or not bool(chunk.any())
    assert torch.equal(after[~zero], before[~zero])


def test_every_rank_draws_the_same_blocks_and_another_seed_others():
    a, b, c = _params([4000], 1), _params([4000], 2), _params([4000], 1)
    one_lossy_step.drop_blocks(a, 0.2, block=40, seed=7)
    one_lossy_step.drop_blocks(b, 0.2, block=40, seed=7)   # another rank: other gradients
    one_lossy_step.drop_blocks(c, 0.2, block=40, seed=8)
    assert torch.equal(a[0].grad == 0, b[0].grad == 0)
    assert not torch.equal(a[0].grad == 0, c[0].grad == 0)


@pytest.mark.parametrize(("steps", "warmup", "step"), [(150, None, 7), (300, None, 14),
                                                       (8, None, 0), (100, 10, 9), (3, 10, 2)])
def test_the_lossy_step_is_the_warm_ups_last(steps, warmup, step):
    assert one_lossy_step.step_of(steps, warmup) == step
