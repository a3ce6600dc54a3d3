"""The learning-rate schedule: linear warm-up, then cosine decay to a floor (LLaMA's recipe),
so that a run ends on a settled model rather than on a noisy trajectory; or constant."""

from __future__ import annotations

import math

MIN_LR_RATIO = 0.1  # cosine decays to 10% of the peak, as LLaMA does


def warmup_steps(steps: int, warmup: int | None) -> int:
    """The warm-up length: as given, or 5% of the steps (at least 1)."""
    return max(1, round(0.05 * steps)) if warmup is None else warmup


def lr_at(step: int, steps: int, peak: float, schedule: str = "cosine",
          warmup: int | None = None) -> float:
    """The learning rate of step `step` (0-based) of `steps`."""
    if schedule == "constant":
        return peak
    w = warmup_steps(steps, warmup)
    if step < w:
        return peak * (step + 1) / w
    progress = (step - w) / max(1, steps - w)
    return peak * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))


def set_lr(optimizer, lr: float) -> None:
    """Set the rate of every parameter group (lossbed's wrappers are torch optimizers: their
    own groups are the ones a step reads)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
