"""Training batches the way torch's DistributedSampler gives them.

The training text is cut into consecutive samples of seq_len + 1 tokens. Each epoch, one
seeded permutation of all samples (the same on every rank, and the same for every variant
of a seed) is dealt out rank by rank: rank r takes positions r, r + world, r + 2·world, ...
So every rank draws from the whole training split, the ranks' data are identically
distributed (the condition under which the received-mean estimator is unbiased), no sample
is used twice in one step, and a run's data order depends on the seed alone.
"""

from __future__ import annotations

import torch

from testbed.errors import UsageError


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
        self.epoch = -1
        self._start_epoch()

    def _start_epoch(self) -> None:
        self.epoch += 1
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.samples, generator=generator)[:self.per_rank * self.world]
        self.mine = order[self.rank::self.world]
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
