"""Every check that reads lossbed's source holds over the repository, and is seen to fire:
each on its planted breach (exactly the planted lines) and on none of its near miss
(tests/source_checks.py, where a check is added with its plants, #71)."""

from __future__ import annotations

import pytest

from tests import source_checks
from tests.helpers import REPO

CHECKS = {check.name: check for check in source_checks.CHECKS}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_source_keeps_the_rule(name):
    check = CHECKS[name]
    assert source_checks.scan(check) == [], check.why


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_check_names_its_planted_breach_and_not_its_near_miss(name):
    check = CHECKS[name]
    assert check.applies(check.planted_path)
    assert sorted(check.find(check.planted, check.planted_path)) == list(check.planted_lines)
    assert check.find(check.near_miss, check.planted_path) == []


def test_each_check_reads_the_modules_it_names():
    """A check whose folders or filter match no module would hold vacuously."""
    for check in source_checks.CHECKS:
        assert any(True for _ in source_checks.sources(check)), check.name


def test_no_test_parses_the_source_past_the_checks_with_plants():
    """A test module that parses lossbed's source for a pattern does it through
    tests/source_checks.py; the two that parse it otherwise say where their planted case is:
    test_layout's import graph (a planted loop and a planted upward import) and reproduce's
    row labels (the scan finds the rows it knows)."""
    parsing = sorted(p.name for p in (REPO / "tests" / "unit").glob("test_*.py")
                     if p.name != "test_source_checks.py" and "ast.parse(" in p.read_text())
    assert parsing == ["test_layout.py", "test_reproduce.py"]
