"""The lossy all-reduce between two ranks over one real RDMA queue pair (UD, UC or RC).

    python3 -m harness.verbs.collective --rank 0 --qp uc --address 10.201.0.1 --peer 10.201.0.2
    python3 -m harness.verbs.collective --rank 1 --qp uc --address 10.201.0.2 --peer 10.201.0.1

The same two stages as harness/collectives/lossy.py, with the loss semantics of the queue
pair (here Soft-RoCE's): rank r owns half r of the tensor. Reduce: each rank sends the other
owner its contribution to that half, in messages; the owner averages, per message, the
contributions that arrived (its own always counts: the received-mean estimator). Broadcast:
each owner sends its averaged half back; a rank that misses a message keeps its own values
there (gradient mode). A message lost on UC is lost whole, on UD it is one packet, on RC it is
retransmitted until it arrives.

Nothing waits for what was lost: after its sends complete, a rank says so on the control
connection (TCP on lossbed's control port, unimpaired by default), and the receiver stops
after a short grace for messages still in flight. Both ranks make both contributions from the
seed, so each can check its result against the exact mean and, under loss, that every value
is one the estimator may give. Torch-free and numpy-free (the VMs' system Python has pyverbs
and nothing else; torch imports for a minute under TCG).
"""

from __future__ import annotations

import argparse
import json
import random
import select
import socket
import struct
import sys
import time
from array import array

from harness.verbs.transfer import CONTROL_PORT, QKEY, UD_GRH_BYTES, Endpoint, _control_server

MESSAGE_HEAD = struct.Struct("<II")  # stage, message index
REDUCE, BROADCAST = 0, 1
SEND_IDS = 1 << 20  # work request ids of sends start here (receives count from 0)


class Control:
    """JSON lines over the control connection, read without blocking the completion loop."""

    def __init__(self, conn: socket.socket):
        self.conn, self.buffer, self.closed = conn, b"", False

    def send(self, obj) -> None:
        self.conn.sendall((json.dumps(obj) + "\n").encode())

    def receive(self, timeout_s: float | None = None) -> list:
        """The lines that are complete now (waiting up to timeout_s for one); [] if none."""
        if b"\n" not in self.buffer and not self.closed:
            readable, _, _ = select.select([self.conn], [], [], timeout_s)
            if readable:
                try:
                    chunk = self.conn.recv(65536)
                except ConnectionResetError:
                    chunk = b""  # the peer finished and left: nothing more will come
                self.closed = not chunk  # the peer finished: it sends nothing more
                self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines]

    def close(self, timeout_s: float = 10.0) -> None:
        """Leave in order: say we send nothing more, read until the peer says the same
        (closing with its lines unread would reset the connection under it), then close."""
        self.conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + timeout_s
        while not self.closed and time.monotonic() < deadline:
            self.receive(0.1)
        self.conn.close()

    def expect(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            lines = self.receive(0.1)
            if lines:
                if len(lines) > 1:  # keep the rest for later
                    self.buffer = b"".join(json.dumps(x).encode() + b"\n"
                                           for x in lines[1:]) + self.buffer
                return lines[0]
            if self.closed:
                break
        raise SystemExit(f"the peer said nothing on the control connection in {timeout_s} s "
                         "(or closed it)")


def contribution(seed: int, rank: int, numel: int) -> array:
    rng = random.Random(seed * 2 + rank)
    return array("f", [rng.gauss(0.0, 1.0) for _ in range(numel)])


def mean_of(a: array, b: array) -> array:
    """The element-wise mean of two contributions, rounded to float32."""
    return array("f", [(x + y) / 2 for x, y in zip(a, b, strict=True)])


def halves(numel: int) -> list[tuple[int, int]]:
    middle = numel // 2
    return [(0, middle), (middle, numel)]


def messages(start: int, end: int, per_message: int) -> list[tuple[int, int]]:
    return [(first, min(first + per_message, end)) for first in range(start, end, per_message)]


class Run:
    def __init__(self, args):
        self.args = args
        self.per_message = (args.message_bytes - MESSAGE_HEAD.size) // 4
        self.x = [contribution(args.seed, r, args.numel) for r in (0, 1)]
        self.own, self.peer = args.rank, 1 - args.rank
        self.slices = {r: messages(*halves(args.numel)[r], self.per_message) for r in (0, 1)}
        expected = len(self.slices[self.own]) + len(self.slices[self.peer])
        self.ep = Endpoint(args.device, args.qp, args.address, depth=expected + 16)
        v, e = self.ep.v, self.ep.v.e
        self.grh = UD_GRH_BYTES if args.qp == "ud" else 0
        self.slot = args.message_bytes + self.grh
        self.recv_mr = v.MR(self.ep.pd, self.slot * expected,
                            e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
        for i in range(expected):  # posted before the peer can know our queue pair
            sge = v.SGE(self.recv_mr.buf + i * self.slot, self.slot, self.recv_mr.lkey)
            self.ep.qp.post_recv(v.RecvWR(wr_id=i, num_sge=1, sg=[sge]))
        self.arrived: dict[tuple[int, int], array] = {}
        self.arrived_per_stage = {REDUCE: 0, BROADCAST: 0}
        self.error_completions = 0
        self.peer_done: set[int] = set()

    # ---- control connection (reliable) ---------------------------------------------------

    def connect(self) -> None:
        args = self.args
        if args.rank == 0:
            server = _control_server(args.control_port)
            server.settimeout(args.first_timeout_s)
            self.conn, _ = server.accept()
            server.close()
        else:
            deadline = time.monotonic() + args.first_timeout_s
            while True:  # rank 0 may still be starting (Python is slow in a VM)
                try:
                    self.conn = socket.create_connection((args.peer, args.control_port), 10)
                    break
                except ConnectionRefusedError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        self.control = Control(self.conn)
        self.control.send(self.ep.info())
        remote = self.control.expect(args.first_timeout_s)
        self.ep.connect(remote)
        self.ah = self.ep.address_handle(remote) if self.args.qp == "ud" else None
        self.remote_qpn = remote["qpn"]
        self.control.send({"ready": True})  # both queue pairs can send: go
        self.control.expect(args.first_timeout_s)

    # ---- one stage ---------------------------------------------------------------------

    def send_stage(self, stage: int, shard: int, values: array) -> None:
        """All messages of `shard` to the peer; then, once their sends completed, say so."""
        v, e = self.ep.v, self.ep.v.e
        parts = self.slices[shard]
        size = self.args.message_bytes
        mr = v.MR(self.ep.pd, size * len(parts), e.IBV_ACCESS_LOCAL_WRITE)
        for index, (first, last) in enumerate(parts):
            body = MESSAGE_HEAD.pack(stage, index) + values[first:last].tobytes()
            mr.write(body, len(body), index * size)
            wr = v.SendWR(wr_id=SEND_IDS + index, opcode=e.IBV_WR_SEND, num_sge=1,
                          sg=[v.SGE(mr.buf + index * size, len(body), mr.lkey)],
                          send_flags=e.IBV_SEND_SIGNALED)
            if self.ah is not None:
                wr.set_wr_ud(self.ah, self.remote_qpn, QKEY)
            self.ep.qp.post_send(wr)
        outstanding = len(parts)
        deadline = time.monotonic() + self.args.wait_s
        while outstanding and time.monotonic() < deadline:
            outstanding -= self._poll()
        self.control.send({"sent": stage})

    def receive_stage(self, stage: int, shard: int) -> None:
        """Until every message of the peer's `stage` came, or the peer said it sent them all
        and the grace for those in flight passed."""
        expected = len(self.slices[shard])
        grace_until = None
        deadline = time.monotonic() + self.args.wait_s
        while time.monotonic() < deadline:
            if self.arrived_per_stage[stage] == expected:
                return
            if (stage in self.peer_done or self.control.closed) and grace_until is None:
                grace_until = time.monotonic() + self.args.grace_s
            if grace_until is not None and time.monotonic() > grace_until:
                return
            if self._poll() == 0:
                for line in self.control.receive(0.001):
                    self.peer_done.add(line["sent"])

    def _poll(self) -> int:
        """Take completions off the queue; returns how many sends completed."""
        e = self.ep.v.e
        n, wcs = self.ep.cq.poll(num_entries=64)
        sends = 0
        for wc in wcs if n > 0 else []:
            if wc.wr_id >= SEND_IDS:
                sends += 1
                self.error_completions += wc.status != e.IBV_WC_SUCCESS
                continue
            if wc.status != e.IBV_WC_SUCCESS:
                self.error_completions += 1
                continue
            data = self.recv_mr.read(wc.byte_len - self.grh, wc.wr_id * self.slot + self.grh)
            stage, index = MESSAGE_HEAD.unpack_from(data)
            if (stage, index) not in self.arrived:
                self.arrived[(stage, index)] = array("f", data[MESSAGE_HEAD.size:])
                self.arrived_per_stage[stage] += 1
        return sends

    # ---- the all-reduce ------------------------------------------------------------------

    def run(self) -> dict:
        self.connect()
        started = time.monotonic()
        mine = self.x[self.own]
        result = array("f", mine)
        # Reduce: our contribution to the peer's half, then the peer's to ours.
        self.send_stage(REDUCE, self.peer, mine)
        self.receive_stage(REDUCE, self.own)
        reduce_arrived = set()
        for index, (first, last) in enumerate(self.slices[self.own]):
            got = self.arrived.get((REDUCE, index))
            if got is not None:
                reduce_arrived.add(index)
                result[first:last] = mean_of(mine[first:last], got)
        # Broadcast: our averaged half to the peer, then the peer's half to us.
        self.send_stage(BROADCAST, self.own, result)
        self.receive_stage(BROADCAST, self.peer)
        bcast_arrived = set()
        for index, (first, last) in enumerate(self.slices[self.peer]):
            got = self.arrived.get((BROADCAST, index))
            if got is not None:
                bcast_arrived.add(index)
                result[first:last] = got
        seconds = time.monotonic() - started
        self.control.close()
        exact = mean_of(self.x[0], self.x[1])
        return {"qp": self.args.qp, "rank": self.args.rank, "numel": self.args.numel,
                "message_bytes": self.args.message_bytes, "seconds": seconds,
                "reduce_messages": len(self.slices[self.own]),
                "reduce_arrived": len(reduce_arrived),
                "broadcast_messages": len(self.slices[self.peer]),
                "broadcast_arrived": len(bcast_arrived),
                "error_completions": self.error_completions,
                "exact": result == exact,
                "consistent": self.consistent(result, exact, reduce_arrived, bcast_arrived)}

    def consistent(self, result: array, exact: array, reduce_arrived: set,
                   bcast_arrived: set) -> bool:
        """Every message's values are what the estimator gives for what arrived: our half,
        the mean where the peer's contribution came, else ours; the peer's half, what the
        peer broadcast (the mean, or the peer's own values where ours was lost) where its
        message came, else ours."""
        mine, theirs = self.x[self.own], self.x[self.peer]
        for index, (first, last) in enumerate(self.slices[self.own]):
            want = exact if index in reduce_arrived else mine
            if result[first:last] != want[first:last]:
                return False
        for index, (first, last) in enumerate(self.slices[self.peer]):
            got = result[first:last]
            allowed = ([exact[first:last], theirs[first:last]] if index in bcast_arrived
                       else [mine[first:last]])
            if got not in allowed:
                return False
        return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m harness.verbs.collective")
    parser.add_argument("--rank", type=int, choices=[0, 1], required=True)
    parser.add_argument("--qp", choices=["ud", "uc", "rc"], required=True)
    parser.add_argument("--address", required=True, help="this host's RoCE (IPv4) address")
    parser.add_argument("--peer", required=True, help="the other rank's RoCE address")
    parser.add_argument("--numel", type=int, default=20_000, help="float32 values")
    parser.add_argument("--message-bytes", type=int, default=1024,
                        help="UD: at most the path MTU (1024); UC/RC: any size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="rxe0")
    parser.add_argument("--control-port", type=int, default=CONTROL_PORT)
    parser.add_argument("--wait-s", type=float, default=60.0, help="a stage's ceiling")
    parser.add_argument("--grace-s", type=float, default=0.3,
                        help="how long to wait for messages in flight after the peer's sends")
    parser.add_argument("--first-timeout-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.message_bytes <= MESSAGE_HEAD.size or (args.message_bytes - MESSAGE_HEAD.size) % 4:
        parser.error(f"--message-bytes {args.message_bytes}: must be {MESSAGE_HEAD.size} "
                     "plus a positive multiple of 4")
    print(json.dumps(Run(args).run()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
