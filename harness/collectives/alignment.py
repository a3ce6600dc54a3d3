"""Step alignment: all ranks start a step together, meeting in the rendezvous store, and a
rank that does not arrive is named.

Without it, a rank that waited out a deadline in the last step would start this one late,
and its packets would miss the others' deadlines: lateness would turn into loss. The store
is a reliable channel (TCP: a lost segment is sent again, never lost), but in training its
port crosses the same impaired links as the data (harness.train.run.impair_the_control_path),
so under loss its round trips take longer.
"""

from __future__ import annotations

import time
from datetime import timedelta

from harness.collectives.deadline import Deadline

# How long the first alignment waits for a rank before naming it lost: TCP backs off 0.2,
# 0.4, 0.8, ... s per consecutive loss of a segment, so a 60 s stall takes nine in a row (at
# 30% loss: one segment in 50,000); a setup that slow is not just loss.
SETUP_PATIENCE_S = 60.0
GO_KEYS = 3  # release keys, reused in turn (see StepAlignment.align)


class RankLost(RuntimeError):
    """A peer stopped taking part (died, or lost the network entirely)."""


class StepAlignment:
    """The meeting of one collective's ranks in `store` (None: no meeting, every rank goes
    on at once). Patience is three deadline ceilings, or SETUP_PATIENCE_S where the rank
    comes from TCP under loss: the first step (from setup: a model broadcast, a run
    boundary), and every step when `gloo_every_step` (one stage of each step goes over
    gloo, whose retransmission backoff can hold a rank for seconds)."""

    def __init__(self, store, rank: int, world: int, key_prefix: str, deadline: Deadline,
                 gloo_every_step: bool):
        self.store, self.rank, self.world = store, rank, world
        self.key_prefix, self.deadline = key_prefix, deadline
        self.gloo_every_step = gloo_every_step
        self.aligned_once = False  # later steps come straight from the one before

    def align(self, step: int) -> None:
        """Wait until every rank arrived at `step`; RankLost naming the ranks that did not.

        Two store round trips per rank and step, on the step's critical path: one counter
        of arrivals (its value says which round this is and who came last), and a wait for
        the round's release key, which the last to arrive sets. Release keys are reused in
        turn (GO_KEYS of them) so the store does not grow over a long run: the last arrival
        of round r clears the key of round r + 2 after releasing everyone. That key was last
        set in round r - 1, which everyone has passed; and no one can wait on it before round
        r + 1 is complete, which needs this rank to arrive there first."""
        if self.store is None:
            self.aligned_once = True
            return
        prefix, ceiling = self.key_prefix, self.deadline.ceiling_s
        patience = 3 * ceiling
        if not self.aligned_once or self.gloo_every_step:
            # TCP's backoff under loss holds a rank for seconds: five losses of one segment
            # in a row are 0.2 + 0.4 + ... + 3.2 s, and that rank is late, not lost
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
        self.aligned_once = True

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
