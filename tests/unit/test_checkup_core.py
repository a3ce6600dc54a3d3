"""The doctor's check of the compiled core: found beside the harness package that the ranks'
Python imports, loaded in a child process of that Python (its libcrypto linked), and a core
that is missing or does not load is named with why. Run in a Python whose path puts a planted
harness/ first."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import REPO

FACTS = ("import json; from testbed.host import checkup; "
         "print(json.dumps(checkup.interpreter_facts()))")


def _facts(first_on_path: str | None) -> dict:
    path = [p for p in (first_on_path, str(REPO)) if p]
    done = subprocess.run([sys.executable, "-c", FACTS], capture_output=True, text=True,
                          cwd="/", env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
                          check=True)
    return json.loads(done.stdout)


def _planted(tmp_path, core: bytes | None):
    transport = tmp_path / "harness" / "transport"
    transport.mkdir(parents=True)
    (tmp_path / "harness" / "__init__.py").write_text("")
    if core is not None:
        import sysconfig

        (transport / f"_wire{sysconfig.get_config_var('EXT_SUFFIX')}").write_bytes(core)
    return str(tmp_path)


def test_the_built_core_is_found_and_loads():
    facts = _facts(None)
    assert facts["core"].startswith(str(REPO / "harness" / "transport" / "_wire"))
    assert "core_error" not in facts


def test_a_missing_core_is_named(tmp_path):
    facts = _facts(_planted(tmp_path, None))
    assert "core" not in facts and "not built for Python" in facts["core_error"]


def test_a_core_that_does_not_load_is_named_with_why(tmp_path):
    facts = _facts(_planted(tmp_path, b"not an ELF file"))
    assert "core" not in facts
    assert "does not load" in facts["core_error"] and "too short" in facts["core_error"]
