"""Does row 8's chaos check at the smallest n stand for every n (#65)? Row 8 runs each
reference's one-lossy-step twin at its smallest n only; this runs the twins at every n, in
row 8's regime (each seed's lossless checkpoint, then fine-tuning: AdamW 1e-4, SGD 0.03,
64 sequences a step), and prints per optimizer and n the twins' moves in perplexity with
their 95% interval against the ±0.2% tolerance, and whether that n's check agrees with the
smallest n's.

    .venv/bin/python -m tests.benchmarks.bench_row8_twins_per_n [--worlds 4 64]
        [--steps 40] [--seeds 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from harness.bench import stability
    from harness.reproduce import scale_rows

    out = args.out or Path(tempfile.mkdtemp(prefix="row8-twins-"))
    started = time.monotonic()
    claims = scale_rows.run(False, out, size={"worlds": tuple(args.worlds),
                                              "steps": args.steps, "seeds": args.seeds,
                                              "twins_every_n": True})
    records = [json.loads(line) for line in (out / "many_rank.jsonl").read_text().splitlines()]
    print(f"row 8's regime, n = {args.worlds}, {args.steps} steps, seeds "
          f"{sorted({r['seed'] for r in records})}, {time.monotonic() - started:.0f} s")
    print(f"{'optimizer':<9} {'n':>3} {'twins moved ppl by (per seed)':<40} "
          f"{'mean ± 95%':>18} stable")
    for row in ("8a", "8b"):
        claim = next((c for c in claims if c["row"] == row), None)
        if claim is None:
            continue
        optimizer = "sgd" if row == "8b" else "adamw"
        for n, point in sorted(claim["per_n"].items()):
            check = point.get("chaos_check")
            if check is None:
                print(f"{optimizer:<9} {n:>3} (no twins)")
                continue
            moves = ", ".join(f"{d:+.3f}%" for d in check["deltas_pct"])
            print(f"{optimizer:<9} {n:>3} {moves:<40} "
                  f"{stability.interval_text(check).split(' (')[0]:>18} {check['stable']}")
    print(f"records in {out}/many_rank.jsonl")


if __name__ == "__main__":
    main()
