"""The house rules of issue #44, held: rooms of one job each, none too large to read, no
import pointing back up a layer. A production module over MODULE_LINES says why at its top
("Why one file"); no class is over CLASS_LINES."""

from __future__ import annotations

import ast

from tests.helpers import REPO

MODULE_LINES = 500
CLASS_LINES = 310  # "~300": the largest room's share of a module
PRODUCTION = ("harness", "testbed")


def _sources():
    for root in PRODUCTION:
        yield from sorted((REPO / root).rglob("*.py"))
    yield from sorted((REPO / "harness").rglob("*.c"))


def test_no_module_is_over_its_size_without_a_reason_at_its_top():
    unexplained = []
    for path in _sources():
        text = path.read_text()
        head = "\n".join(text.splitlines()[:60])
        if text.count("\n") > MODULE_LINES and "Why one file" not in head:
            unexplained.append(f"{path.relative_to(REPO)}: {text.count(chr(10))} lines")
    assert unexplained == []


def test_no_class_is_over_its_size():
    large = []
    for path in _sources():
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno >= CLASS_LINES:
                large.append(f"{path.relative_to(REPO)}: {node.name} "
                             f"{node.end_lineno - node.lineno + 1} lines")
    assert large == []


def test_testbed_never_imports_harness():
    """The testbed (hosts, links, impairment) stands below the harness that trains on it."""
    upward = []
    for path in sorted((REPO / "testbed").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            upward += [f"{path.relative_to(REPO)}:{node.lineno}" for n in names
                       if n == "harness" or n.startswith("harness.")]
    assert upward == []


def test_production_never_imports_the_tests_references():
    found = []
    for path in _sources():
        if path.suffix == ".py" and "from tests" in path.read_text():
            found.append(str(path.relative_to(REPO)))
    assert found == []
