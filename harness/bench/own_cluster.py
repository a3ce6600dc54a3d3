"""The local cluster a bench, a reproduction or a collective bench builds for itself when
no cluster is named: namespace hosts of the spec's size and MTU, removed after it."""

from __future__ import annotations

import contextlib
import os

from testbed import clusters
from testbed.clusters import netns as netns_cluster


@contextlib.contextmanager
def own_cluster(prefix: str, spec):
    """A local cluster made for one bench alone (spec.hosts, spec.mtu), removed after, also
    on Ctrl-C and on failure. Its datagrams are sealed like any others unless the bench
    was asked for --unsealed (spec.isolated: then its profiles say isolated)."""
    name = f"{prefix}{os.getpid() % 100000}"
    cluster = netns_cluster.up(netns_cluster.ClusterSpec(hosts=spec.hosts, name=name,
                                                         mtu=spec.mtu))
    try:
        yield cluster
    finally:
        clusters.down(name)
