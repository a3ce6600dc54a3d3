"""The compiled core's apply (checks, finite test, sum into the shard) against one numpy add
of the same payloads, in one run: what the core's per-packet work costs above the
memory's own rate.

    .venv/bin/python -m tests.benchmarks.bench_apply [--mtu 9000] [--packets 256]

One batch as a receiver's reduce stage sees it at 0% loss (4 ranks, this rank's shard from
the 3 others, full-size packets in the receive buffer's rows; the baseline adds all of them into one
array in one call). Prints µs per packet and
GB/s of payload for both, their ratio, and one JSON line. Best of 7 rounds of 50 calls.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from harness.collectives.layout import Layout
from harness.collectives.step import Step
from harness.transport import header as hdr
from harness.transport import native

WORLD, RANK, STEP, BUCKET = 4, 0, 3, 1
UDP_IP_BYTES = 28


def batch(mtu: int, packets: int):
    """A step's state and a receive buffer of `packets` reduce packets for it."""
    per_packet = (mtu - UDP_IP_BYTES - hdr.HEADER_BYTES) // 4
    own = -(-packets // (WORLD - 1))  # packets each source sends us
    layout = Layout(own * per_packet * WORLD, WORLD, per_packet)
    rng = np.random.default_rng(0)
    numel = layout.numel
    start, end = layout.shard_bounds(RANK)
    state = Step(layout, STEP, BUCKET, RANK, rng.standard_normal(numel).astype(np.float32),
                  rng.standard_normal(numel).astype(np.float32),
                  np.empty(end - start, np.float32))
    slot = max(mtu, 2048)
    data = np.zeros((packets, slot), np.uint8)
    count = layout.packets(RANK)
    for row in range(packets):
        source, index = 1 + row // count, row % count
        a, b = layout.packet_bounds(RANK, index)
        values = rng.standard_normal(b - a).astype(np.float32)
        datagram = hdr.pack(hdr.STAGE_REDUCE, source, 9, STEP, BUCKET, RANK, index, count,
                            4 * len(values)) + values.tobytes()
        data[row, :len(datagram)] = np.frombuffer(datagram, np.uint8)
    return state, data, slot


def best_of(rounds: int, calls: int, once) -> float:
    """Seconds per call, the best round's."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            once()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--packets", type=int, default=256)
    args = parser.parse_args()
    state, data, slot = batch(args.mtu, args.packets)
    stage = state.stages[hdr.STAGE_REDUCE]
    rows = np.arange(args.packets, dtype=np.int64)
    leftover = np.empty(args.packets, np.int64)
    got, pending = stage.got.copy(), stage.pending.copy()
    applied = []

    def core():
        stage.got[...] = got  # every call applies the whole batch afresh
        stage.pending[...] = pending
        applied.append(native.apply(
            data, rows, step=STEP, bucket=BUCKET, stage=hdr.STAGE_REDUCE, owner=RANK,
            expected=stage.expected, last_floats=stage.last_floats, base=stage.base,
            per_packet=stage.per_packet, target=stage.target, got=stage.got,
            pending=stage.pending, ended=None, add=True, accept=True,
            leftover=leftover).applied)

    # the baseline: one numpy add of the whole batch's payloads (the receive buffer's rows)
    # into a target of the same size, no checks, no per-packet calls: the memory's rate
    values = data[:, hdr.HEADER_BYTES:hdr.HEADER_BYTES + 4 * stage.per_packet].view(np.float32)
    sums = np.zeros(values.shape, np.float32)

    def memory():
        np.add(sums, values, out=sums)

    core_s = best_of(7, 50, core) / args.packets
    assert set(applied) == {args.packets}, applied  # every packet applied in every call
    numpy_s = best_of(7, 50, memory) / args.packets
    payload = 4 * stage.per_packet
    print(f"apply, {args.packets} packets of {payload} B (MTU {args.mtu}): core "
          f"{core_s * 1e6:.2f} µs/packet ({payload / core_s / 1e9:.2f} GB/s), numpy add "
          f"{numpy_s * 1e6:.2f} µs/packet ({payload / numpy_s / 1e9:.2f} GB/s); "
          f"core / numpy {core_s / numpy_s:.2f}")
    print(json.dumps({"mtu": args.mtu, "packets": args.packets, "core_us": core_s * 1e6,
                      "numpy_add_us": numpy_s * 1e6, "core_over_numpy": core_s / numpy_s}))


if __name__ == "__main__":
    main()
