"""GradScaler (torch.amp) under lossbed's schemes: every rank skips the same steps.

GradScaler skips a step where this rank's gradients are not finite (fp16 overflowed). Under
reliable DDP every rank holds the same reduced gradients and decides alike. Under a lossy
scheme each rank decides on what it holds: its own gradients (bounded_drift, rps), or what
arrived (lossy_gradients, whose receivers never apply a non-finite payload). Ranks that
disagree part ways: some step into a collective the others skip, and their scales differ
from then on. Given the scaler when a scheme is set up (`scaler=`), lossbed agrees the
decision over the job's reliable process group (one flag a step, only then) and every rank
acts on it: the optimizers lossbed returns skip or step as one and mark the skip in the
scaler's record (its scale backs off on every rank), and the lossy gradient hook makes the
last bucket non-finite on every rank where any rank's was.
"""

from __future__ import annotations

import torch


class SkipsDisagree(RuntimeError):
    """GradScaler steps a lossbed optimizer it was not given at set-up."""


def any_rank(flag: bool) -> bool:
    """Whether `flag` holds on any rank: a reliable all-reduce over the default process
    group (the one the job's DDP uses; process_group puts the flag where it wants it)."""
    import torch.distributed as dist

    from harness.collectives import process_group

    if not dist.is_available() or not dist.is_initialized():
        return flag
    return bool(process_group.all_reduce_(torch.tensor([1.0 if flag else 0.0])).item() > 0)


def record_skip(scaler, optimizer) -> None:
    """Mark this step skipped in the scaler's own record of `optimizer` (what its update()
    reads to back the scale off), where this rank's gradients were finite."""
    states = getattr(scaler, "_per_optimizer_states", None)
    found = (states or {}).get(id(optimizer), {}).get("found_inf_per_device")
    if not found:
        raise SkipsDisagree("this torch's GradScaler keeps its record where lossbed cannot "
                            "mark a skip agreed with the other ranks")
    for flag in found.values():
        flag.fill_(1.0)


def agreed_step(optimizer, params: list[torch.Tensor], scaler, agree=any_rank) -> bool:
    """Called first in the step() of an optimizer lossbed returns: whether to step. Where
    GradScaler handed it the step (it set `found_inf` and `grad_scale` on the optimizer),
    the skip is agreed by every rank, and the gradients unscaled when it steps."""
    found = getattr(optimizer, "found_inf", None)
    if found is None:
        return True  # not stepped by a GradScaler
    if scaler is None:
        raise SkipsDisagree(
            "GradScaler steps this optimizer, and lossbed was not given it: pass it when "
            "wrapping (e.g. bounded_drift(model, optimizer, scaler=scaler)) so that every "
            "rank skips the same steps")
    here = bool(found.item() > 0)
    if agree(here):
        if not here:
            record_skip(scaler, optimizer)
        return False
    scale = getattr(optimizer, "grad_scale", None)
    if scale is not None:  # (None: the script called scaler.unscale_ already)
        inverse = 1.0 / float(scale)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(inverse)
    return True
