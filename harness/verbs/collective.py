"""The lossy all-reduce over real RDMA queue pairs, torch-free: lossbed's LossyCollective
(harness/collectives/lossy.py) over the verbs transport (transport.py), one rank per host.

    python -m harness.verbs.collective --rank 0 --world 2 --address 10.201.0.1 \\
        --store 10.201.0.1 --transport verbs-uc:8192
    python -m harness.verbs.collective --rank 1 --world 2 --address 10.201.0.2 \\
        --store 10.201.0.1 --transport verbs-uc:8192

The same collective as `lossbed train --transport verbs-*`, without torch (it takes a minute
to import on a VM host under TCG): the rendezvous store is rendezvous.py's, hosted by rank 0
on lossbed's control port, which profiles keep unimpaired.

Every rank makes every rank's contribution from the seed, so each checks its own result and
prints a JSON report: `exact` (the mean, to float32 rounding) and `consistent`: every
message's values are ones the received-mean estimator may give for some set of arrivals
(for its own shard: the mean over itself and any subset of the others; for another owner's
shard: that, or its own contribution where the broadcast was lost). Nothing partial is ever
used, so a message is all of one kind.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from datetime import timedelta

import numpy as np

from harness import barrier
from harness.collectives.deadline import Deadline
from harness.collectives.layout import Layout
from harness.collectives.lossy import LossyCollective
from harness.rank_protocol import RankEnv
from harness.transport import auth
from harness.transport.dropmask import parse_drop_mask
from harness.transport.semantics import Semantics
from harness.verbs.rendezvous import Store
from harness.verbs.transfer import CONTROL_PORT
from harness.verbs.transport import VerbsTransport

TOLERANCE = 1e-6  # float32 sums in arrival order differ from numpy's in the last bits


def contributions(seed: int, step: int, world: int, numel: int) -> np.ndarray:
    """Every rank's contribution at `step`, one row per rank."""
    rng = np.random.default_rng([seed, step])
    return rng.standard_normal((world, numel), dtype=np.float32)


def allowed_values(x: np.ndarray, owner: int, rank: int, first: int, last: int) -> list:
    """What the received-mean estimator may leave in x[:, first:last] on `rank`, for a
    message of `owner`'s shard."""
    others = [k for k in range(len(x)) if k != owner]
    means = [x[[owner, *subset], first:last].mean(axis=0)
             for size in range(len(others) + 1)
             for subset in itertools.combinations(others, size)]
    return means if rank == owner else [*means, x[rank, first:last]]


def consistent(result: np.ndarray, x: np.ndarray, layout: Layout, rank: int) -> bool:
    for owner in range(layout.world):
        starts, ends = layout.packet_arrays(owner)
        for first, last in zip(starts.tolist(), ends.tolist(), strict=True):
            got = result[first:last]
            if not any(np.allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE)
                       for want in allowed_values(x, owner, rank, first, last)):
                return False
    return True


def run(args) -> dict:
    semantics = Semantics.parse(args.transport)
    if not semantics.verbs:
        raise SystemExit(f"--transport {args.transport}: give verbs-ud, verbs-uc[:BYTES] or "
                         "verbs-rc[:BYTES] (the emulated semantics run under lossbed train)")
    host, _, port = args.store.partition(":")
    store = Store(host, int(port or CONTROL_PORT), is_master=args.rank == 0,
                  timeout=timedelta(seconds=args.first_timeout_s))
    transport = VerbsTransport(args.rank, args.world, args.address, store, semantics,
                               device=args.device or RankEnv.from_env().rdma_device,
                               drop_mask=parse_drop_mask(args.drop_mask),
                               receives_per_peer=args.receives_per_peer,
                               key=args.key)
    collective = LossyCollective(transport, store, estimator="received_mean",
                                 deadline=Deadline(ceiling_s=args.ceiling_s))
    layout = Layout(args.numel, args.world, transport.per_packet)  # the collective's cut
    steps, started = [], time.monotonic()
    try:
        for step in range(args.steps):
            x = contributions(args.seed, step, args.world, args.numel)
            result = x[args.rank].copy()
            stats = collective.allreduce(result)
            steps.append({
                "seconds": stats.seconds,
                "reduce_messages": stats.reduce_expected, "reduce_lost": stats.reduce_missing,
                "broadcast_messages": stats.broadcast_expected,
                "broadcast_lost": stats.broadcast_missing,
                "exact": bool(np.allclose(result, x.mean(axis=0), rtol=TOLERANCE,
                                          atol=TOLERANCE)),
                "consistent": consistent(result, x, layout, args.rank)})
        seconds = time.monotonic() - started
        # Leave together: rank 0 hosts the store, and an RC peer may still wait for our
        # acknowledgements (a queue pair answers only while it exists).
        barrier.wait_for_all(store, "done", args.world, timeout_s=600)
        report = {"rank": args.rank, "world": args.world, "transport": str(semantics),
                  "message_bytes": transport.message_bytes, "numel": args.numel,
                  "seconds": seconds, "steps": steps,
                  "counters": transport.counters.to_dict(),
                  "authenticated": transport.authenticated,
                  "device_counters": transport.device_counters()}
        if args.rank == 0:  # the store's host leaves last
            barrier.wait_for_all(store, "left", args.world, timeout_s=60, must=False)
        else:
            store.add("left", 1)
        return report
    finally:
        transport.close()
        store.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.verbs.collective")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--address", required=True, help="this host's RoCE (IPv4) address")
    parser.add_argument("--store", required=True,
                        help=f"rank 0's address[:port] (default port {CONTROL_PORT})")
    parser.add_argument("--transport", default="verbs-uc",
                        help="verbs-ud, verbs-uc[:BYTES] or verbs-rc[:BYTES]")
    parser.add_argument("--numel", type=int, default=20_000, help="float32 values")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="the RDMA device (default: the first)")
    parser.add_argument("--drop-mask", default=None,
                        help="SEED:RATE: also drop messages at the receiver, replayably")
    parser.add_argument("--receives-per-peer", type=int, default=None,
                        help="receive buffers posted per peer (default: 32 MiB of messages)")
    parser.add_argument("--ceiling-s", type=float, default=5.0,
                        help="the longest a stage waits for what was lost")
    parser.add_argument("--first-timeout-s", type=float, default=120.0)
    parser.add_argument("--key", default=None,
                        help="the job key, 64 hex digits (harness.transport.auth): every "
                             "message sealed and checked with it (default: none)")
    args = parser.parse_args(argv)
    if not 0 <= args.rank < args.world:
        parser.error(f"--rank {args.rank}: must be in [0, --world {args.world})")
    if args.numel < 1 or args.steps < 1:
        parser.error("--numel and --steps must be 1 or more")
    if args.key is not None:
        try:
            args.key = auth.parse_key(args.key)
        except ValueError:
            parser.error("--key: give 64 hex digits (32 bytes), the same on every rank")
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
