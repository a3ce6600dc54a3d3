"""lossbed runs on the Pythons GPU hosts bring (3.11 to 3.13; Ubuntu 24.04's is 3.12): it uses
nothing 3.12 or 3.13 removed, and nothing they deprecate. The suite runs on 3.11 here, so the
calls are found in the source; the warnings 3.11 itself gives are errors by pyproject.toml's
filterwarnings."""

from __future__ import annotations

import ast
import tomllib

from tests.helpers import REPO

# Modules removed in 3.12 (PEP 632, asyncore's kin, imp) and 3.13 (PEP 594's dead batteries)
REMOVED_MODULES = {
    "distutils", "imp", "asynchat", "asyncore", "smtpd",
    "aifc", "audioop", "cgi", "cgitb", "chunk", "crypt", "imghdr", "mailcap", "msilib", "nis",
    "nntplib", "ossaudiodev", "pipes", "sndhdr", "spwd", "sunau", "telnetlib", "uu", "xdrlib",
    "lib2to3",
}
# Calls and names deprecated in 3.12 or 3.13, by the attribute a caller writes
DEPRECATED_ATTRIBUTES = {
    "utcnow": "datetime.utcnow (3.12): datetime.now(timezone.utc)",
    "utcfromtimestamp": "datetime.utcfromtimestamp (3.12): fromtimestamp(t, timezone.utc)",
    "getdefaultlocale": "locale.getdefaultlocale (3.11, removed 3.15)",
    "find_loader": "pkgutil.find_loader (3.12): importlib.util.find_spec",
    "get_loader": "pkgutil.get_loader (3.12): importlib.util.find_spec",
    "Num": "ast.Num (3.12): ast.Constant",
    "Str": "ast.Str (3.12): ast.Constant",
    "NameConstant": "ast.NameConstant (3.12): ast.Constant",
    "get_event_loop": "asyncio.get_event_loop without a running loop (3.12)",
    "getargspec": "inspect.getargspec: removed in 3.11",
}
DEPRECATED_KEYWORDS = {"onerror": "shutil.rmtree(onerror=) (3.12): onexc="}


def _sources():
    for folder in ("harness", "testbed"):
        for path in sorted((REPO / folder).rglob("*.py")):
            yield path.relative_to(REPO), ast.parse(path.read_text())


def test_nothing_removed_or_deprecated_in_3_12_or_3_13_is_used():
    found = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module.split(".")[0]]
            else:
                names = []
            found += [f"{path}:{node.lineno} imports {n} (removed)" for n in names
                      if n in REMOVED_MODULES]
            if isinstance(node, ast.Attribute) and node.attr in DEPRECATED_ATTRIBUTES:
                found.append(f"{path}:{node.lineno} {DEPRECATED_ATTRIBUTES[node.attr]}")
            if isinstance(node, ast.keyword) and node.arg in DEPRECATED_KEYWORDS:
                found.append(f"{path}:{node.lineno} {DEPRECATED_KEYWORDS[node.arg]}")
    assert not found, "\n".join(found)


def test_the_supported_pythons_are_declared_and_lossbeds_deprecations_are_errors():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == ">=3.11"
    filters = project["tool"]["pytest"]["ini_options"]["filterwarnings"]
    for package in ("harness", "testbed"):
        assert f"error::DeprecationWarning:{package}" in filters
