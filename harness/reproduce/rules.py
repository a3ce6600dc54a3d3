"""When a training row's Δppl gets no verdict: every rule, fixed before the runs (#27).

A verdict (verdict.Check: the 95% interval of Δppl against ±PPL_BAND_PCT) is given only when
the runs measured what the claim is about. These rules say when they did not. None of them
reads the Δppl, its interval or its sign: each looks at how the runs went (the twin's
perplexity, the packets the collectives missed, the references' packets), so no outcome can
choose the rule that judges it. The first that applies is the reason the row gives:

    regime unchecked   no stability twin was run: nothing says the regime is not chaotic
    regime unstable    a lossless run and its twin (one step as a lossy one: stability.py)
                       differ by more than stability.TOLERANCE_PCT (a quarter of the band)
                       for some seed: chaos alone moves perplexity as far as the loss may
    disturbed          in some seed's run the collectives missed far more packets than the
                       network lost (harness.train.run: more than the kernel's measured loss
                       plus max(3 points, half of it)): a rank fell behind, and lateness was
                       counted as loss
    references late    some seed's lossless reference (a lossy collective itself: rps/adamw)
                       missed packets: it is not the lossless model, and its perturbation is
                       outside the interval

Each rule has a test with planted rows on both sides of it (tests/unit/test_reproduce.py).
"""

from __future__ import annotations

from harness.bench import stability
from harness.bench.summary import withheld_by_the_runs

PPL_BAND_PCT = stability.PPL_BAND_PCT

RULES = ("regime unchecked", "regime unstable", "disturbed", "references late")


def withheld(row: dict, regime: dict | None) -> str | None:
    """Why this bench row (harness.bench.summary.summarise) gets no verdict, or None.
    `regime`: its bench's stability check (summary["stability"])."""
    return withheld_by_the_regime(regime) or withheld_by_the_runs(row)


def withheld_by_the_regime(regime: dict | None) -> str | None:
    """The first two rules, from the stability check alone (the many-rank mode has no clock:
    its runs are never late, so only these two apply to row 8)."""
    if regime is None:
        return "regime unchecked: no stability twin was run"
    if not regime["stable"]:
        what = regime.get("perturbation") or "a 1e-6 change of the initial weights"
        return (f"regime unstable: {what} moved lossless perplexity by "
                f"{regime['delta_pct']:+.2f}% (tolerance ±{regime['tolerance_pct']:g}%)")
    return None
