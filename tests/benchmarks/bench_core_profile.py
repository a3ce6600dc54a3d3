"""Where a lossy all-reduce's time goes, per call of the compiled core: four ranks (--ranks)
as processes on loopback (127.0.0.1 only), rank 0 under cProfile, sealed or not.

    .venv/bin/python -m tests.benchmarks.bench_core_profile [--mtu 9000] [--mib 4]
        [--iters 40] [--ranks 4] [--unsealed] [--no-pipeline] [--perf [--top 15]]
        [--flamegraph FILE.svg]

--no-pipeline: an owner broadcasts its shard only once its reduce stage has ended
(harness/collectives/pipeline.py off), for a before/after of the pipeline in one sitting.

Prints, for rank 0, the seconds per all-reduce spent in each call of _wire (send: build,
seal and the sendmmsg system calls; receive: recvmmsg; screen: header checks and the MACs;
apply: placing and summing payloads), in waiting for datagrams (poll), in the estimator's
rebuild, and in everything else (Python), and one JSON line.

--perf asks the kernel instead (perf record on all the ranks, no cProfile): the CPU time
of the ranks by where it was spent, the kernel included, which cProfile cannot see into
(its sendmmsg and recvmmsg copies, the network stack, the scheduler): the kernel's copies,
the rest of the kernel, the MAC (libcrypto), the compiled core by function, Python, numpy,
torch (the store) and the C library; also the CPU-seconds the ranks used per all-reduce
against the cores' wall time, which says whether the machine is the bound. Needs `perf`.

--flamegraph FILE.svg draws rank 0's measured all-reduces as a flame graph (and FILE.folded,
its stacks as text) (py-spy, a
[dev] dependency, sampling rank 0 with its native frames: the compiled core, numpy and the C
library's system calls under the Python that called them), and prints the share of its
samples under each of the same parts as the cProfile view; the kernel's own share is
--perf's.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import multiprocessing
import os
import pstats
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import numpy as np

from tests.benchmarks import flamegraph

PORT = 29741


def rank_main(rank: int, args, out, go=None, ready=None) -> None:
    import torch.distributed as dist

    from harness.collectives.lossy import LossyCollective
    from harness.runtime import keep_startup_out_of_collector
    from harness.transport.udp import UdpTransport

    store = dist.TCPStore("127.0.0.1", PORT, args.ranks, is_master=rank == 0,
                          timeout=timedelta(seconds=60))
    t = UdpTransport(rank, args.ranks, "127.0.0.1", store, mtu=args.mtu,
                     key=None if args.unsealed else bytes(32), segmentation=True)
    # align_every=0: the ranks meet in the store before the first step only, as in training
    # and collective-bench; aligning every step profiled two store round trips per step too
    c = LossyCollective(t, store, align_every=0, pipelined=not args.no_pipeline)
    keep_startup_out_of_collector()  # as a rank starts (see there)
    x = np.random.default_rng(rank).standard_normal(args.mib << 18).astype(np.float32)
    for _ in range(5):
        c.allreduce(x.copy())
    if go is not None:  # --perf: the measured loop starts once perf is recording (each
        ready.put(rank)  # all-reduce aligns the ranks itself: no barrier needed here)
        go.wait(300)
    profile = cProfile.Profile() if go is None else None
    t0 = time.perf_counter()
    if profile:
        profile.enable()
    for _ in range(args.iters):
        c.allreduce(x.copy())
    if profile:
        profile.disable()
    wall = (time.perf_counter() - t0) / args.iters
    if rank == 0 and profile is None:
        out.put({"wall_s": wall, "missing": t.counters.missing})
    elif rank == 0:
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


# Where a perf sample lands, by its shared object and symbol: the first rule that matches.
KERNEL_COPY = re.compile(r"copy_(user|to_user|from_user|page)|^_copy_|memcpy|memmove|"
                         r"csum_partial_copy|skb_copy_datagram|rep_movs")
CATEGORIES = (
    ("kernel: copies", lambda dso, sym: dso == "[kernel.kallsyms]" and KERNEL_COPY.search(sym)),
    ("kernel: the rest", lambda dso, sym: dso.startswith("[kernel")),
    ("MAC (libcrypto)", lambda dso, sym: "libcrypto" in dso),
    ("core: apply (place, sum)", lambda dso, sym: "_wire" in dso and sym in ("apply",
                                                                            "all_finite")),
    ("core: the rest", lambda dso, sym: "_wire" in dso),
    # (before the interpreter: numpy's objects are named cpython-311-...)
    ("numpy", lambda dso, sym: "numpy" in dso or "_multiarray" in dso or "openblas" in dso),
    ("Python interpreter", lambda dso, sym: dso.startswith(("libpython", "python"))),
    ("torch (store, tensors)", lambda dso, sym: "torch" in dso or "libc10" in dso),
    ("C library", lambda dso, sym: dso.startswith(("libc.so", "libc-", "ld-linux"))),
)


def categorise(report: str) -> dict[str, float]:
    """Percent of the samples in each category, from `perf report --stdio --no-children
    --sort dso,sym -q -g none` lines ("  12.34%  [kernel.kallsyms]  [k] copy_user_...",
    with --show-nr-samples a count after the percent)."""
    shares = {name: 0.0 for name, _ in CATEGORIES} | {"other": 0.0}
    for line in report.splitlines():
        found = re.match(r"\s*([0-9.]+)%\s+(?:\d+\s+)?(\S+)\s+\[[^\]]+\]\s+(\S+)", line)
        if not found:
            continue
        percent, dso, sym = float(found[1]), found[2], found[3]
        name = next((name for name, match in CATEGORIES if match(dso, sym)), "other")
        shares[name] += percent
    return shares


def _start_waiting_ranks(args):
    """The ranks, started: each says `ready` after its warm-up and waits for `go`
    before its measured all-reduces (so a profiler attaches in between)."""
    ctx = multiprocessing.get_context("spawn")
    out, go, ready = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args, out, go, ready))
             for r in range(args.ranks)]
    for p in procs:
        p.start()
    return procs, out, go, ready


def perf_main(args) -> None:
    """The --perf view: perf record on the ranks during the measured all-reduces."""
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("--perf needs perf (Debian: apt-get install linux-perf)")
    procs, out, go, ready = _start_waiting_ranks(args)
    with tempfile.TemporaryDirectory(prefix="lossbed-perf-") as folder:
        data = os.path.join(folder, "perf.data")
        hz = 2000
        for _ in procs:  # every rank imported torch and ran its five warm-up all-reduces
            ready.get(timeout=600)
        recorder = subprocess.Popen(
            [perf, "record", "-q", "-F", str(hz), "-o", data,
             "-p", ",".join(str(p.pid) for p in procs)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)  # perf attached
        started = time.perf_counter()
        go.set()
        result = out.get(timeout=600)
        seconds = time.perf_counter() - started
        recorder.send_signal(signal.SIGINT)
        recorder.wait(60)
        for p in procs:
            p.join(60)
        report = subprocess.run(
            [perf, "report", "-i", data, "--stdio", "--no-children", "--sort", "dso,sym",
             "--show-nr-samples", "-q", "-g", "none"], capture_output=True, text=True,
            check=True).stdout
    total = sum(int(m[1]) for m in re.finditer(r"^\s*[0-9.]+%\s+(\d+)\s", report, re.M))
    cpu_s = total / hz  # the ranks' CPU-seconds while perf recorded
    shares = categorise(report)
    per_call = cpu_s / args.iters
    cores = os.cpu_count() or 1
    print(f"{args.ranks} ranks, {args.mib} MiB all-reduce, MTU {args.mtu}, "
          f"{'unsealed' if args.unsealed else 'sealed'}: {result['wall_s'] * 1e3:.1f} ms per "
          f"all-reduce; the ranks used {per_call * 1e3:.1f} CPU-ms per all-reduce, "
          f"{cpu_s / (seconds * cores):.0%} of the {cores} cores while perf recorded")
    for name, percent in shares.items():
        print(f"  {name:<28} {percent:5.1f}%  {percent / 100 * per_call * 1e3:7.2f} CPU-ms")
    print(f"the {args.top} symbols with most samples:")
    for line in [line for line in report.splitlines() if "%" in line][:args.top]:
        print("  " + " ".join(line.split()))
    print(json.dumps({"wall_s": result["wall_s"], "cpu_s_per_allreduce": per_call,
                      "cores_busy": cpu_s / (seconds * cores), "shares_pct": shares,
                      "mtu": args.mtu, "mib": args.mib, "sealed": not args.unsealed,
                      "missing": result["missing"]}))


# Where a flame graph's stack is, by the first of its frames (leaf last) that matches.
STACK_PARTS = (
    ("send (build, seal, sendmmsg)", re.compile(r"send_packets|Sender|sendmmsg|send_end")),
    ("receive (recvmmsg)", re.compile(r"recvmmsg|Receiver|receive_batch")),
    ("screen (headers, MACs)", re.compile(r"\bscreen|gmac|GMAC|ghash|aes", re.I)),
    ("apply (place, sum)", re.compile(r"\bapply\b|handle_batch|all_finite")),
    ("wait (poll)", re.compile(r"\bpoll\b|epoll|select")),
    ("rebuild (estimator)", re.compile(r"\brebuild\b")),
    ("align (store)", re.compile(r"align|TCPStore|store")),
)


def stack_shares(folded: str) -> dict[str, float]:
    """Percent of the samples under each part, from py-spy's folded stacks ("a;b;c N"): a
    stack belongs to the first part (in STACK_PARTS' order) any of its frames names."""
    shares = {name: 0 for name, _ in STACK_PARTS} | {"other (Python, numpy)": 0}
    total = 0
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        total += int(count)
        name = next((name for name, pattern in STACK_PARTS if pattern.search(stack)),
                    "other (Python, numpy)")
        shares[name] += int(count)
    return {name: 100 * n / total if total else 0.0 for name, n in shares.items()}


def heaviest_leaves(folded: str, top: int) -> list[tuple[str, float]]:
    """The frames most samples ended in (the leaf of each stack), with their share."""
    leaves: dict[str, int] = {}
    total = 0
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            total += int(count)
            leaf = stack.rsplit(";", 1)[-1]
            leaves[leaf] = leaves.get(leaf, 0) + int(count)
    ranked = sorted(leaves.items(), key=lambda kv: -kv[1])[:top]
    return [(leaf, 100 * n / total) for leaf, n in ranked]


def flamegraph_main(args) -> None:
    """The --flamegraph view: py-spy on rank 0 during the measured all-reduces."""
    from pathlib import Path

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.path.exists(spy):
        raise SystemExit("--flamegraph needs py-spy (pip install -e '.[dev]')")
    procs, out, go, ready = _start_waiting_ranks(args)
    for _ in procs:
        ready.get(timeout=600)
    with tempfile.TemporaryDirectory(prefix="lossbed-spy-") as folder:
        raw = os.path.join(folder, "rank0.txt")
        # (native frames need the process paused for each sample: at 250 Hz, a few % of
        # its time; rank 0's all-reduce time below is measured under it)
        spying = subprocess.Popen(
            [spy, "record", "--native", "--rate", "250", "--format", "raw", "-o", raw,
             "--pid", str(procs[0].pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(2.0)  # py-spy attached
        go.set()
        result = out.get(timeout=600)
        spying.send_signal(signal.SIGINT)
        _, spy_err = spying.communicate(timeout=120)
        for p in procs:
            p.join(60)
        if not os.path.exists(raw):
            raise SystemExit(f"py-spy wrote nothing: {spy_err.strip()[-500:]}")
        # rank 0's main thread in its measured loop only (py-spy samples every thread,
        # multiprocessing's idle queue feeder too)
        folded = "\n".join(line for line in Path(raw).read_text().splitlines()
                           if "rank_main (" in line)
        Path(args.flamegraph).with_suffix(".folded").write_text(folded)  # (to read as text)
        Path(args.flamegraph).write_text(flamegraph.svg(folded, (
            f"rank 0 of {args.ranks}, {args.mib} MiB lossy all-reduce, MTU {args.mtu}, "
            f"{'unsealed' if args.unsealed else 'sealed'} (py-spy --native)")))
        shares = stack_shares(folded)
    print(f"rank 0, {args.mib} MiB all-reduce, MTU {args.mtu}, "
          f"{'unsealed' if args.unsealed else 'sealed'}: {result['wall_s'] * 1e3:.1f} ms per "
          f"all-reduce; py-spy's samples of rank 0 by part (flame graph: {args.flamegraph})")
    for name, percent in shares.items():
        print(f"  {name:<30} {percent:5.1f}%  {percent / 100 * result['wall_s'] * 1e3:7.2f} ms")
    print(f"the {args.top} frames most samples ended in:")
    for leaf, percent in heaviest_leaves(folded, args.top):
        print(f"  {percent:5.1f}%  {leaf[:110]}")
    print(json.dumps({"wall_s": result["wall_s"], "shares_pct": shares, "mtu": args.mtu,
                      "mib": args.mib, "sealed": not args.unsealed,
                      "flamegraph": args.flamegraph}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--unsealed", action="store_true")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--no-pipeline", action="store_true",
                        help="the owner's broadcast waits for its whole reduce stage")
    parser.add_argument("--perf", action="store_true",
                        help="perf record on all the ranks (kernel included) instead of "
                             "cProfile on rank 0")
    parser.add_argument("--top", type=int, default=15,
                        help="with --perf: how many of the busiest symbols to list")
    parser.add_argument("--flamegraph", metavar="FILE.svg",
                        help="py-spy's flame graph of rank 0 (native frames included) "
                             "instead of cProfile")
    args = parser.parse_args()
    if args.perf:
        perf_main(args)
        return
    if args.flamegraph:
        flamegraph_main(args)
        return
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args, out)) for r in range(args.ranks)]
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
