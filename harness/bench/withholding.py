"""When a Δppl gets no verdict: every rule, fixed before the runs (#27, #65). One function,
`withheld`, decides it for the bench's table, summary.json and report, for `compare`, and
for every training row of `lossbed reproduce` (docs/explanation/methodology.md describes
it).

A verdict (verdict.Check: the 95% interval of Δppl against ±band) is given only when the
runs measured what the claim is about. These rules say when they did not. None of them
reads the Δppl, its interval or its sign: each looks at how the runs went (the twins'
perplexity, the packets the collectives missed, the references' packets), so no outcome
can choose the rule that judges it. The first that applies is the reason the row gives:

    regime unchecked   the row's own reference (reliable/sgd for rps, ...) had no chaos
                       check: no twin of it was run, so nothing says its regime is not
                       chaotic (stability.py)
    regime unstable    the 95% interval, over the seeds, of how far that reference's twins
                       (one step as a lossy one) moved perplexity reaches past
                       ±stability.TOLERANCE_PCT (a quarter of the band), or has no width
                       (one seed): chaos alone may move perplexity as far as the loss does
    disturbed          in some seed's run the collectives missed far more packets than the
                       network lost (harness.train.run: more than the kernel's measured loss
                       plus max(3 points, half of it)): a rank fell behind, and lateness was
                       counted as loss
    references late    some seed's lossless reference (a lossy collective itself: rps/adamw)
                       missed packets: it is not the lossless model, and its perturbation is
                       outside the interval

Each rule has a test with planted rows on both sides of it (tests/unit/test_reproduce.py,
tests/unit/test_bench_summary.py).
"""

from __future__ import annotations

from harness.bench import stability

RULES = ("regime unchecked", "regime unstable", "disturbed", "references late")


def withheld(row: dict) -> str | None:
    """Why this row (harness.bench.summary.summarise's, carrying `chaos_check`: its own
    reference's stability check, None when that was not run) gets no verdict, or None."""
    return (by_the_regime(row.get("chaos_check"), row.get("reference"))
            or by_the_runs(row))


def by_the_regime(check: dict | None, reference: str | None = None) -> str | None:
    """The first two rules, from the reference's chaos check alone (the many-rank mode has
    no clock: its runs are never late, so only these two apply to row 8)."""
    whose = f" of {reference}" if reference else ""
    if check is None:
        return f"regime unchecked: no chaos check{whose} was run (no twin)"
    if not check["stable"]:
        return (f"regime unstable: the twins{whose} ({check['perturbation']}) moved lossless "
                f"perplexity by {stability.interval_text(check)}")
    return None


def by_the_runs(row: dict) -> str | None:
    """The last two rules: how the row's own runs went."""
    if row.get("disturbed"):
        return (f"disturbed: in the runs of seeds {row['disturbed']} the collectives "
                "missed far more than the network lost")
    if row.get("reference_missed_packets"):
        return (f"references late: the lossless references of seeds "
                f"{row['reference_missed_packets']} missed packets: not the lossless model")
    return None
