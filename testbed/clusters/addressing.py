"""IPv4 addressing of a cluster: validate a subnet, pick a free one, hand out host addresses.

Hosts get the first addresses of the subnet (.1, .2, ...). The last usable address is kept
back for a controller attachment (the machine reaching its hosts, e.g. over SSH), so a
subnet holds (usable addresses - 1) hosts.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from testbed.errors import UsageError

# Default clusters take /24s from here: private, and rarely used by other tools.
DEFAULT_POOL = ipaddress.ip_network("10.201.0.0/16")


def capacity(subnet: ipaddress.IPv4Network) -> int:
    """How many hosts fit: usable addresses minus the one kept for the controller."""
    usable = subnet.num_addresses - 2 if subnet.prefixlen <= 30 else 0
    return max(usable - 1, 0)


def parse_subnet(text: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise UsageError(
            "--subnet", f"{text!r} is not an IPv4 network in CIDR form",
            "Give a network and prefix length, e.g. --subnet 10.201.0.0/24",
        ) from None
    if net.version != 4:
        raise UsageError("--subnet", f"{text} is IPv6", "Give an IPv4 network, e.g. 10.201.0.0/24")
    if str(net) != text.strip():
        raise UsageError(
            "--subnet", f"{text!r} has host bits set",
            f"Use the network address: --subnet {net}",
        )
    if not net.is_private:
        raise UsageError(
            "--subnet", f"{net} is not a private range",
            "Use a private range (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16)",
        )
    return net


def check_fits(subnet: ipaddress.IPv4Network, hosts: int) -> None:
    if hosts > capacity(subnet):
        raise UsageError(
            "--hosts", f"{hosts} hosts do not fit in {subnet} (room for {capacity(subnet)}: "
            "network, broadcast and one controller address are reserved)",
            "Use fewer hosts or a larger --subnet (a shorter prefix length)",
        )


def check_no_overlap(
    subnet: ipaddress.IPv4Network, taken: Iterable[tuple[ipaddress.IPv4Network, str]]
) -> None:
    """`taken` is (network, who uses it): other clusters and this machine's own routes."""
    for net, owner in taken:
        if subnet.overlaps(net):
            raise UsageError(
                "--subnet", f"{subnet} overlaps {net} ({owner})",
                "Choose a range that is free, or leave --subnet out to get one",
            )


def pick_free(
    hosts: int, taken: Iterable[tuple[ipaddress.IPv4Network, str]],
    pool: ipaddress.IPv4Network = DEFAULT_POOL, what: str = "",
    field: str = "--subnet",
    fix: str = "Give one explicitly with --subnet, or take down clusters you no longer need",
) -> ipaddress.IPv4Network:
    """The first subnet of `pool` big enough for `hosts` that overlaps nothing taken."""
    taken = list(taken)
    prefixlen = 24
    while prefixlen > pool.prefixlen and capacity(
        ipaddress.ip_network(f"0.0.0.0/{prefixlen}")
    ) < hosts:
        prefixlen -= 1
    for candidate in pool.subnets(new_prefix=prefixlen):
        if not any(candidate.overlaps(net) for net, _ in taken):
            return candidate
    raise UsageError(field, f"no free /{prefixlen} is left in {pool}{what}", fix)


def host_addresses(subnet: ipaddress.IPv4Network, hosts: int) -> list[str]:
    first = int(subnet.network_address) + 1
    return [str(ipaddress.IPv4Address(first + i)) for i in range(hosts)]


def controller_address(subnet: ipaddress.IPv4Network) -> str:
    return str(subnet.broadcast_address - 1)
