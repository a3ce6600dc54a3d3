"""Read a YAML file a user hands lossbed (a profile, an inventory) without trusting it.

Whatever the file holds, the caller gets either plain data (dicts, lists, scalars) or a
`YamlInputError` that says what is wrong with the file, never a traceback:

- bigger than `max_bytes`, NUL bytes, or not UTF-8 text: refused before parsing;
- not valid YAML, or a key given twice in one mapping (PyYAML would keep the last one);
- nested deeper than MAX_DEPTH, or more than MAX_VALUES values once aliases are expanded
  (an "alias bomb": a few lines whose anchors refer to each other expand to billions of
  values), or an anchor that contains itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20       # profiles and inventories are a few KB
MAX_DEPTH = 64            # no lossbed file nests more than ~6 levels
MAX_VALUES = 100_000      # after expanding aliases


_SELF_REFERENCE = "an anchor (&name) contains an alias of itself (*name)"


class YamlInputError(ValueError):
    """What is wrong with a YAML input, in one sentence (the caller adds which file)."""


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML that refuses a key given twice in one mapping. (Hand-made: PyYAML has no
    option for it, and ruamel.yaml, which has, would be a second YAML parser for a dozen
    lines; the alias and depth limits below are what neither library bounds.)"""


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key: the safe constructor refuses it below
            break
        if duplicate:
            raise YamlInputError(f"{key!r} is given twice (line {key_node.start_mark.line + 1}): "
                                 "give each key once")
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                              _construct_mapping)


def read(path: str | Path, max_bytes: int = MAX_BYTES) -> Any:
    """The data in the YAML file at `path`, or YamlInputError."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise YamlInputError(f"the file is {size:,} bytes; lossbed reads at most "
                                 f"{max_bytes:,} bytes of YAML")
        raw = path.read_bytes()
    except OSError as err:
        raise YamlInputError(f"cannot read it: {err.strerror or err}") from None
    return parse_bytes(raw)


def parse_bytes(raw: bytes) -> Any:
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise YamlInputError(f"it contains a NUL byte (at byte {nul}): it is not a text file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise YamlInputError(f"it is not UTF-8 text (byte {err.start}: "
                             f"{raw[err.start:err.start + 1]!r})") from None
    return parse(text)


def parse(text: str) -> Any:
    """The data in a YAML text, or YamlInputError."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except YamlInputError:
        raise
    except RecursionError:
        raise YamlInputError(f"it is nested too deeply (lossbed allows {MAX_DEPTH} "
                             "levels)") from None
    except yaml.YAMLError as err:
        if "recursive node" in str(err):
            raise YamlInputError(_SELF_REFERENCE) from None
        raise YamlInputError(f"it is not valid YAML: {_where(err, text)}") from None
    except (ValueError, TypeError, OverflowError) as err:  # e.g. an unhashable key
        raise YamlInputError(f"it is not usable YAML: {err}") from None
    check_shape(data)
    return data


def check_shape(data: Any) -> None:
    """Refuse data nested deeper than MAX_DEPTH, holding more than MAX_VALUES values once
    aliases are expanded, or containing itself. Iterative: a deep input cannot overflow the
    stack here."""
    values = 0
    stack = [(data, 1, ())]  # (value, depth, ids of the containers above it)
    while stack:
        value, depth, above = stack.pop()
        values += 1
        if values > MAX_VALUES:
            raise YamlInputError(f"it holds more than {MAX_VALUES:,} values once its aliases "
                                 "(*name) are expanded: write the values out")
        if depth > MAX_DEPTH:
            raise YamlInputError(f"it is nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict | list):
            if id(value) in above:
                raise YamlInputError(_SELF_REFERENCE)
            inner = (*above, id(value))
            children = (list(value.keys()) + list(value.values()) if isinstance(value, dict)
                        else value)
            stack.extend((child, depth + 1, inner) for child in children)


def _where(err: yaml.YAMLError, text: str) -> str:
    """The syntax error at its line and column, with that line and a caret under it."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if mark is None or problem is None:
        return _one_line(err)
    lines = text.splitlines()
    shown = lines[mark.line] if mark.line < len(lines) else ""
    context = getattr(err, "context", None)
    return (f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
            + (f" ({context})" if context else "") + f"\n    {shown[:200]}\n    "
            + " " * min(mark.column, 200) + "^")


def _one_line(err: yaml.YAMLError) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:300] + "…"
