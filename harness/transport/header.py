"""The fixed binary header of every lossbed collective packet (network byte order, 40 B).

    magic u32 "LBED" | version u8 | stage u8 | source rank u16 | job nonce u64 | step u32 |
    bucket u32 | shard u16 | reserved u16 | packet index u32 | packet count u32 |
    payload length u32

A receiver applies a packet only if every field agrees with what it expects: the job's
nonce, a source inside the job, the step it is working on, a shard and packet index that
exist, and a payload length that matches the packet's slot exactly.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

MAGIC = 0x4C424544  # "LBED"
VERSION = 1
HEADER = struct.Struct("!IBBHQIIHHIII")
HEADER_BYTES = HEADER.size
IPV4_UDP_OVERHEAD = 20 + 8

# stages of one collective step
STAGE_REDUCE = 0     # a rank's contribution to a shard, sent to the shard's owner
STAGE_BROADCAST = 1  # the owner's result for its shard, sent to everyone
STAGE_NAMES = {STAGE_REDUCE: "reduce", STAGE_BROADCAST: "broadcast"}


class Header(NamedTuple):
    magic: int
    version: int
    stage: int
    source: int
    nonce: int
    step: int
    bucket: int
    shard: int
    reserved: int
    index: int
    count: int
    length: int


def pack(stage: int, source: int, nonce: int, step: int, bucket: int, shard: int, index: int,
         count: int, length: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, stage, source, nonce, step, bucket, shard, 0, index,
                       count, length)


def unpack(data) -> Header | None:
    """The header of a datagram, or None if it is not a lossbed packet of this version."""
    if len(data) < HEADER_BYTES:
        return None
    head = Header._make(HEADER.unpack_from(data))
    if head.magic != MAGIC or head.version != VERSION:
        return None
    return head


def payload_floats(mtu: int) -> int:
    """float32 values per packet so that IP + UDP + header + payload fit in one MTU."""
    room = mtu - IPV4_UDP_OVERHEAD - HEADER_BYTES
    if room < 4:
        raise ValueError(f"MTU {mtu} leaves no room for a payload")
    return room // 4
