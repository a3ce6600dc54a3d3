"""Time `lossbed up` and `lossbed down` of a local cluster for 4, 16 and 32 hosts.

    sudo .venv/bin/python -m tests.benchmarks.bench_cluster_updown [--repeat 3] [--ssh]

Target (issue 2): 16 hosts up in under 2 s on a 2-core machine. Prints the median over the
repeats; the library is called in-process, so Python start-up is not counted.
"""

from __future__ import annotations

import argparse
import statistics
import time

from testbed.clusters import netns as netns_cluster


def measure(hosts: int, ssh: bool, repeat: int) -> tuple[float, float]:
    ups, downs = [], []
    for i in range(repeat):
        name = f"bench{i}"
        t0 = time.perf_counter()
        netns_cluster.up(netns_cluster.ClusterSpec(hosts=hosts, name=name, ssh=ssh))
        t1 = time.perf_counter()
        netns_cluster.down(name)
        t2 = time.perf_counter()
        ups.append(t1 - t0)
        downs.append(t2 - t1)
    return statistics.median(ups), statistics.median(downs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ssh", action="store_true", help="also start sshd on every host")
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 16, 32])
    args = parser.parse_args()
    print(f"{'hosts':>5} {'up s':>7} {'down s':>7}   (median of {args.repeat}"
          f"{', with sshd' if args.ssh else ''})")
    for n in args.hosts:
        up_s, down_s = measure(n, args.ssh, args.repeat)
        note = "  target < 2 s: " + ("met" if up_s < 2 else "MISSED") if n == 16 else ""
        print(f"{n:>5} {up_s:>7.3f} {down_s:>7.3f}{note}")


if __name__ == "__main__":
    main()
