"""What every variant's wrapper declares to the worker and to `lossbed run`'s API (#68 item
4): the time of its collective per call, the lossy collective it runs, and how far its
replicas drifted. The DDP hooks' states and the lossy optimizers implement it, so no caller
probes them for a member (tests/unit/test_collective_timing.py holds each to it)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from harness.metrics.hdr import Histogram


@runtime_checkable
class CollectiveTiming(Protocol):
    collective_us: Histogram
    """Each call of the collective, from its gradients being ready to its result (µs)."""

    def lossy_collective(self):
        """The lossy collective it runs (its `totals`, `missing`, ...); None: reliable
        (torch.distributed's own all-reduce)."""

    def replica_drift(self) -> float | None:
        """How far this rank's replica is from the one the ranks agree on
        (||mine - theirs|| / ||theirs||); a collective, every rank calls it. None: the
        variant keeps no replicas apart (a gradient all-reduce ends with one model)."""
