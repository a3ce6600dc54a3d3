"""The fixed binary header of every lossbed collective packet (network byte order, 72 B).

    magic u32 "LBED" | version u8 | stage u8 | source rank u16 | job nonce u64 | step u32 |
    bucket u16 | shard u16 | fragment u16 | fragments u16 | packet index u32 |
    packet count u32 | payload length u32 | psn u32 | copy u16 | destination rank u16 |
    seq u64 | tag 16 B

A "packet" here is what the collective rebuilds as a unit: one datagram, or for RoCE UC/RC
semantics one message cut into `fragments` datagrams. psn is the go-back-N sequence number
of RC semantics (0 otherwise); ACK and NAK control packets carry only a psn. `copy` tells
apart the transmissions of one packet: the copies of an end marker, an RC retransmission,
the ACKs and NAKs to one peer (numbered in turn).

seq and tag authenticate the datagram (auth.py): seq counts the datagrams its sender sealed
(the MAC's nonce) and tag is the MAC over the header up to the tag and the payload. Without
a job key both are 0. The destination rank is signed with the rest: a genuine datagram
copied to another rank is refused there (counted misdirected).

A receiver applies a packet only if every field agrees with what it expects: the job's
nonce, a source inside the job, a tag made with that source's key, itself as the
destination, the step it is working on, a shard and packet index that exist, and a payload
length that matches the packet's slot exactly. _wire.c reads and writes this same layout;
native.py checks at import that its constants are these.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

MAGIC = 0x4C424544  # "LBED"
VERSION = 5  # 3: end markers (stages 4 and 5); 4: copy, seq and tag; 5: destination rank
HEADER = struct.Struct("!IBBHQIHHHHIIIIHHQ16s")
HEADER_BYTES = HEADER.size
TAG_BYTES = 16
DEST_OFFSET = HEADER_BYTES - TAG_BYTES - 8 - 2  # where the destination rank is
SEQ_OFFSET = HEADER_BYTES - TAG_BYTES - 8  # where seq starts: the fields before it are ...
TAG_OFFSET = HEADER_BYTES - TAG_BYTES      # ... signed, with seq, by the tag
STAGE_OFFSET = struct.calcsize("!IB")  # the stage byte, after magic and version
FRAGMENTS_OFFSET = struct.calcsize("!IBBHQIHHH")  # fragments, u16 (1: a whole packet)
NO_TAG = bytes(TAG_BYTES)
IPV4_UDP_OVERHEAD = 20 + 8

# stages of one collective step
STAGE_REDUCE = 0     # a rank's contribution to a shard, sent to the shard's owner
STAGE_BROADCAST = 1  # the owner's result for its shard, sent to everyone
STAGE_ACK = 2        # RC: everything before psn arrived
STAGE_NAK = 3        # RC: a gap; send again from psn (go-back-N)
# End markers: "I have sent you all `count` packets of this shard for that stage". No
# payload; packet index == count. Sent after the data, on the same path, so a receiver that
# has one knows that whatever it is still missing from that source was lost.
STAGE_REDUCE_END = 4
STAGE_BROADCAST_END = 5
STAGE_NAMES = {STAGE_REDUCE: "reduce", STAGE_BROADCAST: "broadcast"}
END_OF = {STAGE_REDUCE: STAGE_REDUCE_END, STAGE_BROADCAST: STAGE_BROADCAST_END}
DATA_STAGE_OF_END = {end: data for data, end in END_OF.items()}


class Header(NamedTuple):
    magic: int
    version: int
    stage: int
    source: int
    nonce: int
    step: int
    bucket: int
    shard: int
    fragment: int
    fragments: int
    index: int
    count: int
    length: int
    psn: int
    copy: int
    dest: int
    seq: int
    tag: bytes


def pack(stage: int, source: int, nonce: int, step: int, bucket: int, shard: int, index: int,
         count: int, length: int, fragment: int = 0, fragments: int = 1, psn: int = 0,
         copy: int = 0, dest: int = 0) -> bytes:
    """A header for rank `dest`, not sealed yet (seq and tag 0: auth.PacketAuth.seal fills
    them)."""
    return HEADER.pack(MAGIC, VERSION, stage, source, nonce, step, bucket & 0xFFFF, shard,
                       fragment, fragments, index, count, length, psn, copy, dest, 0, NO_TAG)


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


def payload_bytes(sizes) -> int:
    """The payload of data datagrams of these sizes (a numpy array), headers left out: what
    a receiver's bytes_received counts, as bytes_sent does on the sender's side."""
    return int(sizes.sum()) - len(sizes) * HEADER_BYTES
