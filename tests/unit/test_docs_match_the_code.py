"""The README says what the code does: every option of every command, every LOSSBED_*
variable the code reads, every file it points at, and no placeholder left in it."""

from __future__ import annotations

import re
from pathlib import Path

from testbed import cli

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_every_command_and_option_is_in_the_readme():
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    missing = []
    for name, sub in commands.items():
        if f"lossbed {name}" not in README and f"`{name}`" not in README:
            missing.append(name)
        for action in sub._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help" and flag not in README:
                    missing.append(f"{name} {flag}")
    assert missing == [], f"not in the README: {missing}"


def test_every_lossbed_variable_the_code_reads_is_in_the_readme():
    used = set()
    for path in [*(REPO / "testbed").rglob("*.py"), *(REPO / "harness").rglob("*.py")]:
        used |= set(re.findall(r"LOSSBED_[A-Z_]+[A-Z]", path.read_text()))
    assert used, "no variables found: the pattern is wrong"
    assert sorted(v for v in used if v not in README) == []


def test_the_files_the_readme_names_exist():
    named = set(re.findall(r"`((?:tests|testbed|harness|ansible|netem_profiles)/[\w./-]+)`",
                           README))
    assert named, "no paths found: the pattern is wrong"
    outputs = {"ansible/results/"}  # made by the bench playbook when it runs
    assert sorted(p for p in named - outputs if not (REPO / p.rstrip("/")).exists()) == []


def test_no_placeholder_and_no_make_target_that_does_not_exist():
    assert not re.search(r"\b(BENCH_[A-Z]+|[A-Z]+_MINUTES)\b", README)
    targets = set(re.findall(r"^([a-z-]+):", (REPO / "Makefile").read_text(), re.M))
    for target in re.findall(r"`make ([a-z-]+)", README):
        assert target in targets, f"make {target} is in the README, not in the Makefile"
