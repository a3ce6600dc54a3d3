"""Row 1: unbiased aggregation (arXiv 2507.07114), exactly and on average.

Exactly: the real collective on loopback ranks with a seeded drop mask that records what it
dropped. From the record alone, every element of every rank's result is predicted: on the
owner of its shard, the mean of exactly the contributions that arrived (its own always
does); on any other rank, that mean if the owner's broadcast packet arrived, else the rank's
own contribution (a replica keeps its own values where the broadcast is lost). Every element
is compared, not an average.

Unbiased (1b received-mean, 1d rescale, the paper's claims): the real collective again, its
inputs drawn around known means, the owner's estimate of every packet slot of its shard
against the true mean of the ranks' contributions. The predictions use what the collective
really did: the drop mask's record (how many contributions each slot got) and the loss rate
it really used (its own measured rate, which rescale divides by). The mean error (0:
unbiased) within BIAS_TOLERANCE with identical means, which a rebuild biased by +1% cannot
pass, and per shard within SHARD_TOLERANCE with different means, which a rebuild that
returns the owner's own value cannot; for received-mean also the mean squared error,
predicted per slot from its count C as sigma^2 (1/C - 1/n): an own-value rebuild has mean
error 0 with identical means, but a squared error of sigma^2 (1 - 1/n), 27 times more at
n = 4, p = 0.1.

On average, lossbed's own claims (1c, 1e, 1f): Monte Carlo over independent trials of the
estimators' arithmetic (harness.collectives.rebuild, the code the collective runs), with
each link losing a packet with probability p independently, for both stages. Element x
of a shard owned by o, with contributions g_k of mean mu_k, arrivals a_k ~ Bernoulli(1-p)
for k != o, C = 1 + sum a_k:

    received_mean  m = (g_o + sum a_k g_k) / C
                   E[m] = w mu_o + (1 - w) mean(mu_k, k != o),   w = E[1/C]
    rescale        m = (g_o + sum a_k g_k / (1 - p)) / n          E[m] = mean(mu)
    zero_fill      m = (g_o + sum a_k g_k) / n
                   E[m] = (mu_o + (1-p) sum_{k!=o} mu_k) / n

and a rank r != o that misses the broadcast (probability p) keeps g_r. The prediction for
the mean error of the result over ranks, per owner's shard, follows from these
(predicted_bias; per shard, because averaged over shards received_mean's biases cancel). With
identical means, received_mean and rescale are unbiased and zero_fill is biased by
-p (n-1)/n (1 - p (n-1)/n) mu (-0.069 at n = 4, p = 0.1, mu = 1); with different means per
rank, received_mean over-weights the owner (w > 1/n) and is biased, rescale is not.
"""

from __future__ import annotations

import numpy as np

from harness.collectives.layout import Layout
from harness.collectives.lossy import LossyCollective
from harness.collectives.rebuild import ESTIMATORS, rebuild
from harness.metrics.verdict import Check, claim, combine
from harness.reproduce import loopback
from harness.transport import header as hdr
from harness.transport.dropmask import DropMask
from testbed.stats import mean_interval

DATA_STAGES = (hdr.STAGE_REDUCE, hdr.STAGE_BROADCAST)


class RecordingMask(DropMask):
    """A drop mask that remembers which data packets it dropped: (stage, source, step,
    shard, index), a packet being lost if any of its fragments is."""

    def __init__(self, seed: int, rate: float, receiver: int):
        super().__init__(seed, rate, receiver)
        self.dropped: set[tuple] = set()

    def for_receiver(self, rank: int) -> RecordingMask:
        return RecordingMask(self.seed, self.rate, rank)

    def drops(self, head) -> bool:
        drop = super().drops(head)
        if drop and head.stage in DATA_STAGES:
            self.dropped.add((head.stage, head.source, head.step, head.shard, head.index))
        return drop


def exact_check(world: int = 4, numel: int = 20_000, steps: int = 5, drop_rate: float = 0.1,
                seed: int = 1, estimator: str = "received_mean") -> tuple[Check, dict]:
    """Every element of every rank's result against the prediction from the dropped set.
    (`estimator`: what the collective runs; anything but received_mean is a planted error
    the check must catch.)"""
    rng = np.random.default_rng(seed)
    mask = RecordingMask(seed, drop_rate, receiver=0)
    with loopback.transports(world, drop_mask=mask) as (store, transports):
        masks = [t.drop_mask for t in transports]  # each receiver's own record
        collectives = [LossyCollective(t, store, estimator=estimator) for t in transports]
        layout = Layout(numel, world, transports[0].per_packet)  # the collective's cut
        elements = mismatched = 0
        for _ in range(steps):
            inputs = rng.standard_normal((world, numel)).astype(np.float32)
            results = inputs.copy()
            stats = loopback.on_every_rank(
                world, lambda r, results=results: collectives[r].allreduce(results[r]))
            expected = _predict(layout, inputs, masks, stats[0].step)
            scale = np.abs(inputs).max()
            mismatched += int((np.abs(results - expected) > 1e-6 * scale).sum())
            elements += results.size
        dropped = sum(len(m.dropped) for m in masks)
        late = sum(t.counters.to_dict().get("late", 0) for t in transports)
    check = Check("elements differing from the mean of exactly what arrived (fraction)",
                  mismatched / elements, 0.0, 0.0, 0.0, steps)
    return check, {"elements": elements, "mismatched": mismatched,
                   "data_packets_dropped": dropped, "late_packets": late,
                   "world": world, "drop_rate": drop_rate, "steps": steps}


def _predict(layout, inputs: np.ndarray, masks: list[RecordingMask], step: int) -> np.ndarray:
    world = inputs.shape[0]
    expected = inputs.astype(np.float64)  # what a replica keeps where a broadcast is lost
    for owner in range(world):
        for index in range(layout.packets(owner)):
            start, end = layout.packet_bounds(owner, index)
            arrived = [k for k in range(world) if k == owner or
                       (hdr.STAGE_REDUCE, k, step, owner, index) not in masks[owner].dropped]
            mean = inputs[arrived, start:end].astype(np.float64).mean(0)
            for r in range(world):
                if r == owner or (hdr.STAGE_BROADCAST, owner, step, owner, index) \
                        not in masks[r].dropped:
                    expected[r, start:end] = mean
    return expected


# ---- unbiased, on the real collective --------------------------------------------------

# The mean error that matters, with identical means (mu = 1; the slots of every shard
# pooled: each has the same prediction): half of what a rebuild biased by +1% adds (0.01),
# so that such a rebuild cannot hold, and the true one, measured to +-0.0025, does
BIAS_TOLERANCE = 0.005
# With different means, per shard (pooled, an owner-weighting bias cancels): less than half
# of received-mean's per-shard bias there, (w - 1/n)(mu_o - the others' mean) = -0.055 on
# shard 0, so the check tells rescale from received-mean; a rebuild that returns the
# owner's own value is off by mu_o - mean(mu), 0.5 or more
SHARD_TOLERANCE = 0.02
# the squared error within 10% of its prediction (the planted own-value rebuild is 27x off)
SQUARED_TOLERANCE = 0.10
# --quick's steps of received-mean's run (rescale's: 4 times as many; --full: 4 times more)
ROW1_STEPS = 30


def collective_errors(estimator: str, means: np.ndarray, steps: int, p: float = 0.1,
                      numel: int = 40_000, seed: int = 4, noise: float = 1.0) -> dict:
    """The real collective's owner estimates: per packet slot of every owner's shard and
    step, the mean error (estimate - the true mean of the contributions) and mean squared
    error over its elements, the squared error predicted from the slot's count (the drop
    mask's record), and the loss rate each owner's collective used."""
    world = len(means)
    rng = np.random.default_rng(seed)
    mask = RecordingMask(seed, p, receiver=0)
    errors, squared, predicted, owners = [], [], [], []
    with loopback.transports(world, drop_mask=mask) as (store, transports):
        masks = [t.drop_mask for t in transports]
        collectives = [LossyCollective(t, store, estimator=estimator) for t in transports]
        layout = Layout(numel, world, transports[0].per_packet)
        expected = dropped = 0
        for _ in range(steps):
            inputs = (means[:, None] + noise * rng.standard_normal((world, numel))
                      ).astype(np.float32)
            results = inputs.copy()
            stats = loopback.on_every_rank(
                world, lambda r, results=results: collectives[r].allreduce(results[r]))
            step = stats[0].step
            truth = inputs.astype(np.float64).mean(0)
            for owner in range(world):
                for index in range(layout.packets(owner)):
                    start, end = layout.packet_bounds(owner, index)
                    lost = sum((hdr.STAGE_REDUCE, k, step, owner, index)
                               in masks[owner].dropped for k in range(world) if k != owner)
                    error = results[owner, start:end] - truth[start:end]
                    errors.append(float(error.mean()))
                    squared.append(float((error ** 2).mean()))
                    predicted.append(noise ** 2 * (1 / (world - lost) - 1 / world))
                    owners.append(owner)
                    expected += world - 1
                    dropped += lost
        rates = [c.loss_rate for c in collectives]
    return {"errors": np.array(errors), "squared": np.array(squared),
            "predicted_squared": np.array(predicted), "owners": np.array(owners),
            "rate_used": rates, "rate_applied": dropped / expected, "steps": steps,
            "numel": numel, "world": world, "slots": len(errors)}


def collective_checks(estimator: str, case: str, steps: int, world: int = 4,
                      p: float = 0.1, seed: int = 4) -> tuple[list[Check], dict]:
    """An estimator's unbiasedness on the real collective: the owner's mean error against
    0 (identical means: every slot pooled; different means: per shard); for received-mean
    also the squared error against its prediction from the drop mask's record."""
    run = collective_errors(estimator, CASES[case](world), steps, p=p, seed=seed)
    where = "(real collective)"
    if case == "identical means":
        measured, half = mean_interval(run["errors"])
        checks = [Check(f"mean error of the owner's estimate, {estimator}, {case} {where}",
                        measured, half, 0.0, BIAS_TOLERANCE, run["slots"])]
    else:
        checks = []
        for owner in range(world):
            mine = run["owners"] == owner
            measured, half = mean_interval(run["errors"][mine])
            checks.append(Check(f"mean error of the owner's estimate on shard {owner}, "
                                f"{estimator}, {case} {where}", measured, half, 0.0,
                                SHARD_TOLERANCE, int(mine.sum())))
    if estimator == "received_mean":
        predicted = float(run["predicted_squared"].mean())
        measured, half = mean_interval(run["squared"] - run["predicted_squared"])
        checks.append(Check(f"mean squared error of the owner's estimate, {estimator}, "
                            f"{case} {where}; predicted sigma^2 (1/C - 1/n) from the drop "
                            "mask's counts", predicted + measured, half, predicted,
                            SQUARED_TOLERANCE * predicted, run["slots"]))
    detail = {k: run[k] for k in ("rate_used", "rate_applied", "steps", "numel", "world",
                                  "slots")}
    return checks, detail


# ---- Monte Carlo ------------------------------------------------------------------------


def simulate_results(estimator, means: np.ndarray, p: float, trials: int,
                     rng: np.random.Generator, noise: float = 1.0,
                     at: str = "owner") -> np.ndarray:
    """(trials, owners): per trial, for an element of each owner's shard, the error against
    the true mean of the contributions: of the owner's estimate (at="owner": the
    aggregation the paper is about), or of the result averaged over every rank
    (at="everyone": a replica that missed the broadcast holds its own value). `estimator`
    is a name in ESTIMATORS or a function (total, count, own, world, p) -> estimate (a
    planted one)."""
    world = len(means)
    errors = np.zeros((trials, world))
    for owner in range(world):
        g = means[None, :] + noise * rng.standard_normal((trials, world))
        arrived = rng.random((trials, world)) >= p
        arrived[:, owner] = True
        total = (g * arrived).sum(1)
        count = arrived.sum(1).astype(np.float64)
        own = g[:, owner]
        if callable(estimator):
            m = estimator(total, count, own, world, p)
        else:
            m = rebuild(estimator, total, count, own, world, p)
        truth = g.mean(1)
        if at == "owner":
            errors[:, owner] = m - truth
            continue
        broadcast = rng.random((trials, world)) >= p
        broadcast[:, owner] = True
        result = np.where(broadcast, m[:, None], g)  # a replica keeps its own when lost
        errors[:, owner] = result.mean(1) - truth
    return errors


def predicted_bias(estimator: str, means: np.ndarray, p: float,
                   at: str = "owner", p_broadcast: float | None = None) -> np.ndarray:
    """Per owner, the expected value of simulate_results' error, from the formulas above.
    (Averaged over owners, received_mean's biases cancel: the claim is per element.)
    p_broadcast: the broadcast stage's loss where it differs from the reduce stage's p."""
    q = p if p_broadcast is None else p_broadcast
    world = len(means)
    w = inverse_count(world, p)
    mu_bar = means.mean()
    bias = np.zeros(world)
    for owner in range(world):
        others = np.delete(means, owner)
        if estimator == "received_mean":
            expected = w * means[owner] + (1 - w) * others.mean()
        elif estimator == "rescale":
            expected = mu_bar
        elif estimator == "zero_fill":
            expected = (means[owner] + (1 - p) * others.sum()) / world
        else:
            raise ValueError(f"no prediction for {estimator!r}")
        if at == "owner":
            bias[owner] = expected - mu_bar
            continue
        # the owner and the (1 - p) of replicas that got the broadcast hold `expected`; the
        # p that missed it hold their own mean
        result_mean = (expected + (1 - q) * (world - 1) * expected + q * others.sum()) / world
        bias[owner] = result_mean - mu_bar
    return bias


def inverse_count(world: int, p: float) -> float:
    """E[1 / (1 + B)], B ~ Binomial(world - 1, 1 - p): the owner's weight in received_mean."""
    from math import comb

    n = world - 1
    return sum(comb(n, b) * (1 - p) ** b * p ** (n - b) / (1 + b) for b in range(n + 1))


CASES = {
    # the ranks' contributions are identically distributed (i.i.d. minibatch gradients)
    "identical means": lambda world: np.ones(world),
    # each rank's data has its own mean (non-i.i.d. shards of data)
    "different means": lambda world: np.linspace(-1.0, 2.0, world),
}


def monte_carlo_checks(world: int = 4, p: float = 0.1, trials: int = 20_000, seed: int = 2,
                       estimators=ESTIMATORS, tolerance: float = 0.01,
                       at: str = "owner") -> list[dict]:
    """For each case and estimator, per owner's shard: the measured mean error against the
    predicted bias. A planted estimator (a function) is held to the claim it would make:
    unbiased (0) everywhere."""
    rng = np.random.default_rng(seed)
    out = []
    for case, make_means in CASES.items():
        means = make_means(world)
        for estimator in estimators:
            name = estimator if isinstance(estimator, str) else estimator.__name__
            errors = simulate_results(estimator, means, p, trials, rng, at=at)
            predicted = predicted_bias(name, means, p, at) if isinstance(estimator, str) \
                else np.zeros(world)
            checks = []
            for owner in range(world):
                measured, half = mean_interval(errors[:, owner])
                checks.append(Check(f"mean error ({at}) on shard {owner}, {name}, {case}",
                                    measured, half, float(predicted[owner]), tolerance,
                                    trials))
            out.append({"case": case, "estimator": name, "checks": checks,
                        "verdict": combine(checks)})
    return out


PAPER = "arXiv 2507.07114"


def _case(mc: list[dict], estimator: str, *cases: str) -> list[Check]:
    return [c for m in mc if m["estimator"] == estimator and m["case"] in cases
            for c in m["checks"]]


def run(quick: bool = True, world: int = 4, p: float = 0.1) -> list[dict]:
    """Row 1's claims, each with its checks and verdict."""
    exact, detail = exact_check(world=world, drop_rate=p, steps=3 if quick else 20)
    # rescale's error per slot varies with which contributions were lost (sd 0.14 at
    # mu = 1), received-mean's only with the noise: it needs 4 times the steps
    steps = ROW1_STEPS if quick else 4 * ROW1_STEPS
    unbiased, unbiased_detail = collective_checks("received_mean", "identical means", steps,
                                                  world, p)
    rescale, rescale_detail = [], {}
    for case in CASES:
        checks, rescale_detail[case] = collective_checks("rescale", case, 4 * steps, world,
                                                         p)
        rescale += checks
    trials = 20_000 if quick else 200_000
    owner = monte_carlo_checks(world=world, p=p, trials=trials)
    everyone = monte_carlo_checks(world=world, p=p, trials=trials, seed=3, at="everyone")
    w = inverse_count(world, p)
    setting = f"n = {world}, p = {p}, {trials} trials"
    both = ("identical means", "different means")
    return [
        claim("1a", PAPER, "received-mean: each element is the mean of exactly the "
              "contributions that arrived", "every element of every rank equals the mean "
              "predicted from the drop mask's record (replicas that missed the broadcast: "
              "their own value)", [exact], detail=detail,
              setting=f"real collective, n = {world}, drop mask p = {p}, "
              f"{detail['steps']} steps"),
        claim("1b", PAPER, "received-mean is unbiased when the ranks' contributions are "
              "identically distributed", f"owner's estimate: mean error 0 (±{BIAS_TOLERANCE})"
              ", squared error sigma^2 (1/C - 1/n) per slot", unbiased,
              detail=unbiased_detail, setting=f"real collective, n = {world}, drop mask "
              f"p = {p}, {steps} steps, contributions 1 + N(0, 1)"),
        claim("1c", "lossbed (follows from 1b's formula)", "received-mean is biased when "
              "the ranks' means differ: the owner is over-weighted",
              f"error on shard o = (w - 1/n)(mu_o - mean of the others' mu), "
              f"w = E[1/C] = {w:.4f} (1/n = {1 / world:.4f})",
              _case(owner, "received_mean", "different means"), setting=setting),
        claim("1d", PAPER, "rescale is unbiased for any contributions",
              f"owner's estimate: mean error 0 (±{BIAS_TOLERANCE}) on every shard, with "
              "identical and with different means", rescale, detail=rescale_detail,
              setting=f"real collective with the loss rate it measured, n = {world}, drop "
              f"mask p = {p}, {4 * steps} steps per case"),
        claim("1e", "lossbed (baseline)", "zero-fill is biased towards 0",
              "owner's estimate: error -p/n * (sum of the others' means) on each shard",
              _case(owner, "zero_fill", *both), setting=setting),
        claim("1f", "lossbed (beyond the papers)", "what every rank holds after the "
              "broadcast (a replica that missed it keeps its own value)",
              "zero-fill -p(n-1)/n (1 - p(n-1)/n) mu = "
              f"{-p * (world - 1) / world * (1 - p * (world - 1) / world):.4f} with mu = 1; "
              "every estimator per shard from the formulas",
              [c for m in everyone for c in m["checks"]], setting=setting),
    ]
