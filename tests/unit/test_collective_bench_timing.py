"""What one (algorithm, size) cell of `lossbed collective-bench` reports about its own
iterations, counted on rank 0 (harness/bench/collective_worker.py)."""

from __future__ import annotations

import pytest

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


def test_a_cell_reports_the_ranks_cpu_time_per_byte_of_its_iterations(monkeypatch):
    from harness.bench import collective_worker

    clock = iter([10.0, 10.5, 20.0, 20.3])  # process_time around each turn: 0.5 s, 0.3 s
    monkeypatch.setattr(collective_worker.time, "process_time", lambda: next(clock))
    timing = Timing()
    timing.run(lambda tensor: None, "x", Counters(), 2)
    timing.run(lambda tensor: None, "x", Counters(), 2)
    # 0.8 CPU-seconds over 4 all-reduces of 1 MB: 200 ns per byte
    assert timing.summary(1_000_000, lossy=True)["cpu_ns_per_byte"] == pytest.approx(200.0)
