"""Each way around the impairment, planted on a 3-host namespace cluster with a management
network (`up --ssh` gives every host a second interface, mgmt0, as a real cluster has), is
caught: `lossbed run` ends 5 (no result) naming what carried the traffic, never 0 with a
result. The same job over the impaired interface meets the impairment (coverage >= 0.95)."""

from __future__ import annotations

import json
import time

import pytest

from testbed import clusters
from testbed.clusters import netns as netns_cluster
from testbed.errors import NotAResult
from tests.helpers import lossbed, unique_name

pytestmark = [pytest.mark.netns, pytest.mark.slow]

# A plain gloo job without harness.api: all-reduces of 1 MB; the interface its process
# group binds is the test's to choose (argv[1]: "" keeps lossbed's)
JOB = """
import os, sys
if sys.argv[1]:
    os.environ["GLOO_SOCKET_IFNAME"] = sys.argv[1]
import torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.ones(256 * 1024)
for _ in range(30):
    dist.all_reduce(x)
dist.destroy_process_group()
"""


def assert_job_left_nothing(cluster) -> None:
    """The profile cleared, no lossbed table on any host, no process in the hosts'
    namespaces but the cluster's own sshd (--ssh)."""
    from testbed.host.hosts import is_running, processes_in_namespaces
    from testbed.impair import engine

    assert engine.read_record(cluster) is None
    assert not any(b"lossbed" in h.run(["nft", "list", "tables"]).stdout for h in cluster.hosts)
    left = [p for pids in processes_in_namespaces([h.namespace for h in cluster.hosts]).values()
            for p in pids if is_running(p)]
    names = [open(f"/proc/{p}/comm").read().strip() for p in left if is_running(p)]
    assert set(names) <= {"sshd"}, names


@pytest.fixture(scope="module")
def cluster():
    c = netns_cluster.up(netns_cluster.ClusterSpec(hosts=3, name=unique_name(), ssh=True))
    yield c
    clusters.down(c.name)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    path = tmp_path_factory.mktemp("job") / "job.py"
    path.write_text(JOB)
    return path


def run(cluster, out, job, *, bind="", profile="random-loss", options=("--impair-from",
                                                                      "start"), env=None):
    done = lossbed("run", "--cluster", cluster.name, "--profile", profile, "--loss", "0.1",
                   "--out", str(out), *options, "--", "torchrun", str(job), bind,
                   timeout=300, env=env)
    summary_file = out / "summary.json"
    return done, json.loads(summary_file.read_text()) if summary_file.exists() else None


def test_the_job_on_the_impaired_interface_meets_the_impairment(cluster, job, tmp_path):
    done, summary = run(cluster, tmp_path / "ok", job)
    assert done.returncode == 0, done.stderr[-3000:]
    covered = summary["coverage"]
    assert covered["fraction"] >= 0.95 and summary["invalid"] is None, covered
    assert len(covered["hosts"]) == 3 and covered["total_bytes"] > 10_000_000
    assert_job_left_nothing(cluster)


def test_a_job_that_binds_the_management_network_is_no_result(cluster, job, tmp_path):
    done, summary = run(cluster, tmp_path / "mgmt", job, bind="mgmt0")
    assert done.returncode == NotAResult.exit_code, done.stderr[-3000:]
    assert summary["exit_code"] == 0  # the job itself went well
    assert summary["coverage"]["fraction"] < 0.5
    top = next(iter(summary["coverage"]["elsewhere"]))
    assert top.startswith("mgmt0 on ")
    assert "no result" in done.stderr and "mgmt0" in done.stderr
    assert_job_left_nothing(cluster)


def test_a_profile_that_matches_none_of_the_jobs_ports_is_no_result(cluster, job, tmp_path):
    profile = tmp_path / "elsewhere.yaml"
    profile.write_text("name: elsewhere\nimpairment:\n  loss: {model: bernoulli, loss_pct: 10}\n"
                       "match:\n  include: [{protocol: udp, ports: [9]}]\n")
    done, summary = run(cluster, tmp_path / "miss", job, profile=str(profile))
    assert done.returncode == NotAResult.exit_code, done.stderr[-3000:]
    assert summary["coverage"]["fraction"] < 0.1
    assert "not matched by the profile" in done.stderr
    assert "The profile's match left the job's traffic out" in done.stderr


def test_a_job_that_never_joins_is_never_impaired_and_says_so(cluster, job, tmp_path):
    # the default --impair-from joined waits for harness.api's join, which this job never
    # calls: the whole job runs on a clean network
    done, summary = run(cluster, tmp_path / "never", job, options=("--grace-s", "5"))
    assert done.returncode == NotAResult.exit_code, done.stderr[-3000:]
    assert summary["applied"] is False and summary["exit_code"] == 0
    assert "--impair-from start" in summary["invalid"] and "never applied" in done.stderr
    assert_job_left_nothing(cluster)


def test_a_users_variable_naming_another_interface_is_refused_before_launch(cluster, job,
                                                                           tmp_path):
    import os

    started = time.monotonic()
    done, summary = run(cluster, tmp_path / "var", job,
                        env={**os.environ, "GLOO_SOCKET_IFNAME": "mgmt0"})
    assert done.returncode == 2 and summary is None  # nothing ran, nothing was written
    assert "GLOO_SOCKET_IFNAME" in done.stderr and "mgmt0" in done.stderr
    assert time.monotonic() - started < 30


def test_doctor_names_the_management_network_as_a_second_path(cluster):
    from testbed import doctor

    report = doctor.examine(cluster, doctor.Request(), with_python=False)
    second = [f for f in report.findings if f.check == "second path to peers"]
    assert sorted(f.host for f in second) == ["h1", "h2", "h3"]
    assert all(f.state.startswith("mgmt0 (10.202.") and not f.needed for f in second)
    # a warning, not a refusal: lossbed's own ranks stay on eth0
    assert not [f for f in report.blocking if f.check == "second path to peers"]
