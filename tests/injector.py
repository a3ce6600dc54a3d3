"""An on-path attacker for the data-plane integrity test (test_forged_packets.py).

Runs inside one host's namespace (the observer) of a cluster the test made. It reads the
job's datagrams that reach the observer with a packet socket, learns the job nonce and the
two victims' endpoints from them, then sends forged datagrams to the target with the
spoofed source address and port of its peer (a raw socket writes the IP header itself):

    poison      a copy of the peer's latest broadcast packet, values 1.0, for the next steps
    nan         the same with NaN values, for the next step
    end         copies of the peer's latest end marker, for the next steps
    bomb        a fragment claiming 65535 fragments (a reassembly buffer of ~94 MB each)
    future      data packets far ahead
    redirect    the peer's genuine datagrams to the observer, sent unchanged to the target
                (a rank they were not addressed to), with the peer's source
    replay      the peer's genuine datagrams to the observer, sent again to the observer
                as they were (duplicates the observer must take as the copies they are)

Every forgery but the redirects is addressed to the target and re-stamped (step or values
changed, the old tag kept), as an attacker without the key would make it: only the tag tells
it from a genuine one. The redirects are genuine, tag and all: only the destination rank
the tag covers tells.

It prints one JSON line: how many of each it sent, how many forged ones and how many
redirected genuine ones went to the target with a spoofed source. Every forged datagram
has the IP TTL FORGED_TTL and every redirected one REDIRECT_TTL, so that the test can count
those of each that reached the target. Nothing here leaves the test's own namespaces.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time

ETH_P_IP = 0x0800
MAGIC = b"LBED"
HEADER_BYTES = 72  # harness.transport.header v5: the injector writes raw bytes
STEP_AT, STAGE_AT, SOURCE_AT, FRAGMENTS_AT, DEST_AT = 16, 5, 6, 26, 46


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


# The TTL of every forged datagram, and of every redirected genuine one: the test counts
# what reaches the target of each by it
FORGED_TTL = 33
REDIRECT_TTL = 34


def ip_udp(src: tuple[str, int], dst: tuple[str, int], payload: bytes,
           ttl: int = FORGED_TTL) -> bytes:
    udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload
    head = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, ttl,
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


def to_rank(data: bytes, rank: int) -> bytes:
    """The datagram addressed to `rank` (the templates are the peer's datagrams to the
    observer: unchanged, a keyless receiver would refuse them as another rank's)."""
    return data[:DEST_AT] + struct.pack("!H", rank) + data[DEST_AT + 2:]


def main() -> int:
    ifname, target_ip, peer_ip, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    deadline = time.monotonic() + 120
    peer_ep = target_ep = target_rank = None
    templates: dict[str, bytes] = {}
    replays: list[tuple[tuple, tuple, bytes]] = []
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    sent = {k: 0 for k in ("poison", "nan", "end", "bomb", "future", "redirect", "replay")}
    done_rounds = 0
    first_step = step = None
    for src, dst, data in capture(ifname, {}, deadline):
        if src[0] == target_ip:
            target_ep = src
            target_rank = struct.unpack("!H", data[SOURCE_AT:SOURCE_AT + 2])[0]
        if src[0] != peer_ip or dst[0] == target_ip:  # (a frame the bridge flooded here)
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
        end_step = struct.unpack("!I", templates["end"][STEP_AT:STEP_AT + 4])[0]
        body = to_rank(templates["data"], target_rank)
        end = to_rank(templates["end"], target_rank)
        count = (len(body) - HEADER_BYTES) // 4
        forged = {
            # for each of the next four steps: the capture lags behind the ranks (the more so
            # under load), so "the next step" seen here may be running already
            "poison": [with_step(body[:HEADER_BYTES], step + k) + struct.pack("<f", 1.0) * count
                       for k in (1, 2, 3, 4) for _ in range(5)],
            "nan": [with_step(body[:HEADER_BYTES], step + 1)
                    + struct.pack("<f", float("nan")) * count],
            # stamped past the marker's own step: a marker stamped with the step it already
            # carries would be the genuine one, tag and all (under load the end template can
            # be a step ahead of the data template, and such copies, addressed to the
            # observer, were counted misdirected at the target, not unauthenticated)
            "end": [with_step(end, max(step, end_step) + k)
                    for k in (1, 2, 3) for _ in range(4)],
            "bomb": [body[:FRAGMENTS_AT] + struct.pack("!H", 65535) + body[FRAGMENTS_AT + 2:]
                     for _ in range(2)],
            "future": [with_step(body, step + 1000)],
            # the peer's genuine datagrams to the observer, unchanged (only data and end
            # markers of the steps still running could be taken: the newest ones)
            "redirect": [d for _, _, d in replays[-10:]],
        }
        # every forgery differs from the genuine datagram it was made from (so its tag is
        # wrong), and from that datagram re-addressed (so the step stamp changed something)
        made_from = (templates["data"], templates["end"], body, end)
        assert not any(d in made_from for kind, ds in forged.items()
                       if kind != "redirect" for d in ds)
        for kind, datagrams in forged.items():
            ttl = REDIRECT_TTL if kind == "redirect" else FORGED_TTL
            for d in datagrams:
                raw.sendto(ip_udp(peer_ep, target_ep, d, ttl), (target_ep[0], 0))
                sent[kind] += 1
        for r_src, r_dst, d in replays[:10]:
            raw.sendto(ip_udp(r_src, r_dst, d), (r_dst[0], 0))
            sent["replay"] += 1
        del replays[:10]
        done_rounds += 1
        if done_rounds >= rounds:
            break
        time.sleep(0.05)
    forged_total = sum(v for k, v in sent.items() if k not in ("replay", "redirect"))
    print(json.dumps({"sent": sent, "forged": forged_total, "redirected": sent["redirect"],
                      "rounds": done_rounds,
                      "first_round_step": first_step, "last_round_step": step,
                      "target": target_ep, "peer": peer_ep}), flush=True)
    return 0 if done_rounds else 1


if __name__ == "__main__":
    sys.exit(main())
