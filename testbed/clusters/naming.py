"""Names of everything lossbed creates on a machine.

Every object carries the cluster's prefix so that teardown, also after a crash, can find it
by name alone. All interfaces live inside namespaces that lossbed owns, so deleting the
namespaces removes the links too.

    namespace of host h1 of cluster "demo":   lossbed-demo-h1
    the cluster's switch namespace:           lossbed-demo-switch
    bridge (inside the switch namespace):     demo-br
    switch-side veth of host h1:              demo-h1
    host-side veth (inside host h1):          eth0
"""

from __future__ import annotations

import re

from testbed.errors import UsageError

NAMESPACE_PREFIX = "lossbed-"
# Linux interface names are at most IFNAMSIZ-1 = 15 bytes.
IFNAME_MAX_BYTES = 15
HOST_IFNAME = "eth0"
DEFAULT_CLUSTER_NAME = "local"

# Lower-case letters and digits only: no '-', so "lossbed-<name>-" is an unambiguous prefix
# (cluster "a" can never claim the namespaces of cluster "a-b"), and never a path: no '/',
# no '.', never empty. At most 12, so the bridge "<name>-br" fits in an interface name.
CLUSTER_NAME_MAX = IFNAME_MAX_BYTES - len("-br")
_CLUSTER_NAME = re.compile(rf"^[a-z][a-z0-9]{{0,{CLUSTER_NAME_MAX - 1}}}$")
CLUSTER_NAME_RULE = (f"a cluster name is 1 to {CLUSTER_NAME_MAX} lower-case letters and digits, "
                     "starting with a letter")


def host_name(index: int) -> str:
    """Name of the index-th host (0-based) of a cluster: h1, h2, ..."""
    return f"h{index + 1}"


def cluster_prefix(cluster: str) -> str:
    return f"{NAMESPACE_PREFIX}{cluster}-"


def host_namespace(cluster: str, host: str) -> str:
    return f"{cluster_prefix(cluster)}{host}"


def switch_namespace(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}switch"


def bridge_ifname(cluster: str) -> str:
    return f"{cluster}-br"


def switch_port_ifname(cluster: str, host: str) -> str:
    return f"{cluster}-{host}"


def cluster_of_namespace(namespace: str) -> str | None:
    """The cluster a lossbed namespace belongs to, or None for a namespace lossbed did not make."""
    if not namespace.startswith(NAMESPACE_PREFIX):
        return None
    rest = namespace[len(NAMESPACE_PREFIX) :]
    cluster, sep, _ = rest.partition("-")
    if not sep or not _CLUSTER_NAME.fullmatch(cluster):
        return None
    return cluster


def check_cluster_name(name: str, flag: str = "--cluster") -> str:
    """The name, if it is a cluster name; else UsageError with the rule. Every command that
    takes a cluster name calls this before the name reaches a path, a namespace or a kernel
    object."""
    if not isinstance(name, str) or not _CLUSTER_NAME.fullmatch(name):
        shown = name if len(repr(name)) <= 40 else f"{name[:20]}… ({len(name)} characters)"
        raise UsageError(flag, f"{shown!r} is not a cluster name: {CLUSTER_NAME_RULE}",
                         f"Use e.g. {flag} demo")
    return name


def validate_cluster_name(name: str, host_count: int) -> None:
    """Refuse names that break the rule or that make an interface name too long."""
    check_cluster_name(name, "--name")
    longest_host = host_name(max(host_count, 1) - 1)
    ifname = max((bridge_ifname(name), switch_port_ifname(name, longest_host)), key=len)
    size = len(ifname.encode())
    if size > IFNAME_MAX_BYTES:
        room = IFNAME_MAX_BYTES - (size - len(name))
        raise UsageError(
            "--name",
            f"cluster name {name!r} makes the interface name {ifname!r} {size} bytes long, "
            f"Linux allows {IFNAME_MAX_BYTES}",
            f"Use a name of at most {room} characters with {host_count} hosts",
        )
