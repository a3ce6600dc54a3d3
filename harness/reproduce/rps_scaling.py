"""Row 3: RPS (arXiv 1810.07766), "the influence of the drop rate diminishes as the number of
servers grows".

Measured with the real collective (harness.collectives.rps.RPS on loopback ranks, drop mask
p per link): every rank holds a model x_r (elements i.i.d., variance s^2 = 1 across ranks),
one RPS averaging step runs, and the trial's value is the mean over elements of
(mean_r x'_r - mean_r x_r)^2: the variance one lossy step adds to the average model (a
lossless step adds none).

Prediction, for an element of a shard owned by o: the owner's average is
m = (x_o + sum a_k x_k) / C (a_k: rank k's block arrived, C = 1 + sum a_k); rank k != o takes
m if the broadcast arrived (b_k), else keeps x_k. The average model moves by
((1 + B) m - x_o - sum b_k x_k) / n, B = sum b_k, so

    v(n) = s^2 / n^2 E[ ((1+B)/C - 1)^2 + sum_k ((1+B) a_k / C - b_k)^2 ]

(evaluated by drawing the a's and b's: PREDICTION_DRAWS). For large n, n v(n) tends to
2 p (1 - p) s^2: the harm per step falls like 1/n there. At small n it is below that (at
p = 0.1: n v = 0.113, 0.145, 0.161, 0.170 for n = 2, 4, 8, 16), so "n v(n) about constant"
is a large-n statement, and this row says where it starts to hold.
"""

from __future__ import annotations

import math

import numpy as np

from harness.collectives.rps import RPS
from harness.metrics.verdict import Check, claim
from harness.reproduce import loopback
from testbed.stats import mean_interval

PAPER = "arXiv 1810.07766"
EVENTS_PER_SHARD = 64  # (rank, packet) loss events per shard and stage: loopback.numel_for
PREDICTION_DRAWS = 1_000_000


def predicted_variance(world: int, p: float, seed: int = 0) -> float:
    """v(n) for s = 1 (see the module's formula)."""
    rng = np.random.default_rng(seed)
    a = rng.random((PREDICTION_DRAWS, world - 1)) >= p
    b = rng.random((PREDICTION_DRAWS, world - 1)) >= p
    scale = (1 + b.sum(1)) / (1 + a.sum(1))
    term = (scale - 1) ** 2 + ((scale[:, None] * a - b) ** 2).sum(1)
    return float(term.mean()) / world ** 2


def measure(world: int, trials: int, p: float, seed: int = 7, average=None) -> np.ndarray:
    """Per trial, the variance one RPS step added to the average model. average(rps, x):
    the averaging step (RPS.average; a planted one in tests)."""
    rng = np.random.default_rng(seed)
    added = np.zeros(trials)
    with loopback.transports(world, drop_rate=p, seed=seed) as (store, transports):
        numel = loopback.numel_for(world, EVENTS_PER_SHARD, transports[0].per_packet)
        servers = [RPS(t, store) for t in transports]
        step = average or (lambda rps, x: rps.average(x))
        for trial in range(trials):
            models = rng.standard_normal((world, numel)).astype(np.float32)
            before = models.astype(np.float64).mean(0)
            loopback.on_every_rank(world, lambda r, models=models: step(servers[r], models[r]))
            added[trial] = float(((models.astype(np.float64).mean(0) - before) ** 2).mean())
    return added


def run(quick: bool = True, worlds=None, p: float = 0.1, trials: int | None = None,
        echo=print):
    worlds = worlds or ((2, 4, 8) if quick else (2, 4, 8, 16))
    trials = trials or (60 if quick else 300)
    measured, predicted, per_n = {}, {}, []
    for world in worlds:
        echo(f"[reproduce] row 3: n = {world}, {trials} RPS steps")
        mean, half = mean_interval(measure(world, trials, p))
        measured[world], predicted[world] = (mean, half), predicted_variance(world, p)
        # relative: measured n v(n) against its prediction, 10% either way
        per_n.append(Check(f"v(n) / predicted, n = {world}", mean / predicted[world],
                           half / predicted[world], 1.0, 0.10, trials))
    small, large = worlds[0], worlds[-1]
    shrink = _ratio_check(f"v({large}) / v({small})", measured[large], measured[small],
                          predicted[large] / predicted[small], 0.15, trials)
    before_last = worlds[-2]
    flat = _ratio_check(f"n v(n) at n = {large} / at n = {before_last}",
                        _scaled(measured[large], large), _scaled(measured[before_last],
                                                                 before_last), 1.0, 0.15,
                        trials)
    first_flat = _ratio_check(f"n v(n) at n = {large} / at n = {small}",
                              _scaled(measured[large], large),
                              _scaled(measured[small], small), 1.0, 0.15, trials)
    setting = (f"real collective (RPS.average), p = {p}, n = {', '.join(map(str, worlds))}, "
               f"{trials} trials each")
    detail = {str(n): {"v": measured[n][0], "v_half_width": measured[n][1],
                       "v_predicted": predicted[n], "n_v": n * measured[n][0],
                       "n_v_predicted": n * predicted[n]} for n in worlds}
    return [
        claim("3a", PAPER, "the influence of the drop rate diminishes as the number of "
              "servers grows", "v(n), the variance one lossy step adds to the average "
              "model, from the formula (module doc) at each n (±10%), and "
              f"v({large}) / v({small}) = {predicted[large] / predicted[small]:.3f} (±15%)",
              per_n + [shrink], setting=setting, per_world=detail),
        claim("3b", "the issue's reading of 3a", "the harm falls like 1/n: n v(n) about "
              f"constant from n = {small}", f"n v(n) ratio 1 (±15%) from n = {small} to "
              f"{large}; the formula predicts "
              f"{large * predicted[large] / (small * predicted[small]):.2f}",
              [first_flat], setting=setting),
        claim("3c", "lossbed (from the formula)", f"n v(n) is about constant at large n "
              f"(it tends to 2p(1-p) = {2 * p * (1 - p):.3f})", f"n v(n) ratio 1 (±15%) "
              f"from n = {before_last} to {large}; the formula predicts "
              f"{large * predicted[large] / (before_last * predicted[before_last]):.2f}",
              [flat], setting=setting),
    ]


def _scaled(value: tuple[float, float], world: int) -> tuple[float, float]:
    return value[0] * world, value[1] * world


def _ratio_check(quantity: str, top: tuple[float, float], bottom: tuple[float, float],
                 predicted: float, tolerance: float, trials: int) -> Check:
    """A ratio of two independent measurements, its half-width by the delta method, held to
    a relative tolerance around `predicted`. A measurement of 0 (a step that moved
    nothing) has no ratio: nan, which no verdict is drawn from (the per-n checks are)."""
    if top[0] == 0 or bottom[0] == 0:
        return Check(f"{quantity}, over its prediction {predicted:.3g}", math.nan, math.inf,
                     1.0, tolerance, trials)
    ratio = top[0] / bottom[0]
    half = ratio * float(np.hypot(top[1] / top[0], bottom[1] / bottom[0]))
    return Check(f"{quantity}, over its prediction {predicted:.3g}", ratio / predicted,
                 half / predicted, 1.0, tolerance, trials)
