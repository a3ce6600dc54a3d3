"""Row 7: RPS (arXiv 1810.07766) in training at n = 2, 4 and 8 ranks: "the influence of the
drop rate diminishes as the number of servers grows", measured on perplexity rather than on
one step's variance (row 3).

One bench per n, on a cluster of n hosts of its own: `rps` (SGD with momentum, the paper's)
at 10% random loss against reliable training under the same SGD, the same global batch at
every n (GLOBAL_BATCH sequences per step, split over the ranks), the same steps and seeds,
each bench with its stability twins (harness/bench/withholding.py). Three claims:

    7a  per n, Δppl against ±0.8% (the band of rows 4-6)
    7b  the paper's sentence as it states it, the harm shrinks with n: Δppl at the largest n
        minus at the smallest, paired by seed, below 0 by a one-sided test (verdict.decrease:
        holds only where the decrease is shown)
    7c  lossbed's weaker check, not the paper's sentence: the harm did not grow by more than
        TREND_TOLERANCE points (the same paired difference, a decrease counted as 0)
"""

from __future__ import annotations

from pathlib import Path

from harness.bench import withholding
from harness.bench.spec import BenchSpec
from harness.bench.training_bench import run_bench
from harness.metrics.verdict import BAND_PCT as PPL_BAND_PCT
from harness.metrics.verdict import Check, bounded_growth, claim, decrease, paired
from harness.reproduce.training import check

PAPER = "arXiv 1810.07766"
WORLDS = (2, 4, 8)
GLOBAL_BATCH = 32          # sequences per step over all ranks: 16, 8, 4 per rank
LOSS = 0.1
TREND_TOLERANCE = PPL_BAND_PCT / 2
QUICK_STEPS, QUICK_SEEDS = 40, 2
FULL_STEPS, FULL_SEEDS = 300, 4


def plans(quick: bool, regime: dict | None = None) -> dict[int, BenchSpec]:
    """One bench per number of ranks (regime: BenchSpec's regime options; default
    scratch, as rows 4-5)."""
    steps, seeds = (QUICK_STEPS, QUICK_SEEDS) if quick else (FULL_STEPS, FULL_SEEDS)
    return {n: BenchSpec.make(losses=[LOSS], hosts=n, batch=GLOBAL_BATCH // n,
                              variants=["rps"], steps=steps, seeds=seeds, realisations=1,
                              stability=True, **{"regime": "scratch", **(regime or {})})
            for n in WORLDS}


def run(make_cluster, quick: bool, out: Path, echo=print,
        regime: dict | None = None) -> list[dict]:
    summaries = {}
    for n, spec in plans(quick, regime).items():
        with make_cluster(spec) as cluster:
            echo(f"[reproduce] row 7: rps on {n} ranks ({len(spec.cases())} runs)")
            summaries[n] = run_bench(cluster, spec, out / f"bench-rps-{n}", echo=echo)
    return rows(summaries)


def _row_at_loss(summary: dict) -> dict | None:
    return next((r for r in summary["rows"] if r["variant"] == "rps"
                 and abs(r["loss"] - LOSS) < 1e-9), None)


def _by_seed(row: dict) -> dict[int, float]:
    return dict(zip(row.get("delta_seeds") or [], row.get("ppl_deltas") or [], strict=True))


def trend_checks(smallest: dict, largest: dict, worlds: tuple[int, int]) -> tuple[Check, Check]:
    """Δppl at the largest n minus at the smallest, paired by seed: the paper's trend (a
    shown decrease) and lossbed's weaker bound (no growth beyond TREND_TOLERANCE)."""
    differences = paired(_by_seed(smallest), _by_seed(largest))
    held_back = (withholding.withheld(smallest) or withholding.withheld(largest))
    what = f"Δppl % of rps at n={worlds[1]} minus at n={worlds[0]} (10% loss, paired by seed)"
    return (decrease(what, differences, held_back),
            bounded_growth(what, differences, TREND_TOLERANCE, held_back))


def rows(summaries: dict[int, dict]) -> list[dict]:
    at = {n: _row_at_loss(s) for n, s in summaries.items()}
    at = {n: row for n, row in sorted(at.items()) if row is not None}
    if not at:
        return []
    checks = [check(row, f"n={n}") for n, row in at.items()]
    out = [claim("7a", PAPER, "rps at 10% random loss trains as well as reliable SGD at "
                 f"n = {', '.join(map(str, at))} ranks (the same global batch)",
                 f"Δppl within ±{PPL_BAND_PCT}% at every n", checks,
                 setting=_setting(summaries), per_n={n: _point(r) for n, r in at.items()})]
    if len(at) > 1:
        small, large = min(at), max(at)
        trend, bound = trend_checks(at[small], at[large], (small, large))
        out.append(claim("7b", PAPER, "the harm of the drop rate shrinks as the number of "
                         "servers grows (in training)",
                         f"Δppl at n={large} minus at n={small}, paired by seed, below 0 "
                         "(one-sided at 5%: the decrease shown)", [trend],
                         setting=_setting(summaries)))
        out.append(claim("7c", "lossbed (weaker than 7b: not the paper's sentence)",
                         f"the harm of the drop rate did not grow by more than "
                         f"{TREND_TOLERANCE} points from n={small} to n={large}",
                         f"the same paired difference at most {TREND_TOLERANCE} points (a "
                         "decrease counted as 0)", [bound], setting=_setting(summaries)))
    return out


def _point(row: dict) -> dict:
    return {k: row.get(k) for k in ("seeds", "ppl", "ppl_delta_pct", "ppl_delta_ci95",
                                    "ppl_deltas", "verdict")}


def _setting(summaries: dict[int, dict]) -> str:
    first = next(iter(summaries.values()))
    c = first["config"]
    return (f"benches at n = {', '.join(map(str, summaries))} ranks, {GLOBAL_BATCH} sequences "
            f"of {c['seq_len']} per step over the ranks, {c['seeds']} seeds, regime "
            f"{first.get('regime')}")
