"""One rank of `lossbed collective-bench`: times each algorithm on each tensor size.

Started by the controller (harness.launch) with torchrun-style variables. Rank 0 prints one
JSON object per (algorithm, size) on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

import torch

from harness import runtime
from harness.collectives import reliable
from harness.collectives.lossy import LossyCollective
from harness.collectives.rps import RPS

ALGORITHMS = ("gloo", "lossy-zero_fill", "lossy-received_mean", "lossy-rescale", "rps")
# Any lossy algorithm (or rps) also runs over other loss semantics as NAME@TRANSPORT,
# e.g. lossy-received_mean@roce-uc:65536 or rps@roce-rc.


def store_barrier(store, name: str, world: int, timeout_s: float = 600) -> None:
    """A barrier over the rendezvous store, whose port profiles keep reliable (a gloo
    barrier would cross the impaired links)."""
    store.add(f"barrier/{name}", 1)
    deadline = time.monotonic() + timeout_s
    while int(store.add(f"barrier/{name}", 0)) < world:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {name}: not every rank arrived in {timeout_s} s")
        time.sleep(0.005)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", required=True, help="bytes")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rate-mbit", type=float, default=0.0)
    parser.add_argument("--transport", default="udp", help="udp, roce-ud, roce-uc, roce-rc")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    r = runtime.start(rate_mbit=args.rate_mbit, transport=args.transport)
    try:
        runners = {}
        for name in args.algorithms:
            base, _, semantics = name.partition("@")
            transport = r.transport_for(semantics) if semantics else r.transport
            if base == "gloo":
                runners[name] = reliable.allreduce_mean
            elif base == "rps":
                runners[name] = RPS(transport, r.store).average
            else:
                estimator = base.split("-", 1)[1]
                runners[name] = LossyCollective(transport, r.store,
                                                estimator=estimator).allreduce
        for size in args.sizes:
            numel = max(size // 4, 1)
            tensor = torch.randn(numel, generator=torch.Generator().manual_seed(r.rank))
            for name in args.algorithms:
                run = runners[name]
                semantics = name.partition("@")[2]
                counters = (r.transport_for(semantics) if semantics else r.transport).counters
                store_barrier(r.store, f"{name}/{size}", r.world)
                for _ in range(args.warmup):
                    run(tensor)
                sent0, missing0 = counters.packets_sent, counters.missing
                expected0 = counters.packets_received + counters.missing
                times = []
                for _ in range(args.iters):
                    t0 = time.perf_counter()
                    run(tensor)
                    times.append(time.perf_counter() - t0)
                store_barrier(r.store, f"{name}/{size}/done", r.world)
                if r.rank == 0:
                    expected = counters.packets_received + counters.missing - expected0
                    seconds = sum(times)
                    print(json.dumps({
                        "algorithm": name, "size_bytes": numel * 4, "iters": args.iters,
                        "p50_ms": statistics.median(times) * 1e3,
                        "p99_ms": percentile(times, 0.99) * 1e3, "max_ms": max(times) * 1e3,
                        "mean_ms": seconds / len(times) * 1e3,
                        # algorithm bandwidth: the tensor's bytes per second of one all-reduce
                        "algbw_gbps": numel * 4 * 8 / statistics.median(times) / 1e9,
                        "packets_per_s": (counters.packets_sent - sent0) / seconds
                        if name != "gloo" else None,
                        "missing_fraction": (counters.missing - missing0) / expected
                        if name != "gloo" and expected else None,
                    }), flush=True)
    finally:
        r.close()
    return 0


if __name__ == "__main__":
    runtime.run_and_exit(main)
