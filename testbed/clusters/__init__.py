"""Find clusters by name, whatever their kind, and take them down."""

from __future__ import annotations

import contextlib

from testbed.clusters import naming, state
from testbed.clusters import netns as netns_cluster
from testbed.errors import ClusterError


def known_clusters() -> list[str]:
    """Clusters with a record here, and clusters that left objects behind without one."""
    return sorted(set(state.recorded_clusters()) | netns_cluster.leftover_clusters())


def resolve_name(name: str | None, how: str = "--cluster NAME") -> str:
    """The cluster the user means: the one named, or else the only one that is up."""
    if name is not None:
        return naming.check_cluster_name(name, "--cluster" if "--cluster" in how else "NAME")
    names = known_clusters()
    if not names:
        raise ClusterError("no cluster is up: start one with: lossbed up --hosts 4")
    if len(names) > 1:
        raise ClusterError(
            f"several clusters are up ({', '.join(names)}): say which with {how}"
        )
    return names[0]


# The clusters a command loaded: closed when the command ends (testbed/cli.py's main calls
# close_opened), whatever way it ends, so a remote cluster's connections are let go of
_OPENED = contextlib.ExitStack()


def opened(cluster):
    """`cluster`, to be closed when the command ends (close_opened)."""
    return _OPENED.enter_context(cluster)


def close_opened() -> None:
    """Close every cluster the command opened (Cluster.close), the last opened first."""
    _OPENED.close()


def load(name: str | None, how: str = "--cluster NAME"):
    """The cluster object of a cluster that is fully up (closed when the command ends)."""
    name = resolve_name(name, how)
    record = state.read(name)
    if record is None:
        up = known_clusters()
        raise ClusterError(
            f"cluster {name!r} is not up; "
            + (f"clusters here: {', '.join(up)}" if up else "none is: start one with lossbed up "
               "--hosts 4")
            + f" (after a crash, lossbed down {name} removes any leftovers of it)")
    if record.get("status") != "up":
        raise ClusterError(
            f"cluster {name!r} is incomplete (status {record.get('status')!r}, its `up` "
            f"was interrupted): remove it with: lossbed down {name}"
        )
    if record["kind"] == netns_cluster.KIND:
        return opened(netns_cluster.LocalCluster.from_record(record))
    if record["kind"] == "vm":
        from testbed.clusters.vm.cluster import VMCluster

        return opened(VMCluster.from_record(record))
    raise ClusterError(f"cluster {name!r} has unknown kind {record['kind']!r}")


def down(name: str) -> dict:
    naming.check_cluster_name(name, "NAME")
    record = state.read(name) or {}
    kind = record.get("kind", netns_cluster.KIND)
    if kind in (netns_cluster.KIND, "vm"):
        # VM hosts' qemu processes live in the switch namespace: the same teardown finds them.
        return netns_cluster.down(name)
    raise ClusterError(f"cluster {name!r} has unknown kind {kind!r}")
