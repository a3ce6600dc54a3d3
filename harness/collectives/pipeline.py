"""The two stages pipelined: an owner broadcasts the packets of its shard that are whole
while the rest of its reduce stage is still coming.

Without it an owner sends nothing of its shard until its reduce stage has ended (every
source delivered or said it sent everything, or the deadline), and every other rank, done
with its own reduce, waits for it (the wait between the phases in the profile: docs/results.md,
#67). A packet slot of the own shard is whole once every other rank's contribution to it
has come; its estimate is then the sum over the world, divided by the world, whatever is
still missing elsewhere in the shard: for the estimators that say so (zero_fill and
received_mean: count == world there), the value the end of the stage would write, to the
bit. So those packets are rebuilt and broadcast as soon as enough of them are whole
(`least`: one send per peer is not worth a few packets); the stage's end rebuilds the rest
and broadcasts what did not go yet, with the end markers. Each packet is rebuilt once,
straight into the tensor (without the pipeline the stage rebuilds into its sums, then
copies: on a machine whose cores are all busy, a second pass over the shard costs more
than the overlap gains).

Where it does not apply (applies(), which lossy.LossyCollective asks):
    rescale          its estimate of a whole packet depends on the loss rate, which this
                     step's reduce stage is still changing;
    parameter mode   the owner's optimizer steps its whole shard once (sharded_update);
    one lossy stage  the other goes over torch.distributed, whole;
    RC, UC over UDP  go-back-N's flows and fragmented messages send packets by runs.
A receiver needs nothing new: broadcast packets say their index, are applied wherever they
land in the step, and a source's broadcast still comes after all its reduce packets to us
(it sent them before it began to receive), so a broadcast packet still ends that source's
reduce stage (step.py's infer_ends).
"""

from __future__ import annotations

import numpy as np

from harness.collectives.layout import Layout
from harness.collectives.rebuild import rebuild
from harness.collectives.step import Step
from harness.transport import header as hdr

# The estimators whose estimate of a packet every source delivered is sum / world (rebuild.py)
PIPELINED_ESTIMATORS = ("zero_fill", "received_mean")
# A send of whole packets to every peer once this share of the shard is whole and not sent
# yet: 4 sends a stage at most before its end, each still many packets to a peer (each send
# and each look costs the receiving rank's time: on a machine whose cores are all busy,
# that is the stage's time)
SHARE_PER_SEND = 4


def applies(transport, estimator: str, lossy_stage: str, fragment_floats: int) -> bool:
    """Whether a collective of these settings may pipeline its gradient mode (above: where
    it does not apply); its parameter mode never does."""
    return (estimator in PIPELINED_ESTIMATORS and lossy_stage == "both"
            and transport.batched and not transport.semantics.reliable
            and fragment_floats == 0)


class EarlyBroadcast:
    """One step's broadcast of the own shard, packet by packet as they become whole.
    after_batch() is called after every received batch of the reduce stage; rest() says
    which packets the stage's end still has to send."""

    def __init__(self, transport, state: Step, layout: Layout, shared: np.ndarray,
                 estimator: str):
        self.transport, self.state, self.shared = transport, state, shared
        self.estimator = estimator
        self.rank, self.world = state.rank, layout.world
        self.packets = layout.packets(self.rank)
        self.starts, self.ends = layout.packet_arrays(self.rank)
        self.sent = np.zeros(self.packets, dtype=bool)
        self.least = max(1, -(-self.packets // SHARE_PER_SEND))
        self.peers = [j for j in range(self.world) if j != self.rank]
        self._left = int(state.reduce.expected.sum())  # its packets still due at the last look

    def after_batch(self) -> None:
        """Rebuild and broadcast the packets that became whole, if there are enough."""
        reduce = self.state.reduce
        if self._left - reduce.left < self.least or not self.state.accept_reduce:
            return  # (each packet that comes makes one whole at most: look once `least` came)
        self._left = reduce.left
        whole = reduce.got[self.peers, :self.packets].all(axis=0) & ~self.sent
        if np.count_nonzero(whole) >= self.least:
            self._send(np.flatnonzero(whole))

    def rest(self) -> np.ndarray:
        """The packets not broadcast yet (their indexes), for the stage's end to send."""
        return np.flatnonzero(~self.sent)

    def _send(self, indexes: np.ndarray) -> None:
        self._write_estimates(indexes)
        starts, ends = self.starts[indexes], self.ends[indexes]
        state = self.state
        for dest in self.peers:
            self.transport.send_packets(dest, hdr.STAGE_BROADCAST, state.step, state.bucket,
                                        self.rank, self.shared, starts, ends,
                                        indexes=indexes, count=self.packets)
        self.sent[indexes] = True

    def rebuild_rest(self, counts) -> None:
        """The stage's end: the packets not broadcast yet rebuilt into `shared` (`counts`:
        Step.counts()), straight into it; the others are there already."""
        self._rebuild(self.rest(), counts)

    def _rebuild(self, indexes: np.ndarray, counts) -> None:
        """The estimator's value of these packets, written into `shared` (rebuild.py: the
        owner's estimate, one function wherever it is made). own: `shared`'s slots
        themselves, which still hold this rank's contribution there; the loss rate is
        not passed: the estimators pipelined read neither."""
        total, estimator = self.state.total, self.estimator

        def estimate(first: int, end: int, out: np.ndarray) -> None:
            rebuild(estimator, total[first:end], counts if np.ndim(counts) == 0
                    else counts[first:end], out, self.world, 0.0, out=out)

        self._write(indexes, estimate)

    def _write_estimates(self, indexes: np.ndarray) -> None:
        """shared's slots of these whole packets rebuilt (every contribution came: a count of
        world), run by run of consecutive packets."""
        self._rebuild(indexes, np.float32(self.world))

    def _write(self, indexes: np.ndarray, estimate) -> None:
        """estimate(first, end, out) for each run of consecutive packets among `indexes`:
        [first, end) in the own shard's values, `out` their place in `shared`."""
        if not len(indexes):
            return
        per_packet, (own_start, own_end) = self.state.layout.per_packet, self.state.own
        breaks = np.flatnonzero(np.diff(indexes) != 1) + 1
        firsts = indexes[np.concatenate(([0], breaks))] * per_packet
        ends = np.minimum((indexes[np.concatenate((breaks - 1, [len(indexes) - 1]))] + 1)
                          * per_packet, own_end - own_start)
        for first, end in zip(firsts.tolist(), ends.tolist(), strict=True):
            estimate(first, end, self.shared[own_start + first:own_start + end])
