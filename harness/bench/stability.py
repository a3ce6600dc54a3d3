"""Is the training regime chaotic at the loss's own scale? The check every Δppl verdict
waits for (#27, #54).

A Δppl says what the loss did only if the regime itself does not amplify small
differences: where one lossy step already moves the final perplexity by a sizeable part of
the band, a run under loss differs from its lossless reference by chaos as much as by the
loss, and a verdict either way would be an artefact. So the bench trains, besides the
lossless references of TWIN_SEEDS, their twins: the same seed, data and lossless network,
with one step whose aggregated gradient lost the bench's loss rate of its datagram-sized
blocks (harness/train/one_lossy_step.py: what zero_fill makes of one lossy step, more than
the received-mean estimators leave). Every twin's perplexity must agree with its reference's
within TOLERANCE_PCT, or the regime is chaotic and no Δppl of it gets a verdict.

The numbers are fixed here, before any run: TOLERANCE_PCT is a quarter of the ±0.8% band
Δppl is held against (2507.07114's bound), so that chaos alone can use at most a quarter of
the band and three quarters stay for the effect and its interval; two seeds, because one
twin that happens to land near its reference says little. (Until #54 the twin's initial
weights moved by 1e-6, far below what a lost datagram does to a step: it called a regime
stable in which one lossy step moved the final perplexity by 3 times as much. Measured then,
300 steps, seed 0: SGD at 0.1 with momentum 0.9 from scratch moved by +2.58%, AdamW at 2e-3
by +0.061%.)
"""

from __future__ import annotations

from harness.metrics.verdict import BAND_PCT as PPL_BAND_PCT

TWIN_SEEDS = (0, 1)
TOLERANCE_PCT = PPL_BAND_PCT / 4
DEFAULT_DROP = 0.1  # a bench without a lossy rate checks at 10%


def perturbation(drop: float) -> str:
    return f"one step with {drop:.0%} of its gradient's datagram blocks zeroed"


def check(pairs: list[tuple[dict, dict]]) -> dict | None:
    """The check from (reference, twin) records (their `ppl`, `seed`, and the twin's config's
    drop_once): None when no twin was run."""
    pairs = [(ref, twin) for ref, twin in pairs if ref is not None and twin is not None]
    if not pairs:
        return None
    deltas = [(twin["ppl"] / ref["ppl"] - 1) * 100 for ref, twin in pairs]
    worst = max(deltas, key=abs)
    drop = (pairs[0][1].get("config") or {}).get("drop_once") or DEFAULT_DROP
    return {"seeds": [twin["seed"] for _, twin in pairs], "perturbation": perturbation(drop),
            "ppl_references": [ref["ppl"] for ref, _ in pairs],
            "ppl_twins": [twin["ppl"] for _, twin in pairs], "deltas_pct": deltas,
            "delta_pct": worst, "tolerance_pct": TOLERANCE_PCT,
            "stable": all(abs(d) <= TOLERANCE_PCT for d in deltas)}


def text(result: dict | None) -> str:
    """One line for the bench's table."""
    if result is None:
        return "regime stability: not checked (no twin run; --stability runs them)"
    verdict = ("stable" if result["stable"] else
               "CHAOTIC: no Δppl of this regime can be told from chaos (verdicts withheld)")
    moved = ", ".join(f"seed {s} {d:+.3f}%" for s, d in zip(result["seeds"],
                                                           result["deltas_pct"], strict=True))
    return (f"regime stability: the lossless references and their twins ("
            f"{result['perturbation']}) differ by {moved} (tolerance "
            f"±{result['tolerance_pct']:g}%): {verdict}")
