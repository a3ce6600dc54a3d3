"""The local cluster: N hosts as network namespaces joined by a bridge in a switch namespace.

    host h1 (ns lossbed-<c>-h1)        switch (ns lossbed-<c>-switch)        host h2
    eth0 10.201.0.1/24 ==veth== <c>-h1 --[ bridge <c>-br ]-- <c>-h2 ==veth== eth0 10.201.0.2

Real kernel networking: veth pairs, a Linux bridge, real addresses. Segmentation offloads are
off on both ends of every link so one packet on a link is one MTU-sized packet. Everything is
made through netlink (pyroute2) inside namespaces lossbed owns; nothing is added to the
machine's own namespace.
"""

from __future__ import annotations

import ipaddress
import logging
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyroute2 import IPRoute

from testbed.clusters import addressing, naming, preflight, sshd, state, switch
from testbed.clusters.contract import HostsLossbedOwns
from testbed.errors import ClusterError, UsageError
from testbed.host import namespaces
from testbed.host.hosts import (
    NamespaceHost,
    disable_offloads,
    kill_namespace_processes,
    read_offloads,
)
from testbed.progress import Progress

log = logging.getLogger(__name__)

KIND = "netns"
MAX_HOSTS = 64  # namespace hosts one `up` builds on this machine
MTU_MIN, MTU_MAX = 68, 65535
NETNS_ETC = Path("/etc/netns")


@dataclass
class ClusterSpec:
    """What `lossbed up` was asked for, before validation."""

    hosts: int
    name: str = naming.DEFAULT_CLUSTER_NAME
    mtu: int = 1500
    subnet: str | None = None
    ssh: bool = False


@dataclass
class LocalCluster(HostsLossbedOwns):
    name: str
    subnet: ipaddress.IPv4Network
    mtu: int
    ssh: bool
    hosts: list[NamespaceHost]
    mgmt_subnet: ipaddress.IPv4Network | None = None
    kind: str = field(default=KIND, init=False)

    # ---- the Cluster contract (testbed/clusters/contract.py; the rest: HostsLossbedOwns) -

    @property
    def shares_this_machine(self) -> bool:
        return True

    def rank_python(self, host) -> str:
        return sys.executable

    @property
    def switch_namespace(self) -> str:
        return naming.switch_namespace(self.name)

    @property
    def state_dir(self) -> Path:
        return state.cluster_dir(self.name)

    # ---- record -------------------------------------------------------------------------

    def record(self, status: str) -> dict:
        return {
            "kind": KIND, "name": self.name, "status": status, "subnet": str(self.subnet),
            "mtu": self.mtu, "ssh": self.ssh, "switch_namespace": self.switch_namespace,
            "hosts": [h.to_dict() for h in self.hosts],
            "mgmt_subnet": str(self.mgmt_subnet) if self.mgmt_subnet else None,
        }

    @classmethod
    def from_record(cls, record: dict) -> LocalCluster:
        return cls(
            name=record["name"], subnet=ipaddress.ip_network(record["subnet"]),
            mtu=record["mtu"], ssh=record["ssh"],
            hosts=[NamespaceHost(**h) for h in record["hosts"]],
            mgmt_subnet=(ipaddress.ip_network(record["mgmt_subnet"])
                         if record.get("mgmt_subnet") else None),
        )

    # ---- status ------------------------------------------------------------------------

    def status(self) -> dict:
        """What the kernel says now (not what was asked for): addresses, MTU, offloads, sshd."""
        hosts = []
        with namespaces.netlink(self.switch_namespace) as sw:
            switch_sock = namespaces.socket_in(self.switch_namespace)
            for h in self.hosts:
                port = naming.switch_port_ifname(self.name, h.name)
                port_links = sw.link("get", ifname=port)
                with h.netlink() as ipr:
                    link = ipr.link("get", ifname=h.ifname)[0]
                    addrs = [
                        f"{a.get('IFA_ADDRESS')}/{a['prefixlen']}"
                        for a in ipr.addr("dump", index=link["index"])
                    ]
                hosts.append({
                    "name": h.name, "namespace": h.namespace, "interface": h.ifname,
                    "address": h.address, "kernel_addresses": addrs,
                    "mtu": link.get("IFLA_MTU"), "state": link.get("IFLA_OPERSTATE"),
                    "offloads": h.offloads(),
                    "switch_port": {
                        "interface": port, "mtu": port_links[0].get("IFLA_MTU"),
                        "offloads": read_offloads(_dup(switch_sock), port),
                    },
                    "sshd_pid": sshd.running_pid(self.state_dir, h) if self.ssh else None,
                })
            switch_sock.close()
        out = {
            "name": self.name, "kind": KIND, "subnet": str(self.subnet), "mtu": self.mtu,
            "switch_namespace": self.switch_namespace, "hosts": hosts,
        }
        if self.ssh:
            out["ssh"] = {
                "user": "root", "port": sshd.SSH_PORT,
                "key": str(sshd.client_key(self.state_dir)),
                "known_hosts": str(sshd.known_hosts(self.state_dir)),
            }
        return out


def _dup(sock):
    # read_offloads closes the socket it is given; hand it a duplicate of the switch's one.
    return sock.dup()


# ---- up -------------------------------------------------------------------------------------


def _taken_subnets(exclude: str) -> list[tuple[ipaddress.IPv4Network, str]]:
    """Subnets already in use: other lossbed clusters and this machine's own routes (read only)."""
    taken = []
    for other in state.recorded_clusters():
        record = state.read(other)
        if other != exclude and record and "subnet" in record:
            taken.append((ipaddress.ip_network(record["subnet"]), f"cluster {other}"))
            if record.get("mgmt_subnet"):
                taken.append((ipaddress.ip_network(record["mgmt_subnet"]),
                              f"cluster {other} (management)"))
    with IPRoute() as ipr:
        for route in ipr.get_routes(family=2):
            dst_len = route["dst_len"]
            if dst_len == 0:
                continue  # the default route overlaps everything by definition
            dst = route.get("RTA_DST")
            if dst:
                taken.append((ipaddress.ip_network(f"{dst}/{dst_len}", strict=False),
                              "a route of this machine"))
    return taken


def validate(spec: ClusterSpec) -> LocalCluster:
    """Check every option and resolve defaults; touches nothing."""
    if spec.hosts < 1:
        raise UsageError("--hosts", f"{spec.hosts} is too few", "A cluster needs --hosts 1 or more")
    if spec.hosts > MAX_HOSTS:  # (a typo such as 1000 for 10 would build them all)
        raise UsageError("--hosts", f"{spec.hosts} namespace hosts on one machine",
                         f"Use --hosts {MAX_HOSTS} or fewer: they share this machine's cores "
                         "and memory, each with ranks of its own")
    naming.validate_cluster_name(spec.name, spec.hosts)
    if not MTU_MIN <= spec.mtu <= MTU_MAX:
        raise UsageError(
            "--mtu", f"{spec.mtu} is outside {MTU_MIN}..{MTU_MAX}",
            "Use e.g. --mtu 1500 (Ethernet) or --mtu 9000 (jumbo frames)",
        )
    taken = _taken_subnets(exclude=spec.name)
    if spec.subnet is None:
        subnet = addressing.pick_free(spec.hosts, taken)
    else:
        subnet = addressing.parse_subnet(spec.subnet)
        addressing.check_fits(subnet, spec.hosts)
        addressing.check_no_overlap(subnet, taken)
    addresses = addressing.host_addresses(subnet, spec.hosts)
    names = [naming.host_name(i) for i in range(spec.hosts)]
    mgmt_subnet, mgmt = None, [""] * spec.hosts
    if spec.ssh:
        from testbed.clusters import management

        mgmt_subnet = management.pick_subnet(spec.hosts, [*taken, (subnet, "this cluster")])
        mgmt = addressing.host_addresses(mgmt_subnet, spec.hosts)
    hosts = [
        NamespaceHost(name=host, namespace=naming.host_namespace(spec.name, host),
                      address=address, ifname=naming.HOST_IFNAME, mgmt_address=m)
        for host, address, m in zip(names, addresses, mgmt, strict=True)
    ]
    return LocalCluster(name=spec.name, subnet=subnet, mtu=spec.mtu, ssh=spec.ssh, hosts=hosts,
                        mgmt_subnet=mgmt_subnet)


def up(spec: ClusterSpec) -> LocalCluster:
    """Build the cluster, or nothing: any failure (or Ctrl-C) tears down what was made."""
    naming.check_cluster_name(spec.name, "--name")  # bad input first, then the machine
    preflight.require_root("lossbed up")
    preflight.require_namespaces()
    preflight.require_commands("ip", package="iproute2")
    cluster = validate(spec)
    leftovers = cluster_namespaces(cluster.name)
    if leftovers and not state.read(cluster.name):
        raise ClusterError(
            f"namespaces of an earlier cluster {cluster.name!r} are still present "
            f"({', '.join(leftovers[:3])}...): remove them with: lossbed down {cluster.name}"
        )
    state.claim(cluster.name)
    started = time.monotonic()
    try:
        # Record the intent before the first kernel object: a crash from here on is undone
        # by `lossbed down`, which also scans by prefix.
        state.write(cluster.name, cluster.record("building"))
        _build(cluster)
        state.write(cluster.name, cluster.record("up"))
    except BaseException:
        log.error("building cluster %s failed: removing what was created", cluster.name)
        down(cluster.name)
        raise
    log.info("cluster %s: %d hosts up in %.2f s", cluster.name, len(cluster.hosts),
             time.monotonic() - started)
    return cluster


def _build(cluster: LocalCluster) -> None:
    n = len(cluster.hosts)
    progress = Progress(f"up {cluster.name}", total=3 * n + (n if cluster.ssh else 0))
    switch.create(cluster.name)
    for h in cluster.hosts:
        namespaces.create(h.namespace)
        progress.advance("namespaces")

    ports = [naming.switch_port_ifname(cluster.name, h.name) for h in cluster.hosts]
    with namespaces.netlink(cluster.switch_namespace) as sw:
        for h, port in zip(cluster.hosts, ports, strict=True):
            # Made inside the switch namespace with its peer placed straight into the host's,
            # so the pair never exists in the machine's own namespace.
            sw.link("add", ifname=port, kind="veth", mtu=cluster.mtu,
                    peer={"ifname": h.ifname, "net_ns_fd": h.namespace, "mtu": cluster.mtu})
            progress.advance("links")
    switch.plug(cluster.name, ports, cluster.mtu)

    for h in cluster.hosts:
        with h.netlink() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            eth = ipr.link_lookup(ifname=h.ifname)[0]
            ipr.addr("add", index=eth, address=h.address, prefixlen=cluster.subnet.prefixlen)
            ipr.link("set", index=eth, state="up")
        disable_offloads(h.socket(), h.ifname)
        _write_hosts_file(cluster, h)
        progress.advance("hosts")

    if cluster.ssh:
        from testbed.clusters import management

        management.build(cluster, cluster.mgmt_subnet)
        sshd.prepare(cluster.state_dir, cluster.hosts)
        for h in cluster.hosts:
            sshd.start(cluster.state_dir, h)
            progress.advance("sshd")
    progress.finish()


def _write_hosts_file(cluster: LocalCluster, host: NamespaceHost) -> None:
    """/etc/netns/<ns>/hosts: `ip netns exec` binds it over /etc/hosts inside the host."""
    folder = NETNS_ETC / host.namespace
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost"]
    lines += [f"{h.address}\t{h.name}" for h in cluster.hosts]
    (folder / "hosts").write_text("\n".join(lines) + "\n")


# ---- down -----------------------------------------------------------------------------------


def cluster_namespaces(cluster: str) -> list[str]:
    """Every namespace on this machine that belongs to the cluster, by name prefix."""
    return sorted(ns for ns in namespaces.names() if naming.cluster_of_namespace(ns) == cluster)


def leftover_clusters() -> set[str]:
    """Clusters that have namespaces or /etc/netns folders here, recorded or not."""
    names = {naming.cluster_of_namespace(ns) for ns in namespaces.names()}
    if NETNS_ETC.is_dir():
        names |= {naming.cluster_of_namespace(p.name) for p in NETNS_ETC.iterdir()}
    return {n for n in names if n}


def down(cluster: str) -> dict:
    """Remove everything the cluster made: processes in its namespaces, the namespaces (and
    with them every link and bridge), its hosts files and its state. Safe to repeat, and works
    without a record (after a crash), finding objects by the cluster's prefix."""
    record = state.read(cluster) or {}
    owned = set(cluster_namespaces(cluster))
    owned |= {h["namespace"] for h in record.get("hosts", []) if "namespace" in h}
    if record.get("switch_namespace"):
        owned.add(record["switch_namespace"])
    present = sorted(ns for ns in owned if ns in set(namespaces.names()))
    killed = kill_namespace_processes(present)
    for ns in present:
        try:
            namespaces.remove(ns)
        except FileNotFoundError:
            pass
    etc_dirs = 0
    if NETNS_ETC.is_dir():
        for folder in NETNS_ETC.iterdir():
            if naming.cluster_of_namespace(folder.name) == cluster:
                shutil.rmtree(folder, ignore_errors=True)
                etc_dirs += 1
    state.forget(cluster)
    return {"cluster": cluster, "namespaces": len(present), "processes": killed,
            "hosts_files": etc_dirs}
