"""Slurm's node lists (SLURM_JOB_NODELIST, scontrol's NodeList=), expanded as `scontrol show
hostnames` does: "gpu[01-03,07],login1" is gpu01 gpu02 gpu03 gpu07 login1; brackets may
repeat in a name ("r[1-2]n[1-2]": r1n1 r1n2 r2n1 r2n2), with nothing after the last (Slurm
refuses "n[1-2]x"); a range keeps the width of its
first bound ("[08-10]": 08 09 10). Pure: no Slurm needed. Every name that comes out is a
host name lossbed may use (testbed/clusters/naming.py's rule for hosts), or an error."""

from __future__ import annotations

import itertools
import re

from testbed.errors import UsageError

MAX_NODES = 4096  # more than any allocation lossbed drives; a typo like [1-1000000] stops here
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def expand(text: str, source: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Every node `text` names, in order (a node named twice comes twice, as scontrol gives
    it); `source` is what the error names when it cannot be read."""
    names: list[str] = []
    for part in _top_level_parts(text, source):
        for name in _expand_one(part, source):
            names.append(name)
            if len(names) > MAX_NODES:
                raise UsageError(source, f"{text[:80]!r} names more than {MAX_NODES} nodes",
                                 "Check the node list (a range like [1-100000]?)")
    if not names:
        raise UsageError(source, "names no node", "Run inside an allocation of 2 or more nodes")
    return names


def _top_level_parts(text: str, source: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text.strip():
        if ch == "[":
            depth += 1
            if depth > 1:
                raise UsageError(source, f"{text!r}: a bracket inside a bracket",
                                 "Give a Slurm node list, e.g. node[01-04]")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UsageError(source, f"{text!r}: a ']' without its '['",
                                 "Give a Slurm node list, e.g. node[01-04]")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if depth:
        raise UsageError(source, f"{text!r}: a '[' without its ']'",
                         "Give a Slurm node list, e.g. node[01-04]")
    parts.append(current)
    return [p for p in (p.strip() for p in parts) if p]


def _expand_one(part: str, source: str) -> list[str]:
    """One name with any number of bracket groups: their product, in order."""
    pieces = [p for p in re.split(r"(\[[^\]]*\])", part) if p]
    if len(pieces) > 1 and not pieces[-1].startswith("["):
        raise UsageError(source, f"{part!r}: text after the last bracket (Slurm refuses it)",
                         "Write the node list as Slurm does, e.g. node[01-04]")
    choices = [_bracket(p[1:-1], part, source) if p.startswith("[") else [p]
               for p in pieces]
    names = ["".join(combo) for combo in itertools.product(*choices)]
    for name in names:
        if not _NODE.fullmatch(name):
            raise UsageError(source, f"{name!r} is not a node name lossbed can use",
                             "Node names are letters, digits, '.', '-' and '_'")
    return names


def _bracket(inside: str, part: str, source: str) -> list[str]:
    values: list[str] = []
    for item in inside.split(","):
        found = _RANGE.fullmatch(item.strip())
        if not found:
            raise UsageError(source, f"{part!r}: {item!r} is not a number or a range",
                             "Write ranges as [1-4] or lists as [1,3,5]")
        low, high = found.group(1), found.group(2) or found.group(1)
        if int(high) < int(low):
            raise UsageError(source, f"{part!r}: the range {item} goes down",
                             "Write the lower bound first, e.g. [1-4]")
        if int(high) - int(low) >= MAX_NODES:
            raise UsageError(source, f"{part!r}: the range {item} names more than "
                             f"{MAX_NODES} nodes", "Check the node list")
        width = len(low)
        values += [str(i).zfill(width) for i in range(int(low), int(high) + 1)]
    return values
