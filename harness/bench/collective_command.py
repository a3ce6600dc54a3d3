"""`lossbed collective-bench`: its options and the command (parse, call
harness/bench/collective_bench.py, print its table and nccl-tests' table)."""

from __future__ import annotations

import json
import os
import sys

from harness import launch, options
from testbed import checks, clusters
from testbed.cli import add_min_coverage
from testbed.clusters import netns as netns_cluster
from testbed.errors import NotAResult, UsageError

DEFAULT_SIZES_MIB = [1, 4, 16, 64]


def sizes_mib(args) -> list[float]:
    """The sizes asked for, in MiB: --sizes, or nccl-tests' -b/-e/-f (not both)."""
    from harness.bench import nccl_units

    nccl = (args.minbytes, args.maxbytes, args.stepfactor)
    if args.sizes is not None and any(v is not None for v in nccl):
        raise UsageError("--sizes", "given with -b/-e/-f", "Give the sizes one way: --sizes "
                         "in MiB, or --minbytes/--maxbytes/--stepfactor as nccl-tests takes "
                         "them")
    if all(v is None for v in nccl):
        return args.sizes if args.sizes is not None else list(DEFAULT_SIZES_MIB)
    least = nccl_units.size_bytes("--minbytes", args.minbytes or args.maxbytes)
    most = nccl_units.size_bytes("--maxbytes", args.maxbytes or args.minbytes)
    factor = 2.0 if args.stepfactor is None else args.stepfactor
    return [b / (1 << 20) for b in nccl_units.sizes(least, most, factor)]


def command(args) -> int:
    checks.loss_fraction("--loss", *args.loss)  # (before torch is imported)
    checks.at_least(args, ("iters", 1), ("mtu", 68))
    if args.cluster is None and args.hosts < 2:
        raise UsageError("--hosts", f"{args.hosts} host cannot run a collective",
                         "Use --hosts 2 or more (4 by default)")
    sizes = sizes_mib(args)
    # (a cluster that is not up is named before torch loads)
    cluster = clusters.load(args.cluster) if args.cluster is not None else None
    from harness.bench import collective_bench as cb
    from harness.bench import nccl_units

    spec = cb.BenchSpec(sizes_mib=sizes, losses=args.loss, profiles=args.profiles,
                        algorithms=args.algorithms, iters=args.iters, unsealed=args.unsealed,
                        align_every=args.align_every)
    launch.check_environment()  # (the spec's values were checked as it was made)
    own = None
    if cluster is None:
        own = f"cb{os.getpid() % 100000}"
        cluster = netns_cluster.up(netns_cluster.ClusterSpec(hosts=args.hosts, name=own,
                                                             mtu=args.mtu))
    try:
        rows = cb.run(cluster, spec, progress=lambda m: print(m, file=sys.stderr, flush=True),
                      min_coverage=args.min_coverage)
    finally:
        if own:
            clusters.down(own)
    print(cb.format_table(rows))
    print()
    print(nccl_units.table(rows))
    if args.json:
        with open(args.json, "w") as f:
            for row in rows:
                f.write(json.dumps({**row, "nccl": nccl_units.nccl_row(row)}) + "\n")
        print(f"wrote {len(rows)} rows to {args.json}")
    if any(r.get("invalid") for r in rows):
        raise NotAResult("rows under an impairment their traffic did not meet are no "
                         "result (marked ! above)")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("collective-bench",
                       help="lossy all-reduce, RPS and gloo side by side under loss")
    p.add_argument("--cluster", help="use this cluster (default: build a local one)")
    p.add_argument("--hosts", type=int, default=4, help="hosts of the local cluster")
    p.add_argument("--mtu", type=int, default=9000,
                   help="MTU of the local cluster (jumbo frames, where a data plane is judged "
                        "against the wire; bench trains at 1500)")
    p.add_argument("--sizes", type=float, nargs="+", default=None, metavar="MIB",
                   help="tensor sizes in MiB (default: "
                        f"{' '.join(map(str, DEFAULT_SIZES_MIB))}; or -b/-e/-f)")
    p.add_argument("-b", "--minbytes", metavar="SIZE",
                   help="the least size, as nccl-tests takes it (bytes, or with K, M, G: "
                        "powers of 1024); sizes grow from it by --stepfactor to --maxbytes")
    p.add_argument("-e", "--maxbytes", metavar="SIZE", help="the largest size (nccl-tests' -e)")
    p.add_argument("-f", "--stepfactor", type=float, metavar="F",
                   help="each size the last times F (nccl-tests' -f; default 2)")
    p.add_argument("--loss", type=checks.loss_text, nargs="+", default=[0, 0.01, 0.1],
                   help="loss rates as fractions (0.1 = 10%%)")
    p.add_argument("--profiles", nargs="+", default=["random-loss", "burst-loss"],
                   type=checks.user_name_or_path,
                   help="profiles whose one loss rate --loss sets")
    p.add_argument("--algorithms", nargs="+",
                   default=["reliable", "zero_fill", "unbiased", "rescale", "rps"],
                   help="reliable (gloo's all-reduce), zero_fill, unbiased (received mean), "
                        "rescale (1/(1-p)), rps; each optionally @TRANSPORT")
    p.add_argument("--iters", type=int, default=10, help="timed all-reduces per size")
    p.add_argument("--align-every", type=int, default=0, metavar="N",
                   help="the lossy collectives' ranks meet in the store every N-th step "
                        "before it starts (default 0: at the first only, as training does; "
                        "1: every step, two store round trips on each step's time)")
    p.add_argument("--json", metavar="FILE", type=checks.user_path,
                   help="also write one JSON object per line")
    add_min_coverage(p)
    options.add_unsealed(p)
    p.set_defaults(func=command)
