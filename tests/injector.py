"""An on-path attacker for the data-plane integrity test (test_forged_packets.py).

Runs inside one host's namespace (the observer) of a cluster the test made. It reads the
job's datagrams that reach the observer with a packet socket, learns the job nonce and the
two victims' endpoints from them, then sends forged datagrams to the target with the
spoofed source address and port of its peer (a raw socket writes the IP header itself):

    poison      a copy of the peer's latest broadcast packet, values 1.0, for the next step
    nan         the same with NaN values, for the next step
    end         copies of the peer's latest end marker, for the next steps
    bomb        a fragment claiming 65535 fragments (a reassembly buffer of ~94 MB each)
    future      data packets far ahead
    replay      the peer's genuine datagrams to the observer, sent again as they were

It prints one JSON line: how many of each it sent, and how many went to the target (all
but the replays) with a spoofed source. Every forged datagram has the IP TTL FORGED_TTL, so
that the test can count those that reached the target. Nothing here leaves the test's own
namespaces.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time

ETH_P_IP = 0x0800
MAGIC = b"LBED"
HEADER_BYTES = 72  # harness.transport.header v4: the injector writes raw bytes
STEP_AT, STAGE_AT, FRAGMENTS_AT = 16, 5, 26


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


# The TTL of every forged datagram: the test counts what reaches the target by it
FORGED_TTL = 33


def ip_udp(src: tuple[str, int], dst: tuple[str, int], payload: bytes) -> bytes:
    udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload
    head = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, FORGED_TTL,
                       socket.IPPROTO_UDP, 0, socket.inet_aton(src[0]),
                       socket.inet_aton(dst[0]))
    head = head[:10] + struct.pack("!H", _checksum(head)) + head[12:]
    return head + udp


def capture(ifname: str, peers: dict, until: float):
    """Yield (source endpoint, destination endpoint, lossbed datagram) seen on ifname."""
    sniff = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IP))
    sniff.bind((ifname, 0))
    sniff.settimeout(0.5)
    while time.monotonic() < until:
        try:
            frame = sniff.recv(65535)
        except TimeoutError:
            continue
        ip = frame[14:]
        if len(ip) < 28 or ip[9] != socket.IPPROTO_UDP:
            continue
        ihl = (ip[0] & 0xF) * 4
        src = (socket.inet_ntoa(ip[12:16]), struct.unpack("!H", ip[ihl:ihl + 2])[0])
        dst = (socket.inet_ntoa(ip[16:20]), struct.unpack("!H", ip[ihl + 2:ihl + 4])[0])
        data = ip[ihl + 8:]
        if data[:4] == MAGIC:
            yield src, dst, bytes(data)


def with_step(data: bytes, step: int) -> bytes:
    return data[:STEP_AT] + struct.pack("!I", step) + data[STEP_AT + 4:]


def main() -> int:
    ifname, target_ip, peer_ip, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    deadline = time.monotonic() + 120
    peer_ep = target_ep = None
    templates: dict[str, bytes] = {}
    replays: list[tuple[tuple, tuple, bytes]] = []
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    sent = {k: 0 for k in ("poison", "nan", "end", "bomb", "future", "replay")}
    done_rounds = 0
    first_step = step = None
    for src, dst, data in capture(ifname, {}, deadline):
        if src[0] == target_ip:
            target_ep = src
        if src[0] != peer_ip:
            continue
        peer_ep = src
        stage = data[STAGE_AT]
        if stage == 1 and len(data) > HEADER_BYTES:
            templates["data"] = data
        elif stage == 5:
            templates["end"] = data
        if len(replays) < 200:
            replays.append((src, dst, data))
        if target_ep is None or len(templates) < 2 or len(replays) < 50:
            continue
        # One round: a burst of every kind, stamped from the latest steps seen
        step = struct.unpack("!I", templates["data"][STEP_AT:STEP_AT + 4])[0]
        first_step = step if first_step is None else first_step
        body = templates["data"]
        count = (len(body) - HEADER_BYTES) // 4
        forged = {
            "poison": [with_step(body[:HEADER_BYTES], step + 1) + struct.pack("<f", 1.0) * count
                       for _ in range(20)],
            "nan": [with_step(body[:HEADER_BYTES], step + 1)
                    + struct.pack("<f", float("nan")) * count],
            "end": [with_step(templates["end"], step + k) for k in (1, 2, 3) for _ in range(4)],
            "bomb": [body[:FRAGMENTS_AT] + struct.pack("!H", 65535) + body[FRAGMENTS_AT + 2:]
                     for _ in range(2)],
            "future": [with_step(body, step + 1000)],
        }
        for kind, datagrams in forged.items():
            for d in datagrams:
                raw.sendto(ip_udp(peer_ep, target_ep, d), (target_ep[0], 0))
                sent[kind] += 1
        for r_src, r_dst, d in replays[:10]:
            raw.sendto(ip_udp(r_src, r_dst, d), (r_dst[0], 0))
            sent["replay"] += 1
        del replays[:10]
        done_rounds += 1
        if done_rounds >= rounds:
            break
        time.sleep(0.05)
    forged_total = sum(v for k, v in sent.items() if k != "replay")
    print(json.dumps({"sent": sent, "forged": forged_total, "rounds": done_rounds,
                      "first_round_step": first_step, "last_round_step": step,
                      "target": target_ep, "peer": peer_ep}), flush=True)
    return 0 if done_rounds else 1


if __name__ == "__main__":
    sys.exit(main())
