"""Test traffic: numbered UDP datagrams between hosts, counted at the receivers.

Used to check an impairment end to end (tests, benchmarks): the receiver's own count of what
arrived, per path, independent of the kernel counters it is compared with. Sockets are made
inside each host's namespace by this one process, so no helper processes are needed.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

HEADER = struct.Struct("!HHI")  # sender index, receiver index, sequence number
SO_RCVBUFFORCE = 33
RECEIVE_BUFFER_BYTES = 64 << 20


@dataclass
class PathCount:
    sent: int
    received: bytearray  # 1 where sequence number i arrived

    @property
    def arrived(self) -> int:
        return sum(self.received)

    @property
    def lost(self) -> int:
        return self.sent - self.arrived

    def loss_runs(self) -> list[int]:
        """Lengths of the runs of consecutive missing sequence numbers."""
        runs, run = [], 0
        for got in self.received[: self.sent]:
            if got:
                if run:
                    runs.append(run)
                run = 0
            else:
                run += 1
        if run:
            runs.append(run)
        return runs


@dataclass
class MeshResult:
    paths: dict[str, PathCount] = field(default_factory=dict)  # "h2->h1"
    seconds: float = 0.0
    duplicates: int = 0
    foreign: int = 0

    @property
    def sent(self) -> int:
        return sum(p.sent for p in self.paths.values())

    @property
    def lost(self) -> int:
        return sum(p.lost for p in self.paths.values())


def send_counted(pairs, per_path: int, port: int = 5000, payload_bytes: int = 1000,
                 batch: int = 64, pause_s: float = 0.0005, settle_s: float = 0.3) -> MeshResult:
    """Send `per_path` datagrams on every (src_host, dst_host) pair, interleaved, and count
    what each receiver gets. `batch` datagrams per path go out between receive drains, with
    `pause_s` between batches, so the receivers keep up (check RcvbufErrors to be sure)."""
    hosts = {h.name: h for pair in pairs for h in pair}
    index = {name: i for i, name in enumerate(sorted(hosts))}
    rx = {}
    try:
        for name in {dst.name for _, dst in pairs}:
            h = hosts[name]
            sock = h.socket()
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER_BYTES)
            sock.bind((h.address, port))
            sock.setblocking(False)
            rx[name] = sock
        tx = {name: hosts[name].socket() for name in {src.name for src, _ in pairs}}
        result = MeshResult()
        for src, dst in pairs:
            result.paths[f"{src.name}->{dst.name}"] = PathCount(per_path, bytearray(per_path))
        by_index = {(index[s.name], index[d.name]): result.paths[f"{s.name}->{d.name}"]
                    for s, d in pairs}
        filler = b"\0" * max(payload_bytes - HEADER.size, 0)
        started = time.monotonic()
        for first in range(0, per_path, batch):
            for seq in range(first, min(first + batch, per_path)):
                for src, dst in pairs:
                    tx[src.name].sendto(HEADER.pack(index[src.name], index[dst.name], seq)
                                        + filler, (dst.address, port))
            _drain(rx.values(), by_index, result)
            if pause_s:
                time.sleep(pause_s)
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            if _drain(rx.values(), by_index, result):
                deadline = time.monotonic() + settle_s
            else:
                time.sleep(0.01)
        result.seconds = time.monotonic() - started
        return result
    finally:
        for sock in [*rx.values(), *locals().get("tx", {}).values()]:
            sock.close()


def _drain(sockets, by_index, result: MeshResult) -> int:
    got = 0
    for sock in sockets:
        while True:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                break
            got += 1
            if len(data) < HEADER.size:
                result.foreign += 1
                continue
            src, dst, seq = HEADER.unpack_from(data)
            path = by_index.get((src, dst))
            if path is None or seq >= path.sent:
                result.foreign += 1
            elif path.received[seq]:
                result.duplicates += 1
            else:
                path.received[seq] = 1
    return got


# ---- the same traffic between two processes (hosts that are VMs or remote machines) -------


def send(to: str, port: int, count: int, rate_pps: float, payload_bytes: int = 1000) -> float:
    """Send `count` numbered datagrams to (to, port) at about rate_pps; returns seconds."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    filler = b"\0" * max(payload_bytes - HEADER.size, 0)
    started = time.monotonic()
    for seq in range(count):
        due = started + seq / rate_pps
        wait = due - time.monotonic()
        if wait > 0.0005:
            time.sleep(wait)
        sock.sendto(HEADER.pack(0, 0, seq) + filler, (to, port))
    sock.close()
    return time.monotonic() - started


def receive(bind: str, port: int, count: int, idle_s: float, first_timeout_s: float) -> PathCount:
    """Count numbered datagrams until none came for idle_s (after the first one)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER_BYTES)
    sock.bind((bind, port))
    path = PathCount(count, bytearray(count))
    sock.settimeout(first_timeout_s)
    try:
        while True:
            data = sock.recv(65536)
            sock.settimeout(idle_s)
            if len(data) >= HEADER.size:
                seq = HEADER.unpack_from(data)[2]
                if seq < count:
                    path.received[seq] = 1
    except TimeoutError:
        pass
    finally:
        sock.close()
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(prog="python -m testbed.impair.traffic",
                                     description="numbered UDP datagrams, counted")
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("send")
    s.add_argument("--to", required=True)
    s.add_argument("--port", type=int, default=5000)
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--rate-pps", type=float, default=5000)
    s.add_argument("--size", type=int, default=1000, help="payload bytes")
    r = sub.add_parser("recv")
    r.add_argument("--bind", default="0.0.0.0")
    r.add_argument("--port", type=int, default=5000)
    r.add_argument("--count", type=int, required=True)
    r.add_argument("--idle-s", type=float, default=2.0)
    r.add_argument("--first-timeout-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.mode == "send":
        seconds = send(args.to, args.port, args.count, args.rate_pps, args.size)
        print(json.dumps({"sent": args.count, "seconds": seconds}))
        return 0
    path = receive(args.bind, args.port, args.count, args.idle_s, args.first_timeout_s)
    runs = path.loss_runs()
    print(json.dumps({"sent": path.sent, "received": path.arrived, "lost": path.lost,
                      "bursts": len(runs), "max_burst": max(runs, default=0),
                      "mean_burst": sum(runs) / len(runs) if runs else None}))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
