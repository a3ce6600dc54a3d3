"""Each rule of input, once: a loss rate, a share, a length of time, a positive number, as
every command, spec and record takes them (the CLI, the bench's spec, `run`'s spec and the
profile model call these, so one bad value gets one message wherever it is given). Each
refusal is a UsageError naming the option or field, what was wrong and the fix."""

from __future__ import annotations

import math

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
