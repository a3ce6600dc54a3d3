"""DDP communication hooks: each gradient bucket through the lossy all-reduce, or through
DDP's own all-reduce, timed (the reliable baseline).

    model = DDP(model)
    model.register_comm_hook(LossyHookState(collective), lossy_allreduce_hook)

DDP's contract: hook(state, bucket) -> Future[Tensor] holding the bucket's averaged
gradients. The lossy hook returns it pending, as torch's own hooks do: the bucket is reduced
on a thread of the hook's while backward goes on computing the buckets after it, so
communication overlaps backward (the thread lives for one backward: started by its first
bucket, ended after its last, so nothing of lossbed's runs between steps, when a DataLoader
may fork). Buckets are reduced one after the other, in the order DDP hands them over (the
collective's steps are numbered in that order on every rank). The lossy collective works on
CPU float32: other buckets go through a host buffer (harness/ddp/staging.py). A CUDA
bucket's copy to pinned memory is queued on a copy stream behind an event of the compute
stream, so backward goes on meanwhile; the reducing thread waits on that bucket's copy
alone, and the compute stream waits for the copy back on the GPU (no synchronisation of the
whole device).
"""

# No `from __future__ import annotations` here: DDP checks the hook's return annotation
# object, which must be torch.futures.Future[torch.Tensor] itself, not a string.
import queue
import threading
import time

import torch

from harness.collectives.lossy import LossyCollective
from harness.ddp import amp
from harness.ddp.staging import CudaStaging, HostStaging, staging_for
from harness.metrics.hdr import Histogram


class LossyHookState:
    """What the hook needs between calls: the collective, staging buffers, timings."""

    def __init__(self, collective: LossyCollective, agree_skips: bool = False,
                 agree=amp.any_rank):
        if not isinstance(collective, LossyCollective):
            raise TypeError("LossyHookState needs a LossyCollective")
        self.collective = collective
        # GradScaler's skips agreed (ddp/amp.py): a bucket of this step was not finite here
        self.agree_skips, self.agree, self.not_finite = agree_skips, agree, False
        self.host = HostStaging()
        self.cuda = CudaStaging(self.host.buffers) if torch.cuda.is_available() else None
        self.collective_us = Histogram()
        self.overlap = Overlap()

    def lossy_collective(self) -> LossyCollective:
        return self.collective

    def replica_drift(self) -> None:
        return None  # (an all-reduce of gradients: every rank steps the same model)

    @property
    def staging(self) -> dict[int, torch.Tensor]:
        """The host buffers, one per bucket index (both stagings share them)."""
        return self.host.buffers


class Overlap:
    """The thread a backward's buckets are reduced on, one after the other, while backward
    goes on: started by the first bucket, it ends after the last (is_last)."""

    def __init__(self):
        self.work: queue.SimpleQueue | None = None

    def submit(self, reduce, future: torch.futures.Future, last: bool) -> None:
        if self.work is None:
            self.work = queue.SimpleQueue()
            threading.Thread(target=self._reduce_each, args=(self.work,), daemon=True,
                             name="lossbed-buckets").start()
        self.work.put((reduce, future))
        if last:
            self.work.put(None)  # (the thread ends once it reduced this one)
            self.work = None

    @staticmethod
    def _reduce_each(work: queue.SimpleQueue) -> None:
        while (item := work.get()) is not None:
            reduce, future = item
            try:
                future.set_result(reduce())
            except BaseException as err:  # noqa: BLE001 - DDP raises it from backward
                future.set_exception(err)


def lossy_allreduce_hook(state: LossyHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    grads = bucket.buffer()
    index, last = bucket.index(), bucket.is_last()
    started = time.perf_counter()
    staging = staging_for(grads, state.host, state.cuda)
    if staging is not None:
        # the copy out (queued behind the bucket's gradients on a CUDA device)
        host, copied = staging.to_host(index, grads)
        consumer = torch.cuda.current_stream(grads.device) if grads.is_cuda else None

    def reduce() -> torch.Tensor:
        if staging is not None:
            if copied is not None:
                copied.synchronize()  # this bucket's copy, not the whole device
            state.collective.allreduce(host, bucket=index)
            staging.to_device(host, grads, consumer)
        else:
            state.collective.allreduce(grads.view(-1), bucket=index)
        if state.agree_skips:
            agree_on_skips(state, grads, last)
        state.collective_us.record((time.perf_counter() - started) * 1e6)
        return grads

    future = torch.futures.Future()
    state.overlap.submit(reduce, future, last)
    return future


def agree_on_skips(state: LossyHookState, grads: torch.Tensor, last: bool) -> None:
    """Where any rank's reduced gradients were not finite this step, every rank's are made
    so (its last bucket): GradScaler then skips the step on every rank alike."""
    state.not_finite = state.not_finite or not bool(torch.isfinite(grads).all())
    if last:
        if state.agree(state.not_finite) and not state.not_finite:
            grads.fill_(float("nan"))
        state.not_finite = False


class ReliableTiming:
    """State of timed_allreduce_hook: the collective-time histogram."""

    def __init__(self):
        self.collective_us = Histogram()

    def lossy_collective(self) -> None:
        return None  # torch.distributed's own all-reduce

    def replica_drift(self) -> None:
        return None


def timed_allreduce_hook(state: ReliableTiming, bucket):
    """DDP's own all-reduce (default_hooks.allreduce_hook: the same arithmetic as no hook),
    timed from the bucket being ready to its reduction being done."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    started = time.perf_counter()

    def done(fut):
        state.collective_us.record((time.perf_counter() - started) * 1e6)
        return fut.value()

    return allreduce_hook(None, bucket).then(done)
