"""A profile's match as u32 selector keys (for the netem backend's classifier).

u32 keys are (value, mask, offset) triples on 32-bit words, offsets from the IP header; a
filter matches when all its keys do. Port ranges become prefix masks, and "source or
destination port in range" becomes one filter per end. Like tc's `match ip dport`, the
transport header is assumed to follow a 20-byte IP header (no IP options).
"""

from __future__ import annotations

from testbed.profiles.model import Flow

IPPROTO = {"tcp": 6, "udp": 17}
OFFSET_PROTOCOL = 8     # word holding TTL, protocol, checksum
OFFSET_SADDR, OFFSET_DADDR = 12, 16
OFFSET_PORTS = 20       # sport:16 | dport:16


def range_to_prefixes(first: int, last: int, bits: int = 16) -> list[tuple[int, int]]:
    """Cover [first, last] with (value, mask) prefixes, fewest possible."""
    out = []
    while first <= last:
        size = first & -first if first else 1 << bits
        while size > last - first + 1:
            size >>= 1
        out.append((first, ((1 << bits) - 1) & ~(size - 1)))
        first += size
    return out


def key(value: int, mask: int, offset: int) -> str:
    return f"0x{value & mask:08x}/0x{mask:08x}+{offset}"


def address_key(address: str, offset: int) -> str:
    value = int.from_bytes(bytes(int(x) for x in address.split(".")), "big")
    return key(value, 0xFFFFFFFF, offset)


def flow_alternatives(flow: Flow) -> list[list[str]]:
    """Key lists, any of which matches the flow (protocol, and either port in range)."""
    proto = key(IPPROTO[flow.protocol] << 16, 0x00FF0000, OFFSET_PROTOCOL)
    if not flow.ports:
        return [[proto]]
    out = []
    for ports in flow.ports:
        for value, mask in range_to_prefixes(ports.first, ports.last):
            out.append([proto, key(value << 16, mask << 16, OFFSET_PORTS)])  # source port
            out.append([proto, key(value, mask, OFFSET_PORTS)])              # destination port
    return out
