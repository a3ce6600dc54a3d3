"""The local namespace cluster, built for real on this machine's kernel."""

from __future__ import annotations

import itertools
import json

import pytest

from tests.helpers import NOTHING, leftovers, lossbed, unique_name

pytestmark = pytest.mark.netns

def test_every_host_reaches_every_other_by_icmp_and_name(make_cluster):
    cluster = make_cluster(hosts=4)
    for src, dst in itertools.permutations(cluster.hosts, 2):
        # By name: each host's /etc/hosts (bound by `ip netns exec`) lists the others.
        result = src.run(["ping", "-c", "1", "-W", "2", dst.name])
        assert result.returncode == 0, (src.name, dst.name, result.stderr)
        assert dst.address.encode() in result.stdout


def test_every_host_reaches_every_other_by_udp(make_cluster):
    cluster = make_cluster(hosts=3)
    receivers = {}
    for h in cluster.hosts:
        sock = h.socket()
        sock.bind((h.address, 0))
        sock.settimeout(2)
        receivers[h.name] = sock
    for src, dst in itertools.permutations(cluster.hosts, 2):
        tx = src.socket()
        payload = f"{src.name}->{dst.name}".encode()
        tx.sendto(payload, receivers[dst.name].getsockname())
        data, (addr, _) = receivers[dst.name].recvfrom(100)
        tx.close()
        assert data == payload
        assert addr == src.address  # it came over the link, from the sender's address
    for sock in receivers.values():
        sock.close()


@pytest.mark.parametrize("mtu", [1500, 9000])
def test_df_ping_fits_exactly_the_mtu(make_cluster, mtu):
    cluster = make_cluster(hosts=2, mtu=mtu)
    a, b = cluster.hosts
    # ICMP payload + 8 B ICMP header + 20 B IPv4 header = MTU exactly.
    fits = a.run(["ping", "-c", "1", "-W", "2", "-M", "do", "-s", str(mtu - 28), b.address])
    assert fits.returncode == 0, fits.stdout + fits.stderr
    too_big = a.run(["ping", "-c", "1", "-W", "2", "-M", "do", "-s", str(mtu - 27), b.address])
    assert too_big.returncode != 0
    assert b"message too long" in too_big.stderr + too_big.stdout


def test_offloads_read_back_off_on_both_ends_and_status_reports_them(make_cluster):
    cluster = make_cluster(hosts=2)
    status = cluster.status()
    for h in status["hosts"]:
        for end in (h["offloads"], h["switch_port"]["offloads"]):
            assert "tx-tcp-segmentation" in end and "tx-generic-segmentation" in end
            assert "rx-gro" in end
            assert not any(end.values()), end
        assert h["mtu"] == 1500 and h["state"] == "UP"
        assert f"{h['address']}/24" in h["kernel_addresses"]
    # And by the system's own tool, independent of lossbed's reading code:
    out = cluster.hosts[0].run(["ethtool", "-k", "eth0"], check=True).stdout.decode()
    for line in ("tcp-segmentation-offload: off", "generic-segmentation-offload: off",
                 "generic-receive-offload: off"):
        assert line in out


def test_cli_up_status_exec_down_round_trip():
    name = unique_name()
    try:
        up = lossbed("up", "--hosts", "2", "--name", name, "--mtu", "9000")
        assert up.returncode == 0, up.stderr
        status = json.loads(lossbed("status", name, "--json", check=True).stdout)
        assert [h["name"] for h in status["hosts"]] == ["h1", "h2"]
        assert {h["mtu"] for h in status["hosts"]} == {9000}
        # exec passes output and the exit code through
        out = lossbed("exec", "--cluster", name, "h2", "--", "sh", "-c", "hostname -I; exit 7")
        assert out.returncode == 7
        assert out.stdout.split() == [status["hosts"][1]["address"]]
        bad_host = lossbed("exec", "--cluster", name, "h9", "--", "true")
        assert bad_host.returncode == 2 and "no host 'h9'" in bad_host.stderr
        again = lossbed("up", "--hosts", "1", "--name", name)
        assert again.returncode != 0 and "already up" in again.stderr
        assert len(json.loads(lossbed("status", name, "--json").stdout)["hosts"]) == 2
    finally:
        down = lossbed("down", name)
    assert down.returncode == 0, down.stderr
    assert leftovers(name) == NOTHING


def test_two_clusters_coexist_with_their_own_subnets(make_cluster):
    a = make_cluster(hosts=2)
    b = make_cluster(hosts=2)
    assert not a.subnet.overlaps(b.subnet)
    # Same host names, same interface names, separate namespaces: each works on its own.
    for cluster in (a, b):
        h1, h2 = cluster.hosts
        assert h1.run(["ping", "-c", "1", "-W", "2", h2.address]).returncode == 0
    # A host of one cluster cannot reach the other cluster: separate switches.
    assert a.hosts[0].run(["ping", "-c", "1", "-W", "1", b.hosts[1].address]).returncode != 0


def test_sshd_per_host_listens_only_on_the_host_addresses(make_cluster):
    cluster = make_cluster(hosts=2, ssh=True)
    status = cluster.status()
    assert all(h["sshd_pid"] for h in status["hosts"])
    key, known = status["ssh"]["key"], status["ssh"]["known_hosts"]
    h1, h2 = cluster.hosts
    result = h1.run([
        "ssh", "-i", key, "-o", f"UserKnownHostsFile={known}", "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes", f"root@{h2.name}", "hostname -I",
    ], timeout=30)
    assert result.returncode == 0, result.stderr
    # the host has its cluster address and its management address, nothing else
    assert sorted(result.stdout.decode().split()) == sorted([h2.address, h2.mgmt_address])
    listening = [line.split()[3] for line in
                 h2.run(["ss", "-Htln", "sport = :22"], check=True).stdout.decode().splitlines()]
    assert sorted(listening) == sorted([f"{h2.address}:22", f"{h2.mgmt_address}:22"])
