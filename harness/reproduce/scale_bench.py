"""`lossbed bench --many-rank N ...`: the bench's question at n ranks in the many-rank mode,
row 8's way (harness/reproduce/scale_rows.py), its table and files written as reproduce
writes them (report.py)."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

from harness.bench.spec import BENCH_TRAINING, BenchSpec
from harness.reproduce import report, scale_rows
from testbed.errors import UsageError

# The bench's options this mode takes (besides --loss, --out and --many-rank itself), and
# those it cannot (each refused when given: a silently ignored option would answer another
# question)
BENCH_TAKES = ("steps", "seeds", "pretrain_steps", "preset", "tokenizer", "seq_len")
BENCH_REFUSES = ("hosts", "mtu", "profile", "realisations", "speed_steps", "speed_seeds",
                 "band_pct", "min_coverage", "sgd_lr", "batch", "lr", "optimizer", "schedule",
                 "device", "finetune_lr", "variants", "unsealed", "regime", "cluster",
                 "inventory", "first_seed", "timeout_s")


def bench(args) -> int:
    """bench --many-rank N ...: the question at n ranks in the many-rank mode, row 8's way
    (unbiased_drift and rps against their references, each n against the band)."""
    # the command line's defaults are the declarations' (read, not a spec made and checked)
    defaults = {**asdict(BENCH_TRAINING), **{f.name: f.default for f in fields(BenchSpec)},
                "variants": None, "unsealed": False, "regime": None, "cluster": None,
                "inventory": None, "sgd_lr": None}
    given = [f for f in BENCH_REFUSES if getattr(args, f, None) != defaults.get(f)]
    if given:
        flags = ", ".join("--" + f.replace("_", "-") for f in given)
        raise UsageError("--many-rank", f"runs its own question in this process, so {flags} "
                         "would be ignored", "Leave them out (it takes "
                         + ", ".join("--" + f.replace("_", "-") for f in BENCH_TAKES)
                         + ", one --loss)")
    worlds = sorted(set(args.many_rank))
    batch = scale_rows.global_batch_for(worlds)
    if min(worlds) < 2 or any(batch % n for n in worlds):
        raise UsageError("--many-rank", f"{' '.join(map(str, args.many_rank))}: every n must "
                         f"be 2 or more and divide the {batch} sequences of a step",
                         "e.g. --many-rank 4 16 64")
    if len(args.loss) != 1 or not args.loss[0]:
        raise UsageError("--loss", f"{' '.join(map(str, args.loss))}: --many-rank runs one "
                         "loss rate above 0", "e.g. --many-rank 4 16 64 --loss 0.1")
    out = Path(args.out or f"results/bench-many-rank-{time.strftime('%Y%m%d-%H%M%S')}")
    started = time.monotonic()
    # --steps and --pretrain-steps count the bench's steps: the same sequences here
    steps = scale_rows.bench_steps(args.steps, batch)
    pretrain = scale_rows.bench_steps(args.pretrain_steps, batch)
    print(f"[bench] many-rank mode: {batch} sequences a step, so the bench's {args.steps} + "
          f"{args.pretrain_steps} steps of {scale_rows.BENCH_SEQUENCES_PER_STEP} are "
          f"{steps} + {pretrain}", file=sys.stderr, flush=True)
    claims = scale_rows.run(False, out.resolve(), loss=args.loss[0],
                            size={"worlds": tuple(worlds), "steps": steps, "seeds": args.seeds,
                                  "pretrain_steps": pretrain,
                                  "model": {"preset": args.preset, "tokenizer": args.tokenizer,
                                            "seq_len": args.seq_len}},
                            echo=lambda line: print(line, file=sys.stderr, flush=True))
    result = {"mode": "bench --many-rank", "commit": report.current_commit(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "claims": claims,
              "seconds": {"8": round(time.monotonic() - started, 1)}}
    report.write(out, result)
    print(report.markdown(result))
    print(f"results in {out}/ (reproduction.md, reproduction.json, many_rank.jsonl)")
    return 0
