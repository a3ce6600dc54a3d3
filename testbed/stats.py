"""Small statistics for loss measurements: binomial intervals with burst correction."""

from __future__ import annotations

import math

Z95 = 1.959963984540054


def wilson_interval(successes: int, trials: int, z: float = Z95,
                    inflation: float = 1.0) -> tuple[float, float]:
    """Wilson score interval for a proportion. `inflation` widens it for correlated trials
    (variance factor: an effective sample size of trials / inflation)."""
    if trials <= 0:
        return (0.0, 1.0)
    n = trials / inflation
    p = successes / trials
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def markov_inflation(p: float, r: float) -> float:
    """Variance factor of the loss count for a two-state chain with transitions p (G->B) and
    r (B->G) whose loss indicator is the state (the simple Gilbert model): the lag-k
    autocorrelation is (1-p-r)^k, so the variance of a long-run mean grows by (1+rho)/(1-rho)."""
    rho = 1 - p - r
    if rho <= -1 or rho >= 1:
        return 1.0
    return max(1.0, (1 + rho) / (1 - rho))


def sigma_distance(measured: int, trials: int, target: float, inflation: float = 1.0) -> float:
    """How many standard deviations `measured` losses in `trials` lie from the target rate."""
    if trials <= 0:
        return 0.0
    sd = math.sqrt(max(target * (1 - target), 1e-300) * inflation / trials)
    return abs(measured / trials - target) / sd
