"""Loss applied for real by the kernel of this machine (nft and bpf backends), measured by
the receivers and compared with the kernel's own counters."""

from __future__ import annotations

import itertools
import socket
import threading

import pytest

from testbed import profiles
from testbed.impair import engine, traffic, verify

pytestmark = pytest.mark.netns


def apply(cluster, profile: str, sets: list[str], backend: str | None = None):
    the_plan, choice = engine.make_plan(cluster, profiles.load(profile, sets), backend=backend)
    engine.apply(cluster, the_plan, choice)
    return the_plan


@pytest.fixture(scope="module")
def four_hosts():
    from testbed import clusters
    from testbed.clusters import netns as netns_cluster
    from tests.helpers import unique_name

    cluster = netns_cluster.up(netns_cluster.ClusterSpec(hosts=4, name=unique_name()))
    yield cluster
    clusters.down(cluster.name)


@pytest.mark.parametrize("backend", ["nft", "bpf"])
@pytest.mark.parametrize("loss_pct", [1, 10, 30])
def test_bernoulli_loss_matches_the_target_and_the_receivers(four_hosts, backend, loss_pct):
    apply(four_hosts, "random-loss", [f"loss_pct={loss_pct}"], backend)
    try:
        pairs = list(itertools.permutations(four_hosts.hosts, 2))
        result = traffic.send_counted(pairs, per_path=4200)  # 12 paths: 50,400 datagrams
        report = verify.verify(four_hosts)
    finally:
        engine.clear(four_hosts)
    assert report.backend == backend
    # No loss inflicted by the receivers themselves, so all loss is the emulated loss.
    assert set(report.rcvbuf_errors.values()) == {0}
    assert result.duplicates == 0 and result.foreign == 0
    # The kernel's counters agree exactly with what the receivers counted, path by path.
    by_path = {p.path: p for p in report.paths}
    for path, count in result.paths.items():
        assert by_path[path].seen_packets == count.sent, path
        assert by_path[path].dropped_packets == count.lost, path
        assert by_path[path].mean_packet_bytes <= four_hosts.mtu  # wire packets, no GSO
        # and the bytes it dropped: every datagram is 1000 B of payload, 1028 B of IP
        assert by_path[path].dropped_bytes == count.lost * 1028, path
        assert by_path[path].seen_bytes == count.sent * 1028, path
    # Binomial 4-sigma bound on the total: a correct impairment fails this with odds of
    # about 6e-5 per case (6 cases here: ~4e-4 for the whole test).
    n, k, p = result.sent, result.lost, loss_pct / 100
    assert abs(k / n - p) <= 4 * (p * (1 - p) / n) ** 0.5, (k, n)


def test_gilbert_elliott_on_bpf_matches_the_model_loss_and_burst_length(four_hosts):
    # p=1.11%, r=10%: bursts of 10 packets, counted in packets only (no time limit)
    apply(four_hosts, "burst-loss", ["loss_pct=10", "max_burst_ms=0"], "bpf")
    h1, h2 = four_hosts.hosts[:2]
    try:
        result = traffic.send_counted([(h2, h1)], per_path=200_000, batch=256)
        report = verify.verify(four_hosts)
    finally:
        engine.clear(four_hosts)
    assert report.rcvbuf_errors["h1"] == 0
    count = result.paths["h2->h1"]
    runs = count.loss_runs()
    measured_loss = count.lost / count.sent
    mean_burst = sum(runs) / len(runs)
    # Within 10% of the model's stationary values (0.10 and 10 packets). With 200,000
    # packets the loss estimate's sd is ~0.0028 (variance x17 for the chain's correlation),
    # so 10% is 3.6 sd; ~2,000 bursts give the mean burst an sd of ~0.21, 10% is 4.7 sd.
    # Odds of a false failure: about 3e-4.
    assert abs(measured_loss - 0.10) <= 0.010, measured_loss
    assert abs(mean_burst - 10) <= 1.0, mean_burst
    # The BPF map counted the same drops and the same bursts as the receiver saw.
    path = next(p for p in report.paths if p.path == "h2->h1")
    assert path.dropped_packets == count.lost
    assert path.bursts == len(runs)
    assert path.max_burst == max(runs)


def test_a_burst_time_limit_ends_bursts_on_a_quiet_path_only(four_hosts):
    """p=50%, r=1%: once Bad, a burst lasts ~100 packets (stationary loss 98%). One packet
    every 20 ms: with a 5 ms limit each packet finds any burst expired and arrives in Good
    (where nothing is lost); without a limit the chain keeps it Bad. Back-to-back packets
    end their bursts by the chain, not by the clock, so they still lose most."""
    h1, h2 = four_hosts.hosts[:2]
    model = "{model: gilbert_elliott, p_pct: 50, r_pct: 1, max_burst_ms: %g}"

    def send(limit_ms: float, quiet: bool):
        apply(four_hosts, "burst-loss", [f"impairment.loss={model % limit_ms}"], "bpf")
        try:
            if quiet:
                return traffic.send_counted([(h2, h1)], per_path=60, batch=1, pause_s=0.02)
            return traffic.send_counted([(h2, h1)], per_path=3000, batch=100)
        finally:
            engine.clear(four_hosts)

    quiet_limited, quiet_unlimited, busy_limited = send(5, True), send(0, True), send(5, False)
    assert quiet_limited.lost == 0
    assert quiet_unlimited.lost >= 40, quiet_unlimited.lost  # expected ~58 of 60
    assert busy_limited.lost / busy_limited.sent > 0.5, busy_limited.lost


def test_the_match_impairs_included_udp_ports_only(four_hosts):
    apply(four_hosts, "random-loss", [
        "loss_pct=30", "match.include=[{protocol: udp, ports: [5000-5100]}]"])
    h1, h2 = four_hosts.hosts[:2]
    try:
        included = traffic.send_counted([(h2, h1)], per_path=5000, port=5050)
        other_port = traffic.send_counted([(h2, h1)], per_path=5000, port=6000)
    finally:
        engine.clear(four_hosts)
    assert abs(included.lost / included.sent - 0.30) < 4 * (0.3 * 0.7 / 5000) ** 0.5
    assert other_port.lost == 0


def test_an_excluded_tcp_port_loses_nothing_while_everything_else_does(four_hosts):
    """30% loss on all traffic but the default exclusions (SSH, control, rendezvous): while a
    TCP transfer on the rendezvous port runs, the impairment point drops not one packet (its
    own kernel counters), while UDP beside it loses.

    The kernel's counters are the evidence, not TCP's retransmission count: on a loaded
    2-core machine a stall longer than the minimum RTO makes TCP retransmit spuriously (CI
    once saw 26 retransmitted segments of a transfer that lost nothing)."""
    from testbed import ports

    h1, h2 = four_hosts.hosts[:2]
    apply(four_hosts, "random-loss", ["loss_pct=30"])
    try:
        dropped_before = _dropped(verify.verify(four_hosts))
        received = _tcp_transfer(h2, h1, ports.RENDEZVOUS, 2 << 20)
        dropped_during_tcp = _dropped(verify.verify(four_hosts)) - dropped_before
        udp = traffic.send_counted([(h2, h1)], per_path=3000)
    finally:
        engine.clear(four_hosts)
    assert received == 2 << 20
    assert dropped_during_tcp == 0  # the only traffic then was the excluded transfer
    assert udp.lost > 0.2 * udp.sent


@pytest.mark.parametrize("backend", ["nft", "bpf"])
def test_what_the_exclusions_let_through_is_counted_apart(four_hosts, backend):
    """A TCP transfer on the rendezvous port (exempt by default) beside counted UDP: the
    backend's exempt counter holds the transfer's bytes, and coverage names them apart from
    what the match missed, on the host that received them."""
    from testbed import ports
    from testbed.impair import coverage

    h1, h2 = four_hosts.hosts[:2]
    apply(four_hosts, "random-loss", ["loss_pct=10"], backend)
    try:
        before = verify.read(four_hosts)
        received = _tcp_transfer(h2, h1, ports.RENDEZVOUS, 2 << 20)
        traffic.send_counted([(h2, h1)], per_path=2000)
        after = verify.read(four_hosts)
        got = verify.measure_coverage(four_hosts, after, before, min_coverage=0.01)
    finally:
        engine.clear(four_hosts)
    assert received == 2 << 20
    exempt_h1 = [e.since(b) for e, b in zip(after.exempt[0], before.exempt[0], strict=True)]
    assert [e.direction for e in exempt_h1] == ["ingress"]
    assert 2 << 20 <= exempt_h1[0].bytes < 1.1 * (2 << 20), exempt_h1
    assert got.hosts[0].exempt_bytes == pytest.approx(exempt_h1[0].bytes, rel=0.01)
    assert got.elsewhere()[f"{h1.ifname} on h1, {coverage.EXEMPT}"] >= 2 << 20
    # the UDP was matched and impaired: the exempt transfer is most of what was not
    assert got.fraction is not None and got.impaired_bytes > 0


def _dropped(report) -> int:
    return sum(path.dropped_packets for path in report.paths)


def _tcp_transfer(src, dst, port: int, size: int) -> int:
    server = dst.socket(kind=socket.SOCK_STREAM)
    server.bind((dst.address, port))
    server.listen(1)
    got = []

    def serve():
        conn, _ = server.accept()
        total = 0
        while chunk := conn.recv(1 << 16):
            total += len(chunk)
        got.append(total)
        conn.close()

    thread = threading.Thread(target=serve)
    thread.start()
    client = src.socket(kind=socket.SOCK_STREAM)
    client.settimeout(30)
    client.connect((dst.address, port))
    client.sendall(b"\0" * size)
    client.close()
    thread.join(30)
    server.close()
    return got[0]
