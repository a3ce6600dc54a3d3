"""Test tiers: unit/ needs nothing; netns/ needs root and namespaces (CI is root, so they run
there for real); hardware/ needs a GPU or RDMA device and is skipped without one."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    is_root = os.geteuid() == 0
    has_netns = os.path.exists("/proc/self/ns/net")
    for item in items:
        if item.get_closest_marker("netns") and not (is_root and has_netns):
            item.add_marker(pytest.mark.skip(
                reason="needs root and network namespaces (CI runs these as root)"))
