"""One host of the wire's own limit: the compiled blaster (_blaster.c), nothing else to do.

Started on every host of a cluster at once (harness.launch), each sends MTU-sized datagrams
to every other host in turn and drains its own socket, for --seconds, in one of four modes:
sendmmsg or UDP GSO (one buffer the kernel cuts into MTU-sized datagrams), plain or sealed
(every datagram AES-128-GMAC sealed and checked at the receiver, by the data plane's MAC). All
hosts start at --start-at (time.time()) and print one JSON line: what they sent, received
and refused. tests/benchmarks/bench_wire.py holds the collective against these figures.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

from harness.bench import _blaster
from harness.rank_protocol import RankEnv
from harness.transport import header as hdr
from harness.transport import native

PORT = 29661  # one port for every host's blaster (each host its own address)
KEY = bytes(16)  # the blaster's MAC key: what it costs, not what it protects


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--peers", nargs="+", required=True, help="every host's address")
    parser.add_argument("--mode", choices=["sendmmsg", "gso"], required=True)
    parser.add_argument("--sealed", action="store_true")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--start-at", type=float, required=True)
    args = parser.parse_args(argv)
    told = RankEnv.from_env().required()  # launched by lossbed (harness/rank_protocol.py)
    rank, mtu, me = told.rank, told.mtu, told.address
    datagram = mtu - hdr.IPV4_UDP_OVERHEAD
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for option in (33, 32):  # SO_RCVBUFFORCE, SO_SNDBUFFORCE: as the transport has them
        sock.setsockopt(socket.SOL_SOCKET, option, 64 << 20)
    sock.bind((me, PORT))
    sock.setblocking(False)
    segments = native.enable_segmentation(sock, datagram) if args.mode == "gso" else 1
    if args.mode == "gso" and segments == 1:
        print("UDP GSO is not available on this socket", file=sys.stderr)
        return 2
    peers = [native.sockaddr_in(a, PORT) for a in args.peers if a != me]
    time.sleep(max(0.0, args.start_at - time.time()))
    sent, received, payload_bytes, refused, seconds = _blaster.blast(
        sock.fileno(), peers, rank, datagram, segments, KEY if args.sealed else None,
        args.seconds)
    # (counted: what arrived while sending; what is still queued at the end is not)
    print(json.dumps({"rank": rank, "mode": args.mode, "sealed": args.sealed,
                      "segments": segments, "sent": sent, "received": received,
                      "payload_bytes": payload_bytes, "refused": refused,
                      "seconds": seconds}))
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
