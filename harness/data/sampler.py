"""Training batches from torch's DistributedSampler.

The training text is cut into consecutive samples of seq_len + 1 tokens. Each epoch, one
seeded permutation of all samples (the same on every rank, and the same for every variant
of a seed) is dealt out rank by rank: rank r takes positions r, r + world, r + 2·world, ...
So every rank draws from the whole training split, the ranks' data are identically
distributed (the condition under which the received-mean estimator is unbiased), no sample
is used twice in one step, and a run's data order depends on the seed alone.

DistributedSampler seeds each epoch with seed + epoch, so seed s's second epoch would be seed
s + 1's first: the seed it is given is spread by SEED_STRIDE so that no two seeds of a bench
share an epoch's order.
"""

from __future__ import annotations

import torch
from torch.utils.data import DistributedSampler

from testbed.errors import UsageError

SEED_STRIDE = 1_000_003


class Batches:
    def __init__(self, train: torch.Tensor, rank: int, world: int, batch: int, seq_len: int,
                 seed: int):
        self.tokens, self.rank, self.world = train, rank, world
        self.batch, self.seq_len, self.seed = batch, seq_len, seed
        self.samples = (len(train) - 1) // seq_len
        self.per_rank = self.samples // world
        if self.per_rank < batch:
            raise UsageError("--batch", f"the training split has {self.samples} samples of "
                             f"{seq_len} + 1 tokens: {self.per_rank} per rank, fewer than a "
                             f"batch of {batch}", "Use a smaller --batch or --seq-len, fewer "
                             "hosts, or a larger corpus")
        # (the sampler reads only the dataset's length: the samples are numbered, not loaded)
        self.sampler = DistributedSampler(range(self.samples), num_replicas=world, rank=rank,
                                          shuffle=True, seed=seed * SEED_STRIDE,
                                          drop_last=True)
        self.epoch = -1
        self._start_epoch()

    def _start_epoch(self) -> None:
        self.epoch += 1
        self.sampler.set_epoch(self.epoch)
        self.mine = torch.tensor(list(self.sampler), dtype=torch.long)
        self.position = 0

    def next_indices(self) -> torch.Tensor:
        """The sample numbers of this rank's next batch."""
        if self.position + self.batch > len(self.mine):
            self._start_epoch()
        chosen = self.mine[self.position:self.position + self.batch]
        self.position += self.batch
        return chosen

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self.next_indices() * self.seq_len
        windows = torch.stack([self.tokens[s:s + self.seq_len + 1] for s in starts.tolist()])
        return windows[:, :-1], windows[:, 1:]
