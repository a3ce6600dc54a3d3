"""Real-cluster mode against real SSH: a local cluster started with --ssh has a management
network and sshd per host; an inventory of it drives apply, verify, clear and training (by
the nightly workflow's bench step) from the controller namespace, exactly as from a real
cluster's head node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from testbed import clusters
from testbed.clusters import netns as netns_cluster
from testbed.host.hosts import is_running, processes_in_namespaces
from testbed.impair import traffic
from tests import prometheus_server
from tests.helpers import REPO, lossbed, unique_name, with_repo_on_path

pytestmark = [pytest.mark.netns, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    c = netns_cluster.up(netns_cluster.ClusterSpec(hosts=3, name=unique_name(), ssh=True))
    yield c
    clusters.down(c.name)


@pytest.fixture
def inventory(cluster, tmp_path):
    result = lossbed("inventory", "--cluster", cluster.name)
    assert result.returncode == 0, result.stderr
    path = tmp_path / "inventory.yml"
    path.write_text(result.stdout)
    return path


def controller_argv(cluster, *args) -> list[str]:
    return ["ip", "netns", "exec", f"lossbed-{cluster.name}-ctl", sys.executable, "-m",
            "harness.cli", *args]


def controller(cluster, *args, timeout=300) -> subprocess.CompletedProcess:
    """lossbed run from the cluster's management network, where SSH reaches the hosts."""
    return subprocess.run(controller_argv(cluster, *args), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": with_repo_on_path()})


def impaired(cluster) -> dict[str, str]:
    out = {}
    for h in cluster.hosts:
        text = h.run(["tc", "filter", "show", "dev", "eth0", "ingress"]).stdout.decode()
        tables = h.run(["nft", "list", "tables"]).stdout.decode()
        if "lossbed" in text or "lossbed" in tables:
            out[h.name] = text + tables
    return out


def test_apply_verify_clear_over_ssh(cluster, inventory):
    dry = controller(cluster, "apply", "random-loss", "--set", "loss_pct=10", "--inventory",
                     str(inventory), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "h1 (eth0" in dry.stdout and "h3->h2" in dry.stdout
    assert impaired(cluster) == {}
    applied = controller(cluster, "apply", "random-loss", "--set", "loss_pct=10",
                         "--inventory", str(inventory))
    assert applied.returncode == 0, applied.stderr
    assert set(impaired(cluster)) == {"h1", "h2", "h3"}
    # status of real hosts (the README's `lossbed status --inventory`): each host's
    # interface, what it carries, and no watchdog's failed clear
    status = controller(cluster, "status", "--inventory", str(inventory), "--json")
    assert status.returncode == 0, status.stderr
    hosts = {h["name"]: h for h in json.loads(status.stdout)["hosts"]}
    assert set(hosts) == {"h1", "h2", "h3"}
    assert all(h["lease_failure"] is None and h["interface"] == "eth0" for h in hosts.values())
    h1, h2, _ = cluster.hosts
    counted = traffic.send_counted([(h2, h1)], per_path=5000)
    report = json.loads(controller(cluster, "verify", "--inventory", str(inventory),
                                   "--json").stdout)
    path = next(p for p in report["paths"] if p["path"] == "h2->h1")
    assert path["seen_packets"] == 5000 and path["dropped_packets"] == counted.lost
    assert 0.05 < counted.lost / 5000 < 0.15
    cleared = controller(cluster, "clear", "--inventory", str(inventory))
    assert cleared.returncode == 0, cleared.stderr
    assert impaired(cluster) == {}


def test_lease_reverts_every_host_after_the_controller_is_killed(cluster, inventory):
    """A training run renews a 6 s lease; SIGKILL the controller mid-run: within the lease
    plus 3 s (the watchdog's poll and the clear) no host is impaired any more, and the
    ranks are gone (their SSH channels closed, the guard stopped them), and the killed
    controller left no folder of its own in the temporary folder (these ranks write
    nothing on its machine)."""
    temporary = set(Path(tempfile.gettempdir()).glob("lossbed-train-*"))
    child = subprocess.Popen(
        controller_argv(cluster, "train", "--inventory", str(inventory), "--variant",
                        "unbiased", "--profile", "random-loss", "--set", "loss_pct=5",
                        "--steps", "5000", "--batch", "4", "--seq-len", "32", "--lease-s",
                        "6"), cwd=REPO, env={**os.environ, "PYTHONPATH": with_repo_on_path()},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in child.stderr:
        if "step 11/" in line:
            break
    assert set(impaired(cluster)) == {"h1", "h2", "h3"}
    child.kill()  # SIGKILL: no clean-up of its own
    child.wait()
    killed_at = time.monotonic()
    while impaired(cluster) and time.monotonic() - killed_at < 9:
        time.sleep(0.2)
    assert impaired(cluster) == {}, "the lease should have expired"
    reverted_s = time.monotonic() - killed_at
    assert reverted_s < 9
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = processes_in_namespaces([h.namespace for h in cluster.hosts])
        ranks = [p for pids in left.values() for p in pids if is_running(p)
                 and "train.worker" in open(f"/proc/{p}/cmdline").read()]
        if not ranks:
            break
        time.sleep(0.5)
    assert ranks == []
    assert set(Path(tempfile.gettempdir()).glob("lossbed-train-*")) == temporary


def test_refuses_the_interface_carrying_ssh_unless_forced(cluster, inventory, tmp_path):
    bad = tmp_path / "mgmt.yml"
    bad.write_text(inventory.read_text().replace("lossbed_interface: eth0",
                                                 "lossbed_interface: mgmt0"))
    refused = controller(cluster, "apply", "random-loss", "--inventory", str(bad))
    assert refused.returncode != 0
    assert "refusing to impair mgmt0" in refused.stderr and "SSH session" in refused.stderr
    assert "--force-interface" in refused.stderr
    assert impaired(cluster) == {}
    mgmt = [h.run(["tc", "qdisc", "show", "dev", "mgmt0"]).stdout.decode()
            for h in cluster.hosts]
    assert not any("clsact" in m for m in mgmt)  # nothing half-applied anywhere
    # --force-interface then applies it: shown on VM hosts, whose one NIC carries SSH
    # (test_vm_over_ssh.py)


@pytest.mark.parametrize("breakage,words", [
    ("address", ["host h3", "not reachable over SSH"]),
    ("key", ["not reachable over SSH", "Authentication"]),
])
def test_unreachable_host_or_rejected_key_applies_nothing_anywhere(cluster, inventory,
                                                                   tmp_path, breakage, words):
    text = inventory.read_text()
    if breakage == "address":
        h3 = cluster.hosts[2].mgmt_address
        text = text.replace(f"ansible_host: {h3}", "ansible_host: "
                            + h3.rsplit(".", 1)[0] + ".200")
    else:
        wrong = tmp_path / "wrong_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)],
                       check=True)
        text = text.replace("ansible_ssh_private_key_file: ",
                            f"ansible_ssh_private_key_file: {wrong}\n    unused_key: ")
        text = "\n".join(line for line in text.splitlines() if "unused_key" not in line)
    broken = tmp_path / "broken.yml"
    broken.write_text(text)
    result = controller(cluster, "apply", "random-loss", "--inventory", str(broken),
                        timeout=120)
    assert result.returncode != 0
    for word in words:
        assert word in result.stderr, (word, result.stderr[-2000:])
    assert impaired(cluster) == {}


@pytest.mark.skipif(prometheus_server.pushgateway_available() is not None,
                    reason=str(prometheus_server.pushgateway_available()))
def test_the_nightly_workflow_commands_run_with_a_tiny_matrix(cluster, inventory, tmp_path):
    """The nightly workflow's bench step (random loss; the burst step is the same command),
    its compare step and its clear step, each its own script, run from the controller
    namespace against this cluster's inventory with the matrix shrunk to fit CI (2 steps, 1
    seed, one variant at 10% besides the lossless reference). `make setup`/`make provision`
    are not run here: provisioning would change this machine's own kernel settings
    (namespace hosts share it); it runs against VM hosts in test_vm_over_ssh.py."""
    import yaml

    workflow = yaml.safe_load((REPO / ".github/workflows/nightly.yml").read_text())
    steps = {s["name"]: s.get("run", "") for s in workflow["jobs"]["bench"]["steps"]}
    tiny = {"--loss 0 0.01 0.05 0.1": "--loss 0.1", "--loss 0.01 0.05 0.1": "--loss 0.1",
            "--seeds 3": "--seeds 1 --variants unbiased"}
    assert "--device cuda" in workflow["jobs"]["bench"]["env"]["MODEL"]  # the GPU hosts'
    assert "--device cuda" in workflow["jobs"]["bench"]["env"]["DOCTOR"]
    env = {**os.environ, "INVENTORY": str(inventory), "BASELINE": str(tmp_path / "baseline"),
           "LOSSBED_VENV": str(REPO / ".venv"), "STEPS": "2",
           "MODEL": "--preset tiny --device cpu --speed-steps 2 --realisations 1 --no-stability",
           "DOCTOR": "--device cpu --profile burst-loss"}

    def step(script: str) -> subprocess.CompletedProcess:
        for big, small in tiny.items():
            script = script.replace(big, small)
        return subprocess.run(["ip", "netns", "exec", f"lossbed-{cluster.name}-ctl", "bash",
                               "-eo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)

    checked = step(steps["Check every host can run the bench (lossbed doctor)"])
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-2000:]
    assert "everything this run needs is there" in checked.stdout
    # The burst step is the random step's command with its profile and rates: one launch
    # of it here stands for both (the burst profile itself is the VM and netns tests'); its
    # summary is the random bench's, for the steps that read both
    random_step = steps["Bench under random loss (0, 1%, 5%, 10%)"]
    burst_step = steps["Bench under burst loss (1%, 5%, 10%)"]
    assert burst_step == random_step.replace("random-loss", "burst-loss").replace(
        "--loss 0 0.01", "--loss 0.01")
    # the bench pushes its verdicts where the cluster has a Pushgateway (the workflow's
    # $PUSH): a real one here, in the controller's namespace, where the step runs
    with prometheus_server.pushgateway(tmp_path / "pushgateway",
                                       f"lossbed-{cluster.name}-ctl") as (gateway, held):
        env["PUSH"] = f"--metrics-push {gateway}"
        bench = step(random_step)
        assert bench.returncode == 0, bench.stderr[-3000:]
        pushed = held()
    summary = tmp_path / "results" / "random-loss" / "summary.json"
    (tmp_path / "results" / "burst-loss").mkdir()
    (tmp_path / "results" / "burst-loss" / "summary.json").write_text(summary.read_text())
    rows = {"random-loss": json.loads(summary.read_text())["rows"]}
    pairs = {(r["variant"], r["loss"]) for r in rows["random-loss"]}
    assert {("reliable", 0.0), ("unbiased", 0.1)} <= pairs, pairs
    # every verdict of the summary is what the Pushgateway holds for Prometheus, labelled by
    # variant and loss
    for row in rows["random-loss"]:
        said = ("withheld" if row["verdict_withheld"] else row["verdict"]) or "none"
        held_rows = [line for line in pushed.splitlines()
                     if line.startswith("lossbed_bench_verdict{")
                     and f'variant="{row["variant"]}"' in line
                     and f'loss="{row["loss"]:g}"' in line]
        assert len(held_rows) == 1 and f'verdict="{said}"' in held_rows[0] \
            and held_rows[0].endswith(" 1"), (row, pushed)
    # The compare step: the first night stores the baseline, the next compares with it.
    compare = steps["Compare with the stored baseline"]
    first = step(compare)
    assert first.returncode == 0 and first.stdout.count("this run becomes it") == 2, first
    second = step(compare)
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.count("0 regression(s)") == 2, second.stdout
    cleared = step(steps["Remove every impairment from the hosts"])
    assert cleared.returncode == 0, cleared.stderr
    assert impaired(cluster) == {}
    # the bench's runs are `lossbed train` runs over SSH: they trained, measured the loss,
    # and left no rank behind on any host
    for profile, runs in rows.items():
        unbiased = next(r for r in runs if r["variant"] == "unbiased")
        assert unbiased["ppl"] > 1 and 0.0 < unbiased["measured_loss"] < 0.2, (profile, unbiased)
    left = processes_in_namespaces([h.namespace for h in cluster.hosts])
    assert not [p for pids in left.values() for p in pids
                if "train.worker" in open(f"/proc/{p}/cmdline").read()]
    # ... and no file on their disks: the ranks' metrics came over stdout, and rank 0's
    # parameters stayed in memory (these hosts share this file system, so it would show)
    written = [p.name for p in (tmp_path / "results").rglob("*")
               if p.name == "rank0_params.pt" or p.name.startswith("rank")]
    assert written == []


def test_doctor_examines_every_host_over_ssh(cluster, inventory):
    """The same checks over SSH: each host's agent examines its own machine, the clock is
    read on the host (date over SSH), and a check that fails on the hosts is named with its
    fix and makes the exit code 3."""
    result = controller(cluster, "doctor", "--inventory", str(inventory), "--json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert sorted(report["facts"]) == sorted(h.name for h in cluster.hosts)
    for name, facts in report["facts"].items():
        assert facts["host"] == name and facts["nic"]["name"] == "eth0"
        assert facts["python"]["core"], "the compiled core, as the host's Python imports it"
        # one machine here, one clock: the offset is within its own round trip's bound
        assert abs(facts["clock_offset_s"]) <= facts["clock_uncertainty_s"] + 0.001
    cuda = controller(cluster, "doctor", "--inventory", str(inventory), "--device", "cuda")
    if not any(f["check"] == "GPUs" and f["ok"] for f in report["findings"]):
        assert cuda.returncode == 3 and "GPUs: 0. Fix:" in cuda.stdout
