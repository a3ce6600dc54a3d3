"""A management network for local clusters started with --ssh, as real clusters have one:
SSH and lossbed's agent reach the hosts over it, so impairing the data-plane NIC never
touches the controlling session (and impairing the management NIC is what lossbed refuses).

    controller ns lossbed-<c>-ctl: ctl0 10.202.x.254 --[ bridge <c>-mg ]-- mgmt0 10.202.x.1 (h1)

Everything lives in the cluster's namespaces: `down` removes it with them. The controller
namespace is where `lossbed … --inventory` runs to drive the hosts over SSH, exactly as it
would from a real cluster's head node.
"""

from __future__ import annotations

import ipaddress

from testbed.clusters import addressing, naming
from testbed.host import namespaces

POOL = ipaddress.ip_network("10.202.0.0/16")
HOST_IFNAME = "mgmt0"
CONTROLLER_IFNAME = "ctl0"


def controller_namespace(cluster: str) -> str:
    return f"{naming.cluster_prefix(cluster)}ctl"


def bridge(cluster: str) -> str:
    return f"{cluster}-mg"


def port(cluster: str, host: str) -> str:
    return f"{cluster}m{host}"


def pick_subnet(hosts: int, taken) -> ipaddress.IPv4Network:
    return addressing.pick_free(hosts, taken, pool=POOL, what=" for the management network",
                                field="--ssh", fix="Take down clusters you no longer need")


def build(cluster, subnet: ipaddress.IPv4Network) -> None:
    """The management bridge, one mgmt0 per host, and the controller namespace."""
    switch_ns = naming.switch_namespace(cluster.name)
    ctl_ns = controller_namespace(cluster.name)
    namespaces.create(ctl_ns)
    addresses = addressing.host_addresses(subnet, len(cluster.hosts))
    with namespaces.netlink(switch_ns) as sw:
        sw.link("add", ifname=bridge(cluster.name), kind="bridge", br_forward_delay=0)
        br = sw.link_lookup(ifname=bridge(cluster.name))[0]
        peers = [(port(cluster.name, h.name), h.namespace, HOST_IFNAME) for h in cluster.hosts]
        peers.append((f"{cluster.name}mctl", ctl_ns, CONTROLLER_IFNAME))
        for name, namespace, inside in peers:
            sw.link("add", ifname=name, kind="veth", peer={"ifname": inside,
                                                           "net_ns_fd": namespace})
            sw.link("set", index=sw.link_lookup(ifname=name)[0], master=br, state="up")
        sw.link("set", index=br, state="up")
    ends = [(h.namespace, a) for h, a in zip(cluster.hosts, addresses, strict=True)]
    ends.append((ctl_ns, addressing.controller_address(subnet)))
    for namespace, address in ends:
        inside = CONTROLLER_IFNAME if namespace == ctl_ns else HOST_IFNAME
        with namespaces.netlink(namespace) as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            index = ipr.link_lookup(ifname=inside)[0]
            ipr.addr("add", index=index, address=address, prefixlen=subnet.prefixlen)
            ipr.link("set", index=index, state="up")
