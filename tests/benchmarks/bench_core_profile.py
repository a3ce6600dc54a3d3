"""Where a lossy all-reduce's time goes, per call of the compiled core: four ranks as
processes on loopback (127.0.0.1 only), rank 0 under cProfile, sealed or not.

    .venv/bin/python -m tests.benchmarks.bench_core_profile [--mtu 9000] [--mib 4]
        [--iters 40] [--unsealed]

Prints, for rank 0, the seconds per all-reduce spent in each call of _wire (send: build,
seal and the sendmmsg system calls; receive: recvmmsg; screen: header checks and the MACs;
apply: placing and summing payloads), in waiting for datagrams (poll), in the estimator's
rebuild, and in everything else (Python), and one JSON line.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import multiprocessing
import pstats
import time
from datetime import timedelta

import numpy as np

PORT = 29741
WORLD = 4


def rank_main(rank: int, args, out) -> None:
    import torch.distributed as dist

    from harness.collectives.lossy import LossyCollective
    from harness.transport.udp import UdpTransport

    store = dist.TCPStore("127.0.0.1", PORT, WORLD, is_master=rank == 0,
                          timeout=timedelta(seconds=60))
    t = UdpTransport(rank, WORLD, "127.0.0.1", store, mtu=args.mtu,
                     key=None if args.unsealed else bytes(32), segmentation=True)
    c = LossyCollective(t, store)
    x = np.random.default_rng(rank).standard_normal(args.mib << 18).astype(np.float32)
    for _ in range(5):
        c.allreduce(x.copy())
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    for _ in range(args.iters):
        c.allreduce(x.copy())
    profile.disable()
    wall = (time.perf_counter() - t0) / args.iters
    if rank == 0:
        rows = pstats.Stats(profile).stats.items()

        def seconds(match, cumulative=False) -> float:
            return sum(ct if cumulative else tt for (file, _l, name), (_c, _n, tt, ct, _r)
                       in rows if match(file, name)) / args.iters

        parts = {
            "send (build, seal, sendmmsg)": seconds(lambda f, n: "_wire.Sender" in n),
            "receive (recvmmsg)": seconds(lambda f, n: "_wire.Receiver" in n),
            "screen (headers, MACs)": seconds(lambda f, n: "_wire.screen" in n),
            "apply (place, sum)": seconds(lambda f, n: "_wire.apply" in n),
            "wait (poll)": seconds(lambda f, n: "select.poll" in n),
            "rebuild (estimator)": seconds(
                lambda f, n: f.endswith("rebuild.py") and n == "rebuild", cumulative=True),
        }
        parts["other (Python)"] = wall - sum(parts.values())
        out.put({"wall_s": wall, "parts_s": parts, "missing": t.counters.missing})
    t.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--unsealed", action="store_true")
    args = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    result = out.get(timeout=600)
    for p in procs:
        p.join(60)
    print(f"rank 0, {args.mib} MiB all-reduce, MTU {args.mtu}, "
          f"{'unsealed' if args.unsealed else 'sealed'}: {result['wall_s'] * 1e3:.1f} ms "
          "per all-reduce")
    for label, seconds in result["parts_s"].items():
        print(f"  {label:<30} {seconds * 1e3:7.2f} ms  {seconds / result['wall_s']:6.1%}")
    print(json.dumps({**result, "mtu": args.mtu, "mib": args.mib,
                      "sealed": not args.unsealed}))


if __name__ == "__main__":
    main()
