"""Test tiers: unit/ needs nothing; netns/ needs root and namespaces (CI is root, so they run
there for real); hardware/ needs a GPU or RDMA device and is skipped without one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.forkaudit import sitecustomize as fork_audit

FORK_AUDIT_DIR = Path(fork_audit.__file__).parent


def _vm_hosts_missing() -> str | None:
    """Why VM hosts cannot boot here (qemu or a distribution kernel missing), or None."""
    from testbed.clusters.vm import image, kernel
    from testbed.errors import EnvironmentProblem

    try:
        image.require_qemu()
        kernel.find_kernel()
        kernel.find_busybox()
    except EnvironmentProblem as err:
        return f"VM hosts cannot boot here: {err}"
    return None


def pytest_collection_modifyitems(config, items):
    is_root = os.geteuid() == 0
    has_netns = os.path.exists("/proc/self/ns/net")
    vm_missing = None
    if any(item.get_closest_marker("vm") for item in items):
        vm_missing = _vm_hosts_missing()
    for item in items:
        if item.get_closest_marker("netns") and not (is_root and has_netns):
            item.add_marker(pytest.mark.skip(
                reason="needs root and network namespaces (CI runs these as root)"))
        elif item.get_closest_marker("vm") and vm_missing:
            item.add_marker(pytest.mark.skip(reason=vm_missing))


@pytest.fixture(autouse=True)
def no_fork_while_threads_run(tmp_path_factory, monkeypatch):
    """Every test, and every Python process it starts, runs under the fork audit
    (tests/forkaudit/sitecustomize.py): os.fork/os.forkpty while more than one thread is alive
    fails there and fails the test, naming the call and its stack."""
    log_path = tmp_path_factory.mktemp("fork-audit") / "forks.log"
    monkeypatch.setenv(fork_audit.LOG_ENV, str(log_path))
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(FORK_AUDIT_DIR), path) if p))
    yield
    if log_path.exists() and log_path.read_text():
        pytest.fail("a fork while threads were alive:\n" + log_path.read_text(), pytrace=False)
