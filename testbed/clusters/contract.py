"""The Cluster contract: what the impairment engine, the launcher and the doctor need from a
set of hosts. Three kinds implement it: namespace hosts on this machine (clusters/netns.py),
qemu VMs with a real kernel each (clusters/vm/), and real machines over SSH
(clusters/remote.py). Code outside testbed/clusters asks a cluster these questions; it never
tests which kind it holds."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from testbed.errors import UsageError
from testbed.host.hosts import Host


@runtime_checkable
class Cluster(Protocol):
    name: str
    """What lossbed calls the cluster (state folder, messages); validated, never a path."""
    kind: str
    """"netns", "vm" or "remote": for records and what is printed, not for decisions."""
    mtu: int
    """The data plane's MTU, the same on every host."""
    hosts: list[Host]
    """The hosts, in rank order: rank r runs on hosts[r] (or its GPUs, see harness/launch)."""
    ssh: bool
    """Every host runs an sshd lossbed made (lossbed up --ssh): `lossbed inventory` lists
    them for Ansible and remote runs; False where lossbed made none (a remote inventory's
    hosts are reached with the operator's own keys)."""

    @property
    def state_dir(self) -> Path:
        """Where lossbed keeps what it knows of this cluster on this machine (the applied
        profile's record, keys): inside lossbed's state root, never a path a user names."""

    def host(self, name: str) -> Host:
        """The host called `name`, or a UsageError naming the hosts there are."""

    @property
    def shares_this_machine(self) -> bool:
        """True when every host is this machine (namespace hosts): ranks then inherit this
        process's environment, Python and file system, and count as one machine's local
        ranks."""

    @property
    def lease_s(self) -> float | None:
        """How long an impairment outlives the controller's last renewal on hosts lossbed
        does not own (remote machines: a lost controller must not leave them impaired);
        None where lossbed owns the hosts and removes what it made itself."""

    @property
    def force_interface(self) -> bool:
        """Impair the interface even if it carries the default route or the SSH session
        (only remote hosts can lock their operator out; False elsewhere)."""

    def connect(self) -> None:
        """Reach every host, or raise a ClusterError naming each unreachable one, before
        anything is applied anywhere (nothing to do for hosts on this machine)."""

    def close(self) -> None:
        """Let go of what connect() opened."""

    def __enter__(self) -> Cluster:
        """A cluster is a context manager: `with` closes it (NamedHosts)."""

    def __exit__(self, *exc) -> None:
        """close()."""

    def rank_python(self, host: Host) -> str:
        """The Python interpreter that runs ranks on the host."""

    def status(self) -> dict:
        """What the kernel and the hosts say now (not what was asked for), as plain data."""


class NamedHosts:
    """host(name), and closing as a context manager, the same for every kind."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise UsageError("HOST", f"cluster {self.name!r} has no host {name!r}",
                         f"Use one of: {', '.join(h.name for h in self.hosts)}")


class HostsLossbedOwns(NamedHosts):
    """The Cluster members that are the same for every kind of host lossbed makes itself
    (namespaces, VMs): it removes what it applied, so no lease; no interface carries an
    operator's session; nothing to connect to beforehand."""

    @property
    def lease_s(self) -> None:
        return None

    @property
    def force_interface(self) -> bool:
        return False

    def connect(self) -> None:
        pass

    def close(self) -> None:
        pass
