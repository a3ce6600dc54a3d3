"""The generated pages of docs/reference/: the CLI from its parsers, the profile schema from
its pydantic models. `python -m tests.docs_reference` writes them; a test holds the files
equal to what it would write (tests/unit/test_docs_match_the_code.py).
"""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path

from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[1]
CLI_PAGE = REPO / "docs" / "reference" / "cli.md"
PROFILES_PAGE = REPO / "docs" / "reference" / "profiles.md"
OUTPUTS_PAGE = REPO / "docs" / "reference" / "outputs.md"
# outputs.md is written by hand but for the table of results.jsonl's fields between these
FIELDS_BEGIN = "<!-- generated from harness/bench/fields.py: python -m tests.docs_reference -->"
FIELDS_END = "<!-- end of the generated table -->"


def cli_page() -> str:
    import os

    from harness import cli

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps usage to the terminal: one width for all
    try:
        return _cli_page(cli.build_parser())
    finally:
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns


def _cli_page(parser) -> str:
    commands = next(a for a in parser._actions if a.dest == "command")
    helps = {c.dest: c.help for c in commands._choices_actions}
    out = ["# Reference: the CLI", "",
           "Generated from the parsers (`python -m tests.docs_reference`); every option with "
           "its default. A loss rate is a fraction everywhere (`--loss 0.1` is 10%).", "",
           "`-v` (or `--verbose`) before the command logs at debug level: `lossbed -v up "
           "--hosts 2`.", ""]
    for name, sub in commands.choices.items():
        out += [f"## `lossbed {name}`", "", helps.get(name) or sub.description or "", ""]
        out += ["```text", sub.format_usage().strip().replace("usage: ", "", 1), "```", ""]
        rows = []
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flags = ", ".join(action.option_strings) or action.metavar or action.dest
            if action.metavar and action.option_strings and action.nargs != 0:
                flags += f" {action.metavar}"
            text = sub.formatter_class("x")._get_help_string(action) or ""
            text = text.replace("%%", "%").replace("%(default)s", str(action.default))
            if action.choices and "{" not in flags:
                text += f" Choices: {', '.join(map(str, action.choices))}."
            rows.append(f"| `{flags}` | {' '.join(text.split()).replace('|', '/')} |")
        if rows:
            out += ["| option | meaning |", "|---|---|", *rows, ""]
    return "\n".join(out).rstrip() + "\n"


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return " / ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (list, dict):
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{origin.__name__}[{args}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _limits(field) -> str:
    bounds = []
    for meta in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                bounds.append(f"{sign} {value:g}" if isinstance(value, float) else
                              f"{sign} {value}")
    return ", ".join(bounds)


def profiles_page() -> str:
    from testbed.profiles import model

    out = ["# Reference: the profile schema", "",
           "Generated from the pydantic models of `testbed/profiles/model.py` (`python -m "
           "tests.docs_reference`). Units are in the field names; probabilities are percents "
           "(`loss_pct: 10` is 10%). A field past its kernel limit is refused with the "
           "reason.", ""]
    models = [model.Profile, model.Impairment, model.LinkOverride, model.Bernoulli,
              model.GilbertElliott, model.FourState, model.Slot, model.Match, model.Flow,
              model.PortRange]
    for cls in models:
        out += [f"## `{cls.__name__}`", "", " ".join((cls.__doc__ or "").split()), "",
                "| field | type | default | limits |", "|---|---|---|---|"]
        for name, field in cls.model_fields.items():
            default = ("(required)" if field.is_required() else
                       "(made)" if field.default_factory is not None else repr(field.default))
            limit = _limits(field)
            why = model.LIMITS.get(name, "")
            out.append(f"| `{name}` | {_type_name(field.annotation).replace('|', '/')} | "
                       f"{default} | {limit}{': ' + why if why and limit else ''} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def outputs_page() -> str:
    """outputs.md with its table of results.jsonl's fields made again from RESULT_FIELDS."""
    from harness.bench.fields import RESULT_FIELDS

    text = OUTPUTS_PAGE.read_text()
    before, rest = text.split(FIELDS_BEGIN, 1)
    after = rest.split(FIELDS_END, 1)[1]
    rows = [f"| `{name}` | {' '.join(meaning.split()).replace('|', '/')} |"
            for name, meaning in RESULT_FIELDS.items()]
    table = "\n".join(["| field | what it holds |", "|---|---|", *rows])
    return f"{before}{FIELDS_BEGIN}\n{table}\n{FIELDS_END}{after}"


def main() -> int:
    CLI_PAGE.parent.mkdir(parents=True, exist_ok=True)
    CLI_PAGE.write_text(cli_page())
    PROFILES_PAGE.write_text(profiles_page())
    OUTPUTS_PAGE.write_text(outputs_page())
    print(f"wrote {CLI_PAGE.relative_to(REPO)}, {PROFILES_PAGE.relative_to(REPO)} and the "
          f"fields' table of {OUTPUTS_PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


_ = BaseModel  # (the models are pydantic's)
