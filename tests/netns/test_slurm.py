"""lossbed inside a real Slurm allocation (#69): Debian's slurmctld and one slurmd per
namespace host, munge, lossbed's agent on every node and its Epilog (tests/slurm_cluster.py).
Jobs run as `nobody`: the impairment is the agent's, within the admin's policy; the user
has no root and no SSH."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

from testbed import clusters
from testbed.clusters import netns as netns_cluster
from testbed.host.hosts import is_running, processes_in_namespaces
from tests.helpers import NOTHING, RANK_ONE_FAILS, REPO, leftovers, unique_name
from tests.slurm_cluster import available, slurm_on

pytestmark = pytest.mark.skipif(available() is not None, reason=f"{available()}")

USER = "nobody"
LOSS = 0.1
MAX_LOSS = 0.2  # the admin's


@pytest.fixture(scope="module")
def slurm():
    name = unique_name()
    # with a management network (ssh): Slurm there, the data plane on eth0, as on a GPU
    # cluster; the agents' policy maps each node to its data-plane address
    cluster = netns_cluster.up(netns_cluster.ClusterSpec(hosts=2, name=name, ssh=True))
    # (a folder every user can enter: the jobs run as nobody; pytest's own is root's alone)
    folder = Path(tempfile.mkdtemp(prefix="lossbed-slurm-"))
    folder.chmod(0o755)
    try:
        with slurm_on(cluster, folder / "slurm", allowed=["random-loss"],
                      max_loss=MAX_LOSS) as running:
            yield running
    finally:
        clusters.down(name)
        assert leftovers(name) == NOTHING
        # (the folders slurmd's mount namespace bound Python through are empty here)
        shutil.rmtree(folder)


def workdir(slurm, name: str) -> Path:
    path = slurm.folder.parent / name
    path.mkdir(mode=0o777)
    path.chmod(0o777)  # (the job's user writes its report there)
    return path


def lossbed_run(out: Path, *options: str, steps: int = 30) -> str:
    """A job script's line: `lossbed run --slurm` of the plain PyTorch example."""
    return (f"export PYTHONPATH={REPO}\n"
            f"{sys.executable} -m harness.cli run --slurm --profile random-loss "
            f"{' '.join(options)} --out {out} -- torchrun {REPO}/examples/plain_pytorch.py "
            f"--variant unbiased --steps {steps}\necho \"lossbed exit $?\"\n")


def assert_nodes_left_nothing(slurm) -> None:
    """No lossbed qdisc, filter or nft table on any node's interface, no holder, and nothing
    running in the nodes' namespaces but Slurm's daemons and the agents."""
    for host in slurm.cluster.hosts:
        tables = host.run(["nft", "list", "tables"]).stdout.decode()
        assert "lossbed" not in tables, (host.name, tables)
        qdiscs = host.run(["tc", "qdisc", "show", "dev", host.ifname]).stdout.decode()
        assert not any(kind in qdiscs for kind in ("clsact", "ingress", "netem", "htb")), qdiscs
        assert not (Path(slurm.folder) / "agent" / f"{host.name}.json").exists()
    namespaces = [h.namespace for h in slurm.cluster.hosts]
    deadline = time.monotonic() + 5  # (a lease's watchdog looks at its lease every 0.5 s)
    while True:
        left = [p for pids in processes_in_namespaces(namespaces).values() for p in pids
                if is_running(p) and p not in slurm.daemons()]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert left == [], [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left]


def test_an_sbatch_job_runs_lossbed_run_and_bench_under_loss_as_a_user_without_root(slurm):
    """One job: the doctor, `lossbed run --slurm` at 10% loss, a bench asking for more hosts
    than the allocation has (refused before anything runs), then a tiny `lossbed bench
    --slurm` (the nightly workflow's matrix shrunk: one lossy variant at 10%)."""
    wd = workdir(slurm, "run")
    doctor = (f"{sys.executable} -m harness.cli doctor --slurm\n"
              "echo \"doctor exit $?\"\n")
    bench = (f"{sys.executable} -m harness.cli bench --slurm --profile random-loss --loss "
             f"{LOSS} --steps 2 --seeds 1 --variants unbiased --preset tiny --speed-steps 2 "
             "--realisations 1 --no-stability")
    job = slurm.sbatch(doctor + lossbed_run(wd / "out", "--loss", str(LOSS))
                       + f"{bench} --hosts 3 --out {wd}/refused\necho \"hosts exit $?\"\n"
                       + f"{bench} --out {wd}/bench\necho \"bench exit $?\"\n",
                       user=USER, workdir=wd)
    assert slurm.wait(job) == "COMPLETED"
    said = (wd / "job.out").read_text()
    assert "--hosts: 3 hosts asked, but the Slurm allocation has 2" in said, said[-4000:]
    assert "hosts exit 2" in said and not (wd / "refused").exists(), said[-4000:]
    assert "bench exit 0" in said, said[-4000:]
    rows = json.loads((wd / "bench" / "summary.json").read_text())["rows"]
    assert {(r["variant"], r["loss"]) for r in rows} >= {("reliable", 0.0), ("unbiased", LOSS)}
    lossy = next(r for r in rows if r["variant"] == "unbiased")
    assert 0.0 < lossy["measured_loss"] < 0.2 and lossy["ppl"] > 1, lossy
    # the doctor on the node finds everything the role installed: both agents, the Epilog
    assert "doctor exit 0" in said and "everything this run needs is there" in said, said
    assert re.search(r"\ball +agent +answers: impairs eth0", said), said  # (both nodes)
    assert re.search(r"\bepilog +Epilog=\S+ +ok\n", said), said
    assert "lossbed exit 0" in said, said[-4000:]
    summary = json.loads((wd / "out" / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["ranks"] == 2, summary
    assert summary["coverage"]["fraction"] >= 0.9, summary["coverage"]
    measured, (low, high) = summary["measured_loss"], summary["measured_loss_interval"]
    assert low <= measured <= high and abs(measured - LOSS) < 2 * (high - low) + 0.01, summary
    assert summary["invalid"] is None
    slurm.idle()
    assert_nodes_left_nothing(slurm)


def held_by(slurm, job: str, wd: Path) -> list[Path]:
    """Until every node's agent holds its impairment for the job, while the job waits or
    runs; the holder files (one per node, in the cluster's order)."""
    held = [Path(slurm.folder) / "agent" / f"{h.name}.json" for h in slurm.cluster.hosts]
    deadline = time.monotonic() + 180
    while not all(p.exists() for p in held):
        assert time.monotonic() < deadline and slurm.state(job) in ("PENDING", "RUNNING"), \
            (wd / "job.out").read_text()[-3000:]
        time.sleep(0.2)
    return held


def test_scancel_mid_run_leaves_nothing_on_any_node(slurm):
    """lossbed's own training (`train --slurm`) this time, cancelled once it is impaired."""
    wd = workdir(slurm, "cancel")
    job = slurm.sbatch(f"export PYTHONPATH={REPO}\n{sys.executable} -m harness.cli train "
                       f"--slurm --profile random-loss --loss {LOSS} --variant unbiased "
                       "--steps 100000\n", user=USER, workdir=wd)
    held = held_by(slurm, job, wd)
    assert all(json.loads(p.read_text())["job"] == job for p in held)
    slurm.command(["scancel", job], user=USER)
    assert slurm.wait(job) == "CANCELLED"
    slurm.idle()  # (the Epilog ran on every node)
    assert_nodes_left_nothing(slurm)


def node_impaired(host) -> bool:
    """The node's interface still carries lossbed's impairment (the bpf backend's clsact
    filters, or an nft table)."""
    tables = host.run(["nft", "list", "tables"]).stdout.decode()
    qdiscs = host.run(["tc", "qdisc", "show", "dev", host.ifname]).stdout.decode()
    return "lossbed" in tables or "clsact" in qdiscs


def test_a_controller_lost_mid_run_leaves_the_lease_to_revert_every_node(slurm):
    """The controller (lossbed train, on the first node) is killed outright mid-run while
    the job goes on: nobody renews the lease, and each node's agent reverts its impairment
    by itself once --lease-s has passed, the job still running; its end clears the rest."""
    wd = workdir(slurm, "lost")
    job = slurm.sbatch(f"export PYTHONPATH={REPO}\n{sys.executable} -m harness.cli train "
                       f"--slurm --lease-s 4 --profile random-loss --loss {LOSS} "
                       f"--variant unbiased --steps 100000 &\necho $! > {wd}/controller\n"
                       "wait\nsleep 600\n", user=USER, workdir=wd)
    held_by(slurm, job, wd)
    assert all(node_impaired(h) for h in slurm.cluster.hosts)
    os.kill(int((wd / "controller").read_text()), signal.SIGKILL)
    lost_at = time.monotonic()
    while any(node_impaired(h) for h in slurm.cluster.hosts):
        assert time.monotonic() - lost_at < 30, "the lease did not revert the nodes"
        time.sleep(0.25)
    reverted_s = time.monotonic() - lost_at
    assert reverted_s > 1 and slurm.state(job) == "RUNNING"  # (its lease, not the job's end)
    slurm.command(["scancel", job], user=USER)
    assert slurm.wait(job) == "CANCELLED"
    slurm.idle()
    assert_nodes_left_nothing(slurm)


def test_a_disallowed_profile_is_refused_and_a_failing_ranks_message_comes_back(slurm):
    """One job, two runs: a profile the admin did not allow (refused with the reason, before
    any rank starts); then a script whose rank 1 fails (its error and the exit code come
    back through srun to the user)."""
    wd = workdir(slurm, "refused")
    (wd / "fails.py").write_text(RANK_ONE_FAILS)
    # (a loss above the admin's max_loss is refused the same way: tests/unit/test_slurm_parts.py)
    script = lossbed_run(wd / "other", "--impair-from", "start").replace(
        "--profile random-loss", "--profile burst-loss")
    script += (f"{sys.executable} -m harness.cli run --slurm --profile random-loss --loss "
               f"{LOSS} --out {wd}/fails -- torchrun {wd}/fails.py\n"
               "echo \"failing exit $?\"\n")
    job = slurm.sbatch(script, user=USER, workdir=wd)
    assert slurm.wait(job) == "COMPLETED"
    said = (wd / "job.out").read_text()
    assert "profile 'burst-loss' is not allowed on this cluster (the admin allows: " \
           "random-loss" in said, said[-4000:]
    assert "lossbed exit 6" in said, said[-4000:]  # (policy.Refused's exit code)
    assert not (wd / "other" / "ranks").exists()  # no rank started
    assert re.search(r"\[run\] failed: rank 1 on h[12]: RuntimeError: rank one gives up",
                     said), said[-4000:]
    assert "failing exit 0" not in said and re.search(r"failing exit [1-9]", said), said
    summary = json.loads((wd / "fails" / "summary.json").read_text())
    assert summary["applied"] and summary["stopped_by"] == "rank 1's error", summary
    slurm.idle()
    assert_nodes_left_nothing(slurm)


def test_a_node_lost_mid_run_ends_the_job_and_leaves_nothing_on_the_others(slurm):
    """The second node goes down mid-run as a machine does (its links down, every process on
    it killed: slurmd, the job's steps, lossbed's agent), and nobody tells Slurm: it finds
    the node silent (SlurmdTimeout, 30 s in the fixture; about 40 s here) and ends the job (not
    requeued). Meanwhile srun to the node does not return: lossbed's renewals of its lease
    wait, the first node's go on (each host's its own). The first node is then left with
    nothing of the job (its Epilog cleared it, no lossbed process stays: the clear at the
    end is bounded); the job's output has Slurm's reason (node failure) and lossbed's word
    that the job ended before it cleared, and who clears. Last in the module: the lost node
    stays down."""
    wd = workdir(slurm, "node-lost")
    job = slurm.sbatch(f"export PYTHONPATH={REPO}\n{sys.executable} -m harness.cli train "
                       f"--slurm --profile random-loss --loss {LOSS} --variant unbiased "
                       "--steps 100000\necho \"train exit $?\"\n", user=USER, workdir=wd)
    held = held_by(slurm, job, wd)
    first, lost = slurm.cluster.hosts
    time.sleep(2)  # (training under the impairment)
    slurm.lose(lost)
    ended = slurm.wait(job, timeout=120)
    said = (wd / "job.out").read_text()
    assert ended in ("NODE_FAIL", "FAILED", "CANCELLED"), (ended, said[-3000:])
    # the node left: nothing of the job's (no impairment, no holder, no process)
    deadline = time.monotonic() + 60
    while node_impaired(first) or held[0].exists():
        assert time.monotonic() < deadline, (said[-3000:], slurm.logs())
        time.sleep(0.25)
    deadline = time.monotonic() + 10
    while True:
        left = [p for pids in processes_in_namespaces([first.namespace]).values()
                for p in pids if is_running(p) and p not in slurm.daemons()]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert left == [], [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left]
    said = (wd / "job.out").read_text()
    # Slurm says why the job ended; lossbed, that it could not clear and who does
    assert "CANCELLED AT" in said and "DUE TO NODE FAILURE" in said, said[-3000:]
    assert f"node {lost.name}: the Slurm job ended before lossbed was done there" in said, \
        said[-3000:]
