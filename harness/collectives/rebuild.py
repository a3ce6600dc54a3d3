"""Rebuilding a shard from the contributions that arrived: the estimators.

For every packet slot of the shard an owner holds the sum of the contributions that
arrived (its own always included) and how many there were. What the missing ones were
worth is the estimator's choice:

    zero_fill      missing count as 0:              sum / world        (biased towards 0)
    received_mean  mean of what arrived:            sum / count
    rescale        own + the others scaled by 1/(1-p), p the loss rate seen so far:
                   (own + (sum - own) / (1 - p)) / world

All return the *mean* over ranks (what DDP averages gradients to). received_mean is
unbiased when the ranks' contributions are exchangeable (e.g. i.i.d. minibatch gradients);
rescale is unbiased for any values when p is right; zero_fill is the naive baseline.
"""

from __future__ import annotations

import numpy as np

ESTIMATORS = ("zero_fill", "received_mean", "rescale")


def rebuild(estimator: str, total: np.ndarray, count: np.ndarray, own: np.ndarray,
            world: int, loss_rate: float, out: np.ndarray | None = None) -> np.ndarray:
    """The mean estimate per element. `count` is per element (own included, so >= 1), or
    one number for every element. Written into `out` (which may be `total`) if given."""
    if estimator == "zero_fill":
        return np.divide(total, world, out=out)
    if estimator == "received_mean":
        return np.divide(total, count, out=out)
    if estimator == "rescale":
        keep = max(1.0 - loss_rate, 1e-3)
        estimate = np.subtract(total, own, out=out)  # what the others sent ...
        estimate /= keep                             # ... scaled up for what was lost
        estimate += own
        estimate /= world
        return estimate
    raise ValueError(f"unknown estimator {estimator!r}: use one of {', '.join(ESTIMATORS)}")
