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
everything or said that it sent everything (end markers: end_markers.py), or when its
deadline passes (deadline.py). A path keeps a source's packets in order, so what is still
missing once its markers came was lost, and waiting longer would only add latency. A
source's broadcast packets also end its reduce stage: it broadcasts only after sending us
all its reduce packets. The deadline remains for sources that fall silent (all markers
lost, a rank stalled or dead). On a path that reorders (netem delay with jitter), a packet
overtaken by the markers arrives after its stage ended and is counted late, not applied.

The rooms: step.py holds what one step expects and has received (where packets are
rebuilt), end_markers.py the late markers, alignment.py the meeting of the ranks in the
store (every align_every-th step; training aligns at the first step only, as the store
crosses the same lossy links). lossy_stage="reduce" or "broadcast" puts the loss on that
stage alone and sends the other over torch.distributed (delivered in full), to tell which
stage a result comes from.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from harness.collectives import end_markers, pipeline
from harness.collectives.alignment import RankLost, StepAlignment
from harness.collectives.deadline import Deadline
from harness.collectives.end_markers import END_COPIES, LateEndSender
from harness.collectives.layout import Layout
from harness.collectives.pipeline import EarlyBroadcast
from harness.collectives.rebuild import ESTIMATORS, rebuild
from harness.collectives.step import Stage, Step, StepBuffers, StepStats
from harness.names import LOSSY_STAGES
from harness.transport import header as hdr

if TYPE_CHECKING:
    # torch is imported only where tensors come in: the collective itself is numpy's, and a
    # host that runs it torch-free (a VM under TCG) saves the minute torch takes to import
    import torch

__all__ = ["LOSSY_STAGES", "LossyCollective", "RankLost", "StepStats"]

log = logging.getLogger(__name__)

RC_STAGE_TIMEOUT_S = 60.0  # reliable semantics wait for everything, but not forever
# Which stages cross the lossy transport (lossy_stage): the other one goes over
# torch.distributed (gloo: TCP, which retransmits what the kernel drops), so that a Δppl can
# be attributed to the stage that caused it. "both" is the scheme itself.


class LossyCollective:
    """The lossy all-reduce of one rank over `transport` (harness/transport/contract.py),
    its ranks meeting in `store` (see alignment.py)."""

    def __init__(self, transport, store=None, *, estimator: str = "received_mean",
                 deadline: Deadline | None = None, key_prefix: str = "lossbed/collective",
                 end_copies: int = END_COPIES, align_every: int = 1,
                 wait_for_all: bool = False, lossy_stage: str = "both",
                 background_late_ends: bool = False, pipelined: bool = True):
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
        self.rank, self.world = transport.rank, transport.world
        self.estimator = estimator
        self.deadline = deadline or Deadline()
        # Start every align_every-th step together (1: every step, 0: never); every rank
        # numbers steps alike, so all align at the same ones. The first step always is: the
        # ranks come to it from setup, each in its own time, and that difference would
        # otherwise become loss at zero loss.
        self.align_every = align_every
        self.alignment = StepAlignment(store, self.rank, self.world, key_prefix,
                                       self.deadline,
                                       gloo_every_step=lossy_stage != "both")
        # 0: no end markers, every stage waits for all its packets or its deadline (for
        # paths that reorder a lot)
        self.end_copies = end_copies
        # A lossless reference (a bench's rps at 0%): every stage waits for all its packets
        # (up to RC_STAGE_TIMEOUT_S), so a rank that falls behind costs time, not packets;
        # with deadlines on 2 shared cores a reference was one perturbed run. Nothing is
        # retransmitted: what is still missing after the timeout is counted missing.
        self.wait_for_all = wait_for_all
        self._reduce_expected = 0
        self._reduce_missing = 0
        # Running totals a caller reads around a training step, to say why it was slow
        # (broadcast_early_packets: own packets broadcast before the reduce stage ended)
        self.totals = {"align_s": 0.0, "reduce_deadlines_hit": 0, "broadcast_deadlines_hit": 0,
                       "collective_steps": 0, "broadcast_early_packets": 0}
        self.buffers = StepBuffers(transport)
        # The transport is one thread's at a time (its use_lock): a step holds it, and so
        # does the late markers' background sender for each send it makes between steps.
        self._turn = threading.Condition(transport.use_lock)
        self.late_ends = LateEndSender(transport, self.rank, self.world, self._turn,
                                       background=background_late_ends)
        # whole packets of the own shard broadcast while the rest of its reduce stage comes
        self.pipelined = pipelined and pipeline.applies(transport, estimator, lossy_stage,
                                                        self.buffers.fragment_floats)

    @property
    def loss_rate(self) -> float:
        """Fraction of expected reduce packets that did not arrive, over the run so far."""
        if not self._reduce_expected:
            return 0.0
        return self._reduce_missing / self._reduce_expected

    @property
    def background_sender_alive(self) -> bool:
        return self.late_ends.alive

    def finish(self) -> None:
        """After a run's last step: the late end markers still to go, for a peer still
        waiting for them (end_markers.LateEndSender.finish)."""
        self.late_ends.finish()

    # ---- one step -------------------------------------------------------------------------

    def _send_shard(self, layout: Layout, x: np.ndarray, stage: int, shard: int, dest: int,
                    step: int, bucket: int, only: np.ndarray | None = None) -> None:
        """A shard's packets (`only` those, by index) to `dest`, then its end markers."""
        starts, ends = layout.packet_arrays(shard)
        copies = 0 if self.transport.semantics.reliable else self.end_copies
        if only is None or len(only) == len(starts):
            self.transport.send_packets(dest, stage, step, bucket, shard, x, starts, ends,
                                        copies)
        else:
            self.transport.send_packets(dest, stage, step, bucket, shard, x, starts[only],
                                        ends[only], copies, indexes=only, count=len(starts))

    def _receive_until(self, deadline: float, until, handle, handle_batch) -> None:
        """transport.receive_until, sending late end markers as they fall due meanwhile."""
        while True:
            due = self.late_ends.send_due()
            self.transport.receive_until(min(deadline, due), until, handle, handle_batch)
            if until() or time.monotonic() >= deadline:
                self.late_ends.send_due()
                return

    def _receive(self, state: Step, until, budget: float, stage: Stage | None = None,
                 after_batch=None) -> bool:
        """Receive until `until()` or the budget runs out; True if the deadline was hit.

        With `stage`, lateness is told from loss: a source of that stage that has sent us
        nothing yet (stage.silent) is waited for, up to the deadline's ceiling from the
        start of this wait, and a source first heard from since the last look gets one more
        budget for the rest of its packets. Only then is what is still missing lost: on a
        loaded machine a peer still computing its backward pass is not a lossy link.
        after_batch(), if given, runs after every batch received (the pipelined broadcast)."""
        started = time.monotonic()
        deadline = started + budget

        def handle(head, payload):
            return state.handle(head, payload, self.transport.stash)

        def handle_batch(data, rows):
            verdicts = state.handle_batch(data, rows, self.transport.stash)
            if after_batch is not None:
                after_batch()
            return verdicts

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
             on_reduced, pipelined: bool = False) -> StepStats:
        """One step. `contribution` is what this rank sends to the owners (gradients);
        `shared` is what owners broadcast and everyone receives into (the result, or the
        parameters). on_reduced(start, end, estimate) writes the owner's shard of `shared`.
        pipelined: whether the own shard may be broadcast packet by packet as it becomes
        whole (where on_reduced only writes the estimate: pipeline.py)."""
        with self._turn:  # (the transport is the step's until it ends)
            self.late_ends.raise_error()
            stats = self._run_step(contribution, shared, bucket, on_reduced,
                                   pipelined and self.pipelined)
            self.late_ends.step_ended()
        return stats

    def _run_step(self, contribution: np.ndarray, shared: np.ndarray, bucket: int,
                  on_reduced, pipelined: bool) -> StepStats:
        layout, total = self.buffers.size(contribution.size)
        # Steps are numbered by the transport, so collectives sharing it (several
        # estimators, or a collective and RPS) never take each other's packets.
        step = self.transport.next_step()
        self.late_ends.send_due()  # (those of our last step that fell due since it ended)
        if not self.alignment.aligned_once or (self.align_every
                                               and step % self.align_every == 0):
            aligning = time.monotonic()
            self.alignment.align(step)
            self.totals["align_s"] += time.monotonic() - aligning
        state = Step(layout, step, bucket, self.rank, contribution, shared, total,
                     infer_ends=self.end_copies > 0,
                     fragment_floats=self.buffers.fragment_floats,
                     staging=self.buffers.staging(contribution.size, layout))
        state.replay(self.transport.take_stash(), self.transport.stash, self.transport.counters)
        reliable = self.transport.semantics.reliable
        early = (EarlyBroadcast(self.transport, state, layout, shared, self.estimator)
                 if pipelined else None)
        reduce_hit, reduce_since = self._reduce(state, layout, contribution, on_reduced, early)
        bcast_hit = self._broadcast(state, layout, shared, reduce_since, early)
        reduce_expected = int(state.reduce.expected.sum()) if self.lossy_reduce else 0
        reduce_missing = state.reduce.left if self.lossy_reduce else 0
        bcast_expected = int(state.bcast.expected.sum()) if self.lossy_broadcast else 0
        bcast_missing = state.bcast.left if self.lossy_broadcast else 0
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
        return StepStats(step=step, seconds=time.monotonic() - state.started,
                         reduce_expected=reduce_expected, reduce_missing=reduce_missing,
                         broadcast_expected=bcast_expected, broadcast_missing=bcast_missing,
                         reduce_deadline_hit=reduce_hit, broadcast_deadline_hit=bcast_hit)

    def _patient(self) -> bool:
        """Whether a stage waits for everything (reliable semantics, a lossless reference)
        instead of its deadline."""
        return self.transport.semantics.reliable or self.wait_for_all

    def _reduce(self, state: Step, layout: Layout, contribution: np.ndarray,
                on_reduced, early: EarlyBroadcast | None) -> tuple[bool, float]:
        """The reduce stage: our contribution to every other owner, then wait for ours and
        rebuild the own shard, broadcasting its whole packets meanwhile if `early`.
        (Whether the deadline was hit, when our waiting began.)"""
        start, end = state.own
        if not self.lossy_reduce:
            # delivered in full (lossy_stage="broadcast"): the exact mean
            state.accept_reduce = False
            on_reduced(start, end, _reliable_mean(contribution, self.world)[start:end])
            return False, time.monotonic()
        step, bucket, kind = state.step, state.bucket, f"reduce:{contribution.size}"
        for shard in range(self.world):
            if shard != self.rank:
                self._send_shard(layout, contribution, hdr.STAGE_REDUCE, shard, shard, step,
                                 bucket)
        since = time.monotonic()
        budget = RC_STAGE_TIMEOUT_S if self._patient() else self.deadline.budget(kind)
        hit = self._receive(state, state.reduce.over, budget, state.reduce,
                            early.after_batch if early is not None else None)
        self.deadline.observe(kind, max(state.reduce.last_at - since, 0.0))
        state.accept_reduce = False
        self._reduce_expected += int(state.reduce.expected.sum())
        self._reduce_missing += state.reduce.left
        if early is not None:  # (gradient mode: what on_reduced would write, written)
            early.rebuild_rest(state.counts())
            return hit, since
        # rebuilt in place: the sums are not needed once the estimate is made
        on_reduced(start, end, rebuild(self.estimator, state.total, state.counts(),
                                       contribution[start:end], self.world, self.loss_rate,
                                       out=state.total))
        return hit, since

    def _broadcast(self, state: Step, layout: Layout, shared: np.ndarray,
                   reduce_since: float, early: EarlyBroadcast | None) -> bool:
        """The broadcast stage: our shard to everyone (what `early` did not send yet), then
        wait for the others'. Whether the deadline was hit."""
        if not self.lossy_broadcast:
            # delivered in full (lossy_stage="reduce"): every owner's shard over gloo, so no
            # rank keeps a stale value
            _reliable_broadcast(shared, layout, self.world)
            return False
        step, bucket, kind = state.step, state.bucket, f"broadcast:{shared.size}"
        rest = early.rest() if early is not None else None
        if rest is not None:
            self.totals["broadcast_early_packets"] += early.packets - len(rest)
        for dest in range(self.world):
            if dest != self.rank:
                self._send_shard(layout, shared, hdr.STAGE_BROADCAST, self.rank, dest, step,
                                 bucket, rest)
        # An owner broadcasts once its own reduce stage ends, which may be long after ours
        # did: until then it is silent, and _receive waits for it up to the ceiling, then
        # gives it one more budget. So the broadcast's deadline is its own budget, from now,
        # at least as long as our reduce took (the deadline's multiplier of it).
        since = time.monotonic()
        budget = (RC_STAGE_TIMEOUT_S if self._patient() else self.deadline.budget(
            kind, first_at_least=self.deadline.multiplier * (since - reduce_since)))
        if self.end_copies and not self.transport.semantics.reliable:
            # Say again, a little later, that our broadcast went out (end_markers.py): when
            # our own stage ends if sooner than LATE_END_AFTER_S, and once more at
            # LATE_END_AFTER_S in any case, from this wait or our next step's.
            self.late_ends.schedule(since, layout, step, bucket)
            hit = self._receive(state, state.bcast.over,
                                min(budget, end_markers.LATE_END_AFTER_S))
            self.late_ends.send(layout, step, bucket, self.end_copies)
            if hit:  # (the rest of the budget, which may be none: silent owners)
                hit = self._receive(state, state.bcast.over,
                                    since + budget - time.monotonic(), state.bcast)
        else:
            hit = self._receive(state, state.bcast.over, budget, state.bcast)
        self.deadline.observe(kind, max(state.bcast.last_at - since, 0.0))
        return hit

    # ---- what callers use ---------------------------------------------------------------

    def allreduce(self, tensor: torch.Tensor | np.ndarray, bucket: int = 0) -> StepStats:
        """In place: `tensor` (or a float32 numpy array) becomes the estimated mean over
        ranks (gradient mode)."""
        x = _flat_numpy(tensor)

        def write_mean(start, end, estimate):
            x[start:end] = estimate

        return self._run(x, x, bucket, write_mean, pipelined=True)

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
        layout, _ = self.buffers.size(flat.size)
        _reliable_broadcast(flat, layout, self.world)


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
