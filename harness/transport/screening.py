"""The screening chain: the checks a unit from the wire passes, in order, before anything
reads its values. One chain for every transport that takes units one at a time (UDP's slow
path, the verbs transport); the compiled core's screen (native.screen) runs its first three
links for a whole batch, in the same order, and says so with `checked`.

    foreign          not this job's: no header, another nonce, or a source that did not send
                     it (the sender's endpoint is not the one the source published)
    unauthenticated  not sealed with its source's key (auth.py), where the job has one
    misdirected      genuine, but addressed to another rank (a redirected copy)
    malformed        its length is not the header's, not whole floats, or (where units are
                     never cut) a fragment
    masked           dropped by the seeded drop mask (dropmask.py), as a network would

Each refusal is counted under its name in the transport's Counters (verdicts.py).
"""

from __future__ import annotations

from harness.transport import header as hdr
from harness.transport.auth import PacketAuth
from harness.transport.dropmask import DropMask
from harness.transport.verdicts import (
    FOREIGN,
    MALFORMED,
    MASKED,
    MISDIRECTED,
    UNAUTHENTICATED,
    Counters,
)


def screen(head: hdr.Header | None, view: memoryview, size: int, *, rank: int, nonce: int,
           from_source: bool, auth: PacketAuth | None, drop_mask: DropMask | None,
           counters: Counters, checked: bool = False, whole_only: bool = False) -> str | None:
    """The verdict refusing one unit (`view`, `size` bytes, its header `head`), counted; None
    if it passes. from_source: the sender is the endpoint of the source the header names.
    checked: the compiled core has screened it already (foreign, unauthenticated). whole_only:
    the transport never cuts units, so a fragment is malformed."""
    if not checked and (head is None or head.nonce != nonce or not from_source):
        counters.foreign += 1
        return FOREIGN
    if auth is not None and not checked and not auth.check(view, size):
        counters.unauthenticated += 1
        return UNAUTHENTICATED
    if head.dest != rank:
        counters.misdirected += 1
        return MISDIRECTED
    if (head.length != size - hdr.HEADER_BYTES or head.length % 4
            or (whole_only and head.fragments != 1)):
        counters.malformed += 1
        return MALFORMED
    # (the drop mask loses control datagrams too: an ACK crosses the network like data)
    if drop_mask is not None and drop_mask.drops(head):
        counters.masked += 1
        return MASKED
    return None
