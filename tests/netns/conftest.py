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
