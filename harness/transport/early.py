"""The packets of coming steps that arrive early: kept for their step, within bounds.

A rank that fell behind finds its peers' packets of the next steps waiting and catches up
at compute speed, instead of losing them and waiting out deadlines, which kept it behind
for good.
"""

from __future__ import annotations

from harness.transport import header as hdr

# Packets of the next EARLY_WINDOW_STEPS steps are kept for them, up to EARLY_STASH_BYTES of
# payload (more: dropped, counted future). Only authenticated packets get this far, so what
# is kept was sent by a peer, and a kept packet is applied only in the slot it names.
EARLY_WINDOW_STEPS = 4
EARLY_STASH_BYTES = 256 << 20


class EarlyStash:
    """The packets of coming steps that arrived during this one, kept for them within a
    bound on their number of steps ahead and their bytes."""

    def __init__(self, max_bytes: int = EARLY_STASH_BYTES):
        self.max_bytes, self.bytes, self.items = max_bytes, 0, []

    def keep(self, head: hdr.Header, payload, steps_ahead: int) -> bool:
        size = len(payload) + hdr.HEADER_BYTES
        if not 0 < steps_ahead <= EARLY_WINDOW_STEPS or self.bytes + size > self.max_bytes:
            return False
        self.items.append((head, bytes(payload)))
        self.bytes += size
        return True

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)
