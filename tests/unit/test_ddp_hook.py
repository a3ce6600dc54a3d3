"""The DDP communication hook (harness/ddp/hooks.py): a bucket the lossy collective cannot
take as it is (CUDA, or not float32) goes through one host staging buffer per bucket,
reused, and comes back in the bucket's own dtype and device; a float32 CPU bucket is reduced
in place. Two ranks on loopback (127.0.0.1), no loss: the result is the exact mean."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from harness.collectives.lossy import LossyCollective
from harness.ddp.hooks import LossyHookState, lossy_allreduce_hook
from harness.ddp.staging import HostStaging
from harness.reproduce.loopback import on_every_rank
from tests.unit.test_transport_hostile import make_pair


class Bucket:
    """What the hook uses of DDP's GradBucket."""

    def __init__(self, index: int, grads: torch.Tensor, last: bool = True):
        self._index, self._grads, self._last = index, grads, last

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def buffer(self) -> torch.Tensor:
        return self._grads


def hooked(grads_of_rank, buckets=(0,), calls=1):
    """Each rank runs the hook on its buckets, `calls` times over; per rank its state and
    the results of its last call."""
    store, transports = make_pair()
    try:
        def work(rank):
            state = LossyHookState(LossyCollective(transports[rank], store))
            results = []
            for _ in range(calls):
                results = []
                for index in buckets:
                    grads = grads_of_rank(rank, index)
                    future = lossy_allreduce_hook(state, Bucket(index, grads,
                                                                index == buckets[-1]))
                    results.append((grads, future.wait()))
            return state, results

        return on_every_rank(2, work)
    finally:
        for t in transports:
            t.close()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_a_bucket_of_another_dtype_is_staged_reduced_and_returned_in_its_dtype(dtype):
    def grads(rank, index):  # rank 0: 1, 2, 3, ...; rank 1: 3, 4, 5, ... (means exact)
        return (torch.arange(5000, dtype=torch.float32) % 64 + 1 + 2 * rank).to(dtype)

    ranks = hooked(grads, buckets=(0, 1), calls=2)
    expected = (torch.arange(5000, dtype=torch.float32) % 64 + 2).to(dtype)
    for state, results in ranks:
        for grads_in, result in results:
            assert result is grads_in and result.dtype == dtype  # in place, its own dtype
            assert torch.equal(result, expected)
        # one float32 staging buffer per bucket, kept from the first call to the second
        assert sorted(state.staging) == [0, 1]
        assert all(b.dtype == torch.float32 and b.numel() == 5000
                   for b in state.staging.values())
        assert not any(b.is_pinned() for b in state.staging.values())  # (no CUDA here)


def test_a_staging_buffer_is_reused_and_remade_only_when_the_bucket_changes_size():
    staging = HostStaging()
    like = torch.zeros(100, dtype=torch.bfloat16)
    first = staging.buffer(3, like)
    assert staging.buffer(3, like) is first
    assert staging.buffer(3, torch.zeros(200)).numel() == 200  # (DDP rebuilt its buckets)


class _Event:
    def __init__(self, said):
        self.said = said

    def synchronize(self):
        self.said.append("waited for this bucket's copy")


class _OrderedStaging:
    """A staging as CudaStaging is used: an event to wait on per copy out."""

    def __init__(self, said):
        self.said, self.host = said, torch.zeros(4)

    def to_host(self, index, grads):
        self.said.append(f"copy out {index}")
        self.host.copy_(grads)
        return self.host, _Event(self.said)

    def to_device(self, host, grads, consumer):
        self.said.append(f"copy back {consumer}")
        grads.copy_(host)


def test_a_staged_bucket_is_copied_out_at_once_and_reduced_after_its_own_copy(monkeypatch):
    """The copy out is queued before the hook returns; the reducing thread waits on that
    copy's event alone before the collective reads the buffer, and the copy back is made
    for the stream the hook was called on (#67 item 6: no synchronisation of the device)."""
    from harness.ddp import hooks

    said = []
    collective = HeldCollective()
    state = LossyHookState(collective)
    monkeypatch.setattr(hooks, "staging_for", lambda grads, cpu, cuda: _OrderedStaging(said))
    grads = torch.ones(4)
    future = lossy_allreduce_hook(state, Bucket(0, grads))
    assert said == ["copy out 0"] and not future.done()  # backward goes on meanwhile
    collective.go.set()
    assert torch.equal(future.wait(), torch.full((4,), 2.0))
    assert said == ["copy out 0", "waited for this bucket's copy", "copy back None"]


def test_a_float32_cpu_bucket_is_reduced_in_place_without_staging():
    ranks = hooked(lambda rank, index: torch.full((3000,), float(2 * rank + 1)))
    for state, [(grads_in, result)] in ranks:
        assert result is grads_in and torch.equal(result, torch.full((3000,), 2.0))
        assert state.staging == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_bucket_goes_through_a_pinned_buffer_and_comes_back_on_its_device():
    ranks = hooked(lambda rank, index: torch.full((3000,), float(2 * rank + 1),
                                                  device="cuda"))
    for state, [(grads_in, result)] in ranks:
        assert result is grads_in and result.is_cuda
        assert torch.equal(result.cpu(), torch.full((3000,), 2.0))
        assert state.staging[0].is_pinned()


class HeldCollective(LossyCollective):
    """A collective whose reduce waits until the test lets it go (no network)."""

    def __init__(self):  # (LossyCollective's own set-up is not needed)
        self.go, self.reduced = threading.Event(), []

    def allreduce(self, x, bucket=0):
        assert self.go.wait(30)
        if bucket == 99:
            raise RuntimeError("the collective failed (injected)")
        self.reduced.append(bucket)
        x.mul_(2)


def test_the_hook_returns_before_its_bucket_is_reduced_and_backward_goes_on():
    """The future is pending when the hook returns (backward computes the next buckets
    meanwhile), the buckets are reduced in DDP's order, and the thread that reduced them
    is gone after the last."""
    collective = HeldCollective()
    state = LossyHookState(collective)
    # (the threads alive before, by identity: one an earlier test left winding down may end
    # meanwhile, which a count took for the hook's thread gone twice)
    threads_before = set(threading.enumerate())
    futures = [lossy_allreduce_hook(state, Bucket(i, torch.ones(4), last=i == 2))
               for i in range(3)]
    assert not any(f.done() for f in futures)  # nothing reduced yet: backward went on
    collective.go.set()
    assert [float(f.wait()[0]) for f in futures] == [2.0, 2.0, 2.0]
    assert collective.reduced == [0, 1, 2]
    deadline = time.monotonic() + 5
    while set(threading.enumerate()) - threads_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert set(threading.enumerate()) - threads_before == set()
    assert state.collective_us.total == 3


def test_a_failed_reduce_reaches_backward_through_the_future():
    collective = HeldCollective()
    collective.go.set()
    future = lossy_allreduce_hook(LossyHookState(collective), Bucket(99, torch.ones(4)))
    with pytest.raises(RuntimeError, match="injected"):
        future.wait()


def test_clipping_after_the_hook_clips_the_reduced_gradient_as_ddp_does():
    """Under lossy_gradients the gradient a script clips after backward is the reduced one,
    in place (#66: a clip_grad_norm_ there means what it means under DDP): lossless, every
    rank's clipped gradient is the clipped exact mean."""
    def grads(rank, index):
        return torch.linspace(-1, 1, 4000) * (rank + 1)

    mean = torch.linspace(-1, 1, 4000) * 1.5
    expected = mean.clone()
    total = float(expected.norm())
    expected *= min(1.0, 0.5 / (total + 1e-6))
    for _, [(_, result)] in hooked(grads):
        parameter = torch.nn.Parameter(torch.zeros(4000))
        parameter.grad = result
        assert float(torch.nn.utils.clip_grad_norm_([parameter], 0.5)) == pytest.approx(total)
        assert torch.allclose(parameter.grad, expected, rtol=0, atol=1e-7)
        assert total > 0.5  # (the clip acted)


def test_each_bucket_is_staged_by_what_it_is():
    from harness.ddp.staging import staging_for

    cpu, cuda = HostStaging(), object()
    assert staging_for(torch.zeros(2), cpu, cuda) is None  # CPU float32: as it is
    assert staging_for(torch.zeros(2, dtype=torch.bfloat16), cpu, cuda) is cpu
    assert staging_for(torch.zeros(2, dtype=torch.float64), cpu, cuda) is cpu
