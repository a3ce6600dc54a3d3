"""Wrapping a model in DDP on whatever torch the host brings.

The lossy variants keep DDP from re-broadcasting buffers before every forward: that broadcast
is a reliable gloo/NCCL round trip from rank 0, and it would put a TCP exchange under the
impairment into every step of a variant that is meant to lose packets. torch 2.13 names this
`forward_sync_buffers=False` (and deprecates `broadcast_buffers`); older torches only have
`broadcast_buffers=False`, which skips the buffers' broadcast at construction too. The Llama
presets' only buffers are the rotary frequencies, the same constants on every rank, so both
forms train the same model.
"""

from __future__ import annotations

import inspect
from functools import cache

from torch.nn.parallel import DistributedDataParallel


@cache
def _takes_forward_sync_buffers(ddp_class: type) -> bool:
    return "forward_sync_buffers" in inspect.signature(ddp_class.__init__).parameters


def no_forward_buffer_sync(ddp_class: type = DistributedDataParallel) -> dict:
    """The keyword arguments that turn off DDP's per-forward buffer broadcast on this torch."""
    if _takes_forward_sync_buffers(ddp_class):
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def wrap_ddp(model, device_ids=None, ddp_class: type = DistributedDataParallel, **options):
    """`DDP(model)` with no buffer broadcast before each forward (see the module's docstring)."""
    return ddp_class(model, device_ids=device_ids, **no_forward_buffer_sync(ddp_class),
                     **options)
