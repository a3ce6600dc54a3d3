"""Move numbered messages over one RDMA queue pair and count what completes whole.

    python3 -m harness.verbs.transfer recv --qp uc --size 65536 --count 300
    python3 -m harness.verbs.transfer send --to 10.201.0.1 --qp uc --size 65536 --count 300

The loss semantics are the hardware's (here Soft-RoCE's), not lossbed's: UD carries one
MTU-sized datagram per message; UC carries multi-packet messages and a message with any
packet lost never completes (its receive buffer is reused, no partial data surfaces); RC
retransmits until everything arrives. Every completed message is checked byte for byte.

Runs with the system Python that has pyverbs (Debian's python3-pyverbs) and no torch: the
queue pair numbers and GIDs are exchanged over a TCP connection on lossbed's control port,
which profiles keep unimpaired by default.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

CONTROL_PORT = 29499
UD_GRH_BYTES = 40  # a UD receive buffer starts with the 40-byte global route header
QKEY = 0x11111111
PORT_NUM = 1


def _verbs():
    from harness.verbs import api

    try:
        return api.load()
    except api.VerbsMissing as err:
        raise SystemExit(str(err)) from None


def pattern(seq: int, size: int) -> bytes:
    """The content of message `seq`: its number, then a byte that depends on it."""
    head = seq.to_bytes(8, "little")
    return (head + bytes([seq % 251]) * max(size - 8, 0))[:size]


def find_gid_index(ctx, address: str) -> int:
    """The GID table entry of the RoCE v2 IPv4 address of this host."""
    import ipaddress

    for index in range(32):
        try:
            gid = ipaddress.IPv6Address(str(ctx.query_gid(PORT_NUM, index)))
        except Exception:
            continue
        if gid.ipv4_mapped is not None and str(gid.ipv4_mapped) == address:
            return index
    raise SystemExit(f"no GID for {address} on the RDMA device: is rxe bound to its NIC?")


class Endpoint:
    def __init__(self, device: str, qp_type: str, address: str, depth: int):
        v = self.v = _verbs()
        e = v.e
        self.kind = {"ud": e.IBV_QPT_UD, "uc": e.IBV_QPT_UC, "rc": e.IBV_QPT_RC}[qp_type]
        self.ctx = v.Context(name=device)
        self.pd = v.PD(self.ctx)
        self.cq = v.CQ(self.ctx, 2 * depth + 16)
        cap = v.QPCap(max_send_wr=depth, max_recv_wr=depth, max_send_sge=1, max_recv_sge=1)
        init = v.QPInitAttr(qp_type=self.kind, scq=self.cq, rcq=self.cq, cap=cap)
        self.qp = v.QP(self.pd, init)
        self.gid_index = find_gid_index(self.ctx, address)
        self.gid = str(self.ctx.query_gid(PORT_NUM, self.gid_index))
        # INIT now: receive buffers can only be posted to a queue pair past RESET
        self.attr = v.QPAttr(port_num=PORT_NUM)
        if self.kind == e.IBV_QPT_UD:
            self.attr.qkey = QKEY
        else:
            self.attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        self.qp.to_init(self.attr)

    def info(self) -> dict:
        return {"qpn": self.qp.qp_num, "gid": self.gid, "psn": 0}

    def connect(self, remote: dict) -> None:
        """INIT -> RTR -> RTS towards the remote queue pair."""
        v, e = self.v, self.v.e
        attr = self.attr
        if self.kind != e.IBV_QPT_UD:
            gr = v.GlobalRoute(dgid=_gid(remote["gid"]), sgid_index=self.gid_index)
            attr.ah_attr = v.AHAttr(gr=gr, is_global=1, port_num=PORT_NUM)
            attr.dest_qp_num = remote["qpn"]
            attr.rq_psn = remote["psn"]
            attr.path_mtu = e.IBV_MTU_1024
            if self.kind == e.IBV_QPT_RC:
                attr.max_dest_rd_atomic = 1
                attr.min_rnr_timer = 12
        self.qp.to_rtr(attr)
        attr.sq_psn = 0
        if self.kind == e.IBV_QPT_RC:
            attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic = 14, 7, 7, 1
        self.qp.to_rts(attr)

    def address_handle(self, remote: dict):
        v = self.v
        gr = v.GlobalRoute(dgid=_gid(remote["gid"]), sgid_index=self.gid_index)
        return v.AH(self.pd, attr=v.AHAttr(gr=gr, is_global=1, port_num=PORT_NUM))


def _gid(text: str):
    return _verbs().GID(text)


def _control_server(port: int) -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(1)
    return server


def _send_json(conn, obj) -> None:
    conn.sendall((json.dumps(obj) + "\n").encode())


def _recv_json(reader) -> dict:
    line = reader.readline()
    if not line:
        raise SystemExit("the peer closed the control connection")
    return json.loads(line)


def receive(args) -> dict:
    ep = Endpoint(args.device, args.qp, args.address, depth=args.count)
    v, e = ep.v, ep.v.e
    slot = args.size + (UD_GRH_BYTES if args.qp == "ud" else 0)
    mr = v.MR(ep.pd, slot * args.count, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    for i in range(args.count):
        sge = v.SGE(mr.buf + i * slot, slot, mr.lkey)
        ep.qp.post_recv(v.RecvWR(wr_id=i, num_sge=1, sg=[sge]))
    server = _control_server(args.control_port)
    server.settimeout(args.first_timeout_s)
    conn, _ = server.accept()
    reader = conn.makefile("r")
    remote = _recv_json(reader)
    ep.connect(remote)
    _send_json(conn, ep.info())
    _recv_json(reader)  # the sender is done
    completed, intact, errors = 0, 0, 0
    seen = set()
    deadline = time.monotonic() + args.wait_s
    while time.monotonic() < deadline:
        n, wcs = ep.cq.poll(num_entries=64)
        if n <= 0:
            time.sleep(0.001)
            continue
        for wc in wcs:
            if wc.status != e.IBV_WC_SUCCESS:
                errors += 1
                continue
            completed += 1
            offset = wc.wr_id * slot + (UD_GRH_BYTES if args.qp == "ud" else 0)
            data = mr.read(args.size, offset)
            seq = int.from_bytes(data[:8], "little")
            if wc.byte_len - (UD_GRH_BYTES if args.qp == "ud" else 0) == args.size \
                    and data == pattern(seq, args.size) and seq not in seen:
                intact += 1
                seen.add(seq)
    _send_json(conn, {"done": True})
    conn.close()
    server.close()
    return {"qp": args.qp, "size": args.size, "sent": args.count, "completed": completed,
            "intact": intact, "lost": args.count - intact, "error_completions": errors,
            "received_seq": sorted(seen)}


def send(args) -> dict:
    ep = Endpoint(args.device, args.qp, args.address, depth=args.window)
    v, e = ep.v, ep.v.e
    deadline = time.monotonic() + args.first_timeout_s
    while True:  # the receiver may still be starting (Python is slow in a VM)
        try:
            conn = socket.create_connection((args.to, args.control_port), timeout=10)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    reader = conn.makefile("r")
    _send_json(conn, ep.info())
    remote = _recv_json(reader)
    ep.connect(remote)
    ah = ep.address_handle(remote) if args.qp == "ud" else None
    mr = v.MR(ep.pd, args.size * args.window, e.IBV_ACCESS_LOCAL_WRITE)
    outstanding, sent_ok, send_errors = 0, 0, 0
    started = time.monotonic()
    for seq in range(args.count):
        while outstanding >= args.window:  # reuse a slot only after its send completed
            n, wcs = ep.cq.poll(num_entries=64)
            for wc in wcs if n > 0 else []:
                outstanding -= 1
                sent_ok += wc.status == e.IBV_WC_SUCCESS
                send_errors += wc.status != e.IBV_WC_SUCCESS
        slot = seq % args.window
        mr.write(pattern(seq, args.size), args.size, slot * args.size)
        wr = v.SendWR(wr_id=seq, opcode=e.IBV_WR_SEND, num_sge=1,
                         sg=[v.SGE(mr.buf + slot * args.size, args.size, mr.lkey)],
                         send_flags=e.IBV_SEND_SIGNALED)
        if ah is not None:
            wr.set_wr_ud(ah, remote["qpn"], QKEY)
        ep.qp.post_send(wr)
        outstanding += 1
        if args.rate_mps:
            due = started + (seq + 1) / args.rate_mps
            while time.monotonic() < due:
                time.sleep(0.0005)
    deadline = time.monotonic() + args.wait_s
    while outstanding and time.monotonic() < deadline:
        n, wcs = ep.cq.poll(num_entries=64)
        for wc in wcs if n > 0 else []:
            outstanding -= 1
            sent_ok += wc.status == e.IBV_WC_SUCCESS
            send_errors += wc.status != e.IBV_WC_SUCCESS
    seconds = time.monotonic() - started
    _send_json(conn, {"done": True})
    _recv_json(reader)
    conn.close()
    return {"qp": args.qp, "size": args.size, "posted": args.count,
            "send_completions": sent_ok, "send_errors": send_errors,
            "not_completed": outstanding, "seconds": seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m harness.verbs.transfer")
    sub = parser.add_subparsers(dest="mode", required=True)
    for name in ("recv", "send"):
        p = sub.add_parser(name)
        p.add_argument("--qp", choices=["ud", "uc", "rc"], required=True)
        p.add_argument("--size", type=int, required=True, help="message bytes")
        p.add_argument("--count", type=int, required=True)
        p.add_argument("--device", default="rxe0")
        p.add_argument("--address", required=True, help="this host's RoCE (IPv4) address")
        p.add_argument("--control-port", type=int, default=CONTROL_PORT)
        p.add_argument("--wait-s", type=float, default=5.0)
        p.add_argument("--first-timeout-s", type=float, default=60.0)
        if name == "send":
            p.add_argument("--to", required=True)
            p.add_argument("--window", type=int, default=32)
            p.add_argument("--rate-mps", type=float, default=0, help="messages per second")
    args = parser.parse_args(argv)
    result = receive(args) if args.mode == "recv" else send(args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
