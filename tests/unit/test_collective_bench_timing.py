"""What one (algorithm, size) cell of `lossbed collective-bench` reports about its own
iterations, counted on rank 0 (harness/bench/collective_worker.py)."""

from __future__ import annotations

from harness.bench.collective_worker import Timing
from harness.transport.verdicts import Counters


def test_a_cell_counts_the_deadlines_hit_in_its_own_iterations_only():
    # what the collective had counted before this cell's turn (warm-up, other sizes)
    totals = {"reduce_deadlines_hit": 3, "broadcast_deadlines_hit": 1, "collective_steps": 9}
    calls = []

    def one_allreduce(tensor):
        calls.append(tensor)
        totals["collective_steps"] += 1
        if len(calls) % 2 == 0:  # every other one waited out its broadcast deadline
            totals["broadcast_deadlines_hit"] += 1

    timing = Timing()
    timing.run(one_allreduce, "x", Counters(), 4, totals)
    timing.run(one_allreduce, "x", Counters(), 3, totals)  # (its next turn)
    summary = timing.summary(1024, lossy=True)
    assert summary["deadlines_hit"] == {"reduce": 0, "broadcast": 3}
    assert summary["iterations"] == 7 and len(calls) == 7
    assert timing.summary(1024, lossy=False)["deadlines_hit"] is None  # gloo has none
