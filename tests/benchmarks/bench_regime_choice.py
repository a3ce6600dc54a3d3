"""The measurements the default bench's question was chosen from (#54): for each candidate
regime, what fine-tuning itself gains (a "holds" is empty if the reference barely moves),
whether the regime is chaotic (a twin whose initial weights moved by 1e-6), and the paired
Δppl of the lossy variant at 10% random loss per seed, with the minutes a run costs.

    .venv/bin/python -m tests.benchmarks.bench_regime_choice [--seeds 2] [--steps 150]
        [--regime scratch --adamw-lr 2e-3 --steps 300]

Candidates: AdamW from the bench's lossless checkpoint (as --regime finetune) at peak
1e-4 for unbiased_drift, against reliable; SGD with momentum 0.9 (RPS's paper) from the
same checkpoint at each --sgd-lrs rate, for rps, against reliable under the same SGD. One
namespace cluster of 4 hosts, torn down at the end; the checkpoints are the bench's cache.
The twin: the reference with one step as a lossy one (harness/bench/stability.py). From
scratch (--regime scratch) there is no checkpoint: "gain" is then against the untrained
model's perplexity (the vocabulary's size), which says little.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from harness.bench import checkpoints
from harness.bench.spec import BenchSpec
from harness.train import run
from testbed import clusters
from testbed.clusters import netns


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--adamw-lr", type=float, default=1e-4)
    parser.add_argument("--sgd-lrs", type=float, nargs="+", default=[0.01, 0.03])
    parser.add_argument("--loss", type=float, default=0.1)
    parser.add_argument("--regime", choices=("finetune", "scratch"), default="finetune")
    args = parser.parse_args(argv)
    spec = BenchSpec.make(regime=args.regime)
    cluster = netns.up(netns.ClusterSpec(hosts=spec.hosts, name="regimechoice"))
    try:
        ckpt = ({s: spec.preset for s in range(args.seeds)} if args.regime == "scratch" else
                checkpoints.ensure(cluster, {s: spec.pretrain_config(s)
                                             for s in range(args.seeds)}))
        candidates = {f"adamw {args.adamw_lr:g}": ("adamw", args.adamw_lr, "unbiased_drift")}
        for lr in args.sgd_lrs:
            candidates[f"sgd {lr:g}"] = ("sgd", lr, "rps")
        runs, labels = [], []
        for name, (optimizer, lr, variant) in candidates.items():
            for seed in range(args.seeds):
                base = replace(spec.config("reliable", seed), preset=ckpt[seed], lr=lr,
                               optimizer=optimizer, steps=args.steps)
                runs.append(run.Run(base))
                labels.append((name, seed, "reference"))
                if seed == 0:
                    runs.append(run.Run(replace(base, drop_once=args.loss)))
                    labels.append((name, seed, "twin"))
                runs.append(run.Run(replace(base, variant=variant), "random-loss",
                                    loss=args.loss, loss_seed=seed))
                labels.append((name, seed, "lossy"))
        started = time.monotonic()
        records = run.train_runs(cluster, runs, echo=lambda line: None)
        wall = time.monotonic() - started
    finally:
        clusters.down(cluster.name)
    got = {label: rec for label, rec in zip(labels, records, strict=True)}
    start_ppl = ({s: float(records[0]["vocab_size"]) for s in range(args.seeds)}
                 if args.regime == "scratch" else
                 {s: checkpoints.ppl(ckpt[s]) for s in range(args.seeds)})
    print(f"{len(records)} runs of {args.steps} steps in {wall / 60:.1f} min "
          f"({wall / len(records):.0f} s a run); checkpoint ppl per seed: "
          + ", ".join(f"{p:.2f}" for p in start_ppl.values()))
    print(f"{'candidate':<12} {'gain %':>16} {'twin %':>8} {'lossy Δppl % per seed':>24} "
          f"{'mean':>7} {'sd':>6}")
    for name in candidates:
        gains = [(got[(name, s, "reference")]["ppl"] / start_ppl[s] - 1) * 100
                 for s in range(args.seeds)]
        twin = (got[(name, 0, "twin")]["ppl"] / got[(name, 0, "reference")]["ppl"] - 1) * 100
        deltas = [(got[(name, s, "lossy")]["ppl"] / got[(name, s, "reference")]["ppl"] - 1)
                  * 100 for s in range(args.seeds)]
        sd = statistics.stdev(deltas) if len(deltas) > 1 else float("nan")
        print(f"{name:<12} {'/'.join(f'{g:+.2f}' for g in gains):>16} {twin:>+8.3f} "
              f"{'/'.join(f'{d:+.3f}' for d in deltas):>24} {statistics.fmean(deltas):>+7.3f} "
              f"{sd:>6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
