"""Coverage from constructed counters: the share of the hosts' bytes that crossed the
impairment, where the rest went, and when a run is no result (testbed/impair/coverage.py)."""

from __future__ import annotations

import pytest

from testbed.impair import coverage
from testbed.impair.counters import ExemptCounters, LinkCounters
from testbed.impair.plan import PlannedHost, build
from testbed.profiles.model import Profile

HOSTS = [PlannedHost("h1", "10.0.0.1", "eth0"), PlannedHost("h2", "10.0.0.2", "eth0")]


def plan(direction: str = "ingress"):
    profile = Profile.model_validate({"name": "p", "direction": direction, "impairment": {
        "loss": {"model": "bernoulli", "loss_pct": 10}}})
    return build(profile, HOSTS, "nft")


def link(rx_packets=0, rx_bytes=0, tx_packets=0, tx_bytes=0, *, kind="veth", loopback=False,
         addressed=True, header_bytes=14) -> dict:
    return {"kind": kind, "loopback": loopback, "addressed": addressed,
            "header_bytes": header_bytes, "rx_packets": rx_packets, "rx_bytes": rx_bytes,
            "tx_packets": tx_packets, "tx_bytes": tx_bytes}


def traffic(**interfaces) -> dict:
    rdma = interfaces.pop("rdma", {})
    return {"interfaces": interfaces, "rdma": rdma}


def zero(t: dict) -> dict:
    """The same interfaces with every counter at 0 (the window's start)."""
    return {"interfaces": {n: {**v, "rx_packets": 0, "rx_bytes": 0, "tx_packets": 0,
                               "tx_bytes": 0} for n, v in t["interfaces"].items()},
            "rdma": {p: dict.fromkeys(v, 0) for p, v in t["rdma"].items()}}


def seen(host: str, peer: str, packets: int, size: int = 1000, dropped: int = 0,
         direction: str = "ingress") -> LinkCounters:
    path = f"{peer}->{host}" if direction == "ingress" else f"{host}->{peer}"
    return LinkCounters(host=host, direction=direction, peer=peer, path=path,
                        seen_packets=packets, dropped_packets=dropped,
                        sized_bytes=packets * size, sized_packets=packets)


def measure(after: dict, paths: dict, the_plan=None, **kw) -> coverage.Coverage:
    return coverage.measure(the_plan or plan(), {h: zero(t) for h, t in after.items()}, after,
                            paths, **kw)


def test_everything_through_the_impaired_interface_is_full_coverage():
    # 1000 packets of 1000 IP bytes arrived on each host's eth0: 1014 bytes each as the
    # device counts them (its Ethernet header), all seen by the impairment; loopback and
    # lossbed's IFB (the same packets again) are not the hosts' traffic
    after = {h.name: traffic(eth0=link(1000, 1_014_000), lo=link(50, 9999, loopback=True),
                             **{"ifb-eth0": link(1000, 1_014_000, kind="ifb")})
             for h in HOSTS}
    got = measure(after, {"h1": [seen("h1", "h2", 1000)], "h2": [seen("h2", "h1", 1000)]})
    assert got.fraction == 1.0 and got.packet_fraction == 1.0
    assert got.enough and got.elsewhere() == {}
    assert got.to_dict()["hosts"][0]["fraction"] == 1.0


def test_a_second_interface_carrying_the_job_is_named_and_not_enough():
    after = {"h1": traffic(eth0=link(100, 101_400), mgmt0=link(900, 912_600)),
             "h2": traffic(eth0=link(100, 101_400), mgmt0=link(900, 912_600))}
    got = measure(after, {"h1": [seen("h1", "h2", 100)], "h2": [seen("h2", "h1", 100)]})
    assert got.fraction == pytest.approx(0.1)
    assert not got.enough
    assert list(got.elsewhere()) == ["mgmt0 on h1 (not impaired)", "mgmt0 on h2 (not impaired)"]
    why = got.shortfall()
    assert "only 10.0%" in why and "mgmt0 on h1 (not impaired) carried 45.0%" in why
    assert "GLOO_SOCKET_IFNAME" in why  # the fix


def test_traffic_the_profile_did_not_match_is_named_on_the_impaired_interface():
    after = {h.name: traffic(eth0=link(1000, 1_014_000)) for h in HOSTS}
    got = measure(after, {"h1": [seen("h1", "h2", 0)], "h2": [seen("h2", "h1", 0)]})
    assert got.fraction == 0.0 and not got.enough
    assert all(coverage.NOT_MATCHED in where for where in got.elsewhere())
    assert "The profile's match left the job's traffic out" in got.shortfall()


def test_what_the_exclusions_let_through_is_shown_apart_from_what_the_match_missed():
    # 1000 packets of 1000 B arrived, 800 impaired, 150 exempt (SSH, the rendezvous port),
    # 50 neither (missed by the match)
    after = {h.name: traffic(eth0=link(1000, 1_014_000)) for h in HOSTS}
    paths = {"h1": [seen("h1", "h2", 800)], "h2": [seen("h2", "h1", 800)]}
    exempt = {h.name: [ExemptCounters(h.name, "ingress", 150, 150_000),
                       ExemptCounters(h.name, "egress", 7, 7_000)]  # the other direction
              for h in HOSTS}
    got = measure(after, paths, exempt=exempt)
    assert got.fraction == pytest.approx(0.8)
    assert got.exempt_bytes == 2 * 150_000 and got.hosts[0].exempt_bytes == 150_000
    assert got.elsewhere() == {
        f"eth0 on h1, {coverage.EXEMPT}": 150_000, f"eth0 on h2, {coverage.EXEMPT}": 150_000,
        f"eth0 on h1, {coverage.NOT_MATCHED}": 50_000,
        f"eth0 on h2, {coverage.NOT_MATCHED}": 50_000}
    assert got.to_dict()["exempt_bytes"] == 300_000
    assert "carried its data on a port the profile exempts" in got.shortfall()
    assert "the exclusions (SSH, the rendezvous port) carried 300.0 kB" in \
        coverage.format_coverage(got)
    # without exempt counters (a plan applied before they existed) it is all 'not matched'
    old = measure(after, paths)
    assert old.exempt_bytes == 0
    assert list(old.elsewhere()) == [f"eth0 on h1, {coverage.NOT_MATCHED}",
                                     f"eth0 on h2, {coverage.NOT_MATCHED}"]


def test_rdma_ports_are_a_bypass_counted_once_per_machine():
    port = {"rx_bytes": 9_000_000, "tx_bytes": 9_000_000, "rx_packets": 2000,
            "tx_packets": 2000}
    after = {h.name: traffic(eth0=link(1000, 1_014_000), rdma={"mlx5_0/1": port})
             for h in HOSTS}
    paths = {"h1": [seen("h1", "h2", 1000)], "h2": [seen("h2", "h1", 1000)]}
    apart = measure(after, paths)
    assert apart.total_bytes == 2 * (1_000_000 + 9_000_000)
    assert "rdma mlx5_0/1 on h1 (kernel bypass)" in apart.elsewhere()
    assert "NCCL_IB_DISABLE" in apart.shortfall()
    # namespace hosts share this machine's devices: the port is one, not one per host
    shared = measure(after, paths, one_machine=True)
    assert shared.total_bytes == 2 * 1_000_000 + 9_000_000


def test_at_egress_what_the_impairment_dropped_never_reached_the_device_counter():
    # 1000 packets sent, 100 dropped at the egress hook: the device counted 900
    after = {h.name: traffic(eth0=link(tx_packets=900, tx_bytes=912_600)) for h in HOSTS}
    paths = {h.name: [seen(h.name, "h2" if h.name == "h1" else "h1", 1000, dropped=100,
                           direction="egress")] for h in HOSTS}
    got = measure(after, paths, plan("egress"))
    assert got.fraction == 1.0 and got.hosts[0].total_packets == 1000


def test_no_traffic_is_no_result_and_a_threshold_is_a_threshold():
    idle = {h.name: traffic(eth0=link()) for h in HOSTS}
    nothing = measure(idle, {})
    assert nothing.fraction is None and not nothing.enough
    assert "carried no traffic" in nothing.shortfall()
    after = {h.name: traffic(eth0=link(1000, 1_014_000), mgmt0=link(100, 101_400))
             for h in HOSTS}
    paths = {"h1": [seen("h1", "h2", 1000)], "h2": [seen("h2", "h1", 1000)]}
    assert measure(after, paths).enough  # 10/11 = 0.909 of the bytes
    assert not measure(after, paths, min_coverage=0.95).enough


def test_rdma_traffic_the_drop_mask_impairs_counts_as_impaired():
    port = {"rx_bytes": 9_000_000, "tx_bytes": 0, "rx_packets": 2000, "tx_packets": 0}
    after = {h.name: traffic(eth0=link(1000, 1_014_000), rdma={"mlx5_0/1": port})
             for h in HOSTS}
    paths = {"h1": [seen("h1", "h2", 1000)], "h2": [seen("h2", "h1", 1000)]}
    got = measure(after, paths, rdma_by_drop_mask=True)
    assert got.fraction == 1.0 and got.elsewhere() == {}
