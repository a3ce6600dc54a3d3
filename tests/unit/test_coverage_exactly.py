"""Coverage over a planted window, every number of it known: what each host's impairment
saw, what its interfaces and RDMA ports carried, where the rest went, and the words a user
reads when it is not enough (testbed/impair/coverage.py, #71). test_coverage.py shows the
cases one at a time; here one window holds them together and the whole result is compared."""

from __future__ import annotations

from testbed.impair import coverage
from testbed.impair.counters import ExemptCounters, LinkCounters
from testbed.impair.plan import PlannedHost, build
from testbed.profiles.model import Profile

HOSTS = [PlannedHost(f"h{i}", f"10.0.0.{i}", "eth0") for i in (1, 2, 3, 4)]


def _plan(direction="ingress", hosts=HOSTS):
    profile = Profile.model_validate({"name": "p", "direction": direction, "impairment": {
        "loss": {"model": "bernoulli", "loss_pct": 10}}})
    return build(profile, hosts, "nft")


def _link(packets=0, nbytes=0, *, side="rx", kind="veth", loopback=False, addressed=True,
          header_bytes=14):
    other = "tx" if side == "rx" else "rx"
    return {"kind": kind, "loopback": loopback, "addressed": addressed,
            "header_bytes": header_bytes, f"{side}_packets": packets, f"{side}_bytes": nbytes,
            f"{other}_packets": 7, f"{other}_bytes": 7000}  # the other side: never counted


def _port(nbytes, packets):
    return {"rx_bytes": nbytes, "rx_packets": packets, "tx_bytes": 3, "tx_packets": 3}


def _seen(host, packets, size, dropped=0, direction="ingress"):
    return LinkCounters(host=host, direction=direction, peer="hx", path=f"hx->{host}",
                        seen_packets=packets, dropped_packets=dropped,
                        sized_bytes=packets * size if size else 0,
                        sized_packets=packets if size else 0)


# the window's start and end, per host. h1 has every kind of interface; h2's impaired
# interface appeared during the window (no reading before: not counted); h3's match missed
# one byte; h4's exclusions let through more than the rest of its impaired interface
BEFORE = {
    "h1": {"interfaces": {"eth0": _link(100, 101_400), "mgmt0": _link(10, 10_140),
                          "idle0": _link(3, 3042), "tiny0": _link(),
                          "lo": _link(5, 500, loopback=True, header_bytes=0),
                          "ifb0": _link(100, 101_400, kind="ifb"),
                          "down0": _link(1, 1014, addressed=False)},
           "rdma": {"mlx5_0/1": _port(1000, 10), "mlx5_2/1": _port(400, 4),
                    "mlx5_3/1": _port(0, 0)}},
    "h2": {"interfaces": {"mgmt0": _link()}, "rdma": {}},
    "h3": {"interfaces": {"eth0": _link()}, "rdma": {}},
    "h4": {"interfaces": {"eth0": _link()}, "rdma": {}},
}
AFTER = {
    "h1": {"interfaces": {"new0": _link(5, 5070),  # not there at the start: first, and skipped
                          "eth0": _link(1100, 1_115_400), "mgmt0": _link(20, 20_280),
                          "idle0": _link(3, 3042), "tiny0": _link(1, 15),
                          "lo": _link(55, 5500, loopback=True, header_bytes=0),
                          "ifb0": _link(1100, 1_115_400, kind="ifb"),
                          "down0": _link(9, 9126, addressed=False)},
           "rdma": {"mlx5_1/1": _port(9999, 9),  # not there at the start: first, skipped
                    "mlx5_0/1": _port(6000, 17), "mlx5_2/1": _port(400, 4),
                    "mlx5_3/1": _port(1, 1)}},
    "h2": {"interfaces": {"eth0": _link(50, 50_700), "mgmt0": _link(10, 10_140)}, "rdma": {}},
    "h3": {"interfaces": {"eth0": _link(100, 101_401)}, "rdma": {}},
    "h4": {"interfaces": {"eth0": _link(100, 101_400)}, "rdma": {}},
}
PATHS = {
    # 900 packets of 1000 bytes seen (90 dropped: at ingress the device counted them), 5
    # more on a path that measured no sizes, and an egress path this ingress plan ignores
    "h1": [_seen("h1", 900, 1000, dropped=90), _seen("h1", 5, None),
           _seen("h1", 999, 1000, direction="egress")],
    "h3": [_seen("h3", 100, 1000)],
    "h4": [_seen("h4", 50, 1000)],
}
EXEMPT = {"h1": [ExemptCounters("h1", "ingress", 10, 60_000),
                 ExemptCounters("h1", "egress", 10, 5_000)],
          "h4": [ExemptCounters("h4", "ingress", 80, 80_000)]}

NOT_MATCHED = coverage.NOT_MATCHED
EXEMPT_WORDS = coverage.EXEMPT


def test_every_hosts_window_is_counted_exactly():
    got = coverage.measure(_plan(), BEFORE, AFTER, PATHS, exempt=EXEMPT)
    assert got.hosts == [
        # eth0: 1000 packets, 1,014,000 device bytes = 1,000,000 IP bytes, of which 900,000
        # seen; the other 100,000: 60,000 exempt, 40,000 not matched. mgmt0 10,000,
        # tiny0 1 (15 device bytes of one packet), RDMA 5000 + 1 (mlx5_2 carried nothing)
        coverage.HostCoverage(
            "h1", "ingress", 900_000, 905, 1_000_000 + 10_000 + 1 + 5000 + 1,
            1000 + 10 + 1 + 7 + 1,
            {f"eth0 on h1, {EXEMPT_WORDS}": 60_000, f"eth0 on h1, {NOT_MATCHED}": 40_000,
             "mgmt0 on h1 (not impaired)": 10_000, "tiny0 on h1 (not impaired)": 1,
             "rdma mlx5_0/1 on h1 (kernel bypass)": 5000,
             "rdma mlx5_3/1 on h1 (kernel bypass)": 1},
            60_000),
        coverage.HostCoverage("h2", "ingress", 0, 0, 10_000, 10,
                              {"mgmt0 on h2 (not impaired)": 10_000}, 0),
        coverage.HostCoverage("h3", "ingress", 100_000, 100, 100_001, 100,
                              {f"eth0 on h3, {NOT_MATCHED}": 1}, 0),
        coverage.HostCoverage("h4", "ingress", 50_000, 50, 100_000, 100,
                              {f"eth0 on h4, {EXEMPT_WORDS}": 50_000}, 50_000),
    ]
    impaired, total = 900_000 + 100_000 + 50_000, 1_015_002 + 10_000 + 100_001 + 100_000
    assert (got.impaired_bytes, got.total_bytes, got.exempt_bytes) == (impaired, total,
                                                                        110_000)
    assert got.fraction == impaired / total
    assert got.packet_fraction == (905 + 100 + 50) / (1019 + 10 + 100 + 100)
    assert list(got.elsewhere().items()) == [
        (f"eth0 on h1, {EXEMPT_WORDS}", 60_000), (f"eth0 on h4, {EXEMPT_WORDS}", 50_000),
        (f"eth0 on h1, {NOT_MATCHED}", 40_000), ("mgmt0 on h1 (not impaired)", 10_000),
        ("mgmt0 on h2 (not impaired)", 10_000), ("rdma mlx5_0/1 on h1 (kernel bypass)", 5000),
        ("tiny0 on h1 (not impaired)", 1), ("rdma mlx5_3/1 on h1 (kernel bypass)", 1),
        (f"eth0 on h3, {NOT_MATCHED}", 1)]


def test_the_result_as_recorded():
    got = coverage.measure(_plan(), BEFORE, AFTER, PATHS, exempt=EXEMPT, min_coverage=0.5)
    recorded = got.to_dict()
    assert recorded == {
        "fraction": got.fraction, "packet_fraction": got.packet_fraction,
        "min_coverage": 0.5, "enough": True, "impaired_bytes": 1_050_000,
        "total_bytes": 1_225_003, "exempt_bytes": 110_000, "elsewhere": got.elsewhere(),
        "hosts": [{"host": h.host, "direction": "ingress", "impaired_bytes": h.impaired_bytes,
                   "impaired_packets": h.impaired_packets, "total_bytes": h.total_bytes,
                   "total_packets": h.total_packets, "elsewhere": h.elsewhere,
                   "exempt_bytes": h.exempt_bytes, "fraction": h.fraction}
                  for h in got.hosts]}
    assert [h["fraction"] for h in recorded["hosts"]] == [
        900_000 / 1_015_002, 0.0, 100_000 / 100_001, 0.5]


def test_at_egress_the_dropped_packets_join_the_device_count_and_rdma_by_the_mask():
    egress = coverage.measure(
        _plan("egress", HOSTS[:1]),
        {"h1": {"interfaces": {"eth0": _link(100, 101_400, side="tx")},
                "rdma": {"mlx5_0/1": {"rx_bytes": 0, "rx_packets": 0, "tx_bytes": 100,
                                      "tx_packets": 1}}}},
        {"h1": {"interfaces": {"eth0": _link(1000, 1_014_000, side="tx")},
                "rdma": {"mlx5_0/1": {"rx_bytes": 5, "rx_packets": 5, "tx_bytes": 4100,
                                      "tx_packets": 5}}}},
        {"h1": [_seen("h1", 1000, 1000, dropped=100, direction="egress"),
                # a path that measured no sizes: its drops add packets, no bytes
                _seen("h1", 0, None, dropped=3, direction="egress"),
                _seen("h1", 10, 1000, direction="ingress")]},
        rdma_by_drop_mask=True)
    # the device counted 900 packets (900,000 IP bytes), the impairment dropped 100 of
    # 1000 bytes before it: 1000 packets left, all seen; the mask impairs the port's 4000
    assert egress.hosts == [coverage.HostCoverage(
        "h1", "egress", 1_000_000 + 4000, 1000 + 4, 1_000_000 + 4000, 1000 + 3 + 4, {}, 0)]


SHORT = {"rdma mlx5_0/1 on h1 (kernel bypass)": 10, "eth0 on h1, " + EXEMPT_WORDS: 10,
         "eth0 on h1, " + NOT_MATCHED: 10, "mgmt0 on h1 (not impaired)": 10}


def _short(first: str, n_first: int = 900, impaired: int = 100) -> coverage.Coverage:
    elsewhere = {first: n_first, **{k: v for k, v in SHORT.items() if k != first}}
    elsewhere["wg0 on h1 (not impaired)"] = 5  # the fifth place: not named
    total = impaired + sum(elsewhere.values())
    return coverage.Coverage([coverage.HostCoverage("h1", "ingress", impaired, 1, total, 9,
                                                    elsewhere, 10)], 0.9)


def test_a_shortfall_names_the_four_largest_places_and_the_fix_for_the_largest():
    fixes = {
        "rdma mlx5_0/1 on h1 (kernel bypass)": (
            "The job used an RDMA device, which no qdisc sees: run NCCL over its socket "
            "transport on the impaired interface (lossbed's launchers set NCCL_IB_DISABLE=1 "
            "and NCCL_SOCKET_IFNAME; do not override them), or use the verbs transport "
            "with its drop mask"),
        "eth0 on h1, " + EXEMPT_WORDS: (
            "The job carried its data on a port the profile exempts: move its process "
            "group off the exempt ports (SSH, the rendezvous port: the profile's "
            "match.exclude), or take the port out of match.exclude"),
        "eth0 on h1, " + NOT_MATCHED: (
            "The profile's match left the job's traffic out: check its match (include "
            "the job's ports, or leave include empty for all traffic) and that the job "
            "does not carry its data on an exempt port (SSH, the rendezvous port)"),
        "mgmt0 on h1 (not impaired)": (
            "The job's traffic left by an interface lossbed does not impair: bind its "
            "process group to the impaired one (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME: "
            "lossbed sets them, do not override them), and check `lossbed doctor`'s "
            "bypass findings")}
    for first, fix in fixes.items():
        got = _short(first)
        others = [k for k in SHORT if k != first]
        assert got.shortfall() == (
            "only 9.7% of the hosts' 1.0 kB crossed the impairment (at least 90% needed): "
            f"{first} carried 87.0% (900 B); {others[0]} carried 1.0% (10 B); "
            f"{others[1]} carried 1.0% (10 B); {others[2]} carried 1.0% (10 B). {fix}")
    assert coverage._fix({}) == fixes["mgmt0 on h1 (not impaired)"]


def test_a_place_that_carried_nothing_is_not_named():
    got = _short("mgmt0 on h1 (not impaired)", n_first=0, impaired=1000)
    assert "mgmt0" not in got.shortfall().split(". ")[0]


def test_no_traffic_is_said_in_words():
    idle = coverage.Coverage([coverage.HostCoverage("h1", "ingress", 0, 0, 0, 0)], 0.9)
    assert idle.shortfall() == ("the hosts' interfaces carried no traffic in the run's "
                                "window: nothing was measured under the impairment")
    assert coverage.format_coverage(idle) == "coverage: no traffic in the window"


def test_the_report_line_names_four_places_and_the_exclusions():
    assert coverage.format_coverage(_short("mgmt0 on h1 (not impaired)")) == "\n".join([
        "coverage: 9.7% of 1.0 kB crossed the impairment (needed 90%)",
        "  not impaired: mgmt0 on h1 (not impaired): 900 B",
        "  not impaired: rdma mlx5_0/1 on h1 (kernel bypass): 10 B",
        f"  not impaired: eth0 on h1, {EXEMPT_WORDS}: 10 B",
        f"  not impaired: eth0 on h1, {NOT_MATCHED}: 10 B",
        "  of which the exclusions (SSH, the rendezvous port) carried 10 B"])


def test_sizes_are_written_in_the_largest_unit_they_reach():
    assert [coverage._size(n) for n in (0, 999, 1000, 999_999, 1_000_000, 999_999_999,
                                         1_000_000_000, 2_500_000_000)] == [
        "0 B", "999 B", "1.0 kB", "1000.0 kB", "1.0 MB", "1000.0 MB", "1.0 GB", "2.5 GB"]


def test_places_are_summed_over_hosts():
    two = coverage.Coverage([
        coverage.HostCoverage("h1", "ingress", 0, 0, 30, 3, {"a": 10, "b": 5}),
        coverage.HostCoverage("h2", "ingress", 0, 0, 30, 3, {"a": 1, "c": 20})], 0.9)
    assert list(two.elsewhere().items()) == [("c", 20), ("a", 11), ("b", 5)]
