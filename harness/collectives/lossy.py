"""The lossy all-reduce: reduce-scatter then broadcast, over an unreliable transport.

    rank r owns shard r. Reduce: every rank sends its contribution to each shard's owner;
    the owner rebuilds its shard from whatever arrived (rebuild.py). Broadcast: each owner
    sends its shard to everyone; a rank that misses a packet keeps its own value there.

The two uses of the broadcast:
    gradient mode    allreduce(): a missing packet of a reduced shard leaves the rank's own
                     local gradient in that slot.
    parameter mode   sharded_update(): owners reduce gradients, apply the optimizer to their
                     shard of the parameters, broadcast parameters; a rank that misses a
                     packet keeps its stale parameters (the bounded-drift scheme of
                     arXiv 2507.07114), and resync() makes all ranks equal again, reliably.

Nobody waits for a retransmission. Each stage ends when every source has either delivered
everything or said that it sent everything, or when its deadline passes. A source says so
with end markers after its data (END_COPIES of them, as any one may be lost): a path keeps
a source's packets in order, so what is still missing then was lost, and waiting longer
would only add latency. Bursts of loss take the markers with the tail of the data they
follow, so the news is told twice more, later: a source's broadcast packets (it broadcasts
only after sending us all its reduce packets) end its reduce stage, and LATE_END_COPIES of
its broadcast markers follow LATE_END_AFTER_S after its broadcast (or as it leaves a step
that ended sooner), and as many again LATE_END_AFTER_S after it in any case, from whatever
wait the source is in by then, this step's or its next's, or (background_late_ends, as
training runs it) from a thread while the source computes between steps. The deadline remains for
sources that fall silent (all markers lost, a rank stalled or dead). On a path that reorders
(netem delay with jitter), a packet overtaken by the markers arrives after its stage ended
and is counted late, not applied.
Ranks can start every align_every-th step together through the rendezvous store, so that
one rank's lateness does not become another's loss; a rank that does not arrive has died,
and the others stop with a clear error naming it. Training does not align by default
(TrainConfig.align_every): the store crosses the same lossy links, and aligning through it
cost more (p99 1 s at 10% loss) than the few packets a late rank makes its peers miss.
lossy_stage="reduce" or "broadcast" puts the loss on that stage alone and sends the other
over torch.distributed (delivered in full), to tell which stage a result comes from.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from harness.collectives.deadline import Deadline
from harness.collectives.layout import Layout
from harness.collectives.rebuild import ESTIMATORS, rebuild
from harness.transport import header as hdr
from harness.transport import native
from harness.transport.early import EarlyStash
from harness.transport.verdicts import (
    APPLIED,
    DUPLICATE,
    END,
    FUTURE,
    HELD,
    MALFORMED,
    NONFINITE,
    STALE,
    count_verdict,
)

if TYPE_CHECKING:
    # torch is imported only where tensors come in: the collective itself is numpy's, and a
    # host that runs it torch-free (a VM under TCG) saves the minute torch takes to import
    import torch

log = logging.getLogger(__name__)

EARLY = "early"
RC_STAGE_TIMEOUT_S = 60.0  # reliable semantics wait for everything, but not forever
# Copies of each end marker. Each rank waits on 2 x (world - 1) sources per step, and a
# source whose copies are all lost costs a deadline. With 4 copies at 10% random loss (all
# lost: 1e-4) 1 step in 400 of 4 ranks still had a rank wait out its deadline, which showed
# as p99 in a 40-step benchmark; with 8 (1e-8), 1 in 4 million. They cost 8 header-only
# datagrams per shard sent, in one system call.
END_COPIES = 8
LATE_END_COPIES = 4       # copies of the broadcast's end markers sent again, later ...
LATE_END_AFTER_S = 0.012  # ... this long after the broadcast (see _run)
# The timed set of late markers (see _run) is numbered after the first ones and the first
# late set: each its own transmission, which a drop mask draws afresh for, as a network would.
TIMED_END_FIRST_COPY = END_COPIES + LATE_END_COPIES
# How long the first alignment of a collective waits for a rank before naming it lost: TCP
# backs off 0.2, 0.4, 0.8, ... s per consecutive loss of a segment, so a 60 s stall takes
# nine in a row (at 30% loss: one segment in 50,000); a setup that slow is not just loss.
SETUP_PATIENCE_S = 60.0
GO_KEYS = 3  # release keys of the step alignment, reused in turn (see _align)
# Which stages cross the lossy transport (lossy_stage): the other one goes over
# torch.distributed (gloo: TCP, which retransmits what the kernel drops), so that a Δppl can
# be attributed to the stage that caused it. "both" is the scheme itself.
LOSSY_STAGES = ("both", "reduce", "broadcast")


class RankLost(RuntimeError):
    """A peer stopped taking part (died, or lost the network entirely)."""


@dataclass
class StepStats:
    step: int
    seconds: float
    reduce_expected: int
    reduce_missing: int
    broadcast_expected: int
    broadcast_missing: int
    reduce_deadline_hit: bool
    broadcast_deadline_hit: bool


class _Stage:
    """One stage of one step as a receiver sees it. Per source: how many packets it sends
    us (0 for ourselves), which have come, and whether its end markers came. Packet i of a
    source holds `per_packet` floats (its last packet holds `last_floats[source]`) and lands
    at `base[source] + i * per_packet` in `target`.

    Where the transport cuts packets into fragments (RoCE UC messages), `staging` (float32,
    reused step after step, per_packet floats for every packet expected) is where the
    compiled core reassembles them: each source has its own region (reduce messages of all
    sources go to one place of the target), a message per_packet floats of it. Which
    fragments came is this step's own (frag_got, frag_count), so partial messages are
    forgotten with the step."""

    def __init__(self, expected: list[int], last_floats: list[int], base: list[int],
                 per_packet: int, target: np.ndarray, fragment_floats: int = 0,
                 staging: np.ndarray | None = None):
        self.expected = np.array(expected, dtype=np.int64)
        self.last_floats = np.array(last_floats, dtype=np.int64)
        self.base = np.array(base, dtype=np.int64)
        self.per_packet, self.target = per_packet, target
        self.got = np.zeros((len(expected), max(1, max(expected))), dtype=bool)
        self.claims = np.empty(self.got.shape, dtype=np.int64)  # scratch of _Step._apply
        self.pending = self.expected.copy()
        self.ended = np.zeros(len(expected), dtype=bool)
        self.left = int(self.expected.sum())
        self.last_at = 0.0  # when its last packet came
        self.fragment_floats, self.staging = 0, None
        if staging is not None and 0 < fragment_floats < per_packet:
            most = -(-per_packet // fragment_floats)  # fragments of a full message
            room = self.expected * per_packet
            self.staging_base = np.cumsum(room) - room
            if staging.size < room.sum():
                raise ValueError(f"a staging area of {staging.size} floats for messages of "
                                 f"{int(room.sum())}")
            self.fragment_floats, self.staging = fragment_floats, staging
            self.frag_got = np.zeros((*self.got.shape, most), dtype=np.uint8)
            self.frag_count = np.zeros(self.got.shape, dtype=np.int32)

    def incomplete(self) -> int:
        """Messages of which some fragments came and others never did (lost whole)."""
        return int(np.count_nonzero(self.frag_count > 0)) if self.staging is not None else 0

    def fragments_args(self) -> tuple:
        """What native.apply takes for this stage's fragments (nothing: none are cut)."""
        if self.staging is None:
            return ()
        return (self.fragment_floats, self.staging, self.staging_base, self.frag_got,
                self.frag_count)

    def over(self) -> bool:
        """Every source has delivered everything or said that it sent everything."""
        return not np.any((self.pending > 0) & ~self.ended)

    def silent(self) -> np.ndarray:
        """Per source: owes us packets and has sent nothing of them yet, no end marker
        either. Such a source is slow (still computing, descheduled), not lossy: losing its
        packets and its eight markers alike would take every one of them."""
        return (self.expected > 0) & (self.pending == self.expected) & ~self.ended

    def full_rows(self, source: int) -> np.ndarray:
        """The target region of a source's full-size packets, one row per packet (a view)."""
        n = int(self.expected[source]) - int(self.last_floats[source] != self.per_packet)
        start = int(self.base[source])
        return self.target[start:start + n * self.per_packet].reshape(n, self.per_packet)


class _Step:
    """What one rank expects and has received in one collective step."""

    def __init__(self, layout: Layout, step: int, bucket: int, rank: int,
                 contribution: np.ndarray, shared: np.ndarray, total: np.ndarray,
                 infer_ends: bool = True, fragment_floats: int = 0,
                 staging: tuple[np.ndarray, np.ndarray] | None = None):
        self.layout, self.step, self.bucket, self.rank = layout, step, bucket, rank
        # Take a source's broadcast as the end of its reduce packets to us (what end markers
        # say, told again by every broadcast packet): off where paths reorder.
        self.infer_ends = infer_ends
        world, per_packet = layout.world, layout.per_packet
        self.own = layout.shard_bounds(rank)
        self.own_packets = layout.packets(rank)
        # float32 sums, like gloo's: at 0% loss the result matches it to rounding. `total`
        # is the collective's buffer for this size, reused step after step.
        np.copyto(total, contribution[self.own[0]:self.own[1]])
        self.total = total

        def last_floats(shard: int) -> int:
            size = layout.shard_size(shard)
            return size - (layout.packets(shard) - 1) * per_packet if size else 0

        others = [j != rank for j in range(world)]
        # reduce: every other rank's contribution to our shard, summed into `total`
        reduce_staging, bcast_staging = staging or (None, None)
        self.reduce = _Stage([self.own_packets * o for o in others],
                             [last_floats(rank)] * world, [0] * world, per_packet, self.total,
                             fragment_floats, reduce_staging)
        # broadcast: each other owner's shard, written into `shared` where it belongs. Safe
        # at any time: our contribution to that shard was sent before we began receiving.
        self.bcast = _Stage([layout.packets(j) * o for j, o in enumerate(others)],
                            [last_floats(j) for j in range(world)],
                            [layout.shard_bounds(j)[0] for j in range(world)], per_packet,
                            shared, fragment_floats, bcast_staging)
        self.stages = {hdr.STAGE_REDUCE: self.reduce, hdr.STAGE_BROADCAST: self.bcast}
        self.accept_reduce = True
        self.late_stages: set[int] = set()  # stages whose packets came after they ended
        self.started = time.monotonic()

    def counts(self) -> np.ndarray:
        """Contributions per element of the own shard, own included (one number for all of
        them when nothing was lost: then spelling it out per element only costs time)."""
        if not self.reduce.left:
            return np.float32(self.layout.world)
        per_packet = (1 + self.reduce.got.sum(axis=0)).astype(np.float32)
        # every packet of a shard holds per_packet values but the last, which holds the rest
        return np.repeat(per_packet, self.layout.per_packet)[:self.own[1] - self.own[0]]

    def incomplete_messages(self) -> int:
        return self.reduce.incomplete() + self.bcast.incomplete()

    def handle(self, head: hdr.Header, payload: memoryview, stash: EarlyStash) -> str:
        """One unit (an RC message, a packet kept early or left over from a batch) or a raw
        UC fragment: checked and applied by the compiled core like a batch of one
        (handle_batch). _apply, the numpy code that did it before, is the tests' reference.
        A message of another step is counted once, by its first fragment (the others say
        HELD: not counted)."""
        if head.stage in hdr.DATA_STAGE_OF_END:
            return self._end(head, stash)
        if head.step != self.step:
            if head.step < self.step:
                if head.stage in hdr.STAGE_NAMES:
                    self.late_stages.add(head.stage)
                verdict = STALE
            else:
                verdict = EARLY if stash.keep(head, payload, head.step - self.step) else FUTURE
            return verdict if head.fragment == 0 else HELD
        if (head.bucket != self.bucket or head.stage not in self.stages
                or head.length != len(payload)):
            return MALFORMED
        return self._one(head, payload, stash)

    def _one(self, head: hdr.Header, payload, stash: EarlyStash) -> str:
        """A unit or fragment of this step and bucket through the compiled core, as a batch
        of one datagram: its verdict (HELD: a fragment kept)."""
        verdicts = self.handle_batch(*as_batch([(head, payload)]), stash)
        return next(iter(verdicts)) if verdicts else HELD

    def handle_batch(self, data: np.ndarray, rows: np.ndarray, stash: EarlyStash) -> Counter:
        """handle() for a batch of data packets and UC fragments (see
        UdpTransport.receive_until): each stage's packets of this step checked and applied
        by the compiled core (native.apply, the same rules as _apply; fragments held in the
        stage's staging area until their message is whole), the rare others (early, late,
        another bucket) one at a time. Packet i is the datagram in data[rows[i]]."""
        verdicts: Counter = Counter()
        leftover = np.empty(len(rows), dtype=np.int64)
        for stage, st in self.stages.items():
            reduce = stage == hdr.STAGE_REDUCE
            applied, duplicates, malformed, nonfinite, stale, others, _held = native.apply(
                data, data.shape[1], rows, self.step, self.bucket & 0xFFFF, stage,
                self.rank if reduce else -1, st.expected, st.last_floats, st.base,
                st.per_packet, st.target, st.got, st.got.shape[1], st.pending,
                self.reduce.ended if not reduce and self.infer_ends else None, reduce,
                self.accept_reduce or not reduce, leftover, *st.fragments_args())
            for verdict, count in ((APPLIED, applied), (DUPLICATE, duplicates),
                                   (MALFORMED, malformed), (NONFINITE, nonfinite),
                                   (STALE, stale)):
                _tally(verdicts, verdict, count)
            if applied:
                st.left -= applied
                st.last_at = time.monotonic()
            if stale:
                self.late_stages.add(stage)
            for row in leftover[:others].tolist():
                head = hdr.unpack(data[row])
                payload = memoryview(data[row, hdr.HEADER_BYTES:hdr.HEADER_BYTES + head.length])
                verdicts[self.handle(head, payload, stash)] += 1
        return verdicts

    def _apply(self, stage: int, source, shard, index, count, length, data: np.ndarray,
               rows: np.ndarray, first: int) -> Counter:
        """Check packets of one stage of this step against what is expected, and apply
        those that fit, all at once. Header fields come as arrays; packet i's payload is
        data[rows[i], first:first + length[i]]."""
        st = self.stages[stage]
        verdicts: Counter = Counter()
        source, index = source.astype(np.int64), index.astype(np.int64)
        expected = st.expected[source]
        floats = np.where(index == expected - 1, st.last_floats[source], st.per_packet)
        owner = self.rank if stage == hdr.STAGE_REDUCE else source
        fits = ((shard == owner) & (count == expected) & (index < expected)
                & (length == 4 * floats))
        _tally(verdicts, MALFORMED, len(fits) - int(np.count_nonzero(fits)))
        sel = np.flatnonzero(fits)
        if stage == hdr.STAGE_BROADCAST and self.infer_ends:
            # A source broadcasts only after it sent us its reduce packets, all of them.
            self.reduce.ended[source[sel]] = True
        # NaN or infinite values are never applied (a corrupting link makes them too): the
        # packet counts as not received, and cannot take the slot from a good copy below
        finite = _finite(data, rows[sel], first, floats[sel], st.per_packet)
        _tally(verdicts, NONFINITE, len(sel) - int(np.count_nonzero(finite)))
        sel = sel[finite]
        # a duplicate: already here, or a second copy in this batch. Every packet claims its
        # slot; one claim per slot stands (whichever: numpy does not say), the others lose.
        src_sel, idx_sel, order = source[sel], index[sel], np.arange(len(sel))
        st.claims[src_sel, idx_sel] = order
        new = (st.claims[src_sel, idx_sel] == order) & ~st.got[src_sel, idx_sel]
        _tally(verdicts, DUPLICATE, len(sel) - int(np.count_nonzero(new)))
        sel = sel[new]
        if not len(sel):
            return verdicts
        if stage == hdr.STAGE_REDUCE and not self.accept_reduce:
            self.late_stages.add(stage)
            _tally(verdicts, STALE, len(sel))  # the shard was already rebuilt and sent
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
        _tally(verdicts, APPLIED, len(sel))
        return verdicts

    def _end(self, head: hdr.Header, stash: EarlyStash) -> str:
        """An end marker: its source has sent every packet it had for us in that stage."""
        if head.step != self.step:
            if head.step > self.step and stash.keep(head, b"", head.step - self.step):
                return EARLY
            return END  # another copy, after its step was over: nothing to learn
        if head.bucket != self.bucket:
            return MALFORMED
        stage, src = hdr.DATA_STAGE_OF_END[head.stage], head.source
        st = self.stages[stage]
        owner = self.rank if stage == hdr.STAGE_REDUCE else src
        if (head.shard != owner or head.count != st.expected[src]
                or head.index != head.count or head.length != 0):
            return MALFORMED
        st.ended[src] = True
        if stage == hdr.STAGE_BROADCAST and self.infer_ends:
            self.reduce.ended[src] = True  # as for its broadcast packets (see _apply)
        return END


def as_batch(units: list) -> tuple[np.ndarray, np.ndarray]:
    """(header, payload) pairs as a receive batch for handle_batch: one datagram a row (the
    header packed again, then the payload), and the rows."""
    width = hdr.HEADER_BYTES + max(len(payload) for _, payload in units)
    data = np.zeros((len(units), width), dtype=np.uint8)
    for row, (head, payload) in enumerate(units):
        data[row, :hdr.HEADER_BYTES] = np.frombuffer(hdr.HEADER.pack(*head), np.uint8)
        data[row, hdr.HEADER_BYTES:hdr.HEADER_BYTES + len(payload)] = np.frombuffer(
            payload, np.uint8)
    return data, np.arange(len(units), dtype=np.int64)


def _finite(data: np.ndarray, rows: np.ndarray, first: int, floats: np.ndarray,
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


def _tally(verdicts: Counter, verdict: str, count: int) -> None:
    if count:
        verdicts[verdict] += count


class LossyCollective:
    def __init__(self, transport, store=None, *, estimator: str = "received_mean",
                 deadline: Deadline | None = None, key_prefix: str = "lossbed/collective",
                 end_copies: int = END_COPIES, align_every: int = 1,
                 wait_for_all: bool = False, lossy_stage: str = "both",
                 background_late_ends: bool = False):
        if estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {estimator!r}: use one of "
                             f"{', '.join(ESTIMATORS)}")
        if lossy_stage not in LOSSY_STAGES:
            raise ValueError(f"unknown lossy_stage {lossy_stage!r}: use one of "
                             f"{', '.join(LOSSY_STAGES)}")
        # the stage(s) that cross the lossy transport; the other is delivered in full
        self.lossy_reduce = lossy_stage in ("both", "reduce")
        self.lossy_broadcast = lossy_stage in ("both", "broadcast")
        self.transport = transport
        self.store = store
        # Start every align_every-th step together through the store (1: every step, 0:
        # never): see _align. Every rank numbers steps alike, so all align at the same ones.
        # The first step always is: the ranks come to it from setup (data, model, a run
        # boundary) that takes each its own time, and without it that difference became
        # loss at zero loss (a 0%-loss run once trained another model than gloo's).
        self.align_every = align_every
        self._aligned_once = False
        self.estimator = estimator
        self.deadline = deadline or Deadline()
        # 0: no end markers, every stage waits for all its packets or its deadline (for
        # paths that reorder a lot)
        self.end_copies = end_copies
        # A lossless reference (a bench's rps at 0%): every stage waits for all its packets
        # (up to RC_STAGE_TIMEOUT_S), so a rank that falls behind costs time, not packets.
        # With deadlines, 2 shared cores made references miss 42-7368 packets (late), and
        # the reference was then one perturbed run, not the lossless model. Nothing is
        # retransmitted: what is still missing after the timeout is counted missing.
        self.wait_for_all = wait_for_all
        self.rank, self.world = transport.rank, transport.world
        self.key_prefix = key_prefix
        self._reduce_expected = 0
        self._reduce_missing = 0
        # Running totals a caller reads around a training step, to say why it was slow
        self.totals = {"align_s": 0.0, "reduce_deadlines_hit": 0, "broadcast_deadlines_hit": 0,
                       "collective_steps": 0}
        # per tensor size: its layout and the buffer of the own shard's reduce sums
        self._sizes: dict[int, tuple[Layout, np.ndarray]] = {}
        self._stagings: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # ... UC/RC staging
        # the values of a fragment where the batched transport cuts packets (UC, RC), else 0
        t = transport
        self._fragment_floats = (t.fragment_floats if t.batched
                                 and t.fragment_floats < t.per_packet else 0)
        # Broadcasts whose late end markers are still to go: (when, layout, step, bucket),
        # in the order they are due (see _run)
        self._timed_ends: list[tuple[float, Layout, int, int]] = []
        # The transport is one thread's at a time (its use_lock): a step holds it, and so
        # does the background sender for each send it makes between steps.
        self._turn = threading.Condition(transport.use_lock)
        self._background: threading.Thread | None = None
        self._background_stopping = False
        self._background_error: BaseException | None = None
        if background_late_ends:
            # A training rank computes between steps (forward, backward): the timed late
            # markers of its last broadcast fall due then, and a peer whose wait for that
            # broadcast only they can end would wait out its deadline until this rank's
            # next step sent them. This thread sends them when due instead.
            self._background = threading.Thread(
                target=self._background_sender, daemon=True,
                name=f"late-ends-rank{self.rank}")
            self._background.start()

    def _size(self, numel: int) -> tuple[Layout, np.ndarray]:
        """The layout of a tensor size and its sums buffer, made once: the packet tables
        take a while to build, a fresh 1 MiB buffer per step cost more in page faults than
        its arithmetic, and every step of a training run has the same sizes."""
        entry = self._sizes.get(numel)
        if entry is None:
            layout = Layout(numel, self.world, self.transport.per_packet)
            start, end = layout.shard_bounds(self.rank)
            entry = self._sizes[numel] = (layout, np.empty(end - start, np.float32))
        return entry

    def _staging(self, numel: int, layout: Layout) -> tuple[np.ndarray, np.ndarray] | None:
        """Where UC and RC messages of a tensor size are reassembled (reduce: a region of the own
        shard's messages per source; broadcast: each other owner's messages), made once per
        size; None where the transport sends every packet whole."""
        if self._fragment_floats == 0:
            return None
        entry = self._stagings.get(numel)
        if entry is None:
            others = [j for j in range(self.world) if j != self.rank]
            message = layout.per_packet
            reduce = len(others) * layout.packets(self.rank) * message
            bcast = sum(layout.packets(j) for j in others) * message
            entry = self._stagings[numel] = (np.empty(reduce, np.float32),
                                             np.empty(bcast, np.float32))
        return entry

    @property
    def loss_rate(self) -> float:
        """Fraction of expected reduce packets that did not arrive, over the run so far."""
        if not self._reduce_expected:
            return 0.0
        return self._reduce_missing / self._reduce_expected

    # ---- the two stages -------------------------------------------------------------------

    def _send_shard(self, layout: Layout, x: np.ndarray, stage: int, shard: int, dest: int,
                    step: int, bucket: int) -> None:
        starts, ends = layout.packet_arrays(shard)
        copies = 0 if self.transport.semantics.reliable else self.end_copies
        self.transport.send_packets(dest, stage, step, bucket, shard, x, starts, ends, copies)

    def _send_late_ends(self, layout: Layout, step: int, bucket: int,
                        first_copy: int) -> None:
        count = layout.packets(self.rank)
        if not count:  # an empty shard: no broadcast, nothing to say about it
            return
        for dest in range(self.world):
            if dest != self.rank:
                # numbered after the first ones: a new transmission (a drop mask draws
                # afresh for it, as a network would), not a replay of a lost one
                self.transport.send_end(dest, hdr.STAGE_BROADCAST, step, bucket, self.rank,
                                        count, LATE_END_COPIES, first_copy=first_copy)

    def _send_timed_ends(self) -> float:
        """Send the late end markers that are due; when the next ones are (inf: none)."""
        now = time.monotonic()
        while self._timed_ends and self._timed_ends[0][0] <= now:
            _, layout, step, bucket = self._timed_ends.pop(0)
            self._send_late_ends(layout, step, bucket, TIMED_END_FIRST_COPY)
        return self._timed_ends[0][0] if self._timed_ends else float("inf")

    def finish(self) -> None:
        """Send the late end markers still to go, once due (at most LATE_END_AFTER_S from
        now): after a run's last step, for a peer still waiting for them. Stops the
        background sender; on a closed transport sends nothing."""
        if self._background is not None:
            with self._turn:
                self._background_stopping = True
                self._turn.notify()
            self._background.join()
        with self._turn:
            if self._timed_ends and not self.transport.closed:
                time.sleep(max(0.0, self._timed_ends[-1][0] - time.monotonic()))
                self._send_timed_ends()
            self._timed_ends.clear()
        self._raise_background_error()

    @property
    def background_sender_alive(self) -> bool:
        return self._background is not None and self._background.is_alive()

    def _background_sender(self) -> None:
        """Send the timed late end markers as they fall due while no step holds the
        transport, until finish() or the transport closes (checked under its lock, which
        close() takes: nothing goes out on a closed socket)."""
        try:
            with self._turn:
                while not self._background_stopping and not self.transport.closed:
                    due = self._send_timed_ends()
                    self._turn.wait(None if due == float("inf")
                                    else max(0.0, due - time.monotonic()))
        except BaseException as err:  # noqa: BLE001 - raised in the rank's own thread
            self._background_error = err

    def _raise_background_error(self) -> None:
        if self._background_error is not None:
            err, self._background_error = self._background_error, None
            raise RuntimeError(f"rank {self.rank}: the background sender of late end "
                               f"markers failed: {err}") from err

    def _receive_until(self, deadline: float, until, handle, handle_batch) -> None:
        """transport.receive_until, sending late end markers as they fall due meanwhile."""
        while True:
            due = self._send_timed_ends()
            self.transport.receive_until(min(deadline, due), until, handle, handle_batch)
            if until() or time.monotonic() >= deadline:
                self._send_timed_ends()
                return

    def _receive(self, state: _Step, until, budget: float,
                 stage: _Stage | None = None) -> bool:
        """Receive until `until()` or the budget runs out; True if the deadline was hit.

        With `stage`, lateness is told from loss: a source of that stage that has sent us
        nothing yet (stage.silent) is waited for, up to the deadline's ceiling from the
        start of this wait, and a source first heard from since the last look gets one more
        budget for the rest of its packets. Only then is what is still missing lost. On a
        loaded machine a peer that is still computing its backward pass is not a lossy
        link: with the budget alone, its packets came after the stage ended (at 0% loss,
        3 hosts: 1.4% of all datagrams counted late before the compiled core, 4.2% with it,
        whose faster stages shrink the budget)."""
        started = time.monotonic()
        deadline = started + budget

        def handle(head, payload):
            return state.handle(head, payload, self.transport.stash)

        def handle_batch(data, rows):
            return state.handle_batch(data, rows, self.transport.stash)

        silent = stage.silent() if stage is not None else None
        patience = max(budget, self.deadline.floor_s)
        while True:
            self._receive_until(deadline, until, handle, handle_batch)
            if until() or silent is None:
                break
            now, still = time.monotonic(), stage.silent()
            if still.any() and now < started + self.deadline.ceiling_s:
                deadline = min(started + self.deadline.ceiling_s, now + patience)
            elif (silent & ~still).any():
                deadline = now + patience
            else:
                break
            silent = still
        for late in state.late_stages:
            self.deadline.late(hdr.STAGE_NAMES[late])
        state.late_stages.clear()
        return not until()

    def _run(self, contribution: np.ndarray, shared: np.ndarray, bucket: int,
             on_reduced) -> StepStats:
        """One step. `contribution` is what this rank sends to the owners (gradients);
        `shared` is what owners broadcast and everyone receives into (the result, or the
        parameters). on_reduced(start, end, estimate) writes the owner's shard of `shared`."""
        with self._turn:  # (the transport is the step's until it ends)
            self._raise_background_error()
            stats = self._run_step(contribution, shared, bucket, on_reduced)
            if self._background is not None:  # this step's timed set is due later
                self._turn.notify()
        return stats

    def _run_step(self, contribution: np.ndarray, shared: np.ndarray, bucket: int,
                  on_reduced) -> StepStats:
        layout, total = self._size(contribution.size)
        # Steps are numbered by the transport, so collectives sharing it (several
        # estimators, or a collective and RPS) never take each other's packets.
        step = self.transport.next_step()
        self._send_timed_ends()  # (those of our last step that fell due since it ended)
        if not self._aligned_once or (self.align_every and step % self.align_every == 0):
            aligning = time.monotonic()
            self._align(step)
            self.totals["align_s"] += time.monotonic() - aligning
        state = _Step(layout, step, bucket, self.rank, contribution, shared, total,
                      infer_ends=self.end_copies > 0,
                      fragment_floats=self._fragment_floats,
                      staging=self._staging(contribution.size, layout))
        stash, self.transport.stash = self.transport.stash, EarlyStash()
        self._replay(state, stash)

        kind = f"{contribution.size}"
        reliable = self.transport.semantics.reliable
        patient = reliable or self.wait_for_all  # waits for everything, not a deadline
        start, end = state.own
        if self.lossy_reduce:
            # Reduce: our contribution to every other owner, then wait for ours.
            for shard in range(self.world):
                if shard != self.rank:
                    self._send_shard(layout, contribution, hdr.STAGE_REDUCE, shard, shard,
                                     step, bucket)
            reduce_since = time.monotonic()
            reduce_budget = (RC_STAGE_TIMEOUT_S if patient
                             else self.deadline.budget("reduce:" + kind))
            reduce_hit = self._receive(state, state.reduce.over, reduce_budget, state.reduce)
            self.deadline.observe("reduce:" + kind,
                                  max(state.reduce.last_at - reduce_since, 0.0))
            state.accept_reduce = False
            reduce_expected = int(state.reduce.expected.sum())
            reduce_missing = state.reduce.left
            self._reduce_expected += reduce_expected
            self._reduce_missing += reduce_missing
            # rebuilt in place: the sums are not needed once the estimate is made
            on_reduced(start, end, rebuild(self.estimator, state.total, state.counts(),
                                           contribution[start:end], self.world,
                                           self.loss_rate, out=state.total))
        else:
            # The reduce stage delivered in full (lossy_stage="broadcast"): the exact mean.
            state.accept_reduce = False
            reduce_hit, reduce_expected, reduce_missing = False, 0, 0
            on_reduced(start, end, _reliable_mean(contribution, self.world)[start:end])
            # (how long our reduce took: nothing of it here)
            reduce_since = time.monotonic()

        if self.lossy_broadcast:
            # Broadcast: our shard to everyone, then wait for the others'.
            for dest in range(self.world):
                if dest != self.rank:
                    self._send_shard(layout, shared, hdr.STAGE_BROADCAST, self.rank, dest,
                                     step, bucket)
            # An owner broadcasts once its own reduce stage ends, which may be long after
            # ours did (it waited for a lost packet, or for a slow source): until then it is
            # silent, and _receive waits for it up to the ceiling, then gives it one more
            # budget. So the broadcast's deadline is its own budget, from now. (It used to
            # carry what our reduce had left of its budget as well: a broadcast whose tail
            # and markers were all lost then cost 45-300 ms under 10% burst loss; and where
            # the reduce outlasted its budget, the overrun was taken off the broadcast's,
            # which then cut short a source that had begun: 874 datagrams late in one
            # 40-step `train --profile clean` on 3 hosts at 0% loss.)
            waiting_since = time.monotonic()
            own_reduce_s = waiting_since - reduce_since
            bcast_budget = (RC_STAGE_TIMEOUT_S if patient
                            else self.deadline.budget(
                                "broadcast:" + kind,
                                first_at_least=self.deadline.multiplier * own_reduce_s))
            if self.end_copies and not reliable:
                # Say again, a little later, that our broadcast went out. Under burst loss
                # the markers right after the data often share its fate (a burst of 10
                # packets takes all 8). These go LATE_END_AFTER_S after the data, or when our
                # own broadcast stage ends if sooner: then a peer that waits for them before
                # our next step (after the last step of a run, or a training step's compute)
                # has them. And once more LATE_END_AFTER_S after the data in any case, from
                # this wait or our next step's, by when a burst has usually ended (the burst
                # profile ends them after 10 ms at most): the first set, when our stage ended
                # at once, went in the burst that took the markers. A peer still waiting for
                # our broadcast then stops waiting, instead of at its deadline.
                self._timed_ends.append((waiting_since + LATE_END_AFTER_S, layout, step,
                                         bucket))
                first = min(bcast_budget, LATE_END_AFTER_S)
                bcast_hit = self._receive(state, state.bcast.over, first)
                self._send_late_ends(layout, step, bucket, self.end_copies)
                if bcast_hit:  # (the rest of the budget, which may be none: silent owners)
                    bcast_hit = self._receive(state, state.bcast.over,
                                              waiting_since + bcast_budget - time.monotonic(),
                                              state.bcast)
            else:
                bcast_hit = self._receive(state, state.bcast.over, bcast_budget, state.bcast)
            self.deadline.observe("broadcast:" + kind,
                                  max(state.bcast.last_at - waiting_since, 0.0))
            bcast_expected, bcast_missing = int(state.bcast.expected.sum()), state.bcast.left
        else:
            # The broadcast stage delivered in full (lossy_stage="reduce"): every owner's
            # shard over gloo, so no rank keeps a stale value.
            _reliable_broadcast(shared, layout, self.world)
            bcast_hit, bcast_expected, bcast_missing = False, 0, 0
        self.transport.counters.missing += reduce_missing + bcast_missing
        self.transport.counters.messages_incomplete += state.incomplete_messages()
        if reliable:
            # Peers may still need our datagrams again: serve them before leaving the step.
            if not self.transport.flush(time.monotonic() + RC_STAGE_TIMEOUT_S):
                raise RankLost(f"rank {self.rank}: RC datagrams still unacknowledged after "
                               f"{RC_STAGE_TIMEOUT_S:.0f} s: a peer died or lost the network")
            if reduce_missing or bcast_missing:
                raise RankLost(f"rank {self.rank}: RC step {step} incomplete after "
                               f"{RC_STAGE_TIMEOUT_S:.0f} s: a peer died or lost the network")
        self.deadline.end_step()
        self.totals["reduce_deadlines_hit"] += int(reduce_hit)
        self.totals["broadcast_deadlines_hit"] += int(bcast_hit)
        self.totals["collective_steps"] += 1
        return StepStats(step, time.monotonic() - state.started, reduce_expected,
                         reduce_missing, bcast_expected, bcast_missing, reduce_hit, bcast_hit)

    def _replay(self, state: _Step, stash: EarlyStash) -> None:
        """The packets that came for this step during the last one: its data packets and
        fragments in one call of the compiled core (a rank that fell behind catches up at
        its speed), the rest (end markers, packets of later steps) one at a time. Every
        verdict is counted (a kept packet can still be malformed or not finite) but that of
        one kept again for a later step, which was counted early when it came."""
        counters = self.transport.counters
        now, rest = [], []
        for unit in stash:
            (now if unit[0].step == state.step and unit[0].stage in hdr.STAGE_NAMES
             else rest).append(unit)
        if now:
            verdicts = state.handle_batch(*as_batch(now), self.transport.stash)
            for verdict, count in verdicts.items():
                count_verdict(counters, verdict, count)
        for head, payload in rest:
            verdict = state.handle(head, memoryview(payload), self.transport.stash)
            if verdict != EARLY:
                count_verdict(counters, verdict)

    # ---- what callers use ---------------------------------------------------------------

    def allreduce(self, tensor: torch.Tensor | np.ndarray, bucket: int = 0) -> StepStats:
        """In place: `tensor` (or a float32 numpy array) becomes the estimated mean over
        ranks (gradient mode)."""
        x = _flat_numpy(tensor)

        def write_mean(start, end, estimate):
            x[start:end] = estimate

        return self._run(x, x, bucket, write_mean)

    def sharded_update(self, grads: torch.Tensor, params: torch.Tensor, step_fn,
                       bucket: int = 0) -> StepStats:
        """Parameter mode. Gradients are reduced to their owners; the owner calls
        step_fn(start, end, mean_grad) to update params[start:end] in place; the owners'
        parameters are broadcast. A rank that misses a packet keeps its stale parameters."""
        if grads.numel() != params.numel():
            raise ValueError("grads and params must have the same number of elements")

        import torch

        def owner_step(start, end, estimate):
            # a copy: `estimate` lives in a buffer the next step reuses, and the optimizer
            # may keep the gradient it was given (as .grad)
            step_fn(start, end, torch.from_numpy(np.array(estimate, dtype=np.float32)))

        return self._run(_flat_numpy(grads), _flat_numpy(params), bucket, owner_step)

    def resync(self, params: torch.Tensor) -> None:
        """Make every rank's parameters equal to the owners' shards, reliably (gloo)."""
        flat = _flat_numpy(params)
        layout, _ = self._size(flat.size)
        _reliable_broadcast(flat, layout, self.world)

    # ---- step alignment and liveness --------------------------------------------------

    def _align(self, step: int) -> None:
        """All ranks start a step together, meeting in the rendezvous store (a reliable
        channel: TCP, so a lost segment is sent again, never lost; but in training its port
        crosses the same impaired links as the data (harness.train.run.impair_the_control_path),
        so under loss its round trips take longer). Without this, a rank that waited out a
        deadline in the last step would start this one late, and its packets would miss
        the others' deadlines: lateness would turn into loss. A rank that does not arrive
        within three deadline ceilings has died (or lost the network), and is named
        (within SETUP_PATIENCE_S at the first step, and at every step when one stage goes
        over gloo: TCP under loss can hold a rank that long).

        It costs two store round trips per rank and step, on the step's critical path: one
        counter of arrivals (its value says which round this is and who came last), and a
        wait for the round's release key, which the last to arrive sets. Release keys are
        reused in turn (GO_KEYS of them) so the store does not grow over a long run: the
        last arrival of round r clears the key of round r + 2 after releasing everyone.
        That key was last set in round r - 1, which everyone has passed; and no one can wait
        on it before round r + 1 is complete, which needs this rank to arrive there first."""
        if self.store is None:
            self._aligned_once = True
            return
        from datetime import timedelta

        prefix, ceiling = self.key_prefix, self.deadline.ceiling_s
        patience = 3 * ceiling
        if not self._aligned_once or not (self.lossy_reduce and self.lossy_broadcast):
            # The first step comes from setup (a model broadcast, a run boundary), which
            # crosses the impaired network over TCP: its retransmission backoff can hold one
            # rank back for seconds at high loss (CI: 6+ s at 30%), and that rank is late,
            # not lost. Later steps come straight from the step before, unless one of its
            # stages went over gloo (lossy_stage "reduce" or "broadcast"): then every step
            # crosses TCP under loss, and a segment lost five times running holds its
            # receiver 6 s (0.2 + 0.4 + ... + 3.2 s of backoff; CI: a rank declared lost
            # at 10% while its peer waited out a retransmission in the gloo broadcast).
            patience = max(patience, SETUP_PATIENCE_S)
        round_, arrived = None, None
        try:
            arrived = int(self.store.add(f"{prefix}/arrivals", 1))
            round_ = (arrived - 1) // self.world
            go = f"{prefix}/go/{round_ % GO_KEYS}"
            if arrived % self.world == 0:  # the last to arrive: release everyone
                self.store.set(go, "1")
                self.store.delete_key(f"{prefix}/go/{(round_ + 2) % GO_KEYS}")
            else:
                try:
                    self.store.wait([go], timedelta(seconds=ceiling))
                except Exception:
                    # Someone is late. Say that we are here, so that who is missing can be
                    # named if this goes on, then keep waiting.
                    self.store.set(f"{prefix}/present/{round_}/{self.rank}", str(step))
                    self.store.wait([go], timedelta(seconds=patience - ceiling))
        except Exception as err:
            # Give those who arrived up to one ceiling later time to say so, too.
            time.sleep(ceiling + 0.5)
            missing = self._absent(round_)
            if self.rank == 0:
                # Rank 0 hosts the store: linger so the other ranks can read from it who is
                # missing, instead of only seeing the store vanish when this process exits.
                time.sleep(2.0)
            if missing:
                raise RankLost(
                    f"rank {self.rank}: rank {', '.join(map(str, missing))} did not reach step "
                    f"{step} within {patience:.1f} s: it died or lost the network "
                    f"(this rank arrived {arrived} in round {round_})") from None
            raise RankLost(f"rank {self.rank}: the rendezvous store is unreachable ({err}): "
                           "rank 0, which hosts it, has died or lost its network") from None
        self._aligned_once = True  # later steps come straight from the one before

    def _absent(self, round_: int | None) -> list[int]:
        """The ranks that have not said they arrived at this round (none if the store
        cannot be read)."""
        if round_ is None:
            return []
        try:
            return [k for k in range(self.world) if k != self.rank and not self.store.check(
                [f"{self.key_prefix}/present/{round_}/{k}"])]
        except Exception:
            return []


def _reliable_mean(contribution: np.ndarray, world: int) -> np.ndarray:
    """The exact mean of every rank's contribution, over torch.distributed (a reduce stage
    that loses nothing)."""
    import torch

    from harness.collectives import process_group

    total = torch.from_numpy(np.array(contribution, dtype=np.float32))
    process_group.all_reduce_(total)
    return (total / world).numpy()


def _reliable_broadcast(shared: np.ndarray, layout: Layout, world: int) -> None:
    """Every owner's shard of `shared` to every rank, in place, over torch.distributed (a
    broadcast stage that loses nothing)."""
    import torch

    from harness.collectives import process_group

    for shard in range(world):
        start, end = layout.shard_bounds(shard)
        if end > start:
            view = torch.from_numpy(np.array(shared[start:end], dtype=np.float32))
            process_group.broadcast_(view, src=shard)
            shared[start:end] = view.numpy()


def _flat_numpy(tensor: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(tensor, np.ndarray):
        if tensor.dtype != np.float32 or not tensor.flags.c_contiguous:
            raise ValueError("the lossy collective works on contiguous float32 arrays (got "
                             f"{tensor.dtype}, contiguous={tensor.flags.c_contiguous})")
        return tensor.reshape(-1)
    import torch

    if tensor.dtype != torch.float32 or tensor.device.type != "cpu" \
            or not tensor.is_contiguous():
        raise ValueError("the lossy collective works on contiguous float32 CPU tensors "
                         f"(got {tensor.dtype} on {tensor.device}, contiguous="
                         f"{tensor.is_contiguous()}): copy into a staging buffer first")
    return tensor.view(-1).numpy()
