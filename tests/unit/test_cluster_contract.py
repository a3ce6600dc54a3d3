"""The Cluster contract (testbed/clusters/contract.py) is declared and kept: each kind of
cluster implements every member, and no code outside testbed/clusters decides by a cluster's
kind (it asks the contract instead: shares_this_machine, lease_s, connect(), ...)."""

from __future__ import annotations

import ipaddress
import sys

import pytest

from testbed.clusters import contract
from testbed.clusters.contract import NamedHosts
from testbed.clusters.netns import LocalCluster
from testbed.clusters.remote import RemoteCluster, RemoteHost
from testbed.clusters.vm.cluster import VMCluster, VMHost
from testbed.errors import UsageError
from testbed.host.hosts import Host, NamespaceHost
from tests.helpers import REPO

SUBNET = ipaddress.ip_network("10.201.0.0/24")


def _clusters():
    netns = LocalCluster(name="c", subnet=SUBNET, mtu=1500, ssh=False,
                         hosts=[NamespaceHost("h1", "lossbed-c-h1", "10.201.0.1", "eth0")])
    vm = VMCluster(name="v", subnet=SUBNET, mtu=1500, ssh=False, rdma=False, memory_mb=768,
                   accel="tcg", kernel="6.1", hosts=[VMHost(
                       name="h1", address="10.201.0.1", ifname="eth0", channel="/x.sock",
                       python="/venv/bin/python", project="/p")])
    remote = RemoteCluster(name="r", mtu=9000, inventory_path="hosts.yml", lease_s=120.0,
                           hosts=[RemoteHost(name="gpu1", address="192.168.50.1",
                                             ifname="ens6", ssh_host="10.10.0.1",
                                             ssh_port=22, ssh_user="root",
                                             key_file="~/.ssh/lossbed", known_hosts=None,
                                             python="/opt/torch/.venv/bin/python",
                                             project="/opt/lossbed")])
    return {"netns": netns, "vm": vm, "remote": remote}


@pytest.mark.parametrize("kind", ["netns", "vm", "remote"])
def test_every_kind_implements_the_contract(kind):
    cluster = _clusters()[kind]
    assert isinstance(cluster, contract.Cluster)
    assert cluster.kind == kind
    if kind != "remote":  # a remote cluster's connect() reaches its hosts over SSH
        cluster.connect()
    host = cluster.hosts[0]
    expected = {"netns": (True, None, False), "vm": (False, None, False),
                "remote": (False, 120.0, False)}[kind]
    assert (cluster.shares_this_machine, cluster.lease_s, cluster.force_interface) == expected
    # namespace ranks run this very Python; a VM's or a remote host's, the one it names
    assert cluster.rank_python(host) == (sys.executable if kind == "netns" else host.python)
    # the members every user of a cluster and a host calls, on every kind
    assert isinstance(host, Host)
    assert cluster.host(host.name) is host
    with pytest.raises(UsageError, match=f"has no host 'nope'.*Use one of: {host.name}"):
        cluster.host("nope")
    assert cluster.state_dir.name == cluster.name and cluster.ssh is False
    assert host.gpus == 0
    assert host.project == {"netns": str(REPO), "vm": "/p", "remote": "/opt/lossbed"}[kind]
    assert host.mgmt_address == {"netns": "", "vm": "", "remote": "10.10.0.1"}[kind]




def test_a_host_whose_network_is_elsewhere_refuses_sockets_and_offloads_with_the_reason():
    """Host declares socket() and offloads() (#68 item 4): a VM's and a remote machine's
    sockets are not the controller's, and they say so; the raw UDP rate of such a cluster is
    not measured (nan) rather than probed for."""
    import math

    from harness.bench.collective_bench import raw_udp_rate
    from testbed.clusters.remote import RemoteHost
    from testbed.clusters.vm.cluster import VMHost
    from testbed.errors import LossbedError

    for host, where in ((VMHost.__new__(VMHost), "is a VM"),
                        (RemoteHost.__new__(RemoteHost), "is remote")):
        object.__setattr__(host, "name", "h1")
        for ask in (host.socket, host.offloads):
            with pytest.raises(LossbedError, match=f"host h1 {where}"):
                ask()

    class Elsewhere:
        hosts = [VMHost.__new__(VMHost), VMHost.__new__(VMHost)]
        mtu = 1500

    for h in Elsewhere.hosts:
        object.__setattr__(h, "name", "h")
    assert math.isnan(raw_udp_rate(Elsewhere()))


class _Closing(NamedHosts):
    """A cluster that says when it is closed."""

    def __init__(self, said):
        self.name, self.hosts, self.said = "c", [], said

    def close(self):
        self.said.append("closed")


def test_a_cluster_is_a_context_manager_that_closes_it():
    said = []
    with _Closing(said) as cluster:
        assert isinstance(cluster, _Closing) and said == []
    assert said == ["closed"]


@pytest.mark.parametrize("ends", ["returns", "refuses", "breaks"])
def test_every_cluster_a_command_opened_is_closed_however_it_ends(ends):
    """#68 item 4: Cluster.close is called (a remote cluster's SSH connections were never
    let go of): testbed/cli.py's main closes what the command opened (clusters.opened,
    which load() and an inventory's cluster go through), on success, refusal and bugs."""
    from testbed import cli, clusters
    from testbed.errors import UsageError

    said = []

    def command(args):
        clusters.opened(_Closing(said))
        clusters.opened(_Closing(said))
        if ends == "refuses":
            raise UsageError("--x", "planted", "fix")
        if ends == "breaks":
            raise RuntimeError("a planted bug")
        return 0

    def add(sub):
        sub.add_parser("planted-command").set_defaults(func=command)

    code = cli.main(["planted-command"], more=[add])
    assert code == {"returns": 0, "refuses": 2, "breaks": 1}[ends]
    assert said == ["closed", "closed"]
