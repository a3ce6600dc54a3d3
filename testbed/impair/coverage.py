"""Coverage: how much of the hosts' traffic crossed the impairment point at all.

verify.py says what happened to the packets that reached the impairment (how many it
dropped). That says nothing about the packets that never reached it: a job whose process
group bound a second NIC, NCCL's verbs on an RDMA device, traffic on ports the profile
exempts or does not match. Coverage holds the impairment's own count against every way a
host's traffic can leave or arrive, over the same window:

    coverage = bytes the impairment point saw / IP bytes on every addressed, non-loopback
               interface of the hosts (+ the RDMA ports' data, which no qdisc sees)

counted where the impairment sits: arrivals for an ingress profile (the interfaces' rx, which
the kernel counts before an ingress drop), departures for an egress one (tx, plus what the
impairment dropped before the device counted it). What was not impaired is named by where it
went: the impaired interface's exemptions (the profile's match.exclude: SSH, the rendezvous
port; every backend counts them apart), the rest of the impaired interface (traffic the
match missed, non-IP frames), another interface, an RDMA port.

The interface counters come from the hosts' kernels (netlink's 64-bit link statistics, read
inside each host's namespace), the RDMA ports' from /sys/class/infiniband. A run whose
coverage is below `DEFAULT_MIN_COVERAGE` measured a network that was not the one it names.
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The default least fraction of the hosts' bytes that must cross the impairment for a lossy
# run to count (--min-coverage). The rest is what a run carries besides its data: the
# exempt rendezvous and SSH, ARP, the controller's own reads of the counters.
DEFAULT_MIN_COVERAGE = 0.9
# Link kinds whose traffic is another interface's, counted there already: lossbed's IFB
# devices (an ingress netem's redirect of the impaired interface's own arrivals).
_SHADOW_KINDS = frozenset({"ifb"})
_ARPHRD_ETHER = 1
ETH_HEADER_BYTES = 14
RDMA_ROOT = Path("/sys/class/infiniband")
# the data counters of an InfiniBand/RoCE port count 4-octet words
_RDMA_WORD = 4


# ---- reading, on a host (the host operation "traffic") ------------------------------------


def read_traffic(host) -> dict:
    """Every interface's counters and the RDMA ports' data counters, now."""
    interfaces = {}
    with host.netlink() as ipr:
        addressed = {a["index"] for a in ipr.get_addr(family=socket.AF_INET)}
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            stats = link.get_attr("IFLA_STATS64") or link.get_attr("IFLA_STATS") or {}
            info = link.get_attr("IFLA_LINKINFO")
            kind = info.get_attr("IFLA_INFO_KIND") if info else None
            interfaces[name] = {
                "kind": kind or "", "loopback": bool(link["flags"] & 0x8),  # IFF_LOOPBACK
                "addressed": link["index"] in addressed,
                "header_bytes": ETH_HEADER_BYTES if link["ifi_type"] == _ARPHRD_ETHER else 0,
                **{k: int(stats.get(k, 0)) for k in
                   ("rx_packets", "rx_bytes", "tx_packets", "tx_bytes")}}
    return {"interfaces": interfaces, "rdma": read_rdma_ports()}


def read_rdma_ports(root: Path | None = None) -> dict:
    """device/port -> its data counters in bytes, for hardware RDMA devices only: a software
    device (Soft-RoCE, siw: no `device` link) sends through a netdev, counted there. root:
    RDMA_ROOT, as it is when called."""
    root = RDMA_ROOT if root is None else root
    ports = {}
    if not root.is_dir():
        return ports
    for device in sorted(root.iterdir()):
        if not (device / "device").exists():
            continue
        for port in sorted((device / "ports").glob("*")):
            counters = port / "counters"
            try:
                ports[f"{device.name}/{port.name}"] = {
                    "rx_bytes": _RDMA_WORD * int((counters / "port_rcv_data").read_text()),
                    "tx_bytes": _RDMA_WORD * int((counters / "port_xmit_data").read_text()),
                    "rx_packets": int((counters / "port_rcv_packets").read_text()),
                    "tx_packets": int((counters / "port_xmit_packets").read_text())}
            except (OSError, ValueError):
                continue  # a port without counters carries nothing we could count
    return ports


def rdma_devices(root: Path | None = None) -> list[str]:
    """The hardware RDMA devices here (what NCCL's IB transport would use)."""
    root = RDMA_ROOT if root is None else root
    if not root.is_dir():
        return []
    return sorted(d.name for d in root.iterdir() if (d / "device").exists())


# ---- judging, on the controller -----------------------------------------------------------


@dataclass
class HostCoverage:
    """One host's window: what the impairment saw against what its interfaces carried, in
    the impairment's direction, in IP bytes and packets."""

    host: str
    direction: str                 # "ingress": what arrived; "egress": what left
    impaired_bytes: int
    impaired_packets: int
    total_bytes: int
    total_packets: int
    # bytes that did not cross the impairment, by where they went
    elsewhere: dict[str, int] = field(default_factory=dict)
    # of those, what the profile's exclusions let through (SSH, the rendezvous port)
    exempt_bytes: int = 0

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.impaired_bytes / self.total_bytes) if self.total_bytes else None


@dataclass
class Coverage:
    hosts: list[HostCoverage]
    min_coverage: float

    @property
    def impaired_bytes(self) -> int:
        return sum(h.impaired_bytes for h in self.hosts)

    @property
    def total_bytes(self) -> int:
        return sum(h.total_bytes for h in self.hosts)

    @property
    def exempt_bytes(self) -> int:
        return sum(h.exempt_bytes for h in self.hosts)

    @property
    def fraction(self) -> float | None:
        """The share of the hosts' bytes that crossed the impairment (None: no traffic)."""
        total = self.total_bytes
        return min(1.0, self.impaired_bytes / total) if total else None

    @property
    def packet_fraction(self) -> float | None:
        total = sum(h.total_packets for h in self.hosts)
        return (min(1.0, sum(h.impaired_packets for h in self.hosts) / total)
                if total else None)

    def elsewhere(self) -> dict[str, int]:
        """Where the bytes that were not impaired went, summed over hosts, largest first."""
        out: dict[str, int] = {}
        for h in self.hosts:
            for where, n in h.elsewhere.items():
                out[where] = out.get(where, 0) + n
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    @property
    def enough(self) -> bool:
        """At least min_coverage of the traffic met the impairment (no traffic: not enough,
        a run that carried nothing measured nothing)."""
        return self.fraction is not None and self.fraction >= self.min_coverage

    def shortfall(self) -> str:
        """Why the coverage is not enough: what carried the traffic instead, and the fix."""
        if self.fraction is None:
            return ("the hosts' interfaces carried no traffic in the run's window: nothing "
                    "was measured under the impairment")
        total = self.total_bytes
        parts = [f"{where} carried {n / total:.1%} ({_size(n)})"
                 for where, n in list(self.elsewhere().items())[:4] if n]
        return (f"only {self.fraction:.1%} of the hosts' {_size(total)} crossed the "
                f"impairment (at least {self.min_coverage:.0%} needed): "
                + "; ".join(parts) + ". " + _fix(self.elsewhere()))

    def no_result(self, profile) -> str | None:
        """Why a run under `profile` is no result, or None: the profile impairs, and too
        little of the hosts' traffic crossed the impairment. A clean profile impairs nothing
        to be missed: its coverage is recorded, not judged."""
        if profile.impairs_nothing() or self.enough:
            return None
        return self.shortfall()

    def to_dict(self) -> dict:
        return {"fraction": self.fraction, "packet_fraction": self.packet_fraction,
                "min_coverage": self.min_coverage, "enough": self.enough,
                "impaired_bytes": self.impaired_bytes, "total_bytes": self.total_bytes,
                "exempt_bytes": self.exempt_bytes, "elsewhere": self.elsewhere(),
                "hosts": [{**asdict(h), "fraction": h.fraction} for h in self.hosts]}


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


# the words the impaired interface's own unimpaired traffic is named by
EXEMPT = "let through by the profile's exclusions (SSH, the rendezvous port)"
NOT_MATCHED = "not matched by the profile (traffic its match misses, non-IP)"


def _fix(elsewhere: dict[str, int]) -> str:
    top = next(iter(elsewhere), "")
    if top.startswith("rdma "):
        return ("The job used an RDMA device, which no qdisc sees: run NCCL over its socket "
                "transport on the impaired interface (lossbed's launchers set NCCL_IB_DISABLE=1 "
                "and NCCL_SOCKET_IFNAME; do not override them), or use the verbs transport "
                "with its drop mask")
    if EXEMPT in top:
        return ("The job carried its data on a port the profile exempts: move its process "
                "group off the exempt ports (SSH, the rendezvous port: the profile's "
                "match.exclude), or take the port out of match.exclude")
    if NOT_MATCHED in top:
        return ("The profile's match left the job's traffic out: check its match (include "
                "the job's ports, or leave include empty for all traffic) and that the job "
                "does not carry its data on an exempt port (SSH, the rendezvous port)")
    return ("The job's traffic left by an interface lossbed does not impair: bind its "
            "process group to the impaired one (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME: "
            "lossbed sets them, do not override them), and check `lossbed doctor`'s "
            "bypass findings")


def measure(plan, before: dict[str, dict], after: dict[str, dict], path_counters: dict,
            min_coverage: float = DEFAULT_MIN_COVERAGE, one_machine: bool = False,
            rdma_by_drop_mask: bool = False, exempt: dict | None = None) -> Coverage:
    """Coverage over a window. before/after: host -> read_traffic(); path_counters: host ->
    its impaired paths' LinkCounters over the same window (LinkCounters.since); exempt:
    host -> its ExemptCounters over the window (what the exclusions let through).
    one_machine: the hosts share one machine's RDMA devices (namespace hosts), counted once.
    rdma_by_drop_mask: the receivers drop RDMA traffic by lossbed's seeded mask (no qdisc
    sees it): the RDMA ports' bytes count as impaired, by the mask."""
    direction = "egress" if plan.profile.direction == "egress" else "ingress"
    side = "rx" if direction == "ingress" else "tx"
    hosts = []
    for i, hp in enumerate(plan.hosts):
        counters = [c for c in path_counters.get(hp.host, []) if c.direction == direction]
        seen_packets = sum(c.seen_packets for c in counters)
        seen_bytes = sum(round(c.seen_packets * (c.mean_packet_bytes or 0)) for c in counters)
        dropped_packets = sum(c.dropped_packets for c in counters)
        dropped_bytes = sum(round(c.dropped_packets * (c.mean_packet_bytes or 0))
                            for c in counters)
        exempt_bytes = sum(e.bytes for e in (exempt or {}).get(hp.host, [])
                           if e.direction == direction)
        exempt_seen = 0
        now, then = after[hp.host], before[hp.host]
        total_bytes = total_packets = 0
        elsewhere = {}
        for name, link in now["interfaces"].items():
            earlier = then["interfaces"].get(name)
            if (earlier is None or link["loopback"] or not link["addressed"]
                    or link["kind"] in _SHADOW_KINDS):
                continue
            packets = link[f"{side}_packets"] - earlier[f"{side}_packets"]
            ip_bytes = (link[f"{side}_bytes"] - earlier[f"{side}_bytes"]
                        - link["header_bytes"] * packets)
            if name == hp.ifname and direction == "egress":
                # the impairment dropped these before the device counted them
                packets += dropped_packets
                ip_bytes += dropped_bytes
            total_packets += packets
            total_bytes += max(0, ip_bytes)
            if name == hp.ifname:
                rest = ip_bytes - seen_bytes
                exempt_seen = max(0, min(rest, exempt_bytes))
                if exempt_seen:
                    elsewhere[f"{name} on {hp.host}, {EXEMPT}"] = exempt_seen
                if rest - exempt_seen > 0:
                    elsewhere[f"{name} on {hp.host}, {NOT_MATCHED}"] = rest - exempt_seen
            elif ip_bytes > 0:
                elsewhere[f"{name} on {hp.host} (not impaired)"] = ip_bytes
        if not (one_machine and i > 0):
            for port, c in now["rdma"].items():
                earlier = then["rdma"].get(port)
                if earlier is None:
                    continue
                n = c[f"{side}_bytes"] - earlier[f"{side}_bytes"]
                packets = c[f"{side}_packets"] - earlier[f"{side}_packets"]
                total_bytes += n
                total_packets += packets
                if rdma_by_drop_mask:
                    seen_bytes += n
                    seen_packets += packets
                elif n > 0:
                    elsewhere[f"rdma {port} on {hp.host} (kernel bypass)"] = n
        hosts.append(HostCoverage(hp.host, direction, seen_bytes, seen_packets,
                                  total_bytes, total_packets, elsewhere, exempt_seen))
    return Coverage(hosts, min_coverage)


def format_coverage(coverage: Coverage) -> str:
    if coverage.fraction is None:
        return "coverage: no traffic in the window"
    lines = [f"coverage: {coverage.fraction:.1%} of {_size(coverage.total_bytes)} crossed "
             f"the impairment (needed {coverage.min_coverage:.0%})"]
    for where, n in list(coverage.elsewhere().items())[:4]:
        lines.append(f"  not impaired: {where}: {_size(n)}")
    if coverage.exempt_bytes:
        lines.append(f"  of which the exclusions (SSH, the rendezvous port) carried "
                     f"{_size(coverage.exempt_bytes)}")
    return "\n".join(lines)
