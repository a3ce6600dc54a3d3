"""Rows 4 and 5: perplexity against the loss rate, and the variants side by side at 10%.

Each is a bench (harness.bench: paired seeds, token-level perplexity, every rank's model
scored, a 95% interval over seeds) in the bench's own regime, AdamW at peak 2e-3 from
scratch (rps: SGD with momentum, its paper's), with the stability twins that every Δppl
verdict waits for (harness/bench/withholding.py):

    row 4   unbiased_drift (against reliable) and rps (against reliable under the same SGD)
            at each loss rate, random loss; then burst loss at 10% (the same mean, in
            bursts: beyond both papers, which assume independent loss); 4e: unbiased_drift's
            drift over the steps of its runs at 10%, bounded (no growth with steps)
    row 5   unbiased_drift, unbiased and zero_fill at 10%: per-rank and worst-rank
            perplexity and drift, what each part of the scheme buys

The 10% row is held against 2507.07114's "at most 0.8% perplexity" (Δppl within ±0.8%);
every other loss rate is reported against the same band, for the curve.
"""

from __future__ import annotations

import math
from pathlib import Path

from harness.bench import withholding
from harness.bench.spec import BenchSpec
from harness.bench.training_bench import run_bench
from harness.metrics.verdict import BAND_PCT as PPL_BAND_PCT
from harness.metrics.verdict import Check, claim, delta_ppl

PAPER = "arXiv 2507.07114"
# Not SGD at 0.1 with momentum 0.9 (these rows' regime until #27): chaotic for this model,
# lossless runs of one seed landed on two plateaus (~375 vs ~243 ppl), and its stability
# twin (300 steps, seed 0, 2026-12-03) moved perplexity by +2.58% (297.586 vs 305.264), 13
# times the tolerance of ±0.2%. AdamW at the bench's peak 2e-3 (warm-up, cosine decay, 300
# steps) passes it: +0.061% (107.120 vs 107.185); at 5e-4: +0.000% (176.633 vs 176.634)
OPTIMIZER, LR = "adamw", 2e-3
# --full's size: what this 2-core machine trains in about 75 minutes (80 runs of 300 steps,
# the bench's default length). 8 seeds of 1200 steps would be about 10 hours here
FULL_STEPS = 300
FULL_SEEDS = 4
# Drift during training: sampled every DRIFT_EVERY steps; its growth exponent must stay at
# most half a random walk's (0.5) for "bounded"
DRIFT_EVERY = 20
DRIFT_GROWTH_TOLERANCE = 0.25


def plans(quick: bool, regime: dict | None = None) -> dict[str, BenchSpec]:
    """The benches of rows 4 and 5 (quick: one short bench at 10%, the curve's middle), in
    the regime asked for (BenchSpec's regime options; default scratch)."""
    common = dict(optimizer=OPTIMIZER, lr=LR, realisations=1, speed_steps=10,
                  drift_every=DRIFT_EVERY,
                  stability=True, **{"regime": "scratch", **(regime or {})})
    if quick:
        return {"curve": BenchSpec.make(losses=[0.1], variants=["reliable", "unbiased_drift",
                                                                 "rps"],
                                        steps=60, seeds=2, **common)}
    full = dict(steps=FULL_STEPS, seeds=FULL_SEEDS, **common)
    return {
        "curve": BenchSpec.make(losses=[0.01, 0.05, 0.1, 0.2, 0.3],
                                variants=["reliable", "unbiased_drift", "rps"], **full),
        "burst": BenchSpec.make(losses=[0.1], profile="burst-loss",
                                variants=["reliable", "unbiased_drift", "rps"], **full),
        "variants": BenchSpec.make(losses=[0.1], variants=["reliable", "unbiased_drift",
                                                            "unbiased", "zero_fill"], **full),
    }


def run(make_cluster, quick: bool, out: Path, echo=print,
        regime: dict | None = None) -> list[dict]:
    """Runs the benches on clusters from make_cluster() (a context manager: the bench's
    own cluster, torn down after), then their rows."""
    summaries = {}
    for name, spec in plans(quick, regime).items():
        with make_cluster(spec) as cluster:
            echo(f"[reproduce] rows 4-5: bench {name!r} ({len(spec.cases())} runs)")
            summaries[name] = run_bench(cluster, spec, out / f"bench-{name}", echo=echo)
    return rows(summaries)


def check(row: dict, what: str) -> Check:
    """A bench row against the band, unless a rule withholds its verdict (the bench's own
    one function, harness/bench/withholding.py: the row carries its reference's chaos
    check)."""
    return delta_ppl(row["ppl_delta_pct"], row.get("ppl_delta_ci95"), row["seeds"],
                     PPL_BAND_PCT, f"Δppl % of {row['variant']} at {row['loss']:.0%} ({what})",
                     withholding.withheld(row))


def drift_check(row: dict) -> Check:
    """A bench row's drift growth exponent (over its seeds) against 'does not grow': b at
    most DRIFT_GROWTH_TOLERANCE, a negative b (shrinking, as the rate decays) counted as 0."""
    growth, half = row.get("drift_growth"), row.get("drift_growth_ci95")
    return Check(f"drift growth exponent of {row['variant']} at {row['loss']:.0%}",
                 math.nan if growth is None else max(growth, 0.0),
                 math.inf if half is None else half, 0.0, DRIFT_GROWTH_TOLERANCE,
                 row["seeds"], disturbed=withholding.by_the_runs(row))


def rows(summaries: dict[str, dict]) -> list[dict]:
    """The claims of rows 4 and 5 from the benches' summaries."""
    out = []
    curve = [r for r in summaries["curve"]["rows"] if r["loss"] > 0
             and r["variant"] in ("unbiased_drift", "rps")]
    setting = _setting(summaries["curve"])
    for variant, paper in (("unbiased_drift", PAPER), ("rps", "arXiv 1810.07766")):
        at_10 = [r for r in curve if r["variant"] == variant and abs(r["loss"] - 0.1) < 1e-9]
        if at_10:
            out.append(claim(f"4{'a' if variant == 'unbiased_drift' else 'b'}", paper,
                             f"{variant} at 10% random loss trains as well as without loss",
                             f"Δppl within ±{PPL_BAND_PCT}% of its lossless reference "
                             "(2507.07114's bound)", [check(at_10[0], "random")],
                             setting=setting))
    drifting = next((r for r in curve if r["variant"] == "unbiased_drift"
                     and abs(r["loss"] - 0.1) < 1e-9), None)
    if drifting is not None:
        out.append(claim("4e", PAPER, "unbiased_drift's replicas stay within a bounded "
                         "distance of the owners' model over training (10% random loss)",
                         f"drift growth exponent (rms drift ~ step^b over the run) at most "
                         f"{DRIFT_GROWTH_TOLERANCE} (0: bounded; 0.5: a random walk); a "
                         "shrinking drift is bounded", [drift_check(drifting)],
                         setting=setting, drift_max=drifting.get("drift_max")))
    others = [r for r in curve if abs(r["loss"] - 0.1) > 1e-9]
    if others:
        out.append(claim("4c", "lossbed (the curve)", "Δppl at 1, 5, 20, 30% random loss",
                         f"within ±{PPL_BAND_PCT}% (the same band, for the curve)",
                         [check(r, "random") for r in others], setting=setting,
                         curve=[_point(r) for r in curve]))
    if "burst" in summaries:
        burst = [r for r in summaries["burst"]["rows"] if r["loss"] > 0
                 and r["variant"] in ("unbiased_drift", "rps")]
        out.append(claim("4d", "lossbed (beyond the papers)", "the same at 10% burst loss "
                         "(Gilbert-Elliott, mean burst 10 packets)",
                         f"within ±{PPL_BAND_PCT}%",
                         [check(r, "burst") for r in burst],
                         setting=_setting(summaries["burst"]),
                         curve=[_point(r) for r in burst]))
    if "variants" in summaries:
        side = [r for r in summaries["variants"]["rows"] if r["loss"] > 0
                and r["variant"] != "reliable"]
        out.append(claim("5", PAPER, "what each part buys at 10%: unbiased_drift, unbiased "
                         "(no parameter broadcasts), zero_fill (no unbiased rebuild)",
                         f"Δppl within ±{PPL_BAND_PCT}% each; worst rank and drift "
                         "reported", [check(r, "random") for r in side],
                         setting=_setting(summaries["variants"]),
                         curve=[_point(r) for r in side]))
    return out


def _point(row: dict) -> dict:
    return {k: row.get(k) for k in ("loss", "variant", "seeds", "ppl", "ppl_delta_pct",
                                    "ppl_delta_ci95", "ppl_rank_worst", "drift",
                                    "measured_loss", "disturbed")}


def _setting(summary: dict) -> str:
    c = summary["config"]
    regime = summary.get("regime") or f"{c['optimizer']} lr {c['lr']}"
    return (f"bench: {c['hosts']} ranks, {c['preset']} preset, {c['seeds']} seeds, "
            f"{c['profile']}, regime {regime}")
