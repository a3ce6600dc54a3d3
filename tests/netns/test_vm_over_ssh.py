"""A real cluster's workflow over real SSH against VM hosts: their own Debian kernel (so
`modprobe sch_netem` really loads and the impairment is real netem) over a throwaway overlay
of this machine's root (so nothing written there reaches this machine). Ansible and lossbed
run from the cluster's controller namespace, as from a real cluster's head node. The guests
run no torch (it takes a minute to import under TCG): training over SSH is covered on
namespace hosts (test_remote_cluster.py)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time

import pytest

from tests.helpers import (
    REPO,
    lossbed,
    send_between_vms,
    with_repo_on_path,
)

pytestmark = [pytest.mark.netns, pytest.mark.vm, pytest.mark.slow]

ANSIBLE = REPO / "ansible"
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)"
                   r"\s+skipped=(\d+)", re.M)


@pytest.fixture(scope="module")
def vms(vm_pair):
    return vm_pair  # (conftest.py: one pair for every VM module, sshd on)


@pytest.fixture(scope="module")
def inventory(vms, tmp_path_factory):
    result = lossbed("inventory", "--cluster", vms.name)
    assert result.returncode == 0, result.stderr
    path = tmp_path_factory.mktemp("ansible") / "inventory.yml"
    path.write_text(result.stdout)
    return path


def playbook(vms, inventory, name: str, *extra: str) -> tuple[dict, str]:
    """Run a playbook from the controller namespace; the recap per host and the whole log."""
    result = subprocess.run(
        ["ip", "netns", "exec", f"lossbed-{vms.name}-ctl", str(REPO / ".venv/bin/ansible-playbook"),
         "-i", str(inventory), name, *extra,
         # a VM has one NIC, which carries SSH too: the runs here force it (--force-interface)
         "--extra-vars", "lossbed_verify_force_interface=true",
         # torch imports in 53 s in a TCG guest: the doctor's interpreter checks (tested on
         # namespace hosts, tests/netns/test_doctor.py) are left out of the verify step here
         "--extra-vars", "lossbed_verify_interpreter=false"],
        capture_output=True, text=True, timeout=900, cwd=ANSIBLE, stdin=subprocess.DEVNULL,
        env={**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_LOCAL_TEMP": str(inventory.parent / "tmp")})
    log = result.stdout + result.stderr
    recap = {m[0]: dict(zip(("ok", "changed", "unreachable", "failed", "skipped"),
                            map(int, m[1:]), strict=True)) for m in RECAP.findall(log)}
    assert result.returncode == 0, log[-6000:]
    assert set(recap) == {"h1", "h2"}, log[-3000:]
    for host, counts in recap.items():
        assert counts["unreachable"] == 0 and counts["failed"] == 0, (host, log[-3000:])
    return recap, log


def guest(vms, host: str, *argv: str) -> str:
    result = vms.host(host).run(list(argv), timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.decode() if isinstance(result.stdout, bytes) else result.stdout


def test_sshd_in_a_vm_listens_on_its_address_and_accepts_the_cluster_key(vms):
    h1, h2 = vms.hosts
    status = vms.status()
    assert all(h["sshd_pid"] for h in status["hosts"])
    listening = h1.run(["ss", "-Htln", "sport = :22"]).stdout.decode().split()
    assert f"{h1.address}:22" in listening and "0.0.0.0:22" not in listening
    key = open(status["ssh"]["key"]).read().encode()
    login = h2.run(["sh", "-c", "cat > /tmp/k && chmod 600 /tmp/k && ssh -i /tmp/k "
                    "-o StrictHostKeyChecking=no -o BatchMode=yes root@h1 hostname"],
                   input=key, timeout=120)
    assert login.returncode == 0, login.stderr
    assert login.stdout.decode().strip() == "h1"


def modules(vms, host: str) -> str:
    return guest(vms, host, "cat", "/proc/modules")


def test_provision_converges_over_ssh_then_changes_nothing(vms, inventory):
    """--check on unprovisioned hosts predicts changes and makes none (the kernel role, the
    one that changes kernel state, to keep CI short); the real run converges, the verify step
    passes and the RDMA role's vendor-tool steps say why they are skipped; a second real run
    changes nothing."""
    # Start each guest unprovisioned: its boot loaded the netem modules (rmmod them), and
    # its kernel's socket-buffer limits are the small defaults.
    for h in vms.hosts:
        guest(vms, h.name, "rmmod", "sch_netem", "ifb")
        assert "sch_netem" not in modules(vms, h.name)
    guest_rmem = guest(vms, "h1", "cat", "/proc/sys/net/core/rmem_max")
    assert int(guest_rmem) < 67108864
    host_rmem = open("/proc/sys/net/core/rmem_max").read()
    rdma = ("--extra-vars", "lossbed_rdma_enabled=true")

    checked, _ = playbook(vms, inventory, "provision.yml", "--check", "--tags", "lossbed_kernel")
    for host, counts in checked.items():
        assert counts["changed"] >= 1, (host, counts)  # the boot files would be written
    for h in vms.hosts:  # ... and nothing was
        assert "sch_netem" not in modules(vms, h.name)
        assert guest(vms, h.name, "cat", "/proc/sys/net/core/rmem_max") == guest_rmem
        assert "lossbed.conf" not in guest(vms, h.name, "ls", "/etc/modules-load.d")

    first, log = playbook(vms, inventory, "provision.yml", *rdma)
    for host, counts in first.items():
        assert counts["changed"] >= 3, (host, counts)  # modules, boot files, sysctls
    for h in vms.hosts:
        assert f"{h.name}: modules, socket buffers and MTU as provisioned" in log
        loaded = modules(vms, h.name)
        assert re.search(r"(?m)^sch_netem ", loaded) and re.search(r"(?m)^ifb ", loaded)
        assert int(guest(vms, h.name, "cat", "/proc/sys/net/core/rmem_max")) == 67108864
        assert guest(vms, h.name, "cat", "/etc/modules-load.d/lossbed.conf").splitlines() == [
            "sch_netem", "ifb", "act_mirred", "act_gact", "cls_u32", "sch_htb"]
        assert guest(vms, h.name, "cat", "/etc/sysctl.d/90-lossbed.conf") == (
            "net.core.rmem_max = 67108864\nnet.core.wmem_max = 67108864\n")
        # what needs vendor tools or hardware is skipped with the reason, not faked
        assert f"mlnx_qos is not installed on {h.name}: PFC settings skipped" in log
        assert f"eth0 on {h.name} exposes no RoCE ECN switches: ECN settings skipped" in log
    # the guests' writes stayed in their memory overlays
    assert not os.path.exists("/etc/modules-load.d/lossbed.conf")
    assert open("/proc/sys/net/core/rmem_max").read() == host_rmem

    second, log = playbook(vms, inventory, "provision.yml", *rdma)
    assert {h: c["changed"] for h, c in second.items()} == {"h1": 0, "h2": 0}, log[-3000:]
    assert "h1: modules, socket buffers and MTU as provisioned" in log


def controller(vms, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """lossbed run from the controller namespace, as on a real cluster's head node."""
    return subprocess.run(
        ["ip", "netns", "exec", f"lossbed-{vms.name}-ctl", sys.executable, "-m", "harness.cli",
         *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
        env={**os.environ, "PYTHONPATH": with_repo_on_path()})


def netem_hosts(vms) -> set[str]:
    """The guests whose kernel has a netem qdisc on any device now."""
    return {h.name for h in vms.hosts if "netem" in guest(vms, h.name, "tc", "qdisc", "show")}


def test_lossbed_over_ssh_applies_real_netem_verifies_it_and_its_lease_reverts_it(vms,
                                                                                   inventory):
    """apply (a 120 s lease), traffic, verify, then no controller at all: each guest's
    watchdog removes the netem qdiscs by itself once the lease is older than its length.
    The lease must outlast the traffic and the verify, over SSH into TCG guests (up to 80 s
    in a full suite). Then, rather than wait out the rest, the last renewal is dated back
    to LEFT_S before the lease's end (the lease file's time is all a watchdog reads; the
    lease's full wait is tested on namespace hosts, test_remote_cluster.py), and the
    guests must revert within LEFT_S plus a margin (10 s under TCG). A VM host has one
    NIC, so SSH arrives on the data-plane interface: lossbed refuses it unless
    --force-interface is given (the refusal itself is tested on namespace hosts); SSH's
    port stays unimpaired by default, so the session survives."""
    lease_s = 120
    applied = controller(vms, "apply", "random-loss", "--set", "loss_pct=10", "--inventory",
                         str(inventory), "--force-interface", "--lease-s", str(lease_s))
    applied_at = time.monotonic()
    assert applied.returncode == 0, applied.stderr
    assert "netem" in applied.stdout + applied.stderr  # the backend each host chose
    assert netem_hosts(vms) == {"h1", "h2"}
    got = send_between_vms(vms, 5000)
    ifb = guest(vms, "h1", "tc", "-s", "qdisc", "show", "dev", "ifb-eth0")
    verified = controller(vms, "verify", "--inventory", str(inventory), "--json")
    used_s = time.monotonic() - applied_at
    print(f"traffic and verify done {used_s:.1f} s into the lease")
    assert used_s < lease_s, "the test outran its lease"
    assert verified.returncode == 0, verified.stderr
    p, n = 0.10, got["sent"]
    assert abs(got["lost"] / n - p) <= 4 * math.sqrt(p * (1 - p) / n), got  # 4 sigma
    path = next(x for x in json.loads(verified.stdout)["paths"] if x["path"] == "h2->h1")
    assert path["seen_packets"] == n and path["dropped_packets"] == got["lost"]
    # the loss happened in netem on h1's IFB device (ingress), in netem's own counters
    assert "qdisc netem" in ifb and f"dropped {got['lost']}" in ifb

    assert netem_hosts(vms) == {"h1", "h2"}, "reverted before its lease ran out"
    left_s = 5
    for h in vms.hosts:
        guest(vms, h.name, "sh", "-c", f"touch -d @$(( $(date +%s) - {lease_s - left_s} )) "
              "/run/lossbed-leases/*.lease")
    dated_at = time.monotonic()
    while netem_hosts(vms) and time.monotonic() - dated_at < left_s + 10:
        time.sleep(0.5)
    reverted_after_s = time.monotonic() - dated_at
    assert netem_hosts(vms) == set(), f"still impaired {reverted_after_s:.1f} s after the " \
        f"lease had {left_s} s left"
    assert not guest(vms, "h1", "sh", "-c", "ls /run/lossbed-leases/ 2>/dev/null").strip()
    print(f"lease {lease_s} s with {left_s} s left: reverted {reverted_after_s:.1f} s later")
