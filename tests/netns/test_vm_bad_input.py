"""VM hosts: what is missing on the machine is named with the package that provides it, and
nothing is left behind."""

from __future__ import annotations

import pytest

from testbed.clusters.vm import cluster as vm_cluster
from testbed.clusters.vm import image, kernel
from testbed.errors import EnvironmentProblem, UsageError
from tests.helpers import NOTHING, leftovers, lossbed, unique_name

pytestmark = [pytest.mark.netns, pytest.mark.vm]


def up(**kwargs):
    return vm_cluster.up(vm_cluster.VMSpec(**kwargs))


def test_qemu_missing(monkeypatch):
    monkeypatch.setattr(image, "QEMU", "qemu-system-x86_64-not-installed")
    name = unique_name()
    with pytest.raises(EnvironmentProblem, match="install qemu-system-x86"):
        up(hosts=2, name=name)
    assert leftovers(name) == NOTHING


def test_no_guest_kernel_in_the_cache_names_make_setup(monkeypatch, tmp_path):
    monkeypatch.delenv(kernel.KERNEL_ENV, raising=False)
    monkeypatch.setattr(kernel, "CACHE", tmp_path / "empty-cache")
    name = unique_name()
    with pytest.raises(EnvironmentProblem, match=r"no guest kernel .*`make setup`.*"
                                                 r"LOSSBED_VM_KERNEL=DIR"):
        up(hosts=2, name=name)
    assert leftovers(name) == NOTHING


def test_a_given_kernel_folder_without_a_kernel_is_named(monkeypatch, tmp_path):
    (tmp_path / "lib" / "modules" / "6.1.0-test").mkdir(parents=True)
    monkeypatch.setenv(kernel.KERNEL_ENV, str(tmp_path))
    name = unique_name()
    with pytest.raises(EnvironmentProblem, match=r"LOSSBED_VM_KERNEL .* has no vmlinuz"):
        up(hosts=2, name=name)
    assert leftovers(name) == NOTHING


def test_rdma_without_rdma_core(monkeypatch):
    monkeypatch.setattr(vm_cluster, "RDMA_COMMANDS", ("rdma", "ibv_devices_not_installed"))
    name = unique_name()
    with pytest.raises(EnvironmentProblem,
                       match="Install rdma-core ibverbs-utils python3-pyverbs"):
        up(hosts=2, name=name, rdma=True)
    assert leftovers(name) == NOTHING


def test_more_vms_than_memory_allows():
    name = unique_name()
    with pytest.raises(UsageError, match=r"--hosts: 200 VMs of 768 MB need about .* Use "
                                         r"--hosts \d+ or fewer"):
        up(hosts=200, name=name)
    assert leftovers(name) == NOTHING
    result = lossbed("up", "--kind", "vm", "--hosts", "200", "--name", name)
    assert result.returncode == 2 and "--memory-mb" in result.stderr
    assert leftovers(name) == NOTHING


def test_rdma_on_namespace_hosts_is_refused():
    name = unique_name()
    result = lossbed("up", "--hosts", "2", "--name", name, "--rdma")
    assert result.returncode == 2 and "--kind vm --rdma" in result.stderr
    assert leftovers(name) == NOTHING
