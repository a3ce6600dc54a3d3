"""One collective step as a receiver sees it: what it expects from every source in each stage
(reduce, broadcast), what has come, and how each packet is checked and applied.

This is where packets are rebuilt into the tensor: the compiled core (native.apply) checks a
batch of one stage's packets against what the stage expects and adds (reduce) or writes
(broadcast) their values into the target buffer; fragments of RoCE UC/RC messages wait in a
stage's staging area until their message is whole. The numpy reference the tests hold the
core against is tests/reference/numpy_apply.py.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from harness.collectives.layout import Layout
from harness.transport import header as hdr
from harness.transport import native
from harness.transport.early import EarlyStash
from harness.transport.verdicts import (
    APPLIED,
    DUPLICATE,
    EARLY,
    END,
    FUTURE,
    HELD,
    MALFORMED,
    NONFINITE,
    STALE,
    count_verdict,
)


@dataclass(kw_only=True)
class StepStats:
    """What one step of a lossy collective saw: packets expected and missing per stage, and
    whether each stage ended by its deadline."""

    step: int
    seconds: float
    reduce_expected: int
    reduce_missing: int
    broadcast_expected: int
    broadcast_missing: int
    reduce_deadline_hit: bool
    broadcast_deadline_hit: bool


class Stage:
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

    def fragments(self) -> native.Fragments | None:
        """Where native.apply reassembles this stage's fragments (None: none are cut)."""
        if self.staging is None:
            return None
        return native.Fragments(self.fragment_floats, self.staging, self.staging_base,
                                self.frag_got, self.frag_count)

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


class Step:
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
        self.reduce = Stage([self.own_packets * o for o in others],
                             [last_floats(rank)] * world, [0] * world, per_packet, self.total,
                             fragment_floats, reduce_staging)
        # broadcast: each other owner's shard, written into `shared` where it belongs. Safe
        # at any time: our contribution to that shard was sent before we began receiving.
        self.bcast = Stage([layout.packets(j) * o for j, o in enumerate(others)],
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

    def replay(self, kept: EarlyStash, stash: EarlyStash, counters) -> None:
        """The packets that came for this step during the last one (`kept`): its data
        packets and fragments in one call of the compiled core (a rank that fell behind
        catches up at its speed), the rest (end markers, packets of later steps, kept again
        in `stash`) one at a time. Every verdict is counted in `counters` (a kept packet can
        still be malformed or not finite) but that of one kept again for a later step, which
        was counted early when it came."""
        now, rest = [], []
        for unit in kept:
            (now if unit[0].step == self.step and unit[0].stage in hdr.STAGE_NAMES
             else rest).append(unit)
        if now:
            for verdict, count in self.handle_batch(*as_batch(now), stash).items():
                count_verdict(counters, verdict, count)
        for head, payload in rest:
            verdict = self.handle(head, memoryview(payload), stash)
            if verdict != EARLY:
                count_verdict(counters, verdict)

    def handle(self, head: hdr.Header, payload: memoryview, stash: EarlyStash) -> str:
        """One unit (an RC message, a packet kept early or left over from a batch) or a raw
        UC fragment: checked and applied by the compiled core like a batch of one
        (handle_batch).
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
        by the compiled core (native.apply; fragments held in the
        stage's staging area until their message is whole), the rare others (early, late,
        another bucket) one at a time. Packet i is the datagram in data[rows[i]]."""
        verdicts: Counter = Counter()
        leftover = np.empty(len(rows), dtype=np.int64)
        for stage, st in self.stages.items():
            reduce = stage == hdr.STAGE_REDUCE
            done = native.apply(
                data, rows, step=self.step, bucket=self.bucket, stage=stage,
                owner=self.rank if reduce else -1, expected=st.expected,
                last_floats=st.last_floats, base=st.base, per_packet=st.per_packet,
                target=st.target, got=st.got, pending=st.pending,
                ended=self.reduce.ended if not reduce and self.infer_ends else None,
                add=reduce, accept=self.accept_reduce or not reduce, leftover=leftover,
                fragments=st.fragments())
            for verdict, count in ((APPLIED, done.applied), (DUPLICATE, done.duplicates),
                                   (MALFORMED, done.malformed), (NONFINITE, done.nonfinite),
                                   (STALE, done.stale)):
                _tally(verdicts, verdict, count)
            if done.applied:
                st.left -= done.applied
                st.last_at = time.monotonic()
            if done.stale:
                self.late_stages.add(stage)
            for row in leftover[:done.others].tolist():
                head = hdr.unpack(data[row])
                payload = memoryview(data[row, hdr.HEADER_BYTES:hdr.HEADER_BYTES + head.length])
                verdicts[self.handle(head, payload, stash)] += 1
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
            self.reduce.ended[src] = True  # as its broadcast packets say (native.apply)
        return END


class StepBuffers:
    """What a collective keeps from step to step per tensor size, made once: its layout (the
    packet tables take a while to build) and the own shard's reduce sums (a fresh buffer
    per step costs more in page faults than its arithmetic), and where the transport cuts
    packets into fragments (UC, RC) their staging areas. Every step of a training run has
    the same sizes."""

    def __init__(self, transport):
        self.transport, self.rank, self.world = transport, transport.rank, transport.world
        # the values of a fragment where the batched transport cuts packets, else 0
        t = transport
        self.fragment_floats = (t.fragment_floats if t.batched
                                and t.fragment_floats < t.per_packet else 0)
        self._sizes: dict[int, tuple[Layout, np.ndarray]] = {}
        self._stagings: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def size(self, numel: int) -> tuple[Layout, np.ndarray]:
        """The layout of a tensor size and its sums buffer."""
        entry = self._sizes.get(numel)
        if entry is None:
            layout = Layout(numel, self.world, self.transport.per_packet)
            start, end = layout.shard_bounds(self.rank)
            entry = self._sizes[numel] = (layout, np.empty(end - start, np.float32))
        return entry

    def staging(self, numel: int, layout: Layout) -> tuple[np.ndarray, np.ndarray] | None:
        """Where UC and RC messages of a tensor size are reassembled (reduce: a region of
        the own shard's messages per source; broadcast: each other owner's messages); None
        where the transport sends every packet whole."""
        if self.fragment_floats == 0:
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


def _tally(verdicts: Counter, verdict: str, count: int) -> None:
    if count:
        verdicts[verdict] += count
