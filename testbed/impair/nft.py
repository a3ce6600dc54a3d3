"""The nftables backend: Bernoulli loss by `numgen random`, with a counter per path.

Everything lives in one table, `netdev lossbed`, on the host's emulated interface, with a
base chain on the ingress hook (packets arriving) and/or the egress hook (leaving). The
table is loaded with one `nft -f` transaction, so a host is either fully impaired or not at
all. pyroute2's nftables support cannot build numgen/counter expressions, so this backend
drives the `nft` tool (the kernel's own netlink API underneath).

    table netdev lossbed {
      counter seen_in_h2 {}  counter drop_in_h2 {}  counter exempt_in {}
      chain ingress { type filter hook ingress device "eth0" priority -500; policy accept;
        meta protocol != ip accept
        meta l4proto tcp th sport { 22, 29500 } counter name "exempt_in" accept  # exclusions
        ip saddr 10.201.0.2 jump in_h2 }
      chain in_h2 { meta l4proto udp th dport 5000-5100 goto impair_in_h2 }  # the match
      chain impair_in_h2 { counter name "seen_in_h2"
        numgen random mod 1000000000 < 100000000 counter name "drop_in_h2" drop }
    }
"""

from __future__ import annotations

import json
import logging
import shutil

from testbed.errors import EnvironmentProblem, LossbedError
from testbed.impair.counters import ExemptCounters, LinkCounters
from testbed.impair.plan import HostPlan, LinkRule
from testbed.profiles.model import Flow

log = logging.getLogger(__name__)

NAME = "nft"
TABLE = "lossbed"
FAMILY = "netdev"
SUPPORTS = frozenset({"loss:bernoulli"})
# numgen draws reciprocal_scale(random u32, MODULUS): uniform to within one count in 2^32.
MODULUS = 1_000_000_000
ETH_HEADER_BYTES = 14
HOOK_PRIORITY = -500  # before anything else on the hook


def _short(direction: str) -> str:
    return "in" if direction == "ingress" else "out"


def _tag(rule: LinkRule) -> str:
    return f"{_short(rule.direction)}_{rule.peer}"


def _flow_clauses(flow: Flow) -> list[str]:
    """nft expressions for one Flow: either port end in range (both connection directions)."""
    proto = f"meta l4proto {flow.protocol}"
    if not flow.ports:
        return [proto]
    ports = ", ".join(str(p) for p in flow.ports)
    return [f"{proto} th sport {{ {ports} }}", f"{proto} th dport {{ {ports} }}"]


def render(plan: HostPlan) -> str:
    """The host's whole table as nft source text (pure: printable and unit-testable)."""
    lines = [f"table {FAMILY} {TABLE} {{"]
    for rule in plan.rules:
        lines.append(f"  counter seen_{_tag(rule)} {{ }}")
        lines.append(f"  counter drop_{_tag(rule)} {{ }}")
    for direction in _directions(plan):
        lines.append(f"  counter exempt_{_short(direction)} {{ }}")
    for direction in _directions(plan):
        rules = [r for r in plan.rules if r.direction == direction]
        lines.append(f"  chain {direction} {{")
        lines.append(f'    type filter hook {direction} device "{plan.ifname}" '
                     f"priority {HOOK_PRIORITY}; policy accept;")
        lines.append("    meta protocol != ip accept")
        for flow in plan.match.exclude:
            for clause in _flow_clauses(flow):
                lines.append(f'    {clause} counter name "exempt_{_short(direction)}" accept')
        peer_field = "saddr" if direction == "ingress" else "daddr"
        for rule in rules:
            lines.append(f"    ip {peer_field} {rule.peer_address} jump {_tag(rule)}")
        lines.append("  }")
        for rule in rules:
            tag = _tag(rule)
            lines.append(f"  chain {tag} {{")
            if plan.match.include:
                for flow in plan.match.include:
                    for clause in _flow_clauses(flow):
                        lines.append(f"    {clause} goto impair_{tag}")
            else:
                lines.append(f"    goto impair_{tag}")
            lines.append("  }")
            lines.append(f"  chain impair_{tag} {{")
            lines.append(f'    counter name "seen_{tag}"')
            loss = rule.impairment.loss
            threshold = round(loss.loss_pct / 100 * MODULUS) if loss else 0
            if threshold:
                lines.append(f"    numgen random mod {MODULUS} < {threshold} "
                             f'counter name "drop_{tag}" drop')
            lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _directions(plan: HostPlan) -> list[str]:
    return [d for d in ("ingress", "egress") if any(r.direction == d for r in plan.rules)]


def probe(host) -> str | None:
    """None if nftables works on the host, else why not."""
    if shutil.which("nft") is None:
        return "the nft tool is missing (install nftables)"
    check = (f"table {FAMILY} lossbed_probe {{\n"
             "  chain c {\n    numgen random mod 2 < 1 drop\n  }\n}\n")
    result = host.run(["nft", "-c", "-f", "-"], input=check.encode())
    if result.returncode != 0:
        return f"nft cannot load a numgen rule: {result.stderr.decode().strip()}"
    return None


def apply(host, plan: HostPlan) -> dict:
    text = render(plan)
    result = host.run(["nft", "-f", "-"], input=text.encode())
    if result.returncode != 0:
        # nft -f is one transaction: on failure nothing of it was applied.
        raise LossbedError(f"nft on host {plan.host} refused the rules: "
                           f"{result.stderr.decode().strip()}")
    return {}


def clear(host, ifname: str) -> bool:
    """Remove lossbed's table from the host. True if there was one."""
    if shutil.which("nft") is None:
        return False
    result = host.run(["nft", "delete", "table", FAMILY, TABLE])
    if result.returncode == 0:
        return True
    error = result.stderr.decode().strip()
    if "No such file or directory" in error:
        return False  # there was no table: nothing to remove
    raise EnvironmentProblem(f"could not delete table {FAMILY} {TABLE}: {error}")


def _counter_values(host, plan: HostPlan) -> dict[str, tuple[int, int]]:
    """The table's named counters: name -> (packets, bytes)."""
    result = host.run(["nft", "-j", "list", "counters", "table", FAMILY, TABLE])
    if result.returncode != 0:
        raise LossbedError(f"no lossbed nft table on host {plan.host}: is a profile applied? "
                           f"({result.stderr.decode().strip()})")
    values = {}
    for item in json.loads(result.stdout)["nftables"]:
        counter = item.get("counter")
        if counter:
            values[counter["name"]] = (counter["packets"], counter["bytes"])
    return values


def read_exempt(host, plan: HostPlan, handles: dict) -> list[ExemptCounters]:
    values = _counter_values(host, plan)
    out = []
    for direction in _directions(plan):
        packets, size = values.get(f"exempt_{_short(direction)}", (0, 0))
        if direction == "egress":
            size -= ETH_HEADER_BYTES * packets  # as for the paths' counters below
        out.append(ExemptCounters(plan.host, direction, packets, size))
    return out


def read_counters(host, plan: HostPlan, handles: dict) -> list[LinkCounters]:
    values = _counter_values(host, plan)
    out = []
    for rule in plan.rules:
        tag = _tag(rule)
        seen_packets, seen_bytes = values.get(f"seen_{tag}", (0, 0))
        dropped_packets, dropped_bytes = values.get(f"drop_{tag}", (0, 0))
        if rule.direction == "egress":
            # The egress hook sees the Ethernet header too; ingress sees the IP packet.
            seen_bytes -= ETH_HEADER_BYTES * seen_packets
            dropped_bytes -= ETH_HEADER_BYTES * dropped_packets
        out.append(LinkCounters(
            host=plan.host, direction=rule.direction, peer=rule.peer, path=rule.path(plan.host),
            seen_packets=seen_packets, dropped_packets=dropped_packets,
            sized_bytes=seen_bytes, sized_packets=seen_packets, seen_bytes=seen_bytes,
            dropped_bytes=dropped_bytes,
        ))
    return out
