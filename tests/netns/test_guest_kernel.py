"""Fetching VM hosts' kernel changes nothing about how this machine boots: /boot and dpkg's
list of kernel packages are the same after, and what came is a kernel VM hosts can boot
(an image, its modules with modules.dep; the VM tests boot it). Downloads the distribution's
kernel package (about 70 MB) into a folder of this test's own."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from testbed.clusters.vm import kernel

pytestmark = [pytest.mark.netns, pytest.mark.vm, pytest.mark.slow]


def boot_state() -> tuple:
    listing = sorted((p.name, p.stat().st_mtime_ns) for p in Path("/boot").iterdir()) \
        if Path("/boot").is_dir() else []
    packages = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Status}\n",
                               "linux-image*", "linux-modules*"],
                              capture_output=True, text=True).stdout
    return listing, sorted(packages.splitlines())


def test_fetching_the_guest_kernel_leaves_boot_and_dpkg_as_they_were(tmp_path):
    before = boot_state()
    lines = []
    fetched = kernel.fetch(cache=tmp_path / "cache", echo=lines.append)
    assert boot_state() == before
    assert fetched.image.is_file() and (fetched.modules / "modules.dep").is_file()
    assert fetched.root.parent == tmp_path / "cache" and fetched.version in fetched.image.name
    assert (fetched.modules / "kernel" / "net" / "sched").is_dir()  # netem and friends
    # a second fetch finds the same version there and downloads nothing
    again = []
    assert kernel.fetch(cache=tmp_path / "cache", echo=again.append) == fetched
    assert any("in the cache already" in line for line in again), again
    assert not any(name.startswith(".fetch-") for name in os.listdir(tmp_path / "cache"))
