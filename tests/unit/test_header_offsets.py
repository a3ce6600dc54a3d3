"""The header's byte offsets that Python reads without unpacking (a batch's end markers,
RC's ACKs and NAKs) name the fields pack() writes there."""

from __future__ import annotations

from harness.transport import header as hdr


def test_the_named_offsets_are_the_fields_pack_writes():
    for stage in (hdr.STAGE_REDUCE, hdr.STAGE_BROADCAST_END, hdr.STAGE_NAK):
        for fragments in (1, 2, 0x0102):
            head = hdr.pack(stage, source=3, nonce=2**63 + 5, step=7, bucket=1, shard=2,
                            index=9, count=10, length=0, fragment=0, fragments=fragments)
            assert head[hdr.STAGE_OFFSET] == stage
            at = hdr.FRAGMENTS_OFFSET
            assert int.from_bytes(head[at:at + 2], "big") == fragments
            assert hdr.unpack(head).stage == stage and hdr.unpack(head).fragments == fragments
