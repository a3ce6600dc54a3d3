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
would only add latency. The deadline remains for sources that fall silent (all markers lost,
a rank stalled or dead). On a path that reorders (netem delay with jitter), a packet
overtaken by the markers arrives after its stage ended and is counted late, not applied.
Ranks start each step together through the rendezvous store (a
reliable, unimpaired channel), so one rank's lateness never becomes another's loss; a rank
that does not arrive has died, and the others stop with a clear error naming it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from harness.collectives.deadline import Deadline
from harness.collectives.layout import Layout
from harness.collectives.rebuild import ESTIMATORS, rebuild
from harness.transport import header as hdr
from harness.transport.udp import APPLIED, DUPLICATE, END, FUTURE, MALFORMED, STALE

log = logging.getLogger(__name__)

EARLY = "early"
RC_STAGE_TIMEOUT_S = 60.0  # reliable semantics wait for everything, but not forever
MAX_STASH = 1 << 16
# Copies of each end marker. At 10% random loss all 4 are lost with probability 1e-4; each
# rank waits on 2 x (world - 1) sources per step, so with 4 ranks about 1 step in 400 still
# has a rank that waits out its deadline. They cost 4 header-only datagrams per shard sent.
END_COPIES = 4


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


class _Step:
    """What one rank expects and has received in one collective step."""

    def __init__(self, layout: Layout, step: int, bucket: int, rank: int,
                 contribution: np.ndarray, shared: np.ndarray):
        self.layout, self.step, self.bucket, self.rank = layout, step, bucket, rank
        self.shared = shared  # broadcast packets are written here
        world = layout.world
        self.own = layout.shard_bounds(rank)
        self.own_packets = layout.packets(rank)
        # float32 sums, like gloo's: at 0% loss the result matches it to rounding
        self.total = contribution[self.own[0]:self.own[1]].copy()
        self.reduce_got = np.zeros((world, self.own_packets), dtype=bool)
        self.reduce_left = (world - 1) * self.own_packets
        self.bcast_got = {j: np.zeros(layout.packets(j), dtype=bool)
                          for j in range(world) if j != rank}
        self.bcast_left = sum(len(v) for v in self.bcast_got.values())
        # Per stage and source: packets still missing, and whether its end markers came. A
        # source is settled when it has nothing missing or has ended; a stage is over when
        # every source is settled (sources_left == 0).
        self.pending = {hdr.STAGE_REDUCE: [self.own_packets] * world,
                        hdr.STAGE_BROADCAST: [layout.packets(j) for j in range(world)]}
        self.ended = {stage: [False] * world for stage in self.pending}
        self.sources_left = {stage: sum(1 for j in range(world) if j != rank and pending[j])
                             for stage, pending in self.pending.items()}
        self.accept_reduce = True
        self.late_stages: set[int] = set()  # stages whose packets came after they ended
        self.last_reduce_at = self.last_bcast_at = 0.0  # when the last packet came
        self.started = time.monotonic()

    def counts(self) -> np.ndarray:
        """Contributions per element of the own shard, own included."""
        per_packet = (1 + self.reduce_got.sum(axis=0)).astype(np.float32)
        # every packet of a shard holds per_packet values but the last, which holds the rest
        return np.repeat(per_packet, self.layout.per_packet)[:self.own[1] - self.own[0]]

    def handle(self, head: hdr.Header, payload: memoryview, stash: list) -> str:
        if head.stage in hdr.DATA_STAGE_OF_END:
            return self._end(head, stash)
        if head.step != self.step:
            if head.step < self.step:
                if head.stage in hdr.STAGE_NAMES:
                    self.late_stages.add(head.stage)
                return STALE
            if head.step == self.step + 1 and len(stash) < MAX_STASH:
                stash.append((head, bytes(payload)))
                return EARLY
            return FUTURE
        if head.bucket != self.bucket:
            return MALFORMED
        values = np.frombuffer(payload, dtype=np.float32) if len(payload) % 4 == 0 else None
        return self._apply(head.stage, head.source, head.shard, head.index, head.count,
                           head.length, values)

    def handle_batch(self, heads: np.ndarray, data: np.ndarray, rows: np.ndarray,
                     stash: list) -> Counter:
        """handle() for a batch of plain data packets (see UdpTransport.receive_until),
        with the header fields read as arrays once. Packet i's payload is
        data[rows[i], HEADER_BYTES:HEADER_BYTES + length]."""
        verdicts: Counter = Counter()
        first = hdr.HEADER_BYTES
        this_step = (heads["step"] == self.step) & (heads["bucket"] == self.bucket)
        for i in np.flatnonzero(~this_step).tolist():  # rare: early, late or foreign bucket
            head = hdr.Header._make(heads[i].item())
            payload = memoryview(data[rows[i], first:first + head.length])
            verdicts[self.handle(head, payload, stash)] += 1
        keep = np.flatnonzero(this_step)
        columns = zip(rows[keep].tolist(), heads["stage"][keep].tolist(),
                      heads["source"][keep].tolist(), heads["shard"][keep].tolist(),
                      heads["index"][keep].tolist(), heads["count"][keep].tolist(),
                      heads["length"][keep].tolist(), strict=True)
        for row, stage, src, shard, index, count, length in columns:
            values = data[row, first:first + length].view(np.float32)
            verdicts[self._apply(stage, src, shard, index, count, length, values)] += 1
        return verdicts

    def _apply(self, stage: int, src: int, shard: int, index: int, count: int, length: int,
               values: np.ndarray | None) -> str:
        """Check one packet of this step against what is expected, and apply it."""
        if values is None:
            return MALFORMED
        if stage == hdr.STAGE_REDUCE:
            if shard != self.rank or count != self.own_packets or index >= self.own_packets:
                return MALFORMED
            start, end = self.layout.packet_bounds(self.rank, index)
            if length != 4 * (end - start):
                return MALFORMED
            if self.reduce_got[src, index]:
                return DUPLICATE
            if not self.accept_reduce:
                self.late_stages.add(hdr.STAGE_REDUCE)
                return STALE  # the shard was already rebuilt and sent
            self.total[start - self.own[0]:end - self.own[0]] += values
            self.reduce_got[src, index] = True
            self.reduce_left -= 1
            self._arrived(stage, src)
            self.last_reduce_at = time.monotonic()
            return APPLIED
        if stage == hdr.STAGE_BROADCAST:
            got = self.bcast_got.get(src)
            if got is None or shard != src or count != len(got) or index >= len(got):
                return MALFORMED
            start, end = self.layout.packet_bounds(src, index)
            if length != 4 * (end - start):
                return MALFORMED
            if got[index]:
                return DUPLICATE
            # Safe at any time: this rank's contribution to shard `src` was sent before it
            # started receiving.
            self.shared[start:end] = values
            got[index] = True
            self.bcast_left -= 1
            self._arrived(stage, src)
            self.last_bcast_at = time.monotonic()
            return APPLIED
        return MALFORMED

    def _arrived(self, stage: int, src: int) -> None:
        pending = self.pending[stage]
        pending[src] -= 1
        if pending[src] == 0 and not self.ended[stage][src]:
            self.sources_left[stage] -= 1

    def _end(self, head: hdr.Header, stash: list) -> str:
        """An end marker: its source has sent every packet it had for us in that stage."""
        if head.step != self.step:
            if head.step == self.step + 1 and len(stash) < MAX_STASH:
                stash.append((head, b""))
                return EARLY
            return END  # another copy, after its step was over: nothing to learn
        if head.bucket != self.bucket:
            return MALFORMED
        stage, src = hdr.DATA_STAGE_OF_END[head.stage], head.source
        expected_count = self.own_packets if stage == hdr.STAGE_REDUCE else len(
            self.bcast_got.get(src, ()))
        expected_shard = self.rank if stage == hdr.STAGE_REDUCE else src
        if (head.shard != expected_shard or head.count != expected_count
                or head.index != head.count or head.length != 0):
            return MALFORMED
        if not self.ended[stage][src]:
            self.ended[stage][src] = True
            if self.pending[stage][src] > 0:
                self.sources_left[stage] -= 1
        return END


class LossyCollective:
    def __init__(self, transport, store=None, *, estimator: str = "received_mean",
                 deadline: Deadline | None = None, key_prefix: str = "lossbed/collective",
                 end_copies: int = END_COPIES):
        if estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {estimator!r}: use one of "
                             f"{', '.join(ESTIMATORS)}")
        self.transport = transport
        self.store = store
        self.estimator = estimator
        self.deadline = deadline or Deadline()
        # 0: no end markers, every stage waits for all its packets or its deadline (for
        # paths that reorder a lot)
        self.end_copies = end_copies
        self.rank, self.world = transport.rank, transport.world
        self.key_prefix = key_prefix
        self._reduce_expected = 0
        self._reduce_missing = 0

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
        self.transport.send_packets(dest, stage, step, bucket, shard, x, starts, ends)
        if len(starts) and self.end_copies and not self.transport.semantics.reliable:
            self.transport.send_end(dest, stage, step, bucket, shard, len(starts),
                                    self.end_copies)

    def _receive(self, state: _Step, until, budget: float) -> bool:
        """Receive until `until()` or the budget runs out; True if the deadline was hit."""
        deadline = time.monotonic() + budget

        def handle(head, payload):
            return state.handle(head, payload, self.transport.stash)

        def handle_batch(heads, data, rows):
            return state.handle_batch(heads, data, rows, self.transport.stash)

        self.transport.receive_until(deadline, until, handle, handle_batch)
        for stage in state.late_stages:
            self.deadline.late(hdr.STAGE_NAMES[stage])
        state.late_stages.clear()
        return not until()

    def _run(self, contribution: np.ndarray, shared: np.ndarray, bucket: int,
             on_reduced) -> StepStats:
        """One step. `contribution` is what this rank sends to the owners (gradients);
        `shared` is what owners broadcast and everyone receives into (the result, or the
        parameters). on_reduced(start, end, estimate) writes the owner's shard of `shared`."""
        layout = Layout(contribution.size, self.world, self.transport.per_packet)
        # Steps are numbered by the transport, so collectives sharing it (several
        # estimators, or a collective and RPS) never take each other's packets.
        step = self.transport.next_step()
        self._align(step)
        state = _Step(layout, step, bucket, self.rank, contribution, shared)
        stash, self.transport.stash = self.transport.stash, []
        for head, payload in stash:  # packets of this step that came during the last one
            verdict = state.handle(head, memoryview(payload), self.transport.stash)
            if verdict == APPLIED:
                self.transport.counters.packets_received += 1
            elif verdict == END:
                self.transport.counters.ends_received += 1

        # Reduce: our contribution to every other owner, then wait for ours.
        for shard in range(self.world):
            if shard != self.rank:
                self._send_shard(layout, contribution, hdr.STAGE_REDUCE, shard, shard, step,
                                 bucket)
        kind = f"{contribution.size}"
        reduce_since = time.monotonic()
        reliable = self.transport.semantics.reliable
        reduce_budget = RC_STAGE_TIMEOUT_S if reliable else self.deadline.budget("reduce:" + kind)
        left = state.sources_left
        reduce_hit = self._receive(state, lambda: left[hdr.STAGE_REDUCE] == 0, reduce_budget)
        self.deadline.observe("reduce:" + kind, max(state.last_reduce_at - reduce_since, 0.0))
        state.accept_reduce = False
        reduce_expected = (self.world - 1) * state.own_packets
        reduce_missing = state.reduce_left
        self._reduce_expected += reduce_expected
        self._reduce_missing += reduce_missing
        start, end = state.own
        on_reduced(start, end, rebuild(self.estimator, state.total, state.counts(),
                                       contribution[start:end], self.world, self.loss_rate))

        # Broadcast: our shard to everyone, then wait for the others'.
        for dest in range(self.world):
            if dest != self.rank:
                self._send_shard(layout, shared, hdr.STAGE_BROADCAST, self.rank, dest, step,
                                 bucket)
        # An owner broadcasts once its own reduce stage ends, which may be a whole reduce
        # budget after ours did (we had everything, it waited for a lost packet): the
        # broadcast deadline counts from the start of the reduce stage and includes it.
        waiting_since = time.monotonic()
        bcast_budget = (reduce_since + reduce_budget - waiting_since
                        + (RC_STAGE_TIMEOUT_S if reliable
                           else self.deadline.budget("broadcast:" + kind)))
        bcast_hit = self._receive(state, lambda: left[hdr.STAGE_BROADCAST] == 0, bcast_budget)
        self.deadline.observe("broadcast:" + kind, max(state.last_bcast_at - waiting_since, 0.0))

        self.transport.counters.missing += reduce_missing + state.bcast_left
        if reliable:
            # Peers may still need our datagrams again: serve them before leaving the step.
            if not self.transport.flush(time.monotonic() + RC_STAGE_TIMEOUT_S):
                raise RankLost(f"rank {self.rank}: RC datagrams still unacknowledged after "
                               f"{RC_STAGE_TIMEOUT_S:.0f} s: a peer died or lost the network")
            if state.reduce_left or state.bcast_left:
                raise RankLost(f"rank {self.rank}: RC step {step} incomplete after "
                               f"{RC_STAGE_TIMEOUT_S:.0f} s: a peer died or lost the network")
        self.deadline.end_step()
        return StepStats(step, time.monotonic() - state.started, reduce_expected,
                         reduce_missing, sum(len(v) for v in state.bcast_got.values()),
                         state.bcast_left, reduce_hit, bcast_hit)

    # ---- what callers use ---------------------------------------------------------------

    def allreduce(self, tensor: torch.Tensor, bucket: int = 0) -> StepStats:
        """In place: `tensor` becomes the estimated mean over ranks (gradient mode)."""
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

        def owner_step(start, end, estimate):
            step_fn(start, end, torch.from_numpy(np.ascontiguousarray(estimate,
                                                                      dtype=np.float32)))

        return self._run(_flat_numpy(grads), _flat_numpy(params), bucket, owner_step)

    def resync(self, params: torch.Tensor) -> None:
        """Make every rank's parameters equal to the owners' shards, reliably (gloo)."""
        import torch.distributed as dist

        flat = params.view(-1)
        layout = Layout(flat.numel(), self.world, self.transport.per_packet)
        for shard in range(self.world):
            start, end = layout.shard_bounds(shard)
            if end > start:
                view = flat[start:end].clone()
                dist.broadcast(view, src=shard)
                flat[start:end] = view

    # ---- step alignment and liveness --------------------------------------------------

    def _align(self, step: int) -> None:
        """All ranks start a step together, meeting in the rendezvous store (a reliable
        channel: its port is never impaired). Without this, a rank that waited out a
        deadline in the last step would start this one late, and its packets would miss
        the others' deadlines: lateness would turn into loss. A rank that does not arrive
        within three deadline ceilings has died (or lost the network), and is named."""
        if self.store is None:
            return
        from datetime import timedelta

        prefix = self.key_prefix
        patience = 3 * self.deadline.ceiling_s
        try:
            self.store.set(f"{prefix}/hb/{self.rank}", str(step))
            if int(self.store.add(f"{prefix}/step/{step}", 1)) == self.world:
                self.store.set(f"{prefix}/go/{step}", "1")
                if step >= 2:  # keep the store small over long runs
                    for key in (f"{prefix}/step/{step - 2}", f"{prefix}/go/{step - 2}"):
                        self.store.delete_key(key)
            else:
                self.store.wait([f"{prefix}/go/{step}"], timedelta(seconds=patience))
        except Exception as err:
            missing = self._absent(step)
            if self.rank == 0:
                # Rank 0 hosts the store: linger so the other ranks can read from it who is
                # missing, instead of only seeing the store vanish when this process exits.
                time.sleep(2.0)
            if missing:
                raise RankLost(
                    f"rank {self.rank}: rank {', '.join(map(str, missing))} did not reach step "
                    f"{step} within {patience:.1f} s: it died or lost the network") from None
            raise RankLost(f"rank {self.rank}: the rendezvous store is unreachable ({err}): "
                           "rank 0, which hosts it, has died or lost its network") from None

    def _absent(self, step: int) -> list[int]:
        try:
            return [k for k in range(self.world)
                    if int(self.store.get(f"{self.key_prefix}/hb/{k}")) < step]
        except Exception:
            return []


def _flat_numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype != torch.float32 or tensor.device.type != "cpu" \
            or not tensor.is_contiguous():
        raise ValueError("the lossy collective works on contiguous float32 CPU tensors "
                         f"(got {tensor.dtype} on {tensor.device}, contiguous="
                         f"{tensor.is_contiguous()}): copy into a staging buffer first")
    return tensor.view(-1).numpy()
