"""The bpf backend: a tc clsact classifier, assembled in Python (bpf_program.py), drops
packets by Bernoulli or Gilbert-Elliott loss with per-path state and counters in a BPF map.

Per host: one array map (one slot per path, then one per direction counting what the
match's exclusions let through), one program per direction, attached as
cls_bpf filters named "lossbed" on the interface's clsact ingress/egress hooks. The map
lives as long as the filters do; its id is recorded so `verify` can read it later.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets

from pyroute2.netlink.exceptions import NetlinkError

from testbed.errors import LossbedError
from testbed.impair import bpf_program, bpf_syscall
from testbed.impair.counters import ExemptCounters, LinkCounters
from testbed.impair.plan import HostPlan

log = logging.getLogger(__name__)

NAME = "bpf"
SUPPORTS = frozenset({"loss:bernoulli", "loss:gilbert_elliott", "loss:burst_time_limit", "seed"})
FILTER_NAME = "lossbed"
FILTER_PRIO = 0xB0  # lossbed's filters sit at one priority, away from the usual 1..49152
PARENTS = {"ingress": 0xFFFFFFF2, "egress": 0xFFFFFFF3}  # TC_H_CLSACT | TC_H_MIN_{IN,E}GRESS
ETH_P_ALL = 0x0003


def path_seed(seed: int | None, path: str) -> int:
    """Each path's generator seed: from the profile's seed and the path's name, so paths are
    independent and a seeded profile replays the same drop pattern; random without a seed."""
    if seed is None:
        return int.from_bytes(os.urandom(8), "little") | 1
    digest = hashlib.sha256(f"{seed}:{path}".encode()).digest()
    return int.from_bytes(digest[:8], "little") | 1


def probe(host) -> str | None:
    """None if the host's kernel loads and runs a tc BPF classifier."""
    from testbed.impair.bpf_asm import R0, Asm

    a = Asm()
    a.mov(R0, bpf_program.TC_ACT_UNSPEC)
    a.exit()
    try:
        fd = bpf_syscall.load_sched_cls("lossbed_probe", a.assemble())
    except LossbedError as err:
        return str(err)
    os.close(fd)
    return None


def apply(host, plan: HostPlan) -> dict:
    """Attach the programs; return what `verify` and `clear` need (the map's id and name,
    the exempt traffic's slots)."""
    map_name = "lb_" + secrets.token_hex(6)
    exempt_slots = exempt_slot_of(plan)
    map_fd = bpf_syscall.create_array_map(map_name, bpf_program.VALUE_SIZE,
                                          len(plan.rules) + len(exempt_slots))
    prog_fds = []
    try:
        for slot, rule in enumerate(plan.rules):
            params = bpf_program.slot_params(
                rule.impairment.loss, path_seed(rule.impairment.seed, rule.path(plan.host)))
            bpf_syscall.update(map_fd, slot, params.initial_value())
        for slot in exempt_slots.values():
            bpf_syscall.update(map_fd, slot, bpf_program.slot_params(None, 1).initial_value())
        map_id = bpf_syscall.map_info(map_fd)["id"]
        with host.netlink() as ipr:
            index = ipr.link_lookup(ifname=plan.ifname)[0]
            try:
                ipr.tc("add", "clsact", index)
            except NetlinkError as err:
                if err.code != 17:  # EEXIST: someone's clsact is there; share it
                    raise
            try:
                for direction in ("ingress", "egress"):
                    slots = [(slot, r.peer_address) for slot, r in enumerate(plan.rules)
                             if r.direction == direction]
                    if not slots:
                        continue
                    code = bpf_program.build(direction, plan.match, slots, map_fd,
                                             exempt_slots[direction])
                    fd = bpf_syscall.load_sched_cls(f"lossbed_{direction[:2]}", code)
                    prog_fds.append(fd)
                    ipr.tc("add-filter", "bpf", index, parent=PARENTS[direction],
                           fd=fd, name=FILTER_NAME, direct_action=True, prio=FILTER_PRIO,
                           protocol=ETH_P_ALL)
            except BaseException:
                _remove(ipr, index)
                raise
    finally:
        for fd in [*prog_fds, map_fd]:
            os.close(fd)  # the attached filters hold the program, the program the map
    return {"map_id": map_id, "map_name": map_name, "exempt_slots": exempt_slots}


def exempt_slot_of(plan: HostPlan) -> dict[str, int]:
    """direction -> the map slot counting what the exclusions let through, after the paths'."""
    directions = [d for d in ("ingress", "egress") if any(r.direction == d for r in plan.rules)]
    return {d: len(plan.rules) + i for i, d in enumerate(directions)}


def _our_filters(ipr, index: int) -> list:
    found = []
    for parent in PARENTS.values():
        try:
            filters = ipr.get_filters(index=index, parent=parent)
        except NetlinkError:
            continue  # no clsact here
        for f in filters:
            opts = f.get_attr("TCA_OPTIONS")
            name = opts.get_attr("TCA_BPF_NAME") if opts is not None else None
            if f.get_attr("TCA_KIND") == "bpf" and name and name.startswith(FILTER_NAME):
                found.append((parent, f))
    return found


def _remove(ipr, index: int) -> bool:
    """Delete lossbed's filters, and the clsact qdisc if nothing else uses it."""
    removed = False
    for parent, f in _our_filters(ipr, index):
        # `info` carries the filter's priority and protocol, as the kernel gave it.
        ipr.tc("del-filter", "bpf", index, parent=parent, info=f["info"])
        removed = True
    remaining = 0
    for parent in PARENTS.values():
        try:
            remaining += len([f for f in ipr.get_filters(index=index, parent=parent)
                              if f.get_attr("TCA_KIND")])
        except NetlinkError:
            pass
    if remaining == 0:
        try:
            ipr.tc("del", "clsact", index)
        except NetlinkError:
            pass
    return removed


def clear(host, ifname: str) -> bool:
    with host.netlink() as ipr:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            return False
        return _remove(ipr, found[0])


def _read_slots(host, plan: HostPlan, handles: dict, slots: list[int]) -> list[dict]:
    """The decoded values of the map's `slots`, after checking the map is still lossbed's."""
    with host.netlink() as ipr:
        found = ipr.link_lookup(ifname=plan.ifname)
        attached = bool(found) and bool(_our_filters(ipr, found[0]))
    if not attached:
        # The map can outlive its filters for a moment (freed after an RCU grace period):
        # without lossbed's filters on the interface, its counters describe nothing.
        raise LossbedError(f"the bpf filters of host {plan.host} are gone: was the profile "
                           "cleared behind lossbed's back?")
    try:
        fd = bpf_syscall.map_fd_by_id(handles["map_id"])
    except LossbedError:
        raise LossbedError(f"the bpf map of host {plan.host} is gone: was the profile "
                           "cleared or the cluster rebuilt?") from None
    try:
        info = bpf_syscall.map_info(fd)
        if info["name"] != handles["map_name"]:
            raise LossbedError(f"map id {handles['map_id']} now belongs to another map "
                               f"({info['name']}): the profile of host {plan.host} is gone")
        return [bpf_program.decode_value(bpf_syscall.lookup(fd, slot, bpf_program.VALUE_SIZE))
                for slot in slots]
    finally:
        os.close(fd)


def read_counters(host, plan: HostPlan, handles: dict) -> list[LinkCounters]:
    values = _read_slots(host, plan, handles, list(range(len(plan.rules))))
    return [LinkCounters(host=plan.host, direction=rule.direction, peer=rule.peer,
                         path=rule.path(plan.host), seen_packets=v["seen_packets"],
                         dropped_packets=v["dropped_packets"],
                         sized_bytes=v["seen_bytes"], sized_packets=v["seen_packets"],
                         seen_bytes=v["seen_bytes"], dropped_bytes=v["dropped_bytes"],
                         bursts=v["bursts"], max_burst=v["max_burst"])
            for rule, v in zip(plan.rules, values, strict=True)]


def read_exempt(host, plan: HostPlan, handles: dict) -> list[ExemptCounters]:
    # a plan applied before the exempt slots existed has none to read
    slots = handles.get("exempt_slots") or {}
    values = _read_slots(host, plan, handles, list(slots.values()))
    return [ExemptCounters(plan.host, direction, v["seen_packets"], v["seen_bytes"])
            for direction, v in zip(slots, values, strict=True)]


