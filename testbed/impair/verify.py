"""Measure the impairment the kernel really applied, instead of trusting the configuration.

For every impaired path: the packets the impairment point saw and dropped (from the kernel:
nft counters, the BPF map, netem's qdisc stats), the measured loss with a 95% interval
against the profile's target, the mean packet size (a packet larger than the MTU means
segmentation offloads merged packets and loss hits super-packets, not wire packets), and for
the bpf backend the runs of consecutive drops. Per host: the UDP receive-buffer drops from
/proc/net/snmp, loss the receiver inflicted on itself that must not be taken for emulated
loss.

Counters are cumulative, so a figure for one run is the difference of two readings taken
around it (`read` before, `read` after, `report(after, since=before)`); `verify` reports
everything since the profile was applied (and the hosts' socket drops since boot).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from testbed import stats
from testbed.impair import coverage, engine
from testbed.impair.counters import ExemptCounters, LinkCounters
from testbed.profiles.model import GilbertElliott

# A measured loss farther than this from the target, in standard deviations, is flagged.
# Under a correct impairment a 4-sigma excursion happens about once in 16,000 paths.
FLAG_SIGMA = 4.0


@dataclass
class PathReport:
    path: str
    host: str
    direction: str
    target_loss: float
    seen_packets: int
    dropped_packets: int
    measured_loss: float | None
    interval95: tuple[float, float] | None
    sigma_from_target: float | None
    mean_packet_bytes: float | None
    superpackets: bool
    bursts: int | None = None
    seen_bytes: int | None = None     # IP-level
    dropped_bytes: int | None = None  # IP-level
    mean_burst: float | None = None
    target_mean_burst: float | None = None
    max_burst: int | None = None
    flags: list[str] = field(default_factory=list)


@dataclass
class Report:
    cluster: str
    profile: str
    backend: str
    mtu: int
    paths: list[PathReport]
    rcvbuf_errors: dict[str, int]
    udp_in_datagrams: dict[str, int]
    # "since the profile was applied" (UDP counters: since the hosts booted), or a window
    # between two readings ("between two readings, N s")
    window: str = "since the profile was applied"

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def total_seen(self) -> int:
        return sum(p.seen_packets for p in self.paths)

    @property
    def total_dropped(self) -> int:
        return sum(p.dropped_packets for p in self.paths)


def read_udp_snmp(host) -> dict[str, int]:
    """The host's UDP counters (its own /proc/net/snmp, read inside its namespace)."""
    return host.agent_call("udp_snmp", {})


def _path_report(counters, rule, mtu: int) -> PathReport:
    loss = rule.impairment.loss
    target = loss.stationary_loss() if loss else 0.0
    inflation = 1.0
    if isinstance(loss, GilbertElliott) and loss.loss_in_bad_pct == 100 \
            and loss.loss_in_good_pct == 0:
        inflation = stats.markov_inflation(loss.p, loss.r)
    n, k = counters.seen_packets, counters.dropped_packets
    report = PathReport(
        path=counters.path, host=counters.host, direction=counters.direction,
        target_loss=target, seen_packets=n, dropped_packets=k,
        measured_loss=k / n if n else None,
        interval95=stats.wilson_interval(k, n, inflation=inflation) if n else None,
        sigma_from_target=stats.sigma_distance(k, n, target, inflation) if n else None,
        mean_packet_bytes=counters.mean_packet_bytes,
        superpackets=bool(counters.mean_packet_bytes and counters.mean_packet_bytes > mtu),
        bursts=counters.bursts, max_burst=counters.max_burst,
        seen_bytes=counters.seen_bytes, dropped_bytes=counters.dropped_bytes,
        mean_burst=k / counters.bursts if counters.bursts else None,
        target_mean_burst=loss.mean_burst_length() if loss else None,
    )
    if report.superpackets:
        report.flags.append(f"mean packet {counters.mean_packet_bytes:.0f} B > MTU {mtu}: "
                            "segmentation offloads are on, loss hits super-packets")
    if report.sigma_from_target is not None and report.sigma_from_target > FLAG_SIGMA \
            and (target > 0 or k > 0):
        report.flags.append(f"measured loss is {report.sigma_from_target:.1f} sigma from the "
                            "target")
    return report


@dataclass
class Reading:
    """The counters of every impaired path and every host's UDP counters, at one moment."""

    counters: list[list[LinkCounters]]   # per host of the plan, per rule
    snmp: dict[str, dict[str, int]]      # host -> /proc/net/snmp's Udp row
    taken_at: float
    # host -> every interface's and RDMA port's counters (coverage.read_traffic)
    traffic: dict[str, dict] = field(default_factory=dict)
    # per host of the plan: what the profile's exclusions let through, per direction
    exempt: list[list[ExemptCounters]] = field(default_factory=list)
    # host -> seconds its lease has left (None: no lease: a host lossbed owns)
    lease_left: dict[str, float | None] = field(default_factory=dict)


def read_traffic(host) -> dict:
    return host.agent_call("traffic", {})


def read(cluster) -> Reading:
    import time

    the_plan, record = engine.applied_plan(cluster)

    def read_host(hp):
        return cluster.host(hp.host).agent_call("reading", {
            "backend": the_plan.backend, "plan": hp.to_dict(),
            "handles": record["handles"].get(hp.host, {})})

    # hosts in parallel: on remote clusters each call is an SSH round trip and a Python start
    with ThreadPoolExecutor(max_workers=min(16, len(the_plan.hosts))) as pool:
        found = list(pool.map(read_host, the_plan.hosts))
    names = [hp.host for hp in the_plan.hosts]
    return Reading(counters=[[LinkCounters(**c) for c in f["paths"]] for f in found],
                   snmp={name: f["udp_snmp"] for name, f in zip(names, found, strict=True)},
                   taken_at=time.monotonic(),
                   traffic={name: f["traffic"] for name, f in zip(names, found, strict=True)},
                   exempt=[[ExemptCounters(**c) for c in f["exempt"]] for f in found],
                   lease_left={name: f.get("lease_left_s")
                               for name, f in zip(names, found, strict=True)})


def report(cluster, reading: Reading, since: Reading | None = None) -> Report:
    """The report of `reading`, or of what happened between `since` and `reading` (two
    readings of the same applied profile)."""
    the_plan, _ = engine.applied_plan(cluster)
    paths = []
    for i, hp in enumerate(the_plan.hosts):
        for j, rule in enumerate(hp.rules):
            counters = reading.counters[i][j]
            if since is not None:
                counters = counters.since(since.counters[i][j])
            paths.append(_path_report(counters, rule, cluster.mtu))

    def udp(name: str, key: str) -> int:
        now = reading.snmp[name].get(key, 0)
        return now - (since.snmp[name].get(key, 0) if since is not None else 0)

    names = list(reading.snmp)
    return Report(
        cluster=cluster.name, profile=the_plan.profile.name, backend=the_plan.backend,
        mtu=cluster.mtu, paths=paths,
        rcvbuf_errors={name: udp(name, "RcvbufErrors") for name in names},
        udp_in_datagrams={name: udp(name, "InDatagrams") for name in names},
        window=("since the profile was applied" if since is None else
                f"between two readings {reading.taken_at - since.taken_at:.1f} s apart"))


def measure_coverage(cluster, reading: Reading, since: Reading,
                     min_coverage: float = coverage.DEFAULT_MIN_COVERAGE,
                     rdma_by_drop_mask: bool = False) -> coverage.Coverage:
    """How much of the hosts' traffic between two readings crossed the impairment (the
    RDMA ports' as well, where lossbed's drop mask impairs it: rdma_by_drop_mask)."""
    the_plan, _ = engine.applied_plan(cluster)
    paths = {hp.host: [now.since(then) for now, then in
                       zip(reading.counters[i], since.counters[i], strict=True)]
             for i, hp in enumerate(the_plan.hosts)}
    exempt = {hp.host: [now.since(then) for now, then in
                        zip(reading.exempt[i], since.exempt[i], strict=True)]
              for i, hp in enumerate(the_plan.hosts)} if reading.exempt and since.exempt else {}
    return coverage.measure(the_plan, since.traffic, reading.traffic, paths, min_coverage,
                            one_machine=cluster.shares_this_machine,
                            rdma_by_drop_mask=rdma_by_drop_mask, exempt=exempt)


def loss_applied_by(backend: str | None, cluster, drop_mask: str | None) -> list[str]:
    """What dropped a run's packets: the kernel's impairment (its backend, where; None: no
    profile that impairs was applied), and the receivers' drop mask where one is set."""
    by = [] if backend is None else [
        f"kernel: the {backend} backend on the hosts' "
        f"{', '.join(sorted({h.ifname for h in cluster.hosts}))}"]
    if drop_mask:
        by.append(f"drop mask {drop_mask} (SEED:RATE) at the receivers")
    return by


def verify(cluster) -> Report:
    return report(cluster, read(cluster))


def format_report(report: Report) -> str:
    lines = [f"cluster {report.cluster}: profile {report.profile}, backend {report.backend}"]
    lines.append(f"{'path':<12} {'seen':>9} {'dropped':>8} {'target':>8} {'measured':>9} "
                 f"{'95% interval':>17} {'pkt B':>6} {'burst':>11}")
    for p in report.paths:
        measured = f"{p.measured_loss * 100:.3f}%" if p.measured_loss is not None else "-"
        interval = (f"{p.interval95[0] * 100:.2f}-{p.interval95[1] * 100:.2f}%"
                    if p.interval95 else "-")
        size = f"{p.mean_packet_bytes:.0f}" if p.mean_packet_bytes else "-"
        burst = "-"
        if p.mean_burst is not None:
            burst = f"{p.mean_burst:.2f}/{p.target_mean_burst:.2f}"
        lines.append(f"{p.path:<12} {p.seen_packets:>9} {p.dropped_packets:>8} "
                     f"{p.target_loss * 100:>7.3f}% {measured:>9} {interval:>17} {size:>6} "
                     f"{burst:>11}")
        for flag in p.flags:
            lines.append(f"  ! {flag}")
    total_seen, total_dropped = report.total_seen, report.total_dropped
    if total_seen:
        lines.append(f"all paths: {total_dropped}/{total_seen} dropped "
                     f"({total_dropped / total_seen * 100:.3f}%)")
    self_inflicted = {h: n for h, n in report.rcvbuf_errors.items() if n}
    if self_inflicted:
        lines.append("receivers dropped datagrams themselves (UDP RcvbufErrors, not emulated "
                     "loss): " + ", ".join(f"{h} {n}" for h, n in self_inflicted.items()))
    else:
        lines.append("receivers' own UDP drops (RcvbufErrors): none")
    lines.append("burst column: measured mean run of drops / model mean (bpf backend only)")
    return "\n".join(lines)
