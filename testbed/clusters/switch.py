"""A cluster's switch: a namespace holding a Linux bridge that every host's link joins."""

from __future__ import annotations

import os
import subprocess

from testbed.clusters import naming
from testbed.host import namespaces
from testbed.host.hosts import disable_offloads

# A switch forwards frames; it must not run them through a host firewall. With
# br_netfilter in the kernel (built in here) every bridged IP packet takes a detour through
# the iptables hooks of the switch's namespace unless these are 0 there.
BRIDGE_NETFILTER_SYSCTLS = ("net.bridge.bridge-nf-call-iptables",
                            "net.bridge.bridge-nf-call-ip6tables",
                            "net.bridge.bridge-nf-call-arptables")


def create(cluster: str) -> None:
    """The switch namespace with its loopback up and an empty bridge."""
    namespace = naming.switch_namespace(cluster)
    namespaces.create(namespace)
    with namespaces.netlink(namespace) as sw:
        sw.link("set", index=sw.link_lookup(ifname="lo")[0], state="up")
        sw.link("add", ifname=naming.bridge_ifname(cluster), kind="bridge", br_forward_delay=0)
    if os.path.isdir("/proc/sys/net/bridge"):
        # pyroute2 has no sysctl API, and these are per-namespace: set them from inside.
        subprocess.run(["ip", "netns", "exec", namespace, "sysctl", "-q", "-w",
                        *(f"{name}=0" for name in BRIDGE_NETFILTER_SYSCTLS)],
                       check=True, capture_output=True)


def plug(cluster: str, ports: list[str], mtu: int) -> None:
    """Join existing links of the switch namespace to the bridge: MTU set, offloads off, up."""
    namespace = naming.switch_namespace(cluster)
    with namespaces.netlink(namespace) as sw:
        bridge_index = sw.link_lookup(ifname=naming.bridge_ifname(cluster))[0]
        for port in ports:
            index = sw.link_lookup(ifname=port)[0]
            sw.link("set", index=index, mtu=mtu)
            sw.link("set", index=index, master=bridge_index, state="up")
        sw.link("set", index=bridge_index, mtu=mtu, state="up")
    sock = namespaces.socket_in(namespace)
    try:
        for port in ports:
            disable_offloads(sock.dup(), port)
    finally:
        sock.close()
