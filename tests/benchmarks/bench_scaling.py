"""Cost as the work grows (#67 item 5): the lossy all-reduce and gloo at 2, 4 and 8 hosts,
their p50 and bus bandwidth (nccl-tests' busbw = algbw * 2(n-1)/n), and the lossy
collective's CPU time per byte, measured in one run on namespace clusters of this machine.

Every host of a namespace cluster shares this machine's cores: the table names the cores
each host had (the machine's cores over the hosts), which is the bound here, not the wire.

    .venv/bin/python -m tests.benchmarks.bench_scaling [--hosts 2 4 8] [-b 1M] [-e 16M]
        [-f 4] [--loss 0 0.1] [--iters 20] [--mtu 9000] [--json FILE]

Prints a table and one JSON object (the last line). Needs root (namespaces)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_hosts(hosts: int, args) -> list[dict]:
    """One collective-bench on a fresh cluster of `hosts` hosts: its rows."""
    with tempfile.TemporaryDirectory(prefix="lossbed-scaling-") as folder:
        out = Path(folder) / "rows.jsonl"
        lossbed = str(Path(sys.executable).with_name("lossbed"))
        done = subprocess.run(
            [lossbed, "collective-bench", "--hosts", str(hosts), "--mtu", str(args.mtu),
             "-b", args.minbytes, "-e", args.maxbytes, "-f", str(args.stepfactor),
             "--loss", *map(str, args.loss), "--profiles", "random-loss",
             "--algorithms", "reliable", "unbiased", "--iters", str(args.iters),
             "--json", str(out)], capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"collective-bench at {hosts} hosts failed ({done.returncode}): "
                             f"{done.stderr[-2000:]}")
        return [json.loads(line) for line in out.read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("-b", "--minbytes", default="1M")
    parser.add_argument("-e", "--maxbytes", default="16M")
    parser.add_argument("-f", "--stepfactor", type=float, default=4)
    parser.add_argument("--loss", type=float, nargs="+", default=[0.0, 0.1])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    rows, started = [], time.monotonic()
    for hosts in args.hosts:
        print(f"{hosts} hosts ...", file=sys.stderr, flush=True)
        rows += run_hosts(hosts, args)
    head = (f"{'hosts':>5} {'cores/host':>10} {'size':>8} {'algorithm':<10} {'loss':>5} "
            f"{'p50 ms':>8} {'busbw GB/s':>10} {'cpu ns/B':>9} {'missing':>8}")
    print(head)
    print("-" * len(head))
    for r in sorted(rows, key=lambda r: (r["size_bytes"], r["algorithm"], r["loss"],
                                         r["hosts"])):
        n = r["nccl"]
        missing = f"{r['missing_fraction']:.2%}" if r.get("missing_fraction") is not None \
            else "-"
        print(f"{r['hosts']:>5} {cores / r['hosts']:>10.2f} {r['size_bytes'] >> 20:>7}M "
              f"{r['algorithm']:<10} {r['loss']:>5.0%} {r['p50_ms']:>8.2f} "
              f"{n['busbw']:>10.3f} {r['cpu_ns_per_byte']:>9.2f} {missing:>8}")
    print(f"busbw = algbw * 2(n-1)/n (algbw = size / mean time); cpu: rank 0's CPU time per "
          f"byte of one all-reduce; {cores} cores shared by every host; "
          f"{(time.monotonic() - started) / 60:.1f} min")
    summary = {"cores": cores, "rows": [
        {"hosts": r["hosts"], "size_bytes": r["size_bytes"], "algorithm": r["algorithm"],
         "loss": r["loss"], "p50_ms": r["p50_ms"], "busbw_gbps": r["nccl"]["busbw"],
         "cpu_ns_per_byte": r["cpu_ns_per_byte"], "measured_loss": r["measured_loss"],
         "missing_fraction": r.get("missing_fraction")} for r in rows]}
    if args.json:
        Path(args.json).write_text(json.dumps(summary) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
