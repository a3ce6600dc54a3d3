from __future__ import annotations

import pytest

from testbed import clusters
from testbed.clusters import netns as netns_cluster
from tests.helpers import NOTHING, leftovers, unique_name


@pytest.fixture
def make_cluster():
    """Build clusters through the library; every one is taken down after the test."""
    made = []

    def _make(**kwargs):
        kwargs.setdefault("name", unique_name())
        made.append(kwargs["name"])
        return netns_cluster.up(netns_cluster.ClusterSpec(**kwargs))

    yield _make
    for name in made:
        clusters.down(name)
        assert leftovers(name) == NOTHING


@pytest.fixture(scope="session")
def vm_pair():
    """The one pair of VM hosts every VM module uses (a pair boots in about 14 s under TCG,
    three pairs were a boot per module): with sshd and Soft-RoCE, which the modules that do
    not use them leave alone. Taken down, and checked clean, after the last of them."""
    from tests.helpers import two_vm_hosts

    yield from two_vm_hosts(rdma=True, ssh=True)
