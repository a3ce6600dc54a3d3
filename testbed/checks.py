"""Each rule of input, once: a loss rate, a share, a length of time, a positive number, as
every command, spec and record takes them (the CLI, the bench's spec, `run`'s spec and the
profile model call these, so one bad value gets one message wherever it is given). Each
refusal is a UsageError naming the option or field, what was wrong and the fix."""

from __future__ import annotations

import math
import os
from pathlib import Path

from testbed.errors import UsageError

MIN_COVERAGE_EXAMPLE = ("e.g. --min-coverage 0.9: at least 90% of the hosts' bytes crossed "
                        "the impairment")


def loss_fraction(option: str, *values: float) -> None:
    """A loss rate: a fraction in [0, 1) (0.1 = 10%)."""
    for value in values:
        if not (isinstance(value, int | float) and 0 <= value < 1):
            raise UsageError(option, f"{value:g} is not a fraction in [0, 1)"
                             if isinstance(value, int | float) else f"{value!r} is not a number",
                             f"{option} is a fraction: {option} 0.1 means 10%"
                             + (f"; for {value:g}% write {option} {value / 100:g}"
                                if isinstance(value, int | float) and 1 <= value < 100
                                else ""))


def given(value) -> tuple:
    """The value an option was given, as a rule's *values; none where it was left out (None:
    e.g. --loss's "the profile's own rates")."""
    return () if value is None else (value,)


def loss_text(text: str) -> float:
    """--loss as argparse reads it: a number; a percent sign is answered with the fraction
    (argparse names the option and prints this)."""
    import argparse

    value = text.strip()
    if value.endswith("%"):
        try:
            percent = float(value[:-1])
        except ValueError:
            percent = None
        raise argparse.ArgumentTypeError(
            f"{text!r} is a percent; a loss rate here is a fraction"
            + (f": write {percent / 100:g} for {percent:g}%" if percent is not None else ""))
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: a loss rate is a "
                                         "fraction, 0.1 means 10%") from None


def share(option: str, value: float, example: str) -> None:
    """A share of something: a fraction in [0, 1], both ends included."""
    if not (math.isfinite(value) and 0 <= value <= 1):
        raise UsageError(option, f"{value:g} is not a fraction in [0, 1]", example)


def seconds(option: str, value: float, example: float, what: str,
            positive: bool = False) -> None:
    """A length of time: finite seconds, 0 or more (more than 0 where `positive`)."""
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        raise UsageError(option, f"{value} is not a {'positive ' if positive else ''}number "
                         "of seconds", f"e.g. {option} {example:g}: {what}")


def positive_rate(option: str, value: float, example: float) -> None:
    """A learning rate (or any positive, finite number)."""
    if not (math.isfinite(value) and value > 0):
        raise UsageError(option, f"{value} is not a positive learning rate",
                         f"e.g. {option} {example:g}")


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def writable_file(option: str, path: str) -> None:
    """A file a command will write when it ends: its folder exists and can be written, so a
    long run is not lost at its last step."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(option, f"{path} is a folder", f"Give a file name, e.g. "
                         f"{option} {target / 'rows.jsonl'}")
    folder = target.parent
    if not folder.is_dir():
        raise UsageError(option, f"the folder {folder} does not exist",
                         "Create it first, or give a file in a folder that exists")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(option, f"{path} cannot be written here", "Give a writable path")


def writable_folder(option: str, path: str) -> None:
    """A folder a command will create (with its parents) and fill: not a file, and its
    nearest existing ancestor a folder that can be written."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise UsageError(option, f"{path} is a file, not a folder", "Give a folder")
    ancestor = _nearest_existing(target.absolute())
    if not ancestor.is_dir():
        raise UsageError(option, f"{ancestor} is a file: {path} cannot be made under it",
                         "Give a folder")
    if not os.access(ancestor, os.W_OK):
        raise UsageError(option, f"{path} cannot be created: {ancestor} is not writable",
                         "Give a writable folder")


def user_path(text: str) -> str:
    """A file or folder the user typed, as argparse reads it: absolute against the folder
    they typed it in. lossbed's commands pass paths on to processes that start elsewhere
    (Ansible's reader in the checkout, ranks in their host's project folder), where a
    relative path names another file: a relative --inventory once planned the checkout's
    hosts instead of the user's."""
    return os.path.abspath(os.path.expanduser(text))


def user_name_or_path(text: str) -> str:
    """A name (a profile in netem_profiles/, a model preset, a tokenizer kind, a cached data
    set) or a path, as argparse reads it: a path, made absolute as user_path makes it, when
    it has a '/' or starts with '~', ends in .yaml/.yml (a profile file), or names a file or
    folder in the user's folder; a name otherwise, left as typed."""
    if (os.sep in text or text.startswith("~") or text.endswith((".yaml", ".yml"))
            or os.path.exists(text)):
        return user_path(text)
    return text


def port(option: str, value) -> None:
    """A TCP port to listen on: 1-65535, or 0 (the kernel picks a free one)."""
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 65535):
        raise UsageError(option, f"{value!r} is not a port",
                         f"Give 1-65535 (0: a free one), e.g. {option} 9400")


def at_least(args, *limits: tuple[str, int]) -> None:
    """Counts given on the command line (argparse's args), each at least its limit."""
    for name, least in limits:
        value = getattr(args, name)
        if value < least:
            option = "--" + name.replace("_", "-")
            raise UsageError(option, f"{value} is too small", f"Give {least} or more")


def new_folder(path: str | None, option: str) -> str | None:
    """An absolute path for a folder a run writes, refused if it holds anything already (a
    run never overwrites what another left)."""
    if path is None:
        return None
    folder = Path(path).resolve()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UsageError(option, f"{folder} exists and is not an empty folder",
                         "Give a new folder (nothing is overwritten)")
    return str(folder)
