"""Step alignment tells a late rank from a lost one.

The first step of a collective follows setup (a model broadcast, a run boundary), which
crosses the impaired network over TCP: at 30% loss one rank's setup can stall for seconds
in TCP's retransmission backoff (CI: 4 ranks on 2 cores, a rank 6+ s late at the first
step's alignment, declared lost, and the launch failed). That rank is late, not lost. Later
steps come straight from the last step, and a rank missing for three deadline ceilings
there has died or lost the network, unless a stage of each step crosses TCP too
(lossy_stage "reduce" or "broadcast": the other stage goes over gloo), where a rank can be
as late at every step as after setup (CI: a rank declared lost at 10% loss while its peer
waited out TCP's backoff in the gloo broadcast, and the test failed on "Connection closed").
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from harness.collectives.deadline import Deadline
from harness.collectives.lossy import LossyCollective, RankLost
from harness.reproduce.loopback import MemoryStore

CEILING_S = 0.5  # steady-state patience: 3 ceilings, 1.5 s


def collectives(store, world=2, lossy_stage="both"):
    # a transport that only alignment needs (no step sends here): the members the collective
    # reads of any transport when it is made (harness/transport/contract.py)
    return [LossyCollective(SimpleNamespace(rank=r, world=world, batched=False,
                                            use_lock=threading.RLock()), store,
                            deadline=Deadline(ceiling_s=CEILING_S), lossy_stage=lossy_stage)
            for r in range(world)]


def align_late(collective, step: int, delay_s: float, errors: list) -> threading.Thread:
    def late():
        time.sleep(delay_s)
        try:
            collective.alignment.align(step)
        except Exception as err:  # noqa: BLE001 - the test reports it
            errors.append(err)

    thread = threading.Thread(target=late)
    thread.start()
    return thread


def test_a_rank_late_from_setup_is_waited_for_beyond_the_steady_patience():
    first, second = collectives(MemoryStore())
    errors = []
    # 3 s late: twice the steady-state patience
    thread = align_late(second, 0, 3.0, errors)
    started = time.monotonic()
    first.alignment.align(0)  # the first alignment of this collective: it comes from setup
    thread.join()
    assert errors == []
    assert time.monotonic() - started >= 2.5


def test_a_rank_missing_at_a_later_step_is_named_after_three_ceilings():
    store = MemoryStore()
    first, second = collectives(store)
    threads = [threading.Thread(target=c.alignment.align, args=(0,)) for c in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # (step 0's alignment itself marks the collective as past setup: nothing set by hand)
    started = time.monotonic()
    with pytest.raises(RankLost, match=r"rank 1 did not reach step 1 within 1\.5 s"):
        first.alignment.align(1)
    # three ceilings of waiting, then one more ceiling for a late "present" (and 2 s more
    # for rank 0, which hosts the store): no sooner (mutation caught: giving up after one
    # ceiling, which the message alone does not show) and not much later
    elapsed = time.monotonic() - started
    assert 3 * CEILING_S + CEILING_S + 2.0 <= elapsed < 3 * CEILING_S + CEILING_S + 0.5 + 3.0


@pytest.mark.parametrize("lossy_stage", ["reduce", "broadcast"])
def test_a_rank_late_after_a_gloo_stage_is_waited_for_at_every_step(lossy_stage):
    """Mutation caught: the setup patience for the first step only (the old code): rank 0
    gives up on rank 1 after 1.5 s at step 1."""
    first, second = collectives(MemoryStore(), lossy_stage=lossy_stage)
    threads = [threading.Thread(target=c.alignment.align, args=(0,)) for c in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = []
    thread = align_late(second, 1, 3.0, errors)  # twice the steady-state patience
    started = time.monotonic()
    first.alignment.align(1)
    thread.join()
    assert errors == []
    assert time.monotonic() - started >= 2.5
