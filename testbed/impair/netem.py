"""The netem backend: the kernel's network emulator, through pyroute2, on every host.

One HTB tree per impaired device, one class and netem leaf per path, u32 filters choosing
the class by the peer's address and the profile's match; unmatched traffic is sent directly
(HTB class 1:0), unimpaired, and excluded traffic through a class of its own (1:f), also
unimpaired, whose counters show what the exclusions carried. Egress impairs the host's
interface itself; ingress redirects arriving packets (ingress qdisc + u32 + mirred) to an IFB
device that carries the same kind of tree, so loss happens before the receiver's stack sees
a packet.

    eth0 ingress --mirred--> ifb-eth0 [htb 1: -> 1:10 netem (from h2), 1:11 netem (from h3)]
    eth0 root   [htb 1: -> 1:10 netem (to h2), ...]                      (egress)

The netem qdiscs are encoded by netem_nla.py (every attribute); HTB, u32 and mirred use
pyroute2's own encoders, with only the keywords those encoders implement.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass, field

from pyroute2.netlink.exceptions import NetlinkError

from testbed.impair import netem_nla, u32_match
from testbed.impair.counters import ExemptCounters, LinkCounters
from testbed.impair.plan import HostPlan, LinkRule

log = logging.getLogger(__name__)

NAME = "netem"
SUPPORTS = frozenset({
    "loss:bernoulli", "loss:correlation", "loss:gilbert_elliott", "loss:four_state", "delay",
    "jitter", "delay_correlation", "delay_distribution", "rate", "reorder", "duplicate",
    "corrupt", "ecn", "slot", "seed", "limit",
})
# HTB classes must never shape: their rate is far above any NIC's, netem does the rate.
CLASS_RATE_BYTES_S = 400_000_000_000 // 8
LINE_RATE_MBIT = 100_000  # assumed link rate for sizing netem's queue when none is given
# lossbed's HTB root handle b0ed: ("lossbed"), so clearing finds its own tree and never
# removes a root qdisc someone else made.
ROOT = 0xB0ED0000
INGRESS = 0xFFFF0000       # handle ffff:, parent of the ingress qdisc's filters
TC_H_ROOT = 0xFFFFFFFF
TC_H_INGRESS = 0xFFFFFFF1
FIRST_CLASS = 0x10
EXEMPT_CLASS = ROOT | 0x0F  # below the paths' classes
PRIO_EXCLUDE, PRIO_PATH, PRIO_REDIRECT = 1, 10, 1
ETH_P_IP, ETH_P_ALL = 0x0800, 0x0003
ETH_HEADER_BYTES = 14


def ifb_name(ifname: str) -> str:
    return f"ifb-{ifname}"[:15]


@dataclass
class Device:
    """One impaired device: the interface (egress) or its IFB (ingress), and its paths."""

    direction: str
    rules: list[LinkRule] = field(default_factory=list)

    @property
    def peer_offset(self) -> int:
        # at ingress a path is picked by the packet's source, at egress by its destination
        return u32_match.OFFSET_SADDR if self.direction == "ingress" else u32_match.OFFSET_DADDR


def devices(plan: HostPlan) -> list[Device]:
    out = []
    for direction in ("egress", "ingress"):
        rules = [r for r in plan.rules if r.direction == direction]
        if rules:
            out.append(Device(direction, rules))
    return out


def leaf_handle(slot: int) -> int:
    return (FIRST_CLASS + slot) << 16


def class_id(slot: int) -> int:
    return ROOT | (FIRST_CLASS + slot)


def netem_messages(plan: HostPlan, index: int = 0) -> list[netem_nla.NetemTcmsg]:
    """The netem qdisc messages of a host, one per path (pure: for tests and --dry-run)."""
    msgs = []
    for device in devices(plan):
        for slot, rule in enumerate(device.rules):
            imp = rule.impairment
            limit = imp.limit_packets or netem_nla.default_limit(imp, plan.mtu, LINE_RATE_MBIT)
            msgs.append(netem_nla.qdisc_message(index, leaf_handle(slot), class_id(slot),
                                                netem_nla.options(imp, limit)))
    return msgs


def filters(plan: HostPlan, device: Device) -> list[dict]:
    """u32 filters of one device: exclusions to the exempt class, then one set per path."""
    out = []
    for flow in plan.match.exclude:
        for keys in u32_match.flow_alternatives(flow):
            out.append({"prio": PRIO_EXCLUDE, "target": EXEMPT_CLASS, "keys": keys})
    for slot, rule in enumerate(device.rules):
        peer = u32_match.address_key(rule.peer_address, device.peer_offset)
        alternatives = [[]]
        if plan.match.include:
            alternatives = [k for flow in plan.match.include
                            for k in u32_match.flow_alternatives(flow)]
        for keys in alternatives:
            out.append({"prio": PRIO_PATH, "target": class_id(slot), "keys": [peer, *keys]})
    return out


def probe(host) -> str | None:
    """None if the host's kernel creates a netem qdisc (tried on its loopback, then removed)."""
    with host.netlink() as ipr:
        lo = ipr.link_lookup(ifname="lo")[0]
        msg = netem_nla.qdisc_message(lo, ROOT, TC_H_ROOT,
                                      netem_nla.options(_probe_impairment(), 1000))
        try:
            netem_nla.create(ipr, msg)
        except NetlinkError as err:
            return f"the kernel has no sch_netem (creating a netem qdisc: {err})"
        ipr.tc("del", index=lo, handle=ROOT, parent=TC_H_ROOT)
    return None


def _probe_impairment():
    from testbed.profiles.model import Impairment

    return Impairment()


def apply(host, plan: HostPlan) -> dict:
    with host.netlink() as ipr:
        index = ipr.link_lookup(ifname=plan.ifname)[0]
        try:
            for device in devices(plan):
                if device.direction == "ingress":
                    dev_index = _ingress_redirect(ipr, plan.ifname, index, plan.mtu)
                else:
                    dev_index = index
                _tree(ipr, plan, device, dev_index)
        except BaseException:
            _remove(ipr, plan.ifname)
            raise
    return {}


def _ingress_redirect(ipr, ifname: str, index: int, mtu: int) -> int:
    ifb = ifb_name(ifname)
    ipr.link("add", ifname=ifb, kind="ifb")
    ifb_index = ipr.link_lookup(ifname=ifb)[0]
    ipr.link("set", index=ifb_index, mtu=mtu, state="up")
    ipr.tc("add", "ingress", index)
    ipr.tc("add-filter", "u32", index, parent=INGRESS, prio=PRIO_REDIRECT,
           protocol=ETH_P_ALL, target=0x1, keys=["0x0/0x0+0"],
           action={"kind": "mirred", "direction": "egress", "action": "redirect",
                   "ifindex": ifb_index})
    return ifb_index


def _tree(ipr, plan: HostPlan, device: Device, dev_index: int) -> None:
    # default 0: packets no filter claims leave directly, unshaped and unimpaired.
    ipr.tc("add", "htb", dev_index, ROOT, parent=TC_H_ROOT, default=0)
    device_plan = HostPlan(plan.host, plan.address, plan.ifname, plan.match,
                           tuple(device.rules), plan.mtu)
    ipr.tc("add-class", "htb", dev_index, EXEMPT_CLASS, parent=ROOT,
           rate=CLASS_RATE_BYTES_S, ceil=CLASS_RATE_BYTES_S)
    for slot, msg in enumerate(netem_messages(device_plan, dev_index)):
        ipr.tc("add-class", "htb", dev_index, class_id(slot), parent=ROOT,
               rate=CLASS_RATE_BYTES_S, ceil=CLASS_RATE_BYTES_S)
        netem_nla.create(ipr, msg)
    def add(f: dict, **action) -> None:
        ipr.tc("add-filter", "u32", dev_index, parent=ROOT, prio=f["prio"], protocol=ETH_P_IP,
               target=f["target"], keys=f["keys"], **action)

    counted = True
    for f in filters(plan, device):
        # A path's filters pass its packets on with an action that does nothing else: its
        # counters are the bytes the path saw, netem's those it sent (and holds), the rest
        # it dropped: netem counts its drops in packets alone
        action = {"action": "ok"} if counted and f["target"] != EXEMPT_CLASS else {}
        try:
            add(f, **action)
        except NetlinkError as err:
            if not action or err.code not in (errno.ENOENT, errno.EOPNOTSUPP):
                raise
            # a kernel without act_gact: the path's drops in packets only (doctor says so)
            log.info("%s: no act_gact, netem's dropped bytes are not counted", plan.host)
            counted = False
            add(f)


def _remove(ipr, ifname: str) -> bool:
    removed = False
    index = ipr.link_lookup(ifname=ifname)
    if index:
        qdiscs = {q["handle"]: q.get_attr("TCA_KIND") for q in ipr.get_qdiscs(index=index[0])}
        if qdiscs.get(ROOT) == "htb":
            ipr.tc("del", index=index[0], handle=ROOT, parent=TC_H_ROOT)
            removed = True
        ifb = ipr.link_lookup(ifname=ifb_name(ifname))
        # The ingress qdisc is lossbed's when lossbed's IFB exists: it was made to feed it.
        if ifb and qdiscs.get(INGRESS) == "ingress":
            ipr.tc("del", index=index[0], handle=INGRESS, parent=TC_H_INGRESS)
        if ifb:
            ipr.link("del", index=ifb[0])
            removed = True
    return removed


def clear(host, ifname: str) -> bool:
    with host.netlink() as ipr:
        return _remove(ipr, ifname)


def _device_name(plan: HostPlan, device: Device) -> str:
    return ifb_name(plan.ifname) if device.direction == "ingress" else plan.ifname


def read_exempt(host, plan: HostPlan, handles: dict) -> list[ExemptCounters]:
    """The exempt class's counters per impaired device (none on a tree from before it)."""
    out = []
    with host.netlink() as ipr:
        for device in devices(plan):
            index = ipr.link_lookup(ifname=_device_name(plan, device))[0]
            for c in ipr.get_classes(index=index):
                if c["handle"] != EXEMPT_CLASS:
                    continue
                stats = c.get_attr("TCA_STATS2")
                basic = stats.get_attr("TCA_STATS_BASIC") if stats is not None else None
                packets, size = (basic["packets"], basic["bytes"]) if basic else (0, 0)
                out.append(ExemptCounters(plan.host, device.direction, packets,
                                          size - ETH_HEADER_BYTES * packets))
    return out


def read_counters(host, plan: HostPlan, handles: dict) -> list[LinkCounters]:
    """netem's own counters: a path's leaf saw sent + dropped packets, dropped what it lost;
    the bytes it dropped are those its filters passed on less those it sent and holds."""
    out = []
    with host.netlink() as ipr:
        for device in devices(plan):
            index = ipr.link_lookup(ifname=_device_name(plan, device))[0]
            leaves = {q["handle"]: q for q in ipr.get_qdiscs(index=index)
                      if q.get_attr("TCA_KIND") == "netem"}
            classified = _bytes_classified(ipr, index)
            for slot, rule in enumerate(device.rules):
                q = leaves.get(leaf_handle(slot))
                stats = q.get_attr("TCA_STATS2") if q is not None else None
                basic = stats.get_attr("TCA_STATS_BASIC") if stats is not None else None
                queue = stats.get_attr("TCA_STATS_QUEUE") if stats is not None else None
                sent_p = basic["packets"] if basic else 0
                sent_b = basic["bytes"] if basic else 0
                dropped = queue["drops"] if queue else 0
                backlog = queue["qlen"] if queue else 0
                held_b = queue["backlog"] if queue else 0
                # All counted as Ethernet frames (the IFB and the NIC alike): the IP size is
                # 14 bytes less a packet. What the path's filters passed on is what netem
                # sent, holds and dropped.
                seen_p = sent_p + dropped + backlog
                to_path = classified.get(class_id(slot))
                seen_b = None if to_path is None else to_path - ETH_HEADER_BYTES * seen_p
                sent_ip = sent_b - ETH_HEADER_BYTES * sent_p
                held_ip = held_b - ETH_HEADER_BYTES * backlog
                out.append(LinkCounters(
                    host=plan.host, direction=rule.direction, peer=rule.peer,
                    path=rule.path(plan.host), seen_packets=seen_p, dropped_packets=dropped,
                    sized_bytes=sent_ip, sized_packets=sent_p, seen_bytes=seen_b,
                    dropped_bytes=None if seen_b is None else seen_b - sent_ip - held_ip,
                ))
    return out


def _bytes_classified(ipr, index: int) -> dict[int, int]:
    """The bytes each path's filters passed to its class (their actions' counters), by
    class; a class whose filters count nothing (a tree from before they did) is absent."""
    total: dict[int, int] = {}
    for f in ipr.get_filters(index=index, parent=ROOT):
        options = f.get_attr("TCA_OPTIONS")
        target = options.get_attr("TCA_U32_CLASSID") if options is not None else None
        actions = options.get_attr("TCA_U32_ACT") if options is not None else None
        if target is None or actions is None:
            continue
        for action in actions.get("attrs", []):
            stats = action[1].get_attr("TCA_ACT_STATS")
            basic = stats.get_attr("TCA_STATS_BASIC") if stats is not None else None
            if basic is not None:
                total[target] = total.get(target, 0) + basic["bytes"]
    return total
