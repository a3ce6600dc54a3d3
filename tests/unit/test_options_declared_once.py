"""`lossbed train`'s options are TrainConfig's fields (harness/options.py builds them), each
declared once: its default, type and choices in the field, nowhere else (#55)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from harness import options
from harness.cli import TRAINING_OPTIONS
from harness.train.config import TrainConfig
from tests.helpers import REPO


def _subparser(name: str) -> argparse.ArgumentParser:
    from harness import cli

    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    return commands.choices[name]


def test_every_setting_of_train_is_a_field_with_the_fields_default_and_choices():
    train = {a.dest: a for a in _subparser("train")._actions}
    declared = options.options(TrainConfig)
    assert len(declared) >= 20
    for field in declared:
        action = train[field.name]
        assert action.option_strings == [options.flag_of(field)]
        assert action.default == field.default, field.name
    assert train["variant"].choices == ["reliable", "zero_fill", "unbiased", "unbiased_drift",
                                        "rps"]
    assert train["lossy_stage"].choices == ["both", "reduce", "broadcast"]
    assert train["steps"].type is int and train["lr"].type is float
    assert train["warmup_steps"].type is int and train["warmup_steps"].default is None


def _flags_by_hand(block: str) -> list[str]:
    """TrainConfig's flags a parser's code writes as strings."""
    return [options.flag_of(f) for f in options.options(TrainConfig)
            if f'"{options.flag_of(f)}"' in block]


def test_no_option_of_train_is_written_by_hand_in_the_cli():
    """The train parser's code names none of TrainConfig's flags: adding a setting to
    TrainConfig with option() is the whole change (a flag written again would also clash)."""
    text = (REPO / "harness" / "cli.py").read_text()
    start = text.index('sub.add_parser("train"')
    block = text[start:text.index("sub.add_parser(", start + 1)]
    assert "options.add_options(p, TrainConfig)" in block
    assert _flags_by_hand(block) == []
    # planted: a flag written again is named; another command's flag is not
    assert _flags_by_hand('p.add_argument("--steps", type=int)\n'
                          'p.add_argument("--hosts", type=int)') == ["--steps"]


def test_the_bench_shares_the_training_options_with_its_own_defaults():
    from harness.bench.spec import BENCH_TRAINING, BenchSpec

    bench = {a.dest: a for a in _subparser("bench")._actions}
    for name in TRAINING_OPTIONS:
        assert bench[name].default == getattr(BENCH_TRAINING, name), name
    # the spec holds the runs' settings as a TrainConfig, declared once there (#68 item 1)
    assert BenchSpec().train == BENCH_TRAINING and isinstance(BENCH_TRAINING, TrainConfig)
    assert not {f.name for f in dataclasses.fields(BenchSpec)} & set(TRAINING_OPTIONS)
    assert bench["batch"].default != TrainConfig.batch  # the bench's own, smaller
    assert "a bench runs tens of runs" in bench["batch"].help


def test_a_parsed_command_line_gives_back_the_settings():
    train = _subparser("train")
    args = train.parse_args(["--variant", "rps", "--steps", "7", "--lr", "0.01",
                             "--warmup-steps", "2", "--lossy-stage", "reduce"])
    cfg = TrainConfig(**options.values(TrainConfig, args))
    assert (cfg.variant, cfg.steps, cfg.lr, cfg.warmup_steps, cfg.lossy_stage) == (
        "rps", 7, 0.01, 2, "reduce")
    assert cfg.preset == TrainConfig.preset


def test_the_settings_are_given_by_name():
    with pytest.raises(TypeError):
        TrainConfig("rps")  # the record is keyword-only
    assert dataclasses.fields(TrainConfig)[0].kw_only


def test_the_benchs_own_options_are_its_specs_fields_written_nowhere_else():
    """#68 item 1: --hosts, --mtu, --seeds, ... are BenchSpec's fields (option()), built
    into the parser from there; the bench's parser code writes none of their flags."""
    from harness.bench.spec import BenchSpec
    from harness.cli import BENCH_OPTIONS

    declared = {f.name: f for f in options.options(BenchSpec)}
    assert set(BENCH_OPTIONS) <= set(declared)
    bench = {a.dest: a for a in _subparser("bench")._actions}
    spec = BenchSpec()
    for name, field in declared.items():
        assert bench[name].default == getattr(spec, name), name
        assert bench[name].help.startswith(field.metadata["help"][:20]), name
    text = (REPO / "harness" / "cli.py").read_text()
    start = text.index('sub.add_parser("bench"')
    block = text[start:text.index("sub.add_parser(", start + 1)]
    by_hand = [options.flag_of(f) for f in declared.values()
               if f'"{options.flag_of(f)}"' in block]
    assert by_hand == []
    # and what the command line gives is what the spec is made of
    args = _subparser("bench").parse_args(["--hosts", "3", "--no-stability", "--mtu", "9000"])
    made = BenchSpec(**options.values(BenchSpec, args, BENCH_OPTIONS))
    assert (made.hosts, made.stability, made.mtu) == (3, False, 9000)


def test_an_option_given_at_its_default_is_told_from_one_not_given():
    """A given cluster's bench refuses a --hosts other than its own, so it must know
    whether --hosts was given at all: `--hosts 4` is, the default 4 is not."""
    bench = _subparser("bench")
    asked, left = bench.parse_args(["--hosts", "4"]), bench.parse_args([])
    assert asked.hosts == left.hosts == 4
    assert options.given(asked, "hosts") and not options.given(left, "hosts")
    assert not options.given(asked, "seeds")
