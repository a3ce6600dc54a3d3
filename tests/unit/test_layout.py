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
    {"testbed.clusters", "testbed.doctor"},
    {"testbed.cli"},
]


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The testbed modules a file uses, at any depth of its code: `from pkg import name` is
    the module pkg.name where that is a module, else pkg itself."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m in modules}


def _graph() -> dict[str, set[str]]:
    paths = {_module(p): p for p in (REPO / "testbed").rglob("*.py")}
    return {m: _imports(p, set(paths)) - {m} for m, p in paths.items()}


def _room(module: str) -> int:
    for level, rooms in reversed(list(enumerate(LAYERS))):
        if any(module == r or module.startswith(r + ".") for r in rooms - {"testbed"}):
            return level
    if module == "testbed":
        return 0
    raise AssertionError(f"{module} is in no room: add it to LAYERS")


def test_testbed_has_no_import_loops():
    graph = _graph()
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
    assert loops == [], f"import loops: {loops}"


def test_imports_run_one_way_between_rooms():
    wrong = [(m, i) for m, imported in _graph().items() for i in imported
             if _room(i) > _room(m)]
    assert wrong == [], f"a room imports one above it: {wrong}"


def test_the_rooms_are_folders_a_newcomer_finds():
    top = sorted(p.name for p in (REPO / "testbed").iterdir()
                 if p.name != "__pycache__" and not p.name.startswith("."))
    assert top == ["__init__.py", "checks.py", "cli.py", "clusters", "doctor", "errors.py",
                   "host", "impair", "ports.py", "profiles", "progress.py", "python_packages.py",
                   "stats.py", "system_packages.py", "version.py", "yamlfile.py"]


def test_testbed_never_imports_harness():
    # the network half stands alone: the experiment commands live in harness/cli.py, which
    # adds them to testbed's (mutation caught: testbed/cli.py's bench importing
    # harness.bench, as it did until 2026-12-03)
    wrong = []
    for path in (REPO / "testbed").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            wrong += [(str(path.relative_to(REPO)), n) for n in names
                      if n == "harness" or n.startswith("harness.")]
    assert wrong == []


def test_one_entry_point_has_every_command_and_testbed_alone_has_its_own():
    from harness import cli
    from testbed import cli as testbed_cli

    def commands(parser):
        action = next(a for a in parser._actions if a.dest == "command")
        return set(action.choices)

    network = {"up", "down", "status", "exec", "apply", "clear", "show", "verify", "renew",
               "inventory", "doctor"}
    experiment = {"train", "bench", "reproduce", "compare", "collective-bench", "run",
                  "report"}
    assert commands(testbed_cli.build_parser()) == network
    assert commands(testbed_cli.build_parser([cli.add_commands])) == network | experiment
    toml = (REPO / "pyproject.toml").read_text()
    assert 'lossbed = "harness.cli:main"' in toml
