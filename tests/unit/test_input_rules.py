"""Each rule of input once (testbed/checks.py): a loss rate, a share, a length of time and a
learning rate get one message wherever they are given (the CLI, the bench's spec, `run`'s
spec, collective-bench's spec, a TrainConfig), and no other module writes that message."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.bench import collective_bench
from harness.bench.spec import BenchSpec
from harness.torchrun import RunSpec
from harness.train.config import TrainConfig
from testbed import checks
from testbed.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


def _refusal(make) -> str:
    with pytest.raises(UsageError) as refused:
        make()
    return str(refused.value)


def test_a_loss_rate_is_refused_with_one_message_wherever_it_is_given():
    expected = _refusal(lambda: checks.loss_fraction("--loss", 5))
    assert "5 is not a fraction in [0, 1)" in expected and "--loss 0.05" in expected
    seen = {
        "bench": _refusal(lambda: BenchSpec.make(losses=[0.1, 5])),
        "run": _refusal(lambda: RunSpec(command=["torchrun", "job.py"], loss=5).validate()),
        "collective-bench": _refusal(
            lambda: collective_bench.BenchSpec(losses=[5])),
    }
    assert seen == {where: expected for where in seen}
    drop = _refusal(lambda: TrainConfig(drop_once=1.5))
    assert "drop_once" in drop and "1.5 is not a fraction in [0, 1)" in drop


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_a_share_and_a_time_name_their_option(value):
    assert "--min-coverage" in _refusal(lambda: BenchSpec.make(min_coverage=value))
    assert "--grace-s" in _refusal(lambda: checks.seconds("--grace-s", -1, 5, "why"))
    assert "positive number of seconds" in _refusal(
        lambda: checks.seconds("--lease-s", 0, 120, "why", positive=True))


def test_what_lossbed_run_applied_is_a_record_and_decides_whether_it_is_a_result():
    """torchrun.Impaired (#55: a bag of keys before): never applied, applied but not read
    back, read back; each answered by not_a_result."""
    from types import SimpleNamespace

    from harness.torchrun import Impaired, not_a_result

    spec = RunSpec(command=["torchrun", "x.py"], profile="random-loss")
    lossy = SimpleNamespace(impairs_nothing=lambda: False)
    never = Impaired()
    assert not never.on and "never applied" in not_a_result(spec, lossy, never, 0)
    unread = Impaired(start=object(), backend="bpf")
    assert unread.on and "could not be read" in not_a_result(spec, lossy, unread, 0)
    covered = Impaired(start=object(), backend="bpf",
                       coverage=SimpleNamespace(no_result=lambda profile: None))
    assert not_a_result(spec, lossy, covered, 0) is None
    assert not_a_result(spec, lossy, never, 3) is None  # the job's own failure says it
