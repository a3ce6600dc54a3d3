"""DDP is wrapped on the host's own torch: where DDP has `forward_sync_buffers` (torch 2.13+)
that keyword turns off the per-forward buffer broadcast; on an older torch (the GPU hosts'
2.11, say) `broadcast_buffers=False` does, and the wrap still trains. A world of one gloo
process on loopback."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from harness.ddp.wrap import no_forward_buffer_sync, wrap_ddp


class DDPWithoutForwardSyncBuffers(DistributedDataParallel):
    """DDP as torch 2.4-2.12 have it: no `forward_sync_buffers` keyword; passing one fails as
    it failed on the GPU host ("unexpected keyword argument 'forward_sync_buffers'")."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False):
        super().__init__(module, device_ids=device_ids, output_device=output_device, dim=dim,
                         broadcast_buffers=broadcast_buffers, process_group=process_group,
                         bucket_cap_mb=bucket_cap_mb,
                         find_unused_parameters=find_unused_parameters,
                         check_reduction=check_reduction,
                         gradient_as_bucket_view=gradient_as_bucket_view,
                         static_graph=static_graph)


class WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        self.register_buffer("scale", torch.ones(2))

    def forward(self, x):
        return self.linear(x) * self.scale


def forward_broadcast_of(ddp) -> bool:
    """What DDP's forward reads: `forward_sync_buffers` from torch 2.13, `broadcast_buffers`
    before."""
    return getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", None))


@pytest.fixture
def world_of_one():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_keyword_matches_the_ddp_at_hand():
    keywords = inspect.signature(DistributedDataParallel.__init__).parameters
    has_it = "forward_sync_buffers" in keywords
    expected = {"forward_sync_buffers": False} if has_it else {"broadcast_buffers": False}
    assert no_forward_buffer_sync() == expected
    assert no_forward_buffer_sync(DDPWithoutForwardSyncBuffers) == {"broadcast_buffers": False}


def test_a_torch_without_forward_sync_buffers_is_wrapped_with_broadcast_buffers_off(world_of_one):
    with pytest.raises(TypeError, match="forward_sync_buffers"):
        DDPWithoutForwardSyncBuffers(WithBuffer(), forward_sync_buffers=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ddp = wrap_ddp(WithBuffer(), ddp_class=DDPWithoutForwardSyncBuffers)
        ddp(torch.randn(3, 4)).sum().backward()
    assert forward_broadcast_of(ddp) is False
    assert all(p.grad is not None for p in ddp.parameters())
    # Where DDP has the new keyword the old one is deprecated: that warning is the price of
    # exercising the fallback on such a torch, and nothing else is said.
    messages = [str(w.message) for w in seen]
    assert all("broadcast_buffers" in message for message in messages), messages


def test_the_wrap_on_this_torch_turns_the_forward_broadcast_off(world_of_one):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the wrap says nothing deprecated on this torch
        ddp = wrap_ddp(WithBuffer())
    assert forward_broadcast_of(ddp) is False
