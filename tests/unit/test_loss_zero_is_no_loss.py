"""`--loss 0` is no loss, for every command; leaving --loss out keeps the profile's own rate,
and what a command prints says which rate it applies (#66 item 2: `lossbed run --loss 0`
applied random-loss's own 1%, measured at 1.10%, to a user asking for a lossless baseline,
while bench and collective-bench read 0 as 0%)."""

from __future__ import annotations

import pytest

from harness import torchrun
from harness.cli import build_parser
from harness.train.config import TrainConfig
from harness.train.run import Run
from testbed import profiles
from testbed.errors import UsageError
from testbed.impair import plan


@pytest.mark.parametrize("name", ["random-loss", "burst-loss", "asymmetric", "four-state",
                                  "wan", "clean"])
def test_loss_zero_removes_every_paths_loss_and_keeps_the_rest(name):
    own = profiles.load(name)
    none = profiles.load(name, loss=0)
    assert none.impairment.loss is None
    assert all(i.loss is None for i in none.hosts.values())
    assert all(link.loss is None for link in none.links)
    # delay, rate and the rest stay the profile's
    assert (none.impairment.model_dump(exclude={"loss"})
            == own.impairment.model_dump(exclude={"loss"}))
    assert none.name == own.name and none.match == own.match


def test_no_loss_given_keeps_the_profiles_own_rate():
    assert profiles.load("random-loss").impairment.loss.loss_pct == 1.0
    assert profiles.load("random-loss", loss=None).impairment.loss.loss_pct == 1.0


def test_loss_zero_with_a_set_loss_is_refused_as_any_other_loss():
    with pytest.raises(UsageError, match="--loss 0"):
        profiles.load("random-loss", ["loss_pct=5"], loss=0)


@pytest.mark.parametrize("command", [["apply", "random-loss"], ["run", "--", "x"],
                                     ["train"]])
def test_the_commands_that_apply_one_profile_read_no_loss_as_none_and_0_as_0(command):
    parser = build_parser()
    assert parser.parse_args(command).loss is None
    assert parser.parse_args([*command[:1], "--loss", "0", *command[1:]]).loss == 0.0


def test_run_and_train_apply_no_loss_at_zero():
    checked = torchrun.RunSpec(command=["torchrun", "x.py"], profile="random-loss",
                               loss=0.0).validate()
    assert checked.profile.impairment.loss is None
    own = torchrun.RunSpec(command=["torchrun", "x.py"], profile="random-loss").validate()
    assert own.profile.impairment.loss.loss_pct == 1.0
    assert Run(TrainConfig(), "random-loss", loss=0.0).load_profile().impairment.loss is None
    assert Run(TrainConfig(), "random-loss").load_profile().impairment.loss.loss_pct == 1.0


@pytest.mark.parametrize(("loss", "said"), [
    (None, "loss: the profile's own: loss 1% on every path (--loss sets another)"),
    (0.0, "loss: none (--loss 0)"),
    (0.1, "loss: 10% on every path (--loss 0.1)"),
])
def test_the_rate_applied_is_said(loss, said):
    assert plan.stated_loss(profiles.load("random-loss", loss=loss), loss) == said


def test_a_profile_with_its_own_rates_per_host_says_so():
    said = plan.stated_loss(profiles.load("asymmetric"), None)
    assert said.startswith("loss: the profile's own: ")
    assert "loss 0.5% on the other paths" in said and "at h3 loss GE" in said, said
    assert "h1->h2 loss 5%" in said and "h2->h1 loss 0.1%" in said, said
