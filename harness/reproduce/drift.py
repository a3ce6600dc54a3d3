"""Row 2: bounded drift of parameter broadcasts (arXiv 2507.07114).

The real collective on loopback ranks (drop mask, loss p per link), in parameter mode
(LossyCollective.sharded_update): every rank draws a gradient g = mu + sigma * noise per
step, the owner of a shard steps its parameters with the received-mean estimate ĝ, and
broadcasts them; a replica that misses a broadcast packet keeps its stale values.

Prediction. A replica's copy of a packet is K broadcasts old, K the number of consecutive
most recent broadcasts it missed: P(K = k) = p^k (1 - p), E[K] = p/(1-p),
E[K^2] = p(1+p)/(1-p)^2. Its difference from the owner is lr times the sum of the last K
estimates, each of mean mu and variance v = sigma^2 E[1/C] (C: contributions that arrived,
the owner's own included). So, per element, independent of t:

    replica vs owner     E[d^2] = lr^2 (E[K] v + E[K^2] mu^2)
    replica vs replica   E[(d_r - d_s)^2] = lr^2 (E|K_r - K_s| v + 2 Var(K) mu^2)
                         E|K_r - K_s| = 2 (E[K] - p^2/(1-p^2)),  Var(K) = p/(1-p)^2

(two replicas of a shard neither owns; their staleness is independent). The drift does not
grow: its growth exponent (rms drift ~ t^b) is 0.

Control: gradient mode without resync (allreduce, then every rank steps all its
parameters with what it holds). A replica that missed a broadcast packet steps with its
own gradient there instead of the estimate, an independent error each step: the replicas
random-walk apart, rms drift ~ t^0.5.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from harness.collectives.layout import Layout
from harness.collectives.lossy import LossyCollective
from harness.metrics.verdict import Check, claim
from harness.reproduce import loopback
from harness.reproduce.aggregation import inverse_count
from testbed.stats import mean_interval, slope_interval

PAPER = "arXiv 2507.07114"
LR, MU, SIGMA = 0.01, 0.5, 1.0
PROCESSES_PER_SHARD = 32  # (replica, packet) staleness processes per shard: loopback.numel_for
BATCH_STEPS = 50  # batch means: the drift is correlated over a few steps (1/(1-p))


def predicted_mean_square(world: int, p: float) -> dict:
    """Per element, the stationary mean square drift (see the module's formulas)."""
    v = SIGMA ** 2 * inverse_count(world, p)
    k1, k2 = p / (1 - p), p * (1 + p) / (1 - p) ** 2
    var_k = p / (1 - p) ** 2
    abs_diff = 2 * (k1 - p * p / (1 - p * p))
    return {"replica_vs_owner": LR ** 2 * (k1 * v + k2 * MU ** 2),
            "replica_vs_replica": LR ** 2 * (abs_diff * v + 2 * var_k * MU ** 2)}


def simulate(world: int, steps: int, p: float, mode: str, seed: int = 5) -> dict:
    """Per step, the mean square drift per element (replica vs owner, replica vs replica),
    from the real collective. mode: "parameter" or "gradient" (the control)."""
    rng = np.random.default_rng(seed)
    with loopback.transports(world, drop_rate=p, seed=seed) as (store, transports):
        per_packet = transports[0].per_packet
        numel = loopback.numel_for(world, PROCESSES_PER_SHARD, per_packet)
        collectives = [LossyCollective(t, store, estimator="received_mean")
                       for t in transports]
        layout = Layout(numel, world, per_packet)  # the collective's cut
        owner_of = np.empty(numel, dtype=np.int64)
        for shard in range(world):
            start, end = layout.shard_bounds(shard)
            owner_of[start:end] = shard
        params = np.zeros((world, numel), dtype=np.float32)
        to_owner, between = np.zeros(steps), np.zeros(steps)
        for step in range(steps):
            grads = (MU + SIGMA * rng.standard_normal((world, numel))).astype(np.float32)

            def one(r, grads=grads):
                if mode == "parameter":
                    def sgd(start, end, estimate, r=r):
                        params[r, start:end] -= LR * estimate.numpy()

                    # (torch views of the rows: the update lands in `params`)
                    collectives[r].sharded_update(torch.from_numpy(grads[r]),
                                                  torch.from_numpy(params[r]), sgd)
                else:
                    collectives[r].allreduce(grads[r])
                    params[r] -= LR * grads[r]

            loopback.on_every_rank(world, one)
            to_owner[step], between[step] = _mean_squares(params, owner_of)
    return {"replica_vs_owner": to_owner, "replica_vs_replica": between}


def _mean_squares(params: np.ndarray, owner_of: np.ndarray) -> tuple[float, float]:
    world = params.shape[0]
    owners = params[owner_of, np.arange(params.shape[1])]  # the authoritative copy
    replica = owner_of[None, :] != np.arange(world)[:, None]
    to_owner = float(((params - owners[None, :]) ** 2)[replica].mean())
    pairs = []
    for r in range(world):
        for s in range(r + 1, world):
            neither = (owner_of != r) & (owner_of != s)
            if neither.any():
                pairs.append(float(((params[r, neither] - params[s, neither]) ** 2).mean()))
    return to_owner, (float(np.mean(pairs)) if pairs else math.nan)


def growth_exponent(mean_square: np.ndarray, windows: int = 8) -> tuple[float, float]:
    """(b, half-width) in rms drift ~ t^b: a line through log(window mean of the mean
    square) against log(t), over log-spaced windows of the last 95% of the run (the first
    steps are the drift filling up from zero)."""
    steps = len(mean_square)
    edges = np.unique(np.geomspace(max(steps // 20, 1), steps, windows + 1).astype(int))
    x, y = [], []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        window = mean_square[lo:hi]
        if len(window) and window.mean() > 0:
            x.append(math.log((lo + hi) / 2))
            y.append(math.log(window.mean()))
    slope, half = slope_interval(x, y)
    return slope / 2, half / 2


def stationary(mean_square: np.ndarray) -> tuple[float, float, int]:
    """(mean, half-width, batches) of the mean square over the second half, by batch means."""
    half = mean_square[len(mean_square) // 2:]
    batches = [half[i:i + BATCH_STEPS].mean()
               for i in range(0, len(half) - BATCH_STEPS + 1, BATCH_STEPS)]
    mean, width = mean_interval(batches)
    return mean, width, len(batches)


def bounded_checks(series: dict, world: int, p: float, steps: int) -> list[Check]:
    """The claim's checks on one run's drift series (or a planted one)."""
    predicted = predicted_mean_square(world, p)
    exponent, width = growth_exponent(series["replica_vs_owner"])
    checks = [Check(f"growth exponent of the replica-vs-owner drift, n = {world}",
                    exponent, width, 0.0, 0.1, steps)]
    for kind in ("replica_vs_owner", "replica_vs_replica"):
        if world == 2 and kind == "replica_vs_replica":
            continue  # with two ranks every shard has an owner among any pair
        mean, half, batches = stationary(series[kind])
        # relative: the mean square against its prediction, 10% either way
        checks.append(Check(f"stationary {kind.replace('_', ' ')} mean square / predicted, "
                            f"n = {world}", mean / predicted[kind], half / predicted[kind],
                            1.0, 0.10, batches))
    return checks


def run(quick: bool = True, worlds=(2, 4, 8), p: float = 0.1, steps: int | None = None,
        echo=print):
    steps = steps or (400 if quick else 2000)
    bounded, control, detail = [], [], {}
    for world in worlds:
        echo(f"[reproduce] row 2: n = {world}, {steps} steps in parameter mode, then as many "
             "in gradient mode")
        series = simulate(world, steps, p, "parameter")
        bounded += bounded_checks(series, world, p, steps)
        walk = simulate(world, steps, p, "gradient")
        exponent, width = growth_exponent(walk["replica_vs_owner"])
        control.append(Check(f"growth exponent, gradient mode without resync, n = {world}",
                             exponent, width, 0.5, 0.1, steps))
        predicted = predicted_mean_square(world, p)
        detail[str(world)] = {
            "predicted_rms": {k: math.sqrt(v) for k, v in predicted.items()},
            "measured_rms_second_half": {
                k: math.sqrt(float(series[k][steps // 2:].mean())) for k in series
                if not np.isnan(series[k]).all()},
            "control_rms_at_end": math.sqrt(float(walk["replica_vs_owner"][-1]))}
    setting = f"real collective, p = {p}, n = {', '.join(map(str, worlds))}, {steps} steps"
    return [
        claim("2a", PAPER, "parameter broadcasts keep the replicas' drift bounded",
              "growth exponent 0 (±0.1); stationary mean square drift = "
              "lr^2 (E[K] v + E[K^2] mu^2) replica-vs-owner, "
              "lr^2 (E|K_r-K_s| v + 2 Var(K) mu^2) replica-vs-replica (±10%)",
              bounded, setting=setting, per_world=detail),
        claim("2b", "lossbed (control)", "gradient mode without resync drifts without bound",
              "growth exponent 0.5 (±0.1): a random walk", control, setting=setting),
    ]
