"""Is the training regime chaotic at the loss's own scale? The check every Δppl verdict
waits for (#27, #54, #65).

A Δppl says what the loss did only if the regime itself does not amplify small
differences: where one lossy step already moves the final perplexity by a sizeable part of
the band, a run under loss differs from its lossless reference by chaos as much as by the
loss, and a verdict either way would be an artefact. So the bench trains, besides every
lossless reference a verdict leans on (reliable under AdamW for unbiased_drift, reliable
under SGD for rps, ...), its twin on every seed: the same seed, data and lossless network,
with one step whose aggregated gradient lost the bench's loss rate of its datagram-sized
blocks (harness/train/one_lossy_step.py: what zero_fill makes of one lossy step, more than
the received-mean estimators leave). Each reference's check is the 95% t-interval, over the
seeds, of how far its twins moved perplexity; the reference is stable when that whole
interval lies within ±TOLERANCE_PCT. A reference that was not checked, or whose interval
reaches past the tolerance (one seed: no interval), gives its rows no verdict
(harness/bench/withholding.py).

The numbers are fixed here, before any run: TOLERANCE_PCT is a quarter of the ±0.8% band
Δppl is held against (2507.07114's bound), so that chaos alone can use at most a quarter of
the band and three quarters stay for the effect and its interval. (Until #65 only the
AdamW reference had twins, on seeds 0 and 1, and its "stable" was applied to rps's rows,
whose SGD reference had none; until #54 the twin's initial weights moved by 1e-6, far
below what a lost datagram does to a step: it called a regime stable in which one lossy
step moved the final perplexity by 3 times as much. Measured then, 300 steps, seed 0: SGD
at 0.1 with momentum 0.9 from scratch moved by +2.58%, AdamW at 2e-3 by +0.061%.)
"""

from __future__ import annotations

import math

from harness.metrics.verdict import BAND_PCT as PPL_BAND_PCT
from testbed.stats import mean_interval

TOLERANCE_PCT = PPL_BAND_PCT / 4
DEFAULT_DROP = 0.1  # a bench without a lossy rate checks at 10%


def perturbation(drop: float) -> str:
    return f"one step with {drop:.0%} of its gradient's datagram blocks zeroed"


def check(pairs: list[tuple[dict, dict]]) -> dict | None:
    """One reference's check from its (reference, twin) records (their `ppl`, `seed`, the
    twin's config's drop_once): the twins' moves in percent, their 95% interval over the
    seeds, and whether it lies within ±TOLERANCE_PCT. None when no twin was run."""
    pairs = [(ref, twin) for ref, twin in pairs if ref is not None and twin is not None]
    if not pairs:
        return None
    pairs.sort(key=lambda pair: pair[1]["seed"])
    deltas = [(twin["ppl"] / ref["ppl"] - 1) * 100 for ref, twin in pairs]
    mean, half = mean_interval(deltas)
    drop = (pairs[0][1].get("config") or {}).get("drop_once") or DEFAULT_DROP
    return {"reference": pairs[0][0]["variant"],
            "seeds": [twin["seed"] for _, twin in pairs], "perturbation": perturbation(drop),
            "ppl_references": [ref["ppl"] for ref, _ in pairs],
            "ppl_twins": [twin["ppl"] for _, twin in pairs], "deltas_pct": deltas,
            "delta_pct": mean, "delta_ci95": None if math.isinf(half) else half,
            "tolerance_pct": TOLERANCE_PCT,
            "stable": abs(mean) + half <= TOLERANCE_PCT}


def by_reference(records: list[dict]) -> dict[str, dict]:
    """Every reference's check, by its variant text: each twin against its own seed's
    reference run."""
    refs = {(r["variant"], r["seed"]): r for r in records if r["role"] == "reference"}
    twins: dict[str, list] = {}
    for t in records:
        if t["role"] == "twin":
            twins.setdefault(t["variant"], []).append((refs.get((t["variant"], t["seed"])), t))
    checked = {variant: check(pairs) for variant, pairs in sorted(twins.items())}
    return {variant: c for variant, c in checked.items() if c is not None}


def interval_text(result: dict) -> str:
    """The check's interval against its tolerance, e.g. "+0.003 ± 0.010% (±0.2%)"."""
    half = result["delta_ci95"]
    spread = f" ± {half:.3f}" if half is not None else " (one seed: no interval)"
    return f"{result['delta_pct']:+.3f}{spread}% (tolerance ±{result['tolerance_pct']:g}%)"


def text(checks: dict[str, dict], judged: dict[str, list[str]] | None = None) -> list[str]:
    """The table's lines: one per reference, with the rows it judges (`judged`: reference ->
    lossy variants)."""
    if not checks:
        return ["regime stability: not checked (no twin run; --stability runs them): "
                "no Δppl gets a verdict"]
    lines = []
    for reference, result in checks.items():
        verdict = ("stable" if result["stable"] else
                   "CHAOTIC or undecided: its rows' verdicts withheld")
        moved = ", ".join(f"seed {s} {d:+.3f}%" for s, d in zip(
            result["seeds"], result["deltas_pct"], strict=True))
        rows = (judged or {}).get(reference)
        lines.append(f"regime stability of {reference}"
                     + (f" (judges {', '.join(rows)})" if rows else "")
                     + f": its twins ({result['perturbation']}) moved ppl by "
                     f"{interval_text(result)} over seeds ({moved}): {verdict}")
    return lines
