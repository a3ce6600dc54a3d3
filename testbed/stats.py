"""Statistics for lossbed's measurements, from scipy.stats: Student's t intervals of a mean
and of a slope, the Wilson interval of a loss rate with a correction for bursts.

scipy is imported inside the functions: `lossbed verify` runs on VM hosts too, and scipy's
import takes seconds there for a call most commands never make."""

from __future__ import annotations

import math

CONFIDENCE = 0.95


def t_quantile(degrees: int) -> float:
    """Student's t, two-sided 95%, with this many degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.5 + CONFIDENCE / 2, degrees))


def t95(n: int) -> float:
    """Student's t, two-sided 95%, for a mean of n values (n - 1 degrees of freedom)."""
    return t_quantile(max(n - 1, 1))


def mean_interval(values) -> tuple[float, float]:
    """(mean, half-width of its 95% Student's t interval) of independent values; the
    half-width is infinite for fewer than two values (no spread to measure it by). The mean
    of no values is nan."""
    import numpy as np
    from scipy.stats import sem

    values = np.asarray(values, dtype=np.float64).ravel()
    if len(values) < 2:
        return (float(values[0]) if len(values) else math.nan), math.inf
    return float(values.mean()), t95(len(values)) * float(sem(values))


def slope_interval(x, y) -> tuple[float, float]:
    """(slope, half-width of its 95% interval) of the least-squares line through (x, y)
    (scipy.stats.linregress, t with n - 2 degrees); nan ± inf for fewer than three points."""
    from scipy.stats import linregress

    if len(x) < 3:
        return math.nan, math.inf
    fit = linregress(x, y)
    return float(fit.slope), t_quantile(len(x) - 2) * float(fit.stderr)


def wilson_interval(successes: int, trials: int, inflation: float = 1.0) -> tuple[float, float]:
    """Wilson score interval (95%) of a proportion, scipy.stats.binomtest's. `inflation`
    widens it for correlated trials: the effective sample is trials / inflation, rounded
    down to whole trials (binomtest counts whole trials; rounding down only widens it)."""
    from scipy.stats import binomtest

    if trials <= 0:
        return (0.0, 1.0)
    effective = max(1, math.floor(trials / inflation))
    hits = min(effective, round(successes * effective / trials))
    ci = binomtest(hits, effective).proportion_ci(CONFIDENCE, method="wilson")
    return (float(ci.low), float(ci.high))


def markov_inflation(p: float, r: float) -> float:
    """Variance factor of the loss count for a two-state chain with transitions p (G->B) and
    r (B->G) whose loss indicator is the state (the simple Gilbert model): the lag-k
    autocorrelation is (1-p-r)^k, so the variance of a long-run mean grows by (1+rho)/(1-rho).
    (Hand-made: a closed form of three lines; no library states it for this chain.)"""
    rho = 1 - p - r
    if rho <= -1 or rho >= 1:
        return 1.0
    return max(1.0, (1 + rho) / (1 - rho))


def sigma_distance(measured: int, trials: int, target: float, inflation: float = 1.0) -> float:
    """How many standard deviations `measured` losses in `trials` lie from the target rate
    (the binomial's sd, times the burst inflation; one line, so hand-made)."""
    if trials <= 0:
        return 0.0
    sd = math.sqrt(max(target * (1 - target), 1e-300) * inflation / trials)
    return abs(measured / trials - target) / sd
