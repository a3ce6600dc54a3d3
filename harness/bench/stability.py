"""Is the training regime chaotic? The check every Δppl verdict waits for (#27).

A Δppl says what the loss did only if the regime itself does not amplify small
differences: where a 1e-6 change of the initial weights already moves the final perplexity
by as much as the loss does, a run under loss differs from its lossless reference by chaos
as much as by the loss, and a verdict either way would be an artefact. So the bench trains,
besides seed 0's lossless reference, its twin: the same seed, the same data, the same
lossless network, with every initial weight moved by N(0, NOISE²). The two perplexities must
agree within TOLERANCE_PCT, or the regime is unstable and no Δppl of it gets a verdict.

Both numbers are fixed here, before any run: NOISE is far below what a lost datagram does to
a step (a lost gradient shard changes that step's update by its whole size), so a stable
regime answers it with a change far below the band; TOLERANCE_PCT is a quarter of the ±0.8%
band Δppl is held against (2507.07114's bound), so that chaos alone can use at most a
quarter of the band and three quarters stay for the effect and its interval. Measured
here (300 steps, seed 0): SGD at 0.1 with momentum 0.9 moved by +2.58%, unstable; AdamW at
2e-3 by +0.061% and at 5e-4 by +0.000%, stable.
"""

from __future__ import annotations

from harness.metrics.verdict import BAND_PCT as PPL_BAND_PCT

NOISE = 1e-6
TOLERANCE_PCT = PPL_BAND_PCT / 4
TWIN_SEED = 0


def check(reference: dict | None, twin: dict | None) -> dict | None:
    """The check from the two runs' records (their `ppl`): None when no twin was run."""
    if twin is None or reference is None:
        return None
    delta = (twin["ppl"] / reference["ppl"] - 1) * 100
    return {"seed": twin["seed"], "noise": NOISE, "ppl_reference": reference["ppl"],
            "ppl_twin": twin["ppl"], "delta_pct": delta, "tolerance_pct": TOLERANCE_PCT,
            "stable": abs(delta) <= TOLERANCE_PCT}


def text(result: dict | None) -> str:
    """One line for the bench's table."""
    if result is None:
        return "regime stability: not checked (no twin run; reproduce runs one)"
    verdict = ("stable" if result["stable"] else
               "UNSTABLE: no Δppl of this regime can be told from chaos")
    return (f"regime stability: seed {result['seed']}'s lossless run and its twin (initial "
            f"weights + N(0, {result['noise']:g}²)) differ by {result['delta_pct']:+.3f}% "
            f"(ppl {result['ppl_reference']:.3f} vs {result['ppl_twin']:.3f}; tolerance "
            f"±{result['tolerance_pct']:g}%): {verdict}")
