"""A bucket's way to the lossy collective and back (#67 item 6). The collective works on
CPU float32; a bucket that is not (a CUDA bucket, a half-precision one) goes through a host
buffer of its own (one per bucket index, reused every step).

    HostStaging   a CPU bucket of another dtype: copied and converted in place, at once
    CudaStaging   a CUDA bucket: pinned host buffers and a copy stream of its own. The copy
                  to the host is queued on the copy stream behind an event the compute
                  stream recorded when DDP handed the bucket over, so backward goes on
                  computing the next buckets meanwhile; the hook's thread waits on that
                  copy's own event (not the whole device) before reducing; the copy back is
                  queued on the copy stream too, and the compute stream waits on its event
                  (a wait queued on the GPU: no thread of the CPU blocks on it).

Both keep one order per bucket: its next copy to the host is queued behind its copy back on
the same stream, so a buffer is never overwritten while the device still reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class HostStaging:
    """Host buffers, one per bucket index, for buckets the collective cannot take as they
    are."""

    buffers: dict[int, torch.Tensor] = field(default_factory=dict)

    def buffer(self, index: int, like: torch.Tensor) -> torch.Tensor:
        found = self.buffers.get(index)
        if found is None or found.numel() != like.numel():
            found = torch.empty(like.numel(), dtype=torch.float32,
                                pin_memory=like.is_cuda and torch.cuda.is_available())
            self.buffers[index] = found
        return found

    def to_host(self, index: int, grads: torch.Tensor):
        """The bucket's values in its host buffer; returns (buffer, something to wait on
        before reading it, or None)."""
        host = self.buffer(index, grads)
        host.copy_(grads.view(-1))
        return host, None

    def to_device(self, host: torch.Tensor, grads: torch.Tensor, consumer=None) -> None:
        grads.view(-1).copy_(host)


class CudaStaging(HostStaging):
    """HostStaging for CUDA buckets: the copies on a stream of their own, ordered by events
    (see the module's text). `buffers`: shared with the CPU staging (one per bucket)."""

    def __init__(self, buffers: dict[int, torch.Tensor] | None = None):
        super().__init__({} if buffers is None else buffers)
        self.streams: dict[torch.device, torch.cuda.Stream] = {}

    def stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self.streams:
            self.streams[device] = torch.cuda.Stream(device)
        return self.streams[device]

    def to_host(self, index: int, grads: torch.Tensor):
        host = self.buffer(index, grads)
        compute = torch.cuda.current_stream(grads.device)
        copier = self.stream(grads.device)
        ready = torch.cuda.Event()
        ready.record(compute)  # the bucket's gradients are final once this is reached
        with torch.cuda.stream(copier):
            copier.wait_event(ready)
            host.copy_(grads.view(-1), non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(copier)
        grads.record_stream(copier)  # (the bucket is DDP's, alive all step: told anyway)
        return host, copied

    def to_device(self, host: torch.Tensor, grads: torch.Tensor, consumer=None) -> None:
        """The reduced values back into the bucket; `consumer` (the compute stream the hook
        was called on) waits for them on the GPU."""
        copier = self.stream(grads.device)
        with torch.cuda.stream(copier):
            grads.view(-1).copy_(host, non_blocking=True)
            back = torch.cuda.Event()
            back.record(copier)
        (consumer or torch.cuda.current_stream(grads.device)).wait_event(back)


def staging_for(grads: torch.Tensor, cpu: HostStaging, cuda: CudaStaging | None):
    """How a bucket reaches the collective: None (as it is: CPU float32), or a staging."""
    if grads.is_cuda:
        return cuda
    return cpu if grads.dtype != torch.float32 else None
