"""How the 95% half-width of a bench's paired Δppl narrows with seeds, measured on a bench
that ran many: the interval of the first k seeds for k = 2 .. all, beside the minutes k
seeds cost (priced from the bench's own runs, as its summary's budget section does).

    .venv/bin/python -m tests.benchmarks.bench_width_curve results/bench-TIME

Also printed per variant: the spread of Δppl over loss realisations at seed 0 and over
seeds, and what is left of the seed-to-seed variance once the realisations' is taken out
(the part more loss realisations per seed could not remove). Run `make bench SEEDS=8` (or
more) first; the default bench's 3 seeds give a curve of two points.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from harness.bench import report


def curve(records: list[dict], start_up_min: float = 0.0) -> dict:
    """Per (loss, variant) of the lossy runs: [(k, mean, half-width, minutes)] and the
    spreads."""
    plan = report.budget(records, [], None)
    fixed = (plan["realisation_min"] + start_up_min) if plan else 0.0
    out = {}
    keys = sorted({(r["loss"], r["variant"]) for r in records if r["role"] == "lossy"
                   and r["loss"] > 0 and r.get("ppl_delta_pct") is not None})
    for loss, variant in keys:
        by_seed = {r["seed"]: r["ppl_delta_pct"] for r in records if r["role"] == "lossy"
                   and (r["loss"], r["variant"]) == (loss, variant)}
        seeds = sorted(by_seed)
        points = []
        for k in range(2, len(seeds) + 1):
            mean, half = report.mean_interval([by_seed[s] for s in seeds[:k]])
            points.append((k, mean, half, fixed + k * plan["seed_min"] if plan else None))
        realised = [r["ppl_delta_pct"] for r in records if r["seed"] == 0
                    and (r["loss"], r["variant"]) == (loss, variant)
                    and r["role"] in ("lossy", "realisation")]
        seed_sd = statistics.stdev(by_seed.values()) if len(by_seed) > 1 else None
        real_sd = statistics.stdev(realised) if len(realised) > 1 else None
        between = (max(seed_sd ** 2 - real_sd ** 2, 0.0) ** 0.5
                   if seed_sd is not None and real_sd is not None else None)
        out[(loss, variant)] = {"points": points, "seed_sd": seed_sd,
                                "realisation_sd": real_sd, "between_seeds_sd": between,
                                "deltas": [by_seed[s] for s in seeds]}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", type=Path, help="a bench's output folder")
    args = parser.parse_args(argv)
    records = [json.loads(line) for line in
               (args.bench / "results.jsonl").read_text().splitlines() if line.strip()]
    summary = args.bench / "summary.json"
    plan = json.loads(summary.read_text()).get("budget") if summary.exists() else None
    for (loss, variant), c in curve(records, plan["start_up_min"] if plan else 0.0).items():
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
