"""What authenticating every datagram costs (harness/transport/auth.py): per packet, and in
the lossy all-reduce, with and without the job key in the same run.

Four ranks as processes on loopback (127.0.0.1 only), MTU 1500, meeting in a TCPStore. Each
rank holds two transports, one sealing with a key and one not, and the two take turns of
TURN_ITERS all-reduces so that the machine's slow spells fall on both. Loss: none, then 10%
from the seeded drop mask at the receivers (the kernel's loss needs namespaces; the mask
loses the same datagrams in both). Prints p50 and p99 per setting and their ratios.

    .venv/bin/python -m tests.benchmarks.bench_auth [--floats 1048576] [--iters 60]
    .venv/bin/python -m tests.benchmarks.bench_auth --primitives   # the MACs auth.py chose among
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from datetime import timedelta

import numpy as np

PORT = 29731
WORLD = 4
TURN_ITERS = 10


def per_packet_cost(repeats: int = 4000, mtu: int = 1500) -> dict:
    """Microseconds to seal and to check one full packet at this MTU, one datagram per call
    from Python (the datagram-at-a-time path: UC/RC, the drop mask); the batched path
    seals and checks inside the compiled core (tests/benchmarks/bench_wire.py prices it)."""
    from harness.transport import header as hdr
    from harness.transport.auth import PacketAuth

    key = os.urandom(32)
    a = PacketAuth(key, 1, "bench")
    receiver = PacketAuth(key, 0, "bench")
    receiver.know_peers(["", a.salt.hex()])
    payload = os.urandom(4 * hdr.payload_floats(mtu))
    head = hdr.pack(hdr.STAGE_REDUCE, 1, 7, 0, 0, 0, 0, 1, len(payload))
    t0 = time.perf_counter()
    for _ in range(repeats):
        sealed = a.seal(head, payload)
    seal_us = (time.perf_counter() - t0) / repeats * 1e6
    datagram = sealed + payload
    t0 = time.perf_counter()
    for _ in range(repeats):
        assert receiver.check(datagram, len(datagram))
    check_us = (time.perf_counter() - t0) / repeats * 1e6
    return {"seal_us": seal_us, "check_us": check_us, "packet_bytes": len(datagram)}


def primitive_costs(repeats: int = 20000, packet: int = 1444) -> dict:
    """Microseconds per packet of the MAC primitives auth.py chose among (its docstring
    quotes these), each one call per packet from Python on a 1444-byte packet (a full
    datagram at MTU 1500): AES-128-GCM with nothing to encrypt (GMAC, the one chosen),
    ChaCha20-Poly1305 likewise, keyed BLAKE2b, HMAC-SHA256."""
    import hashlib
    import hmac

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

    data, nonce = os.urandom(packet), os.urandom(12)
    aes, chacha = AESGCM(os.urandom(16)), ChaCha20Poly1305(os.urandom(32))
    blake_key, hmac_key = os.urandom(32), os.urandom(32)
    candidates = {
        "AES-GCM": lambda: aes.encrypt(nonce, b"", data),
        "ChaCha20-Poly1305": lambda: chacha.encrypt(nonce, b"", data),
        "keyed BLAKE2b": lambda: hashlib.blake2b(data, key=blake_key, digest_size=16).digest(),
        "HMAC-SHA256": lambda: hmac.new(hmac_key, data, hashlib.sha256).digest(),
    }
    costs = {}
    for name, mac in candidates.items():
        best = float("inf")
        for _ in range(3):  # the best of three: the machine's slow spells are not the MAC's
            t0 = time.perf_counter()
            for _ in range(repeats // 3):
                mac()
            best = min(best, (time.perf_counter() - t0) / (repeats // 3) * 1e6)
        costs[name] = best
    return costs


def rank_main(rank: int, floats: int, iters: int, loss: float, out) -> None:
    import torch
    import torch.distributed as dist

    from harness.collectives.lossy import LossyCollective
    from harness.runtime import keep_startup_out_of_collector
    from harness.transport.dropmask import DropMask
    from harness.transport.udp import UdpTransport

    store = dist.TCPStore("127.0.0.1", PORT, WORLD, is_master=rank == 0,
                          timeout=timedelta(seconds=60))
    key = bytes(32)  # the same for every rank: what a launch hands them
    setups = {}
    for name, k in (("no key", None), ("key", key)):
        mask = DropMask(11, loss) if loss else None
        t = UdpTransport(rank, WORLD, "127.0.0.1", store, key=k, drop_mask=mask,
                         key_prefix=f"bench/{name}")
        setups[name] = (t, LossyCollective(t, store, key_prefix=f"bench/c/{name}",
                                           align_every=1), [])
    keep_startup_out_of_collector()  # as a rank starts (see there): no full collection's
    # stop, falling wherever start-up's leftovers put it, in either setting's tail
    x = torch.from_numpy(np.random.default_rng(rank).standard_normal(floats).astype(
        np.float32))
    for _ in range(iters // TURN_ITERS):
        for _name, (_t, c, times) in setups.items():
            for _ in range(TURN_ITERS):
                t0 = time.perf_counter()
                c.allreduce(x.clone())
                times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put({name: sorted(times) for name, (_t, _c, times) in setups.items()})
    for t, _c, _times in setups.values():
        t.close()


def one_setting(floats: int, iters: int, loss: float) -> dict:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, floats, iters, loss, out))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    result = out.get(timeout=600)
    for p in procs:
        p.join(60)
    return result


def pct(times: list[float], q: float) -> float:
    return 1000 * times[min(len(times) - 1, int(q * len(times)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floats", type=int, default=1 << 20)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--primitives", action="store_true",
                        help="only the MAC primitives' cost per packet (a few seconds)")
    args = parser.parse_args()
    primitives = primitive_costs()
    print("MAC primitives per 1444-byte packet: " + ", ".join(
        f"{name} {us:.2f} µs" for name, us in primitives.items()))
    if args.primitives:
        return
    cost = per_packet_cost()
    for c in (cost, per_packet_cost(mtu=9000)):
        print(f"per packet ({c['packet_bytes']} B): seal {c['seal_us']:.2f} µs, "
              f"check {c['check_us']:.2f} µs")
    rows = []
    for loss in (0.0, 0.1):
        times = one_setting(args.floats, args.iters, loss)
        base, keyed = times["no key"], times["key"]
        row = {"loss": loss, "floats": args.floats, "iters": len(base),
               "p50_ms": {"no key": pct(base, 0.5), "key": pct(keyed, 0.5)},
               "p99_ms": {"no key": pct(base, 0.99), "key": pct(keyed, 0.99)}}
        row["p50_ratio"] = row["p50_ms"]["key"] / row["p50_ms"]["no key"]
        row["p99_ratio"] = row["p99_ms"]["key"] / row["p99_ms"]["no key"]
        rows.append(row)
        print(f"loss {loss:.0%}, {4 * args.floats >> 20} MiB all-reduce, {WORLD} ranks, "
              f"{len(base)} iterations each: p50 {row['p50_ms']['no key']:.1f} -> "
              f"{row['p50_ms']['key']:.1f} ms (x{row['p50_ratio']:.2f}), p99 "
              f"{row['p99_ms']['no key']:.1f} -> {row['p99_ms']['key']:.1f} ms "
              f"(x{row['p99_ratio']:.2f})", flush=True)
    print(json.dumps({"primitives_us": primitives, "per_packet": cost, "rows": rows}))


if __name__ == "__main__":
    main()
