"""The work lossbed does *on* a host, one function per operation, so the same code runs
wherever the host is: in this process for a namespace host (through a netlink session
opened into its namespace), in the VM's guest process, or on a remote machine through
`python -m testbed.host.agent OP` (agent.py). Operations: probe (which impairment backends
the kernel has), check (what the impaired interface carries), apply, renew, clear, counters
(of an applied plan), udp_snmp, traffic (every interface's counters), checkup (what
`lossbed doctor` judges).
"""

from __future__ import annotations

from testbed.errors import LossbedError


def backends():
    from testbed.impair.registry import BACKENDS

    return BACKENDS


def probe(host, payload: dict) -> dict:
    results = {}
    for name, module in backends().items():
        try:
            results[name] = module.probe(host)
        except Exception as err:  # a probe must never take the run down: report it instead
            results[name] = f"probe failed: {err}"
    return results


def check(host, payload: dict) -> dict:
    """What the interface lossbed would impair carries: the default route? this SSH session?"""
    import os
    import socket

    with host.netlink() as ipr:
        found = ipr.link_lookup(ifname=host.ifname)
        if not found:
            names = [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()]
            raise LossbedError(f"host {host.name}: no interface {host.ifname!r} (it has "
                               f"{', '.join(names)}): fix lossbed_interface")
        index = found[0]
        addresses = [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(family=socket.AF_INET,
                                                                     index=index)]
        default = any(r["dst_len"] == 0 and r.get_attr("RTA_OIF") == index
                      for r in ipr.get_routes(family=socket.AF_INET))
    session = os.environ.get("SSH_CONNECTION", "").split()
    ssh_local = session[2] if len(session) == 4 else None
    from testbed.host import lease

    return {"interface": host.ifname, "addresses": addresses,
            "carries_default_route": default,
            "carries_ssh_session": ssh_local is not None and ssh_local in addresses,
            "lease_failure": lease.failure(host.name, host.ifname) if host.name else None}


def apply(host, payload: dict) -> dict:
    from testbed.host import lease
    from testbed.impair.plan import HostPlan

    if payload.get("lease_s") is not None and not payload.get("force"):
        # Only remote hosts get leases, and only there can lossbed lock the operator out.
        report = check(host, payload)
        risky = [why for why, bad in (("the default route", report["carries_default_route"]),
                                      ("this SSH session", report["carries_ssh_session"]))
                 if bad]
        if risky:
            raise LossbedError(
                f"host {host.name}: refusing to impair {host.ifname}: it carries "
                f"{' and '.join(risky)}. Impair the data-plane NIC (lossbed_interface), or "
                "pass --force-interface if you really mean it")
    handles = backends()[payload["backend"]].apply(host, HostPlan.from_dict(payload["plan"]))
    if payload.get("lease_s") is not None:
        lease.start(host.name, host.ifname, float(payload["lease_s"]))
    return handles


def renew(host, payload: dict) -> bool:
    from testbed.host import lease

    return lease.renew(host.name, host.ifname)


def clear(host, payload: dict) -> list[str]:
    """Remove lossbed's objects of every backend (also those of a crashed run)."""
    from testbed.host import lease

    lease.end(host.name, host.ifname)
    cleared, errors = [], []
    for name, module in backends().items():
        try:
            if module.clear(host, host.ifname):
                cleared.append(name)
        except Exception as err:
            errors.append(f"{name}: {err}")
    if errors:
        raise LossbedError(f"host {host.name}: could not clear everything: " + "; ".join(errors))
    return cleared


def reading(host, payload: dict) -> dict:
    """Everything `verify` reads on a host at one moment, in one call (on a remote host each
    call is an SSH round trip): the impaired paths' counters, what the exclusions let
    through, the UDP counters and every interface's traffic."""
    from testbed.impair.plan import HostPlan

    module = backends()[payload["backend"]]
    plan, handles = HostPlan.from_dict(payload["plan"]), payload.get("handles") or {}
    from testbed.host import lease

    return {"paths": [c.to_dict() for c in module.read_counters(host, plan, handles)],
            "exempt": [c.to_dict() for c in module.read_exempt(host, plan, handles)],
            "udp_snmp": udp_snmp(host, {}), "traffic": traffic(host, {}),
            "lease_left_s": lease.seconds_left(host.name, host.ifname) if host.name else None}


def udp_snmp(host, payload: dict) -> dict:
    result = host.run(["cat", "/proc/net/snmp"], check=True)
    rows = [line.split() for line in result.stdout.decode().splitlines()
            if line.startswith("Udp:")]
    return {name: int(value) for name, value in zip(rows[0][1:], rows[1][1:], strict=True)}


def traffic(host, payload: dict) -> dict:
    """Every interface's and RDMA port's counters (what coverage holds the impairment's
    counters against)."""
    from testbed.impair.coverage import read_traffic

    return read_traffic(host)


def checkup(host, payload: dict) -> dict:
    from testbed.host import checkup as examination

    try:
        carried = check(host, payload)
    except Exception as err:  # a missing interface is a finding of the checkup
        carried = {"error": str(err)}
    return examination.examine(host, payload, probe(host, {}), carried)


OPERATIONS = {"probe": probe, "apply": apply, "clear": clear, "reading": reading,
              "udp_snmp": udp_snmp, "traffic": traffic, "check": check, "renew": renew,
              "checkup": checkup}


def dispatch(host, op: str, payload: dict):
    return OPERATIONS[op](host, payload)
