"""The lossy all-reduce under each loss semantics (udp, roce-ud, roce-uc, roce-rc), in one
run on loopback: what the data plane of each costs, without namespaces or a network.

Two ranks as threads of one process on 127.0.0.1, MTU 9000, sealed (a job key), no loss;
the semantics take turns of TURN_ITERS all-reduces so that the machine's slow spells fall
on all of them. Prints p50 and p99 per semantics and their p50 against udp's in the same
run, then one JSON line.

    .venv/bin/python -m tests.benchmarks.bench_semantics [--floats 1048576] [--iters 100]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

SEMANTICS = ("udp", "roce-ud", "roce-uc:65536", "roce-rc:65536")
TURN_ITERS = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floats", type=int, default=1 << 20)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--semantics", nargs="+", default=list(SEMANTICS))
    args = parser.parse_args()

    import torch

    from harness.collectives.lossy import LossyCollective
    from harness.reproduce.loopback import on_every_rank
    from harness.runtime import keep_startup_out_of_collector
    from harness.transport.semantics import Semantics
    from tests.unit.test_transport_hostile import make_pair

    runs = {}
    for name in args.semantics:
        store, transports = make_pair(mtu=9000, semantics=Semantics.parse(name),
                                      key=b"bench semantics key, 32 bytes.."[:32])
        runs[name] = ([LossyCollective(t, store) for t in transports], transports)
    xs = [torch.randn(args.floats) for _ in range(2)]
    keep_startup_out_of_collector()  # as a rank starts (see there)
    times: dict[str, list[float]] = {name: [] for name in runs}
    try:
        while min(len(t) for t in times.values()) < args.iters:
            for name, (collectives, _) in runs.items():
                for _ in range(TURN_ITERS):
                    started = time.monotonic()
                    on_every_rank(2, lambda r, c=collectives: c[r].allreduce(xs[r]))
                    times[name].append(time.monotonic() - started)
    finally:
        for _, transports in runs.values():
            for t in transports:
                t.close()
    base = float(np.median(times[args.semantics[0]]))
    rows = []
    print(f"{4 * args.floats >> 20} MiB all-reduce, 2 loopback ranks, MTU 9000, sealed, "
          f"{args.iters} iterations each")
    print(f"{'semantics':16} {'p50 ms':>8} {'p99 ms':>8} {'p50 / ' + args.semantics[0]:>12}")
    for name, t in times.items():
        t = sorted(t[:args.iters])
        p50, p99 = float(np.median(t)), t[min(len(t) - 1, int(0.99 * len(t)))]
        rows.append({"semantics": name, "p50_ms": 1000 * p50, "p99_ms": 1000 * p99,
                     "p50_ratio": p50 / base})
        print(f"{name:16} {1000 * p50:8.1f} {1000 * p99:8.1f} {p50 / base:12.2f}")
    print(json.dumps({"floats": args.floats, "iters": args.iters, "rows": rows}))


if __name__ == "__main__":
    main()
