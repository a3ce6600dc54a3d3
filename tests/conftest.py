"""Test tiers: unit/ needs nothing; netns/ needs root and namespaces (CI is root, so they run
there for real); hardware/ needs a GPU or RDMA device and is skipped without one."""

from __future__ import annotations

import os

import pytest


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
