"""VM hosts: qemu VMs with Debian's kernel, so netem, IFB and Soft-RoCE run for real.
At most 2 VMs at a time (2 cores); no torch inside them (it takes ~1 min to import in TCG).
"""

from __future__ import annotations

import itertools
import math
import signal
import subprocess
import sys
import threading
import time

import pytest

from testbed import profiles
from testbed.clusters import netns as netns_cluster
from testbed.clusters import state
from testbed.host.hosts import processes_in_namespaces
from testbed.impair import engine, traffic, verify
from tests.helpers import (
    NOTHING,
    REPO,
    leftovers,
    lossbed,
    send_between_vms,
    unique_name,
)

pytestmark = [pytest.mark.netns, pytest.mark.vm, pytest.mark.slow]

DATAGRAMS = 20_000


@pytest.fixture(scope="module")
def vms(vm_pair):
    return vm_pair  # (conftest.py: one pair for every VM module)


def apply(cluster, profile, sets=()):
    the_plan, choice = engine.make_plan(cluster, profiles.load(profile, list(sets)))
    engine.apply(cluster, the_plan, choice)
    return choice


# First, while no other VM of this module runs (2 cores: VMs running side by side slow
# each other down).
def test_vm_hosts_go_down_clean_after_the_controller_is_killed_in_up():
    name = unique_name()
    child = subprocess.Popen([sys.executable, "-m", "testbed.cli", "up", "--kind", "vm",
                              "--hosts", "2", "--name", name], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    # kill it once the first qemu is running, before the guests are ready
    while time.monotonic() < deadline and not (state.cluster_dir(name) / "h1.pid").exists():
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    qemu_pids = [p for pids in processes_in_namespaces(
        netns_cluster.cluster_namespaces(name)).values() for p in pids]
    assert qemu_pids, "the test meant to kill the controller while a VM was running"
    assert lossbed("down", name).returncode == 0
    assert leftovers(name) == NOTHING
    from testbed.host.hosts import is_running
    assert not any(is_running(p) for p in qemu_pids)
    assert not list(itertools.chain(state.state_root().glob(f"{name}*")))


def test_two_vms_come_up_with_their_own_kernel_and_exec_passes_output_and_codes(vms):
    status = vms.status()
    from testbed.clusters.vm import kernel

    # the distribution's kernel image, whatever this machine itself runs
    assert status["kernel"] == kernel.find_kernel().version
    assert vms.accel in ("kvm", "tcg")
    for h in status["hosts"]:
        assert h["kernel"] == vms.kernel and h["mtu"] == vms.mtu and h["state"] == "UP"
        assert f"{h['address']}/24" in h["kernel_addresses"]
        assert not any(h["offloads"].values()), h["offloads"]
    result = lossbed("exec", "--cluster", vms.name, "h2", "--", "sh", "-c",
                     "grep -w sch_netem /proc/modules | cut -d' ' -f1; echo err >&2; exit 5")
    assert result.returncode == 5
    assert result.stdout.split() == ["sch_netem"] and result.stderr.strip() == "err"
    h1, h2 = vms.hosts
    ping = h2.run(["ping", "-c", "1", "-W", "5", "h1"], timeout=30)
    assert ping.returncode == 0, ping.stdout


# Random loss on VM hosts, checked packet for packet against netem's own counters, runs
# over SSH in test_vm_over_ssh.py.


def test_a_process_started_in_a_vm_streams_its_lines_and_its_group_can_be_killed(vms):
    """What launching ranks on VM hosts rests on (testbed/clusters/vm/process.py): a process started
    through the exec channel gives its output line by line while it runs, and its exit
    code; a killed one takes its children with it, and the channel stays free meanwhile."""
    h1 = vms.hosts[0]
    proc = h1.popen(["sh", "-c", "echo one; echo two >&2; sleep 1; echo three; exit 3"])
    lines = iter(proc.stdout)
    assert next(lines) == "one\n"
    assert proc.poll() is None  # still sleeping: the first line came while it ran
    assert list(lines) == ["three\n"] and list(proc.stderr) == ["two\n"]
    assert proc.wait(60) == 3

    proc = h1.popen(["sh", "-c", "sleep 600 & sleep 600; echo never"])
    time.sleep(1)
    assert h1.run(["pgrep", "-c", "-x", "sleep"]).stdout.strip() == b"2"  # channel is free
    proc.kill_group()
    assert proc.wait(30) == -signal.SIGKILL and list(proc.stdout) == []
    assert h1.run(["pgrep", "-x", "sleep"]).returncode == 1  # nothing left behind


def test_netem_gilbert_elliott_between_vms_matches_loss_and_burst_length(vms):
    # 10% loss in bursts of 3: ~1,300 bursts in 40,000 packets. The mean burst's sd is
    # ~0.067 (10% = 4.5 sd); the loss's sd, inflated x4.4 for the chain's correlation, is
    # ~0.0031 (4 sd = 0.0126). Odds of a false failure: about 1e-4.
    apply(vms, "burst-loss", ["loss_pct=10", "mean_burst_packets=3", "max_burst_ms=0"])
    try:
        got = send_between_vms(vms, 2 * DATAGRAMS, rate_pps=5000)
    finally:
        engine.clear(vms)
    loss = got["lost"] / got["sent"]
    inflation = (1 + (1 - 0.037 - 1 / 3)) / (1 - (1 - 0.037 - 1 / 3))
    assert abs(loss - 0.10) <= 4 * math.sqrt(0.09 * inflation / got["sent"]), got
    assert abs(got["mean_burst"] - 3) <= 0.3, got


def test_netem_four_state_loss_between_vms(vms):
    model = profiles.load("four-state").impairment.loss
    apply(vms, "four-state")
    try:
        got = send_between_vms(vms, DATAGRAMS)
    finally:
        engine.clear(vms)
    # The chain's correlation is mild (bursts ~1.4): allow 5 binomial sd (3 sd inflated).
    p, n = model.stationary_loss(), got["sent"]
    assert abs(got["lost"] / n - p) <= 5 * math.sqrt(p * (1 - p) / n), (got, p)
    assert abs(got["mean_burst"] - model.mean_burst_length()) <= 0.15 * model.mean_burst_length()


def test_egress_delay_and_rate_are_real_on_vms(vms):
    """Delay with jitter at the sender's egress, then a rate limit: both measured."""
    h1, h2 = vms.hosts
    apply(vms, "clean", ["delay_ms=40", "jitter_ms=5", "direction=egress"])
    try:
        ping = h2.run(["ping", "-c", "5", "-i", "0.3", "-q", h1.address], timeout=60)
    finally:
        engine.clear(vms)
    avg_ms = float(ping.stdout.decode().split("=")[-1].split("/")[1])
    # 40 ms each way (both hosts' egress), jitter 5 ms: the round trip is ~80 ms.
    assert 65 <= avg_ms <= 110, ping.stdout


RATE_SCRIPT = r"""
import socket, sys, time
role, addr = sys.argv[1], sys.argv[2]
port = int(sys.argv[3]) if len(sys.argv) > 3 else 6000
if role == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(1); c, _ = s.accept()
    got, first = 0, None
    while True:
        b = c.recv(65536)
        if not b:
            break
        first = first or time.monotonic()
        got += len(b)
    print(got * 8 / (time.monotonic() - first) / 1e6)
else:
    s = socket.create_connection((addr, port)); s.sendall(b"x" * 3_000_000); s.close()
"""


def test_netem_rate_limits_throughput_on_vms(vms):
    """rate_mbit=10 at the sender's egress: a TCP transfer runs at about 10 Mbit/s."""
    h1, h2 = vms.hosts
    apply(vms, "clean", ["rate_mbit=10", "direction=egress"])
    out = {}
    try:
        thread = threading.Thread(target=lambda: out.setdefault("r", h1.run(
            ["python3", "-c", RATE_SCRIPT, "recv", h1.address], timeout=120)))
        thread.start()
        time.sleep(3)
        sent = h2.run(["python3", "-c", RATE_SCRIPT, "send", h1.address], timeout=120)
        thread.join()
    finally:
        engine.clear(vms)
    assert sent.returncode == 0, sent.stderr
    mbit = float(out["r"].stdout.decode().strip())
    # TCP over a 10 Mbit/s netem rate: a little under 10 (headers, slow start)
    assert 6.0 <= mbit <= 10.5, mbit


def test_netem_counts_what_the_exclusions_let_through_in_a_class_of_its_own(vms):
    """3 MB over TCP on the rendezvous port (exempt by default) under netem's 10% loss: the
    exempt HTB class on the receiver's IFB counted them, and coverage names them apart."""
    from testbed import ports
    from testbed.impair import coverage, verify

    h1, h2 = vms.hosts
    apply(vms, "random-loss", ["loss_pct=10"])
    out = {}
    try:
        before = verify.read(vms)
        thread = threading.Thread(target=lambda: out.setdefault("r", h1.run(
            ["python3", "-c", RATE_SCRIPT, "recv", h1.address, str(ports.RENDEZVOUS)],
            timeout=120)))
        thread.start()
        time.sleep(3)
        sent = h2.run(["python3", "-c", RATE_SCRIPT, "send", h1.address,
                       str(ports.RENDEZVOUS)], timeout=120)
        thread.join()
        after = verify.read(vms)
        got = verify.measure_coverage(vms, after, before, min_coverage=0.01)
    finally:
        engine.clear(vms)
    assert sent.returncode == 0 and out["r"].returncode == 0, (sent.stderr, out["r"].stderr)
    exempt = [e.since(b) for e, b in zip(after.exempt[0], before.exempt[0], strict=True)]
    assert [e.direction for e in exempt] == ["ingress"]
    assert 3_000_000 <= exempt[0].bytes < 3_300_000, exempt
    assert got.elsewhere()[f"{h1.ifname} on h1, {coverage.EXEMPT}"] >= 3_000_000


def test_same_random_profile_gives_the_same_loss_on_namespaces_and_on_vms(vms, make_cluster):
    """nft/bpf on this kernel and netem on Debian's: one loss, within the statistical bound."""
    apply(vms, "random-loss", ["loss_pct=10"])
    try:
        vm = send_between_vms(vms, DATAGRAMS)
        path = next(p for p in verify.verify(vms).paths if p.path == "h2->h1")
    finally:
        engine.clear(vms)
    # netem counts its drops in packets; the bytes it dropped, from its filters' counters,
    # are those packets' bytes (each datagram: 1000 B of payload, 1028 B of IP)
    assert path.dropped_packets > 0 and path.dropped_bytes == 1028 * path.dropped_packets, (
        path, vm)
    # (the bytes it saw: every datagram sent, as verify counts the packets it saw)
    assert path.seen_bytes == 1028 * path.seen_packets, (path, vm)
    local = make_cluster(hosts=2)
    apply(local, "random-loss", ["loss_pct=10"])
    try:
        ns = traffic.send_counted([(local.hosts[1], local.hosts[0])], per_path=DATAGRAMS)
    finally:
        engine.clear(local)
    # the namespaces' backend is whatever this machine's kernel has (bpf or nft where it
    # lacks sch_netem, as here; netem elsewhere): the comparison holds for any of them
    p1, n1 = vm["lost"] / vm["sent"], vm["sent"]
    p2, n2 = ns.lost / ns.sent, ns.sent
    pooled = (vm["lost"] + ns.lost) / (n1 + n2)
    # two-sample test at 4 sd: a false failure has odds ~6e-5
    assert abs(p1 - p2) <= 4 * math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2)), (p1, p2)
