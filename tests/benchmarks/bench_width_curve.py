"""How the 95% half-width of a bench's paired Δppl narrows with seeds, measured on a bench
that ran many: the interval of the first k seeds for k = 2 .. all, beside the minutes k
seeds cost (priced from the bench's own runs, as its summary's budget section does).

    .venv/bin/python -m tests.benchmarks.bench_width_curve results/bench-TIME

Also printed per variant: the spread of Δppl over loss realisations at seed 0 and over
seeds, and what is left of the seed-to-seed variance once the realisations' is taken out
(the part more loss realisations per seed could not remove). Run `make bench SEEDS=8` (or
more) first; the default bench's 4 seeds give a curve of three points. Everything comes
from the bench's summary.json: its rows' Δppl per seed and realisation spread, and its
budget's price of a seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from testbed import stats


def curve(summary: dict) -> dict:
    """Per lossy row of a bench summary: [(k, mean, half-width, minutes)] for its first k
    seeds, and the spreads (minutes None where the bench's runs were not timed)."""
    plan = summary.get("budget")
    out = {}
    for row in summary["rows"]:
        deltas = row.get("ppl_deltas") or []
        if row.get("reference") is None or not deltas:
            continue
        points = []
        for k in range(2, len(deltas) + 1):
            mean, half = stats.mean_interval(deltas[:k])
            minutes = (plan["realisation_min"] + plan["start_up_min"] + k * plan["seed_min"]
                       if plan else None)
            points.append((k, mean, half, minutes))
        seed_sd = statistics.stdev(deltas) if len(deltas) > 1 else None
        real_sd = row.get("realisation_sd")
        between = (max(seed_sd ** 2 - real_sd ** 2, 0.0) ** 0.5
                   if seed_sd is not None and real_sd is not None else None)
        out[(row["loss"], row["variant"])] = {"points": points, "seed_sd": seed_sd,
                                              "realisation_sd": real_sd,
                                              "between_seeds_sd": between, "deltas": deltas}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", type=Path, help="a bench's output folder")
    args = parser.parse_args(argv)
    summary = json.loads((args.bench / "summary.json").read_text())
    for (loss, variant), c in curve(summary).items():
        print(f"{variant} at {loss:.0%}: Δppl per seed "
              + ", ".join(f"{d:+.2f}" for d in c["deltas"]))
        print(f"  sd over seeds {c['seed_sd']:.2f}; over realisations at seed 0 "
              + (f"{c['realisation_sd']:.2f}; between seeds (the rest) "
                 f"{c['between_seeds_sd']:.2f}" if c["realisation_sd"] is not None
                 else "n/a"))
        print(f"  {'seeds':>5} {'minutes':>8} {'Δppl %':>8} {'±95%':>7}")
        for k, mean, half, minutes in c["points"]:
            print(f"  {k:>5} {minutes if minutes is not None else float('nan'):>8.1f} "
                  f"{mean:>+8.2f} {half:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
