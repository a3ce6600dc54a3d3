"""The lossy collective of N ranks that live in one process (the many-rank mode), without
sockets and without deadlines: what each packet's fate is comes from a loss process, not
from a clock, so 64 ranks on 2 cores lose what the process drops and nothing more.

Each rank's MemoryCollective offers what lossbed's optimizers call on the real one
(harness/collectives/lossy.py): allreduce (RPS's averaging, the gradient variants),
sharded_update (bounded drift's owners) and resync. The stages are the real ones: the same
layout (harness/collectives/layout.py: shards, MTU-sized packets), the same step numbers,
the owner's rebuild by the production estimator (harness/collectives/rebuild.py) from the
packets that arrived, its own always included; in the broadcast a rank that misses a packet
keeps its own values there. Which packets arrive is a Fate's answer per (receiver, source,
step, stage, shard, packet): fates.py.

The ranks call in lockstep, as ranks of a job do; each call passes barriers at the points
where the real stages wait for their packets, so what a rank reads of another's buffers is
what that rank sent. Sums are made in source order (own first): the real transport sums in
arrival order, so the two differ by float32 rounding only.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np

from harness.collectives.layout import Layout
from harness.collectives.rebuild import rebuild
from harness.collectives.step import StepStats
from harness.transport import header as hdr


def per_packet_at(mtu: int, transport: str = "udp") -> int:
    """float32 values per packet at an MTU: what the transport puts in one unit it loses
    or keeps whole (harness/transport/semantics.py)."""
    from harness.transport.semantics import Semantics

    return Semantics.parse(transport).slot_floats(mtu)


class MemoryExchange:
    """Where the N ranks' calls meet: one per run. fate: which packets arrive (fates.py)."""

    def __init__(self, world: int, per_packet: int, fate, estimator: str = "received_mean"):
        if world < 2:
            raise ValueError("a lossy collective needs 2 ranks or more")
        self.world, self.per_packet, self.fate, self.estimator = world, per_packet, fate, estimator
        self.barrier = threading.Barrier(world)
        # One rank computes at a time: 64 threads contending for the GIL over small numpy
        # and torch operations spend more time handing it over than computing (measured:
        # 8 s a step at n = 64 without this). A rank waits for its turn on a lock, which
        # costs nothing while it waits.
        self.turn = threading.Lock()
        self.sent: list[np.ndarray | None] = [None] * world    # what each rank contributes
        self.shared: list[np.ndarray | None] = [None] * world  # what each receives into
        self._layouts: dict[int, Layout] = {}

    def layout(self, numel: int) -> Layout:
        if numel not in self._layouts:
            self._layouts[numel] = Layout(numel, self.world, self.per_packet)
        return self._layouts[numel]

    def collective(self, rank: int) -> MemoryCollective:
        return MemoryCollective(self, rank)


class MemoryCollective:
    """One rank's side of the exchange, with the interface of LossyCollective that
    ShardedOptimizer and RPSOptimizer use."""

    def __init__(self, exchange: MemoryExchange, rank: int):
        self.exchange, self.rank, self.world = exchange, rank, exchange.world
        self.estimator = exchange.estimator
        # what the optimizers read of the transport: the values per packet
        self.transport = SimpleNamespace(per_packet=exchange.per_packet, rank=rank,
                                         world=exchange.world)
        self.step = 0  # numbered as the transport numbers them: every call is one step
        self._reduce_expected = 0
        self._reduce_missing = 0
        self.missing = 0   # packets this rank did not receive, both stages
        self.expected = 0
        self.totals = {"align_s": 0.0, "reduce_deadlines_hit": 0, "broadcast_deadlines_hit": 0,
                       "collective_steps": 0}

    @property
    def loss_rate(self) -> float:
        if not self._reduce_expected:
            return 0.0
        return self._reduce_missing / self._reduce_expected

    # ---- what callers use (LossyCollective's) ----------------------------------------------

    def allreduce(self, tensor, bucket: int = 0) -> StepStats:
        x = _flat_numpy(tensor)

        def write_mean(start, end, estimate):
            x[start:end] = estimate

        return self._run(x, x, write_mean)

    def sharded_update(self, grads, params, step_fn, bucket: int = 0) -> StepStats:
        import torch

        if grads.numel() != params.numel():
            raise ValueError("grads and params must have the same number of elements")

        def owner_step(start, end, estimate):
            step_fn(start, end, torch.from_numpy(np.array(estimate, dtype=np.float32)))

        return self._run(_flat_numpy(grads), _flat_numpy(params), owner_step)

    def resync(self, params) -> None:
        """Every rank's parameters equal to the owners' shards (reliably)."""
        flat = _flat_numpy(params)
        ex = self.exchange
        layout = ex.layout(flat.size)
        ex.shared[self.rank] = flat
        ex.barrier.wait()
        for owner in range(self.world):
            if owner != self.rank:
                start, end = layout.shard_bounds(owner)
                flat[start:end] = ex.shared[owner][start:end]
        ex.barrier.wait()

    def finish(self) -> None:
        pass

    # ---- one step ----------------------------------------------------------------------------

    def _run(self, contribution: np.ndarray, shared: np.ndarray, on_reduced) -> StepStats:
        ex, rank = self.exchange, self.rank
        layout = ex.layout(contribution.size)
        step = self.step
        self.step += 1
        start, end = layout.shard_bounds(rank)
        ex.sent[rank], ex.shared[rank] = contribution, shared
        ex.barrier.wait()  # every rank's contribution is out
        with ex.turn:
            estimate, expected, missing = self._reduce(layout, step, contribution)
        ex.barrier.wait()  # every owner has read what it was sent: the buffers may change
        on_reduced(start, end, estimate)
        ex.barrier.wait()  # every owner's shard is written
        with ex.turn:
            b_expected, b_missing = self._broadcast(layout, step, shared)
        ex.barrier.wait()  # every rank has read the owners' shards: the step is over
        self.expected += expected + b_expected
        self.missing += missing + b_missing
        self.totals["collective_steps"] += 1
        return StepStats(step=step, seconds=0.0, reduce_expected=expected,
                         reduce_missing=missing, broadcast_expected=b_expected,
                         broadcast_missing=b_missing, reduce_deadline_hit=False,
                         broadcast_deadline_hit=False)

    def _reduce(self, layout: Layout, step: int, contribution: np.ndarray):
        """Our shard rebuilt from the packets of it that arrived: (estimate, expected,
        missing)."""
        ex, rank, world = self.exchange, self.rank, self.world
        start, end = layout.shard_bounds(rank)
        # the reduce stage: every other rank's packets of our shard, each arrived or not
        own_packets = layout.packets(rank)
        sends = [0 if s == rank else own_packets for s in range(world)]
        arrived = ex.fate.arrivals(rank, step, hdr.STAGE_REDUCE, sends)
        expected = sum(sends)
        missing = expected - sum(int(a.sum()) for a in arrived)
        total = contribution[start:end].copy()  # own first, then the sources in order
        got_per_packet = np.ones(own_packets, dtype=np.float32)  # own included
        for source in range(world):
            if source == rank or not own_packets:
                continue
            theirs = ex.sent[source][start:end]
            if arrived[source].all():
                total += theirs
            else:
                keep = _elements(arrived[source], layout.per_packet, end - start)
                total += np.where(keep, theirs, np.float32(0))
            got_per_packet += arrived[source]
        self._reduce_expected += expected
        self._reduce_missing += missing
        counts = (np.float32(world) if missing == 0 else
                  np.repeat(got_per_packet, layout.per_packet)[:end - start])
        estimate = rebuild(self.estimator, total, counts, contribution[start:end], world,
                           self.loss_rate, out=total)
        return estimate, expected, missing

    def _broadcast(self, layout: Layout, step: int, shared: np.ndarray) -> tuple[int, int]:
        """The other owners' shards into ours where their packets arrived: (expected,
        missing)."""
        ex, rank, world = self.exchange, self.rank, self.world
        # the broadcast stage: every other owner's packets of its shard; a missed one
        # leaves our own values there
        sends = [0 if o == rank else layout.packets(o) for o in range(world)]
        arrived = ex.fate.arrivals(rank, step, hdr.STAGE_BROADCAST, sends)
        b_expected = sum(sends)
        b_missing = b_expected - sum(int(a.sum()) for a in arrived)
        for owner in range(world):
            if owner == rank or not sends[owner]:
                continue
            o_start, o_end = layout.shard_bounds(owner)
            keep = _elements(arrived[owner], layout.per_packet, o_end - o_start)
            np.copyto(shared[o_start:o_end], ex.shared[owner][o_start:o_end], where=keep)
        return b_expected, b_missing


def _elements(packets: np.ndarray, per_packet: int, size: int) -> np.ndarray:
    """A shard's per-packet booleans as per-element ones (its last packet may be short)."""
    return np.repeat(packets, per_packet)[:size]


def _flat_numpy(tensor) -> np.ndarray:
    if isinstance(tensor, np.ndarray):
        return tensor.reshape(-1)
    return tensor.detach().view(-1).numpy()


def on_every_rank(world: int, work, abort=None) -> list:
    """work(rank) in one thread per rank; their results in rank order. The first error a
    rank raised is raised here, after every thread has ended; abort() is called when a rank
    fails (an exchange's barrier.abort: the others stop there instead of waiting for it)."""
    results, errors = [None] * world, []

    def one(rank):
        try:
            results[rank] = work(rank)
        except threading.BrokenBarrierError as err:
            errors.append(err)  # (another rank's failure: raised after its own)
        except BaseException as err:  # noqa: BLE001 - re-raised below
            errors.insert(0, err)
            if abort is not None:
                abort()

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
