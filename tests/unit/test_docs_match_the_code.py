"""The README and docs/ say what the code does: every option of every command, every
LOSSBED_* variable the code reads, every file they point at, and no placeholder left in them.
The README stays a user's document (short; history in docs/results.md), and the generated
reference pages stay equal to what the parsers and the profile models say."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from harness import cli
from testbed import checks

REPO = Path(__file__).resolve().parents[2]
README_ALONE = (REPO / "README.md").read_text()
DOCS = sorted((REPO / "docs").rglob("*.md"))
# what the checks below read: the README and every page of docs/ (each starts a section)
README = "\n\n".join([README_ALONE, *(p.read_text() for p in DOCS)])


def _sections(text: str) -> list[str]:
    """The README cut at its headings: a section is a heading and what follows it."""
    return re.split(r"^(?=#{1,4} )", text, flags=re.M)


def _commands(parser) -> dict:
    return next(a for a in parser._actions if a.dest == "command").choices


def test_every_option_is_documented_with_its_command():
    """Every option of every command's --help stands in a README section that shows that
    command (`lossbed CMD`), not merely somewhere in the file (mutation caught: --lease-s
    documented under apply only, while clear, show and verify take it too)."""
    parser = cli.build_parser()
    missing = []
    for name, sub in _commands(parser).items():
        shown = re.compile(rf"lossbed {re.escape(name)}(?![\w-])")
        sections = [s for s in _sections(README) if shown.search(s)]
        if not sections:
            missing.append(f"lossbed {name}")
            continue
        for action in sub._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help" and not any(
                        re.search(rf"{re.escape(flag)}(?![\w-])", s) for s in sections):
                    missing.append(f"{name} {flag}")
    for action in parser._actions:  # the options before the command (-v)
        for flag in action.option_strings:
            if flag not in ("-h", "--help") and f"lossbed {flag}" not in README:
                missing.append(f"lossbed {flag}")
    assert missing == [], f"not documented with their command in the README: {missing}"


def _readme_command_lines() -> list[str]:
    """Every `lossbed …` command the README shows: in code blocks (a line, or what follows
    `ip netns exec NS`) and in inline code, with its comment cut, optional parts ([…])
    opened, and alternatives (a|b) and placeholders (…) left to the test to resolve."""
    found = []
    for block in re.findall(r"```(?:sh|bash|console)?\n(.*?)```", README, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():  # continued lines
            line = re.sub(r"\s+#.*$", "", line).strip()
            at = line.find("lossbed ")
            if at >= 0 and (at == 0 or line[:at].rstrip().endswith(("-ctl", "$", "&&"))):
                found.append(line[at:])
    found += [c for c in re.findall(r"`(lossbed [^`]+)`", README)]
    return found


def _placeholders_filled(sub, words: list[str]) -> list[str]:
    """A placeholder (N, B, MIB: upper case) after an option that takes a number or a
    choice, replaced by a value it takes."""
    flags = {f: a for a in sub._actions for f in a.option_strings}
    out = list(words)
    for i in range(1, len(out)):
        action = flags.get(out[i - 1])
        if action is None or not re.fullmatch(r"[A-Z][A-Z0-9_]*", out[i]):
            continue
        if action.choices:
            out[i] = str(list(action.choices)[0])
        elif action.type in (int, float, checks.loss_text):
            out[i] = "1"
    return out


def test_every_lossbed_command_the_readme_shows_parses():
    """Mutation caught: a README line with an option the command does not have (it once
    showed `lossbed status --inventory …`, which status did not take)."""
    import shlex

    parser = cli.build_parser()
    failures = []
    lines = _readme_command_lines()
    assert len(lines) > 20, lines  # the patterns find the README's commands
    for line in lines:
        text = line
        while "[" in text:  # optional parts, innermost first: [a] is a, [a | b] is a
            text = re.sub(r"\[([^][]*)\]", lambda m: m.group(1).split(" | ")[0], text)
        text = text.replace("...", " ")
        text = re.sub(r"\s>\s.*$", "", text)  # a shell redirection
        text = re.sub(r"([^\s|]+)(?:\|[^\s|]+)+", r"\1", text).replace("…", "X")  # a|b: a
        words = shlex.split(text)[1:]
        options = list(itertools.takewhile(lambda w: w.startswith("-"), words))  # -v
        command, words = words[len(options):len(options) + 1], words[len(options):]
        if command == ["X"]:  # `lossbed … --inventory FILE`: any command
            continue
        if not command and options and set(options) <= {"--version", "--help", "-h"}:
            continue  # an option that answers by itself, no command after it
        if not command or command[0] not in _commands(parser):
            failures.append((line, "no such command"))
            continue
        if len(words) == 1:  # `lossbed CMD` in a sentence names the command, no more
            continue
        try:
            sub = _commands(parser)[command[0]]
            parser.parse_args([*options, *_placeholders_filled(sub, words)])
        except SystemExit:
            failures.append((line, "does not parse"))
    assert failures == [], failures


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


# What prints the README's figures: a benchmark under tests/benchmarks/, or a lossbed command
PRODUCER = re.compile(r"tests/benchmarks/\w+\.py|tests\.benchmarks\.\w+|"
                      r"lossbed (?:bench|reproduce|collective-bench|train)\b|"
                      r"make (?:bench|reproduce)|`reproduce`|`collective-bench`")
# A measured figure: a time, a rate, or a ratio written N.N×
FIGURE = re.compile(r"\d(?:\.\d+)?\s?(?:µs|ms|Gbit/s|tok/s|tokens/s)(?!\w)|\d\.\d+×")


def unsourced_figures(text: str) -> list[str]:
    """Paragraphs that quote a measured figure without naming what prints it: the paragraph
    itself names it, or, for a table, the paragraph just before it."""
    bad = []
    for section in _sections(text):
        paragraphs = re.split(r"\n\s*\n", section)
        for i, para in enumerate(paragraphs):
            if para.lstrip().startswith("```") or not FIGURE.search(para):
                continue
            before = paragraphs[i - 1] if i else ""
            if PRODUCER.search(para) or (para.lstrip().startswith("|")
                                         and PRODUCER.search(before)):
                continue
            bad.append(para.strip()[:120])
    return bad


def test_every_figure_the_readme_quotes_names_what_prints_it():
    """Mutation caught: a paragraph that quotes µs, ms, Gbit/s, tok/s or a ×-ratio and names
    no benchmark (planted below, and the README's 0.6-3.3 µs before it named bench_wire)."""
    assert unsourced_figures(README) == []
    planted = "## A section\n\nThe core seals a datagram in 3.1 µs.\n"
    assert unsourced_figures(planted) == ["The core seals a datagram in 3.1 µs."]
    sourced = planted.replace("3.1 µs.", "3.1 µs (`tests/benchmarks/bench_wire.py`).")
    assert unsourced_figures(sourced) == []


def test_the_readme_is_a_users_document():
    """Short, and the measurement history lives in docs/results.md: a README that names
    commits all over is a lab notebook again."""
    lines = README_ALONE.splitlines()
    assert len(lines) <= 250, len(lines)
    commits = set(re.findall(r"\b[0-9a-f]{7}\b", README_ALONE))
    assert len(commits) <= 2, commits  # the headline results' commit (and the sample's)
    assert "SAMPLE_" not in README_ALONE
    for page in ("docs/concepts.md", "docs/guides/one-machine.md", "docs/guides/gpu-cluster.md",
                 "docs/guides/your-training.md", "docs/reference/cli.md",
                 "docs/reference/profiles.md", "docs/reference/environment.md",
                 "docs/reference/outputs.md", "docs/explanation/methodology.md",
                 "docs/explanation/threat-model.md", "docs/explanation/data-plane.md",
                 "docs/results.md"):
        assert (REPO / page).is_file() and f"]({page})" in README_ALONE, page


def test_the_generated_reference_pages_are_current():
    from tests import docs_reference

    assert docs_reference.CLI_PAGE.read_text() == docs_reference.cli_page(), \
        "docs/reference/cli.md is stale: python -m tests.docs_reference"
    assert docs_reference.PROFILES_PAGE.read_text() == docs_reference.profiles_page(), \
        "docs/reference/profiles.md is stale: python -m tests.docs_reference"
    assert docs_reference.OUTPUTS_PAGE.read_text() == docs_reference.outputs_page(), \
        "docs/reference/outputs.md's table of fields is stale: python -m tests.docs_reference"


def test_every_link_between_the_documents_resolves():
    broken = []
    for page in [REPO / "README.md", *DOCS]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith("http") and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert broken == []


def test_the_readme_says_where_make_setup_puts_lossbed_and_how_to_reach_it():
    """`make setup` installs the `lossbed` script (pyproject's) into the Makefile's VENV's
    bin/: the README says so, and how to put it on PATH (#66)."""
    import re
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    venv = re.search(r"^VENV \?= (\S+)$", (REPO / "Makefile").read_text(), re.M).group(1)
    assert "lossbed" in scripts
    assert f"`{venv}/bin/lossbed`" in README_ALONE
    assert f'export PATH="$PWD/{venv}/bin:$PATH"' in README_ALONE
