"""Every variant's wrapper declares what the worker and `lossbed run`'s API read of it
(harness/ddp/timing.py, #68 item 4): its collective's time, the lossy collective it runs,
its replicas' drift, so nothing probes it for a member."""

from __future__ import annotations

import pytest

from harness.collectives.lossy import LossyCollective
from harness.ddp.hooks import LossyHookState, ReliableTiming
from harness.ddp.rps import RPSOptimizer
from harness.ddp.sharded import ShardedOptimizer
from harness.ddp.timing import CollectiveTiming


@pytest.mark.parametrize("cls", [LossyHookState, ReliableTiming, ShardedOptimizer,
                                 RPSOptimizer])
def test_every_wrapper_declares_the_timing_members(cls):
    assert callable(cls.lossy_collective) and callable(cls.replica_drift)


def test_the_hooks_states_say_what_they_run_and_keep_no_replicas():
    reliable = ReliableTiming()
    assert isinstance(reliable, CollectiveTiming)
    assert reliable.lossy_collective() is None and reliable.replica_drift() is None
    lossy = LossyHookState.__new__(LossyHookState)
    lossy.collective = LossyCollective.__new__(LossyCollective)
    assert lossy.lossy_collective() is lossy.collective and lossy.replica_drift() is None


def test_the_optimizers_name_their_lossy_collective():
    sharded = ShardedOptimizer.__new__(ShardedOptimizer)
    sharded.collective = object()
    assert sharded.lossy_collective() is sharded.collective

    class Rps:
        collective = object()

    rps = RPSOptimizer.__new__(RPSOptimizer)
    rps.rps = Rps()
    assert rps.lossy_collective() is Rps.collective


def test_the_many_rank_gradient_wrapper_names_its_collective_too():
    """(Missed first: the many-rank mode asks every optimizer it made, _MeanGradient too.)"""
    from harness.scale.training import _MeanGradient

    mean = _MeanGradient.__new__(_MeanGradient)
    mean.collective = object()
    assert mean.lossy_collective() is mean.collective
