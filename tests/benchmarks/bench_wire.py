"""Where the data plane stands against the wire it runs on, measured in one run.

On a namespace cluster of each --hosts count (this machine only), per MTU:
1. the wire's own limits: the compiled blaster (harness/bench/blaster.py) on every host at
   once, in four modes (sendmmsg or UDP GSO, plain or sealed), before the collectives;
2. `unbiased` (the lossy all-reduce) and `reliable` (gloo) at 0% and 10% random loss, sealed
   and unsealed (collective-bench, --iters iterations per size);
3. the blasters again, after (the machine's state drifts: both are printed).
Then the ratios the data plane is held to: the collective's aggregate goodput at 0% (each of
n hosts sends 2(n-1)/n of the tensor per all-reduce: 2(n-1) S / p50) unsealed against the
best plain mode and sealed against the best sealed mode; p50, p99 and max against gloo at
0% and 10%; the MAC's price (sealed p50 / unsealed p50) beside the blasters' (best plain /
best sealed); sealed p99 at 10% against its own lossless p50; and the core's seal+check
rate on one core, with the cores that 100 Gbit/s of MTU-sized datagrams would need. Last,
every cell against the targets of #67 (TARGETS): met or missed, by how much.

    .venv/bin/python -m tests.benchmarks.bench_wire [--mtu 9000 1500] [--sizes 4 16]
        [--iters 100] [--seconds 2] [--hosts 4 2] [--json FILE]

Prints a table and one JSON object (the last line). Needs root (namespaces).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from harness import launch
from harness.bench import _blaster
from harness.bench import collective_bench as cb
from harness.transport import header as hdr
from testbed import clusters
from testbed.clusters import netns as netns_cluster

MODES = [("sendmmsg", False), ("sendmmsg", True), ("gso", False), ("gso", True)]
MIB = 1 << 20


def blasters(cluster, seconds: float) -> dict:
    """Aggregate received Gbit/s (payload after the header) of each mode, all hosts at once."""
    addresses = [h.address for h in cluster.hosts]
    out = {}
    for mode, sealed in MODES:
        args = ["--peers", *addresses, "--mode", mode, "--seconds", str(seconds),
                "--start-at", str(time.time() + 3.0)] + (["--sealed"] if sealed else [])
        results = launch.run(cluster, "harness.bench.blaster", args, timeout_s=120,
                             authenticate=False)
        bad = [r for r in results if r.returncode]
        if bad:
            raise RuntimeError(f"blaster on {bad[0].host}: {bad[0].stderr[-2000:]}")
        rows = [json.loads(r.stdout.strip().splitlines()[-1]) for r in results]
        seconds_run = max(r["seconds"] for r in rows)
        out[f"{mode} {'sealed' if sealed else 'plain'}"] = {
            "gbps": sum(r["payload_bytes"] for r in rows) * 8 / seconds_run / 1e9,
            "refused": sum(r["refused"] for r in rows),
            "delivered": sum(r["received"] for r in rows) / max(1, sum(r["sent"] for r in rows)),
        }
    return out


def collectives(cluster, sizes, iters: int, unsealed: bool) -> list[dict]:
    spec = cb.BenchSpec(sizes_mib=sizes, losses=[0.0, 0.1], profiles=["random-loss"],
                        algorithms=["reliable", "unbiased"], iters=iters, warmup=3,
                        unsealed=unsealed)
    return cb.run(cluster, spec, progress=lambda m: print(m, file=sys.stderr, flush=True))


def core_rate(mtu: int, count: int = 200_000) -> dict:
    datagram = mtu - hdr.IPV4_UDP_OVERHEAD
    seal_s, check_s = _blaster.mac_cost(os.urandom(16), datagram, count)
    per = (seal_s + check_s) / count
    return {"datagram_bytes": datagram, "seal_us": seal_s / count * 1e6,
            "check_us": check_s / count * 1e6,
            "seal_check_gbps_per_core": datagram * 8 / per / 1e9,
            "cores_at_100gbps": 100e9 / 8 / datagram * per}


def summarise(mtu, hosts, before, after, sealed_rows, unsealed_rows) -> list[dict]:
    def best(modes, sealed):
        return max(v["gbps"] for k, v in modes.items() if k.endswith(
            "sealed" if sealed else "plain"))

    wire_plain = max(best(before, False), best(after, False))
    wire_sealed = max(best(before, True), best(after, True))
    out = []
    for size in sorted({r["size_bytes"] for r in sealed_rows}):
        def row(rows, algorithm, loss, size=size):
            return next(r for r in rows if r["algorithm"] == algorithm and r["loss"] == loss
                        and r["size_bytes"] == size)

        s0, u0 = row(sealed_rows, "unbiased", 0.0), row(unsealed_rows, "unbiased", 0.0)
        s10, u10 = row(sealed_rows, "unbiased", 0.1), row(unsealed_rows, "unbiased", 0.1)
        g0, g10 = row(sealed_rows, "reliable", 0.0), row(sealed_rows, "reliable", 0.1)

        def goodput(r, size=size):
            return 2 * (hosts - 1) * size * 8 / (r["p50_ms"] / 1e3) / 1e9

        out.append({
            "mtu": mtu, "size_mib": size / MIB, "hosts": hosts,
            "wire_plain_gbps": wire_plain, "wire_sealed_gbps": wire_sealed,
            "unsealed_gbps": goodput(u0), "sealed_gbps": goodput(s0), "gloo_gbps": goodput(g0),
            "unsealed_of_plain_wire": goodput(u0) / wire_plain,
            "sealed_of_sealed_wire": goodput(s0) / wire_sealed,
            "unsealed_p50_vs_gloo_0": u0["p50_ms"] / g0["p50_ms"],
            "sealed_p50_vs_gloo_0": s0["p50_ms"] / g0["p50_ms"],
            "sealed_p99_vs_gloo_0": _ratio(s0["p99_ms"], g0["p99_ms"]),
            "sealed_max_vs_gloo_0": s0["max_ms"] / g0["max_ms"],
            "sealed_p50_vs_gloo_10": s10["p50_ms"] / g10["p50_ms"],
            "sealed_p99_vs_gloo_10": _ratio(s10["p99_ms"], g10["p99_ms"]),
            "unsealed_p50_vs_gloo_10": u10["p50_ms"] / g10["p50_ms"],
            "mac_price": s0["p50_ms"] / u0["p50_ms"],
            "blaster_mac_price": wire_plain / wire_sealed,
            "sealed_p99_10_vs_own_p50_0": _ratio(s10["p99_ms"], s0["p50_ms"]),
            # ... and the machine's own tail without loss: the bound on the line above
            "sealed_p99_0_vs_own_p50_0": _ratio(s0["p99_ms"], s0["p50_ms"]),
            # rank 0's stages that ended at their deadline at 10%: the loss's part in it
            "sealed_deadlines_hit_10": s10.get("deadlines_hit"),
            "missing_at_0_sealed": s0.get("missing_fraction"),
            "missing_at_0_unsealed": u0.get("missing_fraction"),
            "ms": {"unsealed_0": [u0["p50_ms"], u0["p99_ms"], u0["max_ms"]],
                   "sealed_0": [s0["p50_ms"], s0["p99_ms"], s0["max_ms"]],
                   "gloo_0": [g0["p50_ms"], g0["p99_ms"], g0["max_ms"]],
                   "sealed_10": [s10["p50_ms"], s10["p99_ms"], s10["max_ms"]],
                   "unsealed_10": [u10["p50_ms"], u10["p99_ms"], u10["max_ms"]],
                   "gloo_10": [g10["p50_ms"], g10["p99_ms"], g10["max_ms"]]},
        })
    return out


def _ratio(a, b):
    return a / b if a is not None and b else None


# The data plane's targets (#67): (the row's ratio, "min" or "max", the bound, its words)
TARGETS = (
    ("unsealed_of_plain_wire", "min", 0.8, "unsealed goodput / plain wire >= 0.8"),
    ("sealed_of_sealed_wire", "min", 0.8, "sealed goodput / sealed wire >= 0.8"),
    ("unsealed_p50_vs_gloo_0", "max", 0.8, "unsealed p50 / gloo p50 at 0% <= 0.8"),
    ("sealed_p50_vs_gloo_0", "max", 1.0, "sealed p50 / gloo p50 at 0% <= 1.0"),
    ("sealed_p99_10_vs_own_p50_0", "max", 1.5, "sealed p99 at 10% / its lossless p50 <= 1.5"),
)


def against_targets(rows) -> list[dict]:
    """Every cell's ratio against each target: met (True/False; None where the run gives no
    value, a p99 of too few iterations), and the ratio."""
    out = []
    for r in rows:
        for key, side, bound, words in TARGETS:
            value = r.get(key)
            met = None if value is None else (value >= bound if side == "min" else
                                              value <= bound)
            out.append({"hosts": r["hosts"], "mtu": r["mtu"], "size_mib": r["size_mib"],
                        "target": words, "value": value, "met": met})
    return out


def targets_table(checked: list[dict]) -> str:
    cells = sorted({(c["hosts"], c["mtu"], c["size_mib"]) for c in checked})
    names = [words for _, _, _, words in TARGETS]
    lines = ["the targets (#67), per cell: the ratio, and whether it meets the target",
             f"{'target':<46} " + " ".join(f"{f'{h}h {m} {z:g}M':>14}" for h, m, z in cells)]
    for words in names:
        row = []
        for cell in cells:
            c = next(x for x in checked if (x["hosts"], x["mtu"], x["size_mib"]) == cell
                     and x["target"] == words)
            mark = {True: "met", False: "MISSED", None: "n/a"}[c["met"]]
            row.append(f"{(format(c['value'], '.2f') if c['value'] is not None else '-')} "
                       f"{mark}".rjust(14))
        lines.append(f"{words:<46} " + " ".join(row))
    met = sum(1 for c in checked if c["met"])
    judged = sum(1 for c in checked if c["met"] is not None)
    lines.append(f"{met} of {judged} met ({len(checked) - judged} without a value)")
    return "\n".join(lines)


def table(rows, wires, cores) -> str:
    lines = []
    for mtu, (before, after) in wires.items():
        lines.append(f"MTU {mtu}: the wire, aggregate received Gbit/s (before / after the "
                     "collectives)")
        for mode in before:
            lines.append(f"  {mode:<16} {before[mode]['gbps']:6.2f} / {after[mode]['gbps']:6.2f}")
        c = cores[mtu]
        lines.append(f"  core: seal {c['seal_us']:.2f} us + check {c['check_us']:.2f} us per "
                     f"{c['datagram_bytes']}-byte datagram = {c['seal_check_gbps_per_core']:.1f} "
                     f"Gbit/s a core; 100 Gbit/s needs {c['cores_at_100gbps']:.1f} cores")
    head = (f"{'MTU':>5} {'MiB':>4} {'unseal/plain':>12} {'seal/sealed':>11} {'p50/gloo':>8} "
            f"{'p50/gloo s':>10} {'p99/gloo s':>10} {'@10% p50/g':>10} {'@10% p99/g':>10} "
            f"{'MAC price':>9} {'blaster':>7} {'p99@10/p50':>10} {'p99@0/p50':>9} "
            f"{'dl@10':>6}")
    lines += ["", head, "-" * len(head)]

    def f(v, fmt=".2f"):
        return format(v, fmt) if v is not None else "-"

    for r in rows:
        lines.append(
            f"{r['mtu']:>5} {r['size_mib']:>4.0f} {f(r['unsealed_of_plain_wire']):>12} "
            f"{f(r['sealed_of_sealed_wire']):>11} {f(r['unsealed_p50_vs_gloo_0']):>8} "
            f"{f(r['sealed_p50_vs_gloo_0']):>10} {f(r['sealed_p99_vs_gloo_0']):>10} "
            f"{f(r['sealed_p50_vs_gloo_10']):>10} {f(r['sealed_p99_vs_gloo_10']):>10} "
            f"{f(r['mac_price']):>9} {f(r['blaster_mac_price']):>7} "
            f"{f(r['sealed_p99_10_vs_own_p50_0']):>10} "
            f"{f(r['sealed_p99_0_vs_own_p50_0']):>9} "
            f"{cb.deadlines_cell(r['sealed_deadlines_hit_10']):>6}")
    lines.append("unseal/plain: unsealed unbiased's aggregate goodput at 0% / the best plain "
                 "blaster mode; seal/sealed: sealed / the best sealed mode; p50/gloo: "
                 "unsealed, 's': sealed; MAC price: sealed p50 / unsealed p50, beside the "
                 "blaster's best plain / best sealed; p99@10/p50: sealed p99 at 10% random "
                 "loss / its own lossless p50, p99@0/p50 the same without loss (the "
                 "machine's own tail); dl@10: rank 0's reduce/broadcast stages that ended "
                 "at their deadline at 10%, sealed")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mtu", type=int, nargs="+", default=[9000, 1500])
    parser.add_argument("--sizes", type=float, nargs="+", default=[4, 16])
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 2])
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    rows, wires, cores = [], {}, {}
    for hosts in args.hosts:
        for mtu in args.mtu:
            name = f"bw{os.getpid() % 100000}"
            cluster = netns_cluster.up(netns_cluster.ClusterSpec(hosts=hosts, name=name,
                                                                 mtu=mtu))
            try:
                print(f"{hosts} hosts, MTU {mtu}: blasters", file=sys.stderr, flush=True)
                before = blasters(cluster, args.seconds)
                sealed = collectives(cluster, args.sizes, args.iters, unsealed=False)
                unsealed = collectives(cluster, args.sizes, args.iters, unsealed=True)
                after = blasters(cluster, args.seconds)
            finally:
                clusters.down(name)
            wires[(hosts, mtu)] = (before, after)
            cores[mtu] = core_rate(mtu)
            rows += summarise(mtu, hosts, before, after, sealed, unsealed)
    for hosts in args.hosts:
        print(f"{hosts} hosts")
        print(table([r for r in rows if r["hosts"] == hosts],
                    {mtu: w for (h, mtu), w in wires.items() if h == hosts}, cores))
        print()
    checked = against_targets(rows)
    print(targets_table(checked))
    result = {"rows": rows, "targets": checked,
              "wire": {f"{h} hosts, MTU {m}": v for (h, m), v in wires.items()},
              "core": {str(k): v for k, v in cores.items()}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
