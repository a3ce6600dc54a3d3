"""The CLI says its defaults, takes loss in one unit, offers fixed sets as choices, puts
options only where they act, and refuses bad arguments before torch is imported (#46)."""

from __future__ import annotations

import argparse
import logging
import re
import subprocess
import sys

import pytest

from harness import cli
from testbed import profiles
from tests.helpers import REPO, with_repo_on_path

IMPAIRING = {"apply", "train", "bench", "run"}  # the commands that apply an impairment


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    return next(a for a in parser._actions if a.dest == "command").choices


def options(sub):
    return [a for a in sub._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_every_option_has_help_and_says_its_default():
    missing, silent = [], []
    for name, sub in commands().items():
        text = " ".join(sub.format_help().split())
        for action in options(sub):
            flag = action.option_strings[-1]
            if not action.help:
                missing.append(f"{name} {flag}")
            default = action.default
            if default in (None, False, argparse.SUPPRESS) or isinstance(
                    action, argparse._StoreTrueAction):
                continue
            shown = " ".join(map(str, default)) if isinstance(default, list) else str(default)
            if not re.search(rf"default[^)]*?(?<![\w.]){re.escape(shown)}(?![\w.])", text):
                silent.append(f"{name} {flag} ({shown})")
    assert missing == [] and silent == [], (missing, silent)


def test_no_help_text_quotes_this_machines_timings():
    quoted = [f"{name}: {a.help}" for name, sub in commands().items() for a in sub._actions
              if a.help and re.search(r"\b(min|s|seconds|minutes|hours?) here\b", a.help)]
    assert quoted == []


def test_lease_and_force_interface_only_where_an_impairment_is_applied():
    for name, sub in commands().items():
        flags = {f for a in sub._actions for f in a.option_strings}
        if name in IMPAIRING:
            assert {"--lease-s", "--force-interface", "--inventory"} <= flags, name
        elif name != "doctor":  # (doctor judges a run that would force it)
            assert "--lease-s" not in flags and "--force-interface" not in flags, name


def test_fixed_sets_are_choices():
    train = commands()["train"]
    choices = {a.option_strings[-1]: a.choices for a in options(train)}
    assert set(choices["--variant"]) == {"reliable", "zero_fill", "unbiased",
                                         "unbiased_drift", "rps"}
    assert choices["--device"] == ["cpu", "cuda"]
    assert choices["--optimizer"] == ["adamw", "sgd"]
    assert choices["--schedule"] == ["cosine", "constant"]


def test_a_loss_is_a_fraction_wherever_a_user_types_it():
    for name in ("apply", "train", "bench", "collective-bench", "run"):
        loss = next(a for a in options(commands()[name]) if "--loss" in a.option_strings)
        assert "fraction" in loss.help and "0.1 = 10%" in loss.help.replace("%%", "%"), name


def lossbed_bare(*args: str) -> subprocess.CompletedProcess:
    """The CLI in a fresh interpreter, its imports listed (-X importtime)."""
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "harness.cli", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={"PYTHONPATH": with_repo_on_path(), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize(("args", "option", "fix"), [
    (["bench", "--loss", "10"], "--loss", "--loss 0.1"),
    (["train", "--loss", "30"], "--loss", "--loss 0.3"),
    (["collective-bench", "--loss", "0", "5"], "--loss", "--loss 0.05"),
    (["apply", "random-loss", "--loss", "1.5"], "--loss", "fraction"),
    (["bench", "--hosts", "1"], "--hosts", "2 or more"),
    (["run", "--loss", "10", "--", "torchrun", "x.py"], "--loss", "--loss 0.1"),
    (["run", "--grace-s", "-1", "--", "torchrun", "x.py"], "--grace-s", "--grace-s 30"),
    (["run", "--grace-s", "nan", "--", "torchrun", "x.py"], "--grace-s", "--grace-s 30"),
    (["train", "--grace-s", "-5"], "--grace-s", "--grace-s 30"),
    # the many-rank mode: what it cannot take is refused, not ignored
    (["bench", "--many-rank", "3", "4"], "--many-rank", "--many-rank 4 16 64"),
    (["bench", "--many-rank", "4", "16", "--hosts", "8"], "--hosts would be ignored",
     "Leave them out"),
    (["bench", "--many-rank", "4", "--lr", "0.01", "--variants", "rps"], "--lr, --variants",
     "Leave them out"),
    (["bench", "--many-rank", "4", "--loss", "0.01", "0.1"], "--loss", "one loss rate"),
    (["bench", "--many-rank", "4", "--cluster", "c1"], "--cluster", "Leave them out"),
])
def test_bad_arguments_are_refused_before_torch_is_imported(args, option, fix):
    done = lossbed_bare(*args)
    errors = [line for line in done.stderr.splitlines() if not line.startswith("import time")]
    assert done.returncode == 2, done.stderr[-2000:]
    assert option in "\n".join(errors) and fix in "\n".join(errors), errors
    imported = [line.split("|")[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time")]
    assert "torch" not in imported


def test_a_loss_pct_that_looks_like_a_fraction_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING):
        profile = profiles.load("random-loss", ["loss_pct=0.1"])
    assert profile.impairment.loss.loss_pct == 0.1  # taken as written ...
    assert "loss_pct is a percent" in caplog.text and "10% is --loss 0.1" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        profiles.load("random-loss", ["loss_pct=10"])
    assert caplog.text == ""


def test_version_names_the_release_and_an_option_is_never_taken_for_a_longer_one(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert re.match(r"lossbed \d+\.\d+\.\d+( \(commit [0-9a-f]+\))?$", out.strip()), out
    # `doctor --loss 0.1` was read as --loss-backend 0.1 (argparse's prefix matching)
    with pytest.raises(SystemExit) as done:
        cli.build_parser().parse_args(["doctor", "--loss", "0.1"])
    assert done.value.code == 2 and "unrecognized arguments: --loss" in capsys.readouterr().err
