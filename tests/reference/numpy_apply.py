"""The numpy reference of the compiled core's apply (native.apply, harness/collectives/step.py):
the same rules, written for reading, that the differential tests hold the core against on
the same inputs. Not used in production.

apply() checks packets of one stage of a step against what is expected and applies those
that fit; reference_handle_batch and reference_one put it where Step.handle_batch and
Step._one call the core.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from harness.collectives.step import Step
from harness.transport import header as hdr
from harness.transport.early import EarlyStash
from harness.transport.verdicts import APPLIED, DUPLICATE, MALFORMED, NONFINITE, STALE


def apply(state: Step, stage: int, source, shard, index, count, length, data: np.ndarray,
          rows: np.ndarray, first: int) -> Counter:
    """Check packets of one stage of this step against what is expected, and apply
    those that fit, all at once. Header fields come as arrays; packet i's payload is
    data[rows[i], first:first + length[i]]."""
    st = state.stages[stage]
    verdicts: Counter = Counter()
    source, index = source.astype(np.int64), index.astype(np.int64)
    expected = st.expected[source]
    floats = np.where(index == expected - 1, st.last_floats[source], st.per_packet)
    owner = state.rank if stage == hdr.STAGE_REDUCE else source
    fits = ((shard == owner) & (count == expected) & (index < expected)
            & (length == 4 * floats))
    tally(verdicts, MALFORMED, len(fits) - int(np.count_nonzero(fits)))
    sel = np.flatnonzero(fits)
    if stage == hdr.STAGE_BROADCAST and state.infer_ends:
        # A source broadcasts only after it sent us its reduce packets, all of them.
        state.reduce.ended[source[sel]] = True
    # NaN or infinite values are never applied (a corrupting link makes them too): the
    # packet counts as not received, and cannot take the slot from a good copy below
    ok = finite(data, rows[sel], first, floats[sel], st.per_packet)
    tally(verdicts, NONFINITE, len(sel) - int(np.count_nonzero(ok)))
    sel = sel[ok]
    # a duplicate: already here, or a second copy in this batch. Every packet claims its
    # slot; one claim per slot stands (whichever: numpy does not say), the others lose.
    src_sel, idx_sel, order = source[sel], index[sel], np.arange(len(sel))
    claims = np.empty(st.got.shape, dtype=np.int64)
    claims[src_sel, idx_sel] = order
    new = (claims[src_sel, idx_sel] == order) & ~st.got[src_sel, idx_sel]
    tally(verdicts, DUPLICATE, len(sel) - int(np.count_nonzero(new)))
    sel = sel[new]
    if not len(sel):
        return verdicts
    if stage == hdr.STAGE_REDUCE and not state.accept_reduce:
        state.late_stages.add(stage)
        tally(verdicts, STALE, len(sel))  # the shard was already rebuilt and sent
        return verdicts
    source, index, rows, floats = source[sel], index[sel], rows[sel], floats[sel]
    per_packet, add = st.per_packet, stage == hdr.STAGE_REDUCE
    full = floats == per_packet
    # Full-size packets in runs: consecutive rows carrying consecutive packets of one
    # source (a source's packets mostly come in order and together). A run is applied
    # as one slice of the buffer onto one slice of the target, without temporary copies.
    src_f, idx_f, rows_f = source[full], index[full], rows[full]
    breaks = np.flatnonzero((np.diff(src_f) != 0) | (np.diff(idx_f) != 1)
                            | (np.diff(rows_f) != 1)) + 1
    for a, b in zip([0, *breaks.tolist()], [*breaks.tolist(), len(src_f)], strict=True):
        if a == b:
            continue
        row, packet = int(rows_f[a]), int(idx_f[a])
        values = data[row:row + b - a, first:first + 4 * per_packet].view(np.float32)
        region = st.full_rows(int(src_f[a]))[packet:packet + b - a]
        if add:
            region += values
        else:
            region[...] = values
    for i in np.flatnonzero(~full).tolist():  # last packets of shards, shorter
        start = int(st.base[source[i]] + index[i] * per_packet)
        values = data[rows[i], first:first + 4 * int(floats[i])].view(np.float32)
        if add:
            st.target[start:start + len(values)] += values
        else:
            st.target[start:start + len(values)] = values
    st.got[source, index] = True
    st.pending -= np.bincount(source, minlength=len(st.pending))
    st.left -= len(sel)
    st.last_at = time.monotonic()
    tally(verdicts, APPLIED, len(sel))
    return verdicts


def finite(data: np.ndarray, rows: np.ndarray, first: int, floats: np.ndarray,
           per_packet: int) -> np.ndarray:
    """Per packet: are all its values finite? Packet i's floats[i] values are at
    data[rows[i], first:]."""
    ok = np.ones(len(rows), dtype=bool)
    full = floats == per_packet
    if full.any():
        values = data[rows[full], first:first + 4 * per_packet].view(np.float32)
        ok[full] = np.isfinite(values).all(axis=1)
    for i in np.flatnonzero(~full).tolist():  # the shorter last packets of shards
        values = data[rows[i], first:first + 4 * int(floats[i])].view(np.float32)
        ok[i] = bool(np.isfinite(values).all())
    return ok


def tally(verdicts: Counter, verdict: str, count: int) -> None:
    if count:
        verdicts[verdict] += count


def reference_handle_batch(state: Step, data: np.ndarray, rows: np.ndarray,
                           stash: EarlyStash) -> Counter:
    """Step.handle_batch by numpy: header fields read as arrays, apply() per stage."""
    heads = [hdr.unpack(data[r]) for r in rows.tolist()]
    verdicts: Counter = Counter()
    this = np.array([h.step == state.step and h.bucket == state.bucket for h in heads], bool)
    for i in np.flatnonzero(~this).tolist():
        h = heads[i]
        payload = memoryview(data[rows[i], hdr.HEADER_BYTES:hdr.HEADER_BYTES + h.length])
        verdicts[state.handle(h, payload, stash)] += 1
    for stage in state.stages:
        sel = [i for i in np.flatnonzero(this).tolist() if heads[i].stage == stage]
        if sel:
            field = {name: np.array([getattr(heads[i], name) for i in sel], dtype=np.int64)
                     for name in ("source", "shard", "index", "count", "length")}
            verdicts.update(apply(state, stage, field["source"], field["shard"],
                                  field["index"], field["count"], field["length"],
                                  data, rows[sel], hdr.HEADER_BYTES))
    return verdicts


def reference_one(state: Step, head: hdr.Header, payload, stash: EarlyStash) -> str:
    """Step._one by numpy: apply() on arrays of one. For the datagram-at-a-time runs."""
    one = np.array  # header fields as arrays of one
    verdicts = apply(state, head.stage, one([head.source]), one([head.shard]),
                     one([head.index]), one([head.count]), one([head.length]),
                     np.frombuffer(payload, dtype=np.uint8)[None, :],
                     np.zeros(1, dtype=np.int64), 0)
    return next(iter(verdicts))
