"""What an impairment needs from a backend, as feature names, so that a backend that cannot
do something refuses the profile instead of approximating it."""

from __future__ import annotations

from typing import Literal, get_args

from testbed.profiles.model import Impairment

# Every feature a profile can need and a backend can offer (each backend's SUPPORTS is a
# set of these; a test holds them to this list)
Feature = Literal[
    "loss:bernoulli", "loss:correlation", "loss:gilbert_elliott", "loss:four_state",
    "loss:burst_time_limit", "delay", "jitter", "delay_correlation", "delay_distribution",
    "rate", "reorder", "duplicate", "corrupt", "ecn", "slot", "seed", "limit"]
FEATURES: tuple[str, ...] = get_args(Feature)

DESCRIPTIONS: dict[Feature, str] = {
    "loss:bernoulli": "random (Bernoulli) loss",
    "loss:correlation": "loss correlation",
    "loss:gilbert_elliott": "Gilbert-Elliott loss",
    "loss:four_state": "4-state Markov loss",
    "loss:burst_time_limit": "a time limit on Gilbert-Elliott bursts (max_burst_ms)",
    "delay": "delay",
    "jitter": "jitter",
    "delay_correlation": "delay correlation",
    "delay_distribution": "a delay distribution",
    "rate": "a rate limit",
    "reorder": "reordering",
    "duplicate": "duplication",
    "corrupt": "corruption",
    "ecn": "ECN marking",
    "slot": "slotting",
    "seed": "a fixed random seed",
    "limit": "a queue limit",
}


def needed(imp: Impairment) -> set[Feature]:
    needs = set()
    if imp.loss is not None:
        needs.add(f"loss:{imp.loss.model}")
        if imp.loss.model == "bernoulli" and imp.loss.correlation_pct:
            needs.add("loss:correlation")
        if imp.loss.model == "gilbert_elliott" and imp.loss.max_burst_ms:
            needs.add("loss:burst_time_limit")
    checks = {
        "delay": imp.delay_ms, "jitter": imp.jitter_ms,
        "delay_correlation": imp.delay_correlation_pct,
        "delay_distribution": imp.delay_distribution, "rate": imp.rate_mbit,
        "reorder": imp.reorder_pct, "duplicate": imp.duplicate_pct,
        "corrupt": imp.corrupt_pct, "ecn": imp.ecn, "slot": imp.slot,
        "seed": imp.seed is not None, "limit": imp.limit_packets,
    }
    needs |= {name for name, value in checks.items() if value}
    return needs


def describe(features: set[Feature]) -> str:
    return ", ".join(DESCRIPTIONS.get(f, f) for f in sorted(features))
