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
