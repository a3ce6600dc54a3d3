"""The compiled core under AddressSanitizer and UndefinedBehaviorSanitizer: built from the
same source with -fsanitize=address,undefined, fed more than 100,000 hostile datagrams
(tests/native_fuzz.py: every header field, truncations, oversize lengths, wrong tags,
redirected copies, random bytes; through recvmmsg, screen and apply), with no report and
no crash. A sanitizer report ends the process with a non-zero status and its trace, which
the assertion prints.

Mutation caught: the bounds check of apply() against the receiver's own layout (a packet
index past `expected`, a base past the target) removed -> ASan reports a heap overflow.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "harness" / "transport" / "_wire.c"
EXAMPLES = 400  # x 272 datagrams each: 108,800


def compiler_runtime(name: str) -> str:
    return subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("asan") / "_wire.so"
    include = subprocess.run([sys.executable, "-c", "import sysconfig; print("
                              "sysconfig.get_paths()['include'])"], capture_output=True,
                             text=True, check=True).stdout.strip()
    subprocess.run(["gcc", "-O1", "-g", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-shared", "-fPIC",
                    f"-I{include}", str(SOURCE), "-lcrypto", "-o", str(out)], check=True)
    return out


@pytest.mark.slow
def test_hostile_datagrams_under_asan_and_ubsan(sanitized):
    env = {**os.environ, "LD_PRELOAD": compiler_runtime("libasan.so"),
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=66",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=67",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.native_fuzz", str(sanitized),
                           str(EXAMPLES)], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-6000:]
    assert "ERROR: AddressSanitizer" not in done.stderr
    assert "runtime error" not in done.stderr
    fed = int(done.stdout.split("fed ")[1].split()[0])
    assert fed >= 100_000
