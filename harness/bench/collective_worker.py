"""One rank of `lossbed collective-bench`: times each algorithm on each tensor size, the
algorithms taking turns (ROUND_ITERS iterations each) so that they share the machine's
slow spells.

Started by the controller (harness.launch) with torchrun-style variables. Rank 0 prints one
JSON object per (algorithm, size) on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

import torch

from harness import barrier, runtime
from harness.collectives import reliable
from harness.collectives.lossy import LossyCollective
from harness.collectives.rps import RPS
from harness.metrics.hdr import Histogram
from harness.train.config import ESTIMATOR_OF

ROUND_ITERS = 10  # timed iterations of one algorithm before the next takes its turn
# The training variants' names (harness/train/config.py): reliable is torch.distributed's
# all-reduce (gloo), zero_fill / unbiased / rescale the lossy all-reduce with that estimator,
# rps RPS's averaging. Any but reliable also runs over other loss semantics as NAME@TRANSPORT,
# e.g. unbiased@roce-uc:65536 or rps@roce-rc.
ALGORITHMS = ("reliable", "zero_fill", "unbiased", "rescale", "rps")


def store_barrier(store, name: str, world: int, timeout_s: float = 600) -> None:
    """A barrier over the rendezvous store between timed phases (one-time setup, not a timed
    step: a gloo barrier would cross the impaired links)."""
    barrier.wait_for_all(store, f"barrier/{name}", world, timeout_s)


class Timing:
    """One algorithm's timed iterations on one size, gathered over its turns."""

    def __init__(self):
        self.times: list[float] = []
        # the rank's CPU time over its timed iterations (every thread of the process: the
        # late end markers' sender too), for the collective's CPU cost per byte
        self.cpu_s = 0.0
        self.sent = self.missing = self.expected = 0
        # rank 0's stages that ended at their deadline, not by their packets or end markers:
        # where a lossy p99 is the deadline's rather than the machine's
        self.deadlines_hit = {"reduce": 0, "broadcast": 0}

    def run(self, collective, tensor, counters, iters: int, totals: dict | None = None) -> None:
        """`totals`: the lossy collective's running totals (LossyCollective.totals)."""
        totals = totals or {}
        sent0, missing0 = counters.packets_sent, counters.missing
        expected0 = counters.packets_received + counters.missing
        hit0 = {stage: totals.get(f"{stage}_deadlines_hit", 0) for stage in self.deadlines_hit}
        cpu0 = time.process_time()
        for _ in range(iters):
            t0 = time.perf_counter()
            collective(tensor)
            self.times.append(time.perf_counter() - t0)
        self.cpu_s += time.process_time() - cpu0
        self.sent += counters.packets_sent - sent0
        self.missing += counters.missing - missing0
        self.expected += counters.packets_received + counters.missing - expected0
        for stage in self.deadlines_hit:
            self.deadlines_hit[stage] += totals.get(f"{stage}_deadlines_hit", 0) - hit0[stage]

    def summary(self, size_bytes: int, lossy: bool) -> dict:
        times, seconds = self.times, sum(self.times)
        hist = Histogram()
        for s in times:
            hist.record(s * 1e6)
        ms = {k: (v / 1e3 if v is not None else None) for k, v in hist.summary().items()
              if k != "count"}
        return {
            # p99 is None below 100 iterations: with 10 it would be the maximum
            "p50_ms": ms["p50"], "p99_ms": ms["p99"], "max_ms": ms["max"],
            "iterations": len(times), "mean_ms": seconds / len(times) * 1e3,
            # algorithm bandwidth: the tensor's bytes per second of one all-reduce
            "algbw_gbps": size_bytes * 8 / (ms["p50"] / 1e3) / 1e9,
            "packets_per_s": self.sent / seconds if lossy else None,
            "missing_fraction": self.missing / self.expected
            if lossy and self.expected else None,
            "deadlines_hit": dict(self.deadlines_hit) if lossy else None,
            # rank 0's CPU time per byte of the tensor, per all-reduce (its process, every
            # thread: what the collective costs a host's cores as the tensor grows)
            "cpu_ns_per_byte": self.cpu_s / len(times) / size_bytes * 1e9,
        }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", required=True, help="bytes")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--align-every", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    r = runtime.start()
    try:
        runners, totals = {}, {}
        for name in args.algorithms:
            base, _, semantics = name.partition("@")
            transport = r.transport_for(semantics) if semantics else r.transport
            if base == "reliable":
                runners[name] = reliable.allreduce_mean
                continue
            if base == "rps":
                rps = RPS(transport, r.store)
                runners[name], collective = rps.average, rps.collective
            else:
                collective = LossyCollective(transport, r.store, estimator=ESTIMATOR_OF[base],
                                             align_every=args.align_every)
                runners[name] = collective.allreduce
            totals[name] = collective.totals
        for size in args.sizes:
            numel = max(size // 4, 1)
            tensor = torch.randn(numel, generator=torch.Generator().manual_seed(r.rank))
            timed = {name: Timing() for name in args.algorithms}
            for name in args.algorithms:
                store_barrier(r.store, f"{name}/{size}", r.world)
                for _ in range(args.warmup):
                    runners[name](tensor)
            # The algorithms take turns, ROUND_ITERS iterations each, so that a slow spell
            # of the machine (other tenants, a busy core) falls on all of them alike rather
            # than on whichever one it happened to be timing.
            for first in range(0, args.iters, ROUND_ITERS):
                for name in args.algorithms:
                    semantics = name.partition("@")[2]
                    counters = (r.transport_for(semantics) if semantics
                                else r.transport).counters
                    store_barrier(r.store, f"{name}/{size}/{first}", r.world)
                    timed[name].run(runners[name], tensor, counters,
                                    min(ROUND_ITERS, args.iters - first), totals.get(name))
            store_barrier(r.store, f"{size}/done", r.world)
            if r.rank == 0:
                for name, timing in timed.items():
                    print(json.dumps({"algorithm": name, "size_bytes": numel * 4,
                                      "iters": args.iters,
                                      **timing.summary(numel * 4,
                                                       lossy=name != "reliable")}),
                          flush=True)
    finally:
        r.close()
    return 0


if __name__ == "__main__":
    runtime.run_and_exit(main)
