"""The layout shows the architecture: rooms by job, and imports that run one way
(cli -> harness and clusters -> host -> impair -> profiles -> basics). A module importing
another that imports it back, even inside a function, is a loop this test names."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the rooms, lowest first: a module may import its own room and the rooms below it
LAYERS = [
    {"testbed", "testbed.errors", "testbed.checks", "testbed.progress", "testbed.stats",
     "testbed.ports", "testbed.yamlfile", "testbed.system_packages", "testbed.python_packages",
     "testbed.version"},
    {"testbed.profiles"},
    {"testbed.impair"},
    {"testbed.host"},
    {"testbed.slurm"},  # (what runs on a Slurm node: the agent, its policy, the Epilog)
    {"testbed.clusters", "testbed.doctor", "testbed.exporter"},
    {"testbed.cli"},
]


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(text: str, modules: set[str]) -> set[str]:
    """The testbed modules a file uses, at any depth of its code: `from pkg import name` is
    the module pkg.name where that is a module, else pkg itself."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m in modules}


def _graph(sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    """module -> the testbed modules it imports, of the repository's testbed (or of
    `sources`: module -> text, a planted package)."""
    if sources is None:
        sources = {_module(p): p.read_text() for p in (REPO / "testbed").rglob("*.py")}
    return {m: _imports(text, set(sources)) - {m} for m, text in sources.items()}


def _room(module: str) -> int:
    for level, rooms in reversed(list(enumerate(LAYERS))):
        if any(module == r or module.startswith(r + ".") for r in rooms - {"testbed"}):
            return level
    if module == "testbed":
        return 0
    raise AssertionError(f"{module} is in no room: add it to LAYERS")


def _loops(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on_stack, loops = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return loops


def _upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return [(m, i) for m, imported in graph.items() for i in imported if _room(i) > _room(m)]


def test_testbed_has_no_import_loops():
    assert _loops(_graph()) == []


def test_imports_run_one_way_between_rooms():
    assert _upward(_graph()) == [], "a room imports one above it"


# a planted package: a loop through an import inside a function, and the profiles (below
# impair) importing upward; the near miss imports downward only
PLANTED = {"testbed.profiles.model": "def f():\n    from testbed.impair import coverage\n",
           "testbed.impair.coverage": "from testbed.profiles import model\n",
           "testbed.errors": "x = 1\n"}
NEAR_MISS = {"testbed.profiles.model": "from testbed import errors\n",
             "testbed.impair.coverage": "from testbed.profiles import model\n",
             "testbed.errors": "x = 1\n"}


def test_the_graph_checks_find_a_planted_loop_and_upward_import():
    planted = _graph(PLANTED)
    assert _loops(planted) == [["testbed.impair.coverage", "testbed.profiles.model"]]
    assert _upward(planted) == [("testbed.profiles.model", "testbed.impair.coverage")]
    near = _graph(NEAR_MISS)
    assert _loops(near) == [] and _upward(near) == []


def test_the_rooms_are_folders_a_newcomer_finds():
    top = sorted(p.name for p in (REPO / "testbed").iterdir()
                 if p.name != "__pycache__" and not p.name.startswith("."))
    assert top == ["__init__.py", "checks.py", "cli.py", "clusters", "doctor", "errors.py",
                   "exporter", "host", "impair", "ports.py", "profiles", "progress.py",
                   "python_packages.py", "slurm", "stats.py", "system_packages.py",
                   "version.py", "yamlfile.py"]


def test_one_entry_point_has_every_command_and_testbed_alone_has_its_own():
    from harness import cli
    from testbed import cli as testbed_cli

    def commands(parser):
        action = next(a for a in parser._actions if a.dest == "command")
        return set(action.choices)

    network = {"up", "down", "status", "exec", "apply", "clear", "show", "verify", "renew",
               "inventory", "doctor", "metrics"}
    experiment = {"train", "bench", "reproduce", "compare", "collective-bench", "run",
                  "report"}
    assert commands(testbed_cli.build_parser()) == network
    assert commands(testbed_cli.build_parser([cli.add_commands])) == network | experiment
    toml = (REPO / "pyproject.toml").read_text()
    assert 'lossbed = "harness.cli:main"' in toml
