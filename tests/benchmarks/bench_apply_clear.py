"""Time `apply` + `clear` of a profile on a local cluster of 4 and 16 hosts, per backend.

    sudo .venv/bin/python -m tests.benchmarks.bench_apply_clear [--repeat 5]

Target (issue 3): apply + clear under 1 s for 16 hosts. The probe of the kernel's backends
(part of every `lossbed apply`) is timed separately. Prints the median over the repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time

from testbed import profiles
from testbed.clusters import netns as netns_cluster
from testbed.impair import engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 16])
    args = parser.parse_args()
    print(f"{'hosts':>5} {'backend':>7} {'profile':>12} {'probe s':>8} {'apply s':>8} "
          f"{'clear s':>8} {'total s':>8}   (median of {args.repeat})")
    for n in args.hosts:
        cluster = netns_cluster.up(netns_cluster.ClusterSpec(hosts=n, name="benchapply"))
        try:
            for backend, profile in (("nft", "random-loss"), ("bpf", "random-loss"),
                                     ("bpf", "burst-loss")):
                probes, applies, clears = [], [], []
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    the_plan, choice = engine.make_plan(cluster, profiles.load(profile),
                                                        backend=backend)
                    t1 = time.perf_counter()
                    engine.apply(cluster, the_plan, choice)
                    t2 = time.perf_counter()
                    engine.clear(cluster)
                    t3 = time.perf_counter()
                    probes.append(t1 - t0)
                    applies.append(t2 - t1)
                    clears.append(t3 - t2)
                p, a, c = (statistics.median(x) for x in (probes, applies, clears))
                print(f"{n:>5} {backend:>7} {profile:>12} {p:>8.3f} {a:>8.3f} {c:>8.3f} "
                      f"{p + a + c:>8.3f}")
        finally:
            netns_cluster.down("benchapply")


if __name__ == "__main__":
    main()
