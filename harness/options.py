"""Command-line options made from a settings dataclass's fields (as torchtitan builds its CLI
from its config classes): a field that carries `option(...)`'s metadata is an option, its
default, type and choices the field's own, so each is declared once, where the setting is.

    add_options(parser, TrainConfig)          --steps, --seed, ... with TrainConfig's defaults
    TrainConfig(**values(TrainConfig, args))  the settings the user gave, back into the class
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Literal

from testbed import checks

_PATH_TYPES = {"path": checks.user_path, "name_or_path": checks.user_name_or_path}


def option(default: Any, help: str, *, metavar: str | None = None,
           flag: str | None = None, path: Literal["path", "name_or_path"] | None = None
           ) -> Any:
    """A dataclass field that is also a command-line option (--NAME, or `flag`). `path`: the
    value names a file or folder ("path"), or a name or a path ("name_or_path"), read
    against the user's folder (testbed.checks.user_path, user_name_or_path)."""
    return dataclasses.field(default=default, metadata={"help": help, "metavar": metavar,
                                                        "flag": flag, "path": path})


def options(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def flag_of(field: dataclasses.Field) -> str:
    return field.metadata["flag"] or "--" + field.name.replace("_", "-")


def add_options(parser: argparse.ArgumentParser, cls, names: tuple[str, ...] | None = None,
                defaults=None, notes: dict[str, str] | None = None) -> None:
    """cls's options (those in `names`, or all) on parser, with the defaults of `defaults`
    (another class or instance holding the same names; cls by default) and a note appended
    to a help where one is given."""
    hints = typing.get_type_hints(cls)
    for f in options(cls):
        if names is not None and f.name not in names:
            continue
        hint = hints[f.name]
        default = getattr(defaults, f.name) if defaults is not None else f.default
        help = f.metadata["help"] + (notes or {}).get(f.name, "")
        if hint is bool:  # --NAME / --no-NAME
            parser.add_argument(flag_of(f), dest=f.name, default=default, help=help,
                                action=argparse.BooleanOptionalAction)
            continue
        choices = _choices(hint)
        kind = None if choices else _PATH_TYPES.get(f.metadata["path"]) or _type(hint)
        parser.add_argument(flag_of(f), dest=f.name, default=default,
                            type=kind, choices=choices, action=_StoreGiven,
                            metavar=f.metadata["metavar"], help=help)


class _StoreGiven(argparse.Action):
    """Stores the value, and notes that the user gave it: a value equal to the default
    cannot tell (given())."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, {*getattr(namespace, GIVEN, ()), self.dest})


GIVEN = "options_given"


def given(args: argparse.Namespace, name: str) -> bool:
    """Whether the user gave the option `name` (one add_options made), whatever its value."""
    return name in getattr(args, GIVEN, ())


def values(cls, args: argparse.Namespace, names: tuple[str, ...] | None = None) -> dict:
    """The options of cls that args holds (those in `names`, or all)."""
    return {f.name: getattr(args, f.name) for f in options(cls)
            if (names is None or f.name in names) and hasattr(args, f.name)}


def _choices(hint) -> list[str] | None:
    if typing.get_origin(hint) is typing.Literal:
        return list(typing.get_args(hint))
    return None


def _type(hint):
    """int, float or str from `int`, `float | None`, ..."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    kind = args[0]
    if kind not in (int, float, str):
        raise TypeError(f"an option's type must be int, float or str (or a Literal), not {hint}")
    return kind


def add_unsealed(p: argparse.ArgumentParser) -> None:
    """--unsealed, as every command that sends datagrams takes it."""
    p.add_argument("--unsealed", action="store_true",
                   help="send the datagrams without their MAC (default: every datagram "
                        "sealed with a key drawn for the launch); to price the MAC, on a "
                        "network only the experiment uses")
