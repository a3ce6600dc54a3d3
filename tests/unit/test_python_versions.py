"""lossbed runs on the Pythons GPU hosts bring (3.11 to 3.13; Ubuntu 24.04's is 3.12): it uses
nothing 3.12 or 3.13 removed, and nothing they deprecate. The suite runs on 3.11 here, so the
calls are found in the source; the warnings 3.11 itself gives are errors by pyproject.toml's
filterwarnings."""

from __future__ import annotations

import tomllib

from tests.helpers import REPO


def test_the_supported_pythons_are_declared_and_lossbeds_deprecations_are_errors():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == ">=3.11"
    filters = project["tool"]["pytest"]["ini_options"]["filterwarnings"]
    for package in ("harness", "testbed"):
        assert f"error::DeprecationWarning:{package}" in filters
