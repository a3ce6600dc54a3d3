"""RPS (arXiv 1810.07766): every worker is also the parameter server of one block.

Models, not gradients, travel. After its local SGD step, worker i sends block j of its model
to worker j (lost with probability p); server j averages the blocks it received, its own
included; then sends the averaged block back to everyone; a worker that misses a packet of a
block keeps its own values there. On the wire this is the lossy reduce-scatter with the
received-mean rebuild followed by the keep-your-own broadcast: the same two stages as the
lossy all-reduce, applied to parameters.
"""

from __future__ import annotations

import torch

from harness.collectives.lossy import LossyCollective, StepStats


class RPS:
    def __init__(self, transport, store=None, **kwargs):
        self.collective = LossyCollective(transport, store, estimator="received_mean", **kwargs)

    def average(self, params: torch.Tensor, bucket: int = 0) -> StepStats:
        """In place: each block becomes its server's average of the models it received."""
        return self.collective.allreduce(params, bucket)
