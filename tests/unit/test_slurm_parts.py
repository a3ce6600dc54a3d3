"""The pieces of lossbed's Slurm mode that need no running Slurm (#69): node lists expanded as
scontrol does, the allocation read from the job's environment with a clear error for each
way it can be wrong, the admin's configuration and policy, and --slurm on the command line.
The real Slurm is tests/netns/test_slurm.py."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from testbed import profiles
from testbed.clusters import slurm as slurm_cluster
from testbed.errors import EnvironmentProblem, UsageError
from testbed.impair import plan
from testbed.slurm import hostlist, policy
from tests.helpers import lossbed

NODE_LISTS = ["h[1-2]", "gpu[01-03,07],login1", "r[1-2]n[1-2]", "n[08-10]", "n[9-11]",
              "n[010-012]", "a,b,a", "single", "y_[5,7],x-1.lab"]
EXPANDED = [["h1", "h2"], ["gpu01", "gpu02", "gpu03", "gpu07", "login1"],
            ["r1n1", "r1n2", "r2n1", "r2n2"], ["n08", "n09", "n10"], ["n9", "n10", "n11"],
            ["n010", "n011", "n012"], ["a", "b", "a"], ["single"],
            ["y_5", "y_7", "x-1.lab"]]


@pytest.mark.parametrize(("text", "nodes"), list(zip(NODE_LISTS, EXPANDED, strict=True)))
def test_node_lists_expand_as_written(text, nodes):
    assert hostlist.expand(text) == nodes


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="needs scontrol (make setup)")
def test_node_lists_expand_as_scontrol_show_hostnames_does(tmp_path):
    conf = tmp_path / "slurm.conf"  # (scontrol reads one even to expand a list)
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\n")
    for text in NODE_LISTS:
        done = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True,
                              text=True, env={**os.environ, "SLURM_CONF": str(conf)})
        assert done.returncode == 0, done.stderr
        assert hostlist.expand(text) == done.stdout.split(), text


@pytest.mark.parametrize(("text", "said"), [
    ("n[1-3", "without its ']'"), ("n1-3]", "without its '['"), ("n[[1]]", "inside a bracket"),
    ("n[3-1]", "goes down"), ("n[a-b]", "not a number or a range"), ("", "names no node"),
    ("n[1-100000]", "more than 4096"), ("../etc", "not a node name"),
    ("n[1-5000]", "more than 4096"), ("x[1-2]y", "text after the last bracket")])
def test_a_node_list_that_cannot_be_read_is_refused_by_name(text, said):
    with pytest.raises(UsageError, match="SLURM_JOB_NODELIST") as err:
        hostlist.expand(text)
    assert said in str(err.value)


JOB = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2"}


@pytest.mark.parametrize(("env", "field", "said"), [
    ({}, "--slurm", "no Slurm allocation here (SLURM_JOB_ID is not set)"),
    ({**JOB, "SLURM_JOB_ID": "4;2"}, "SLURM_JOB_ID", "is not a job id"),
    ({"SLURM_JOB_ID": "42"}, "SLURM_JOB_NODELIST", "job 42 names no nodes"),
    ({**JOB, "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1"}, "--slurm",
     "job 42 holds one node (n1): there is no link to impair"),
    ({**JOB, "SLURM_JOB_NUM_NODES": "3"}, "SLURM_JOB_NODELIST",
     "names 2 nodes, and SLURM_JOB_NUM_NODES says 3"),
    ({**JOB, "SLURM_JOB_NODELIST": "n1,n1"}, "SLURM_JOB_NODELIST", "names n1 twice"),
])
def test_an_allocation_that_cannot_be_used_is_refused_before_any_node_is_asked(
        env, field, said, monkeypatch):
    monkeypatch.setattr(subprocess, "run", _no_command)
    with pytest.raises(UsageError) as err:
        slurm_cluster.from_allocation(env)
    assert err.value.field == field and said in str(err.value), str(err.value)


def test_without_srun_the_allocation_says_what_to_load(monkeypatch):
    monkeypatch.setattr(subprocess, "run", _no_command)
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "srun" else "/bin/x")
    with pytest.raises(EnvironmentProblem, match="srun is not on PATH: load Slurm's module"):
        slurm_cluster.from_allocation(JOB)


def test_a_step_refused_because_the_job_ended_says_so_and_who_clears(monkeypatch):
    """After scancel, a timeout or a node failure, srun refuses new steps: lossbed says the
    job ended and that the Epilog clears, not only what srun printed."""
    ended = subprocess.CompletedProcess([], 1, b"", b"srun: error: Slurm job 5 has expired\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: ended)
    host = slurm_cluster.SrunHost(name="n2", address="10.0.0.2", job="5")
    with pytest.raises(Exception) as err:
        host.agent_call("clear", {})
    assert str(err.value) == ("node n2: the Slurm job ended before lossbed was done there "
                              "(srun: error: Slurm job 5 has expired): its Epilog clears "
                              "what the job held on its nodes")


def test_a_clear_to_a_node_that_does_not_answer_ends_within_its_bound(monkeypatch, tmp_path):
    """A node that died but is not declared down yet: srun to it does not return. The clear
    at a run's end (Slurm's KillWait after SIGTERM is 30 s by default) gives up after
    CLEAR_TIMEOUT_S, kills its srun and says who clears; other calls wait AGENT_TIMEOUT_S.
    (The old code waited 120 s for a clear too, past KillWait: on a cluster whose process
    tracking lost lossbed, it outlived its job; the real lost node: tests/netns/test_slurm.py.)"""
    import time

    srun = tmp_path / "srun"
    srun.write_text(f"#!/bin/sh\necho $$ > {tmp_path}/pid\nexec sleep 600\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(slurm_cluster, "CLEAR_TIMEOUT_S", 1.0)
    monkeypatch.setattr(slurm_cluster, "AGENT_TIMEOUT_S", 2.0)
    host = slurm_cluster.SrunHost(name="n2", address="10.0.0.2", job="5")
    for op, bound, said in (("clear", 1.0, "no answer from srun in 1 s (a node lost?): its "
                             "Epilog clears what the job held there when the job ends"),
                            ("describe", 2.0, "no answer from srun in 2 s (a node lost?)")):
        started = time.monotonic()
        with pytest.raises(Exception) as err:
            host.agent_call(op, {})
        assert bound <= time.monotonic() - started < bound + 5
        assert str(err.value) == f"node n2: {said}"
        pid = int((tmp_path / "pid").read_text())
        assert not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "Z"  # srun was killed


def test_a_host_that_does_not_answer_delays_no_other_hosts_lease_renewal():
    """The controller renews each host's lease on its own: while a lost node's renewal
    hangs (srun waits for the node until Slurm declares it down), the others' are renewed
    on time and their impairment does not revert mid-run. (The old keeper renewed the hosts
    one after the other in one thread: the host behind the lost one waited with it.)"""
    import threading
    import time
    from types import SimpleNamespace

    from testbed.host import lease

    never = threading.Event()
    renewed: list[float] = []

    class Lost:
        name = "n1"

        def agent_call(self, op, payload):
            never.wait(30)

    class Alive:
        name = "n2"

        def agent_call(self, op, payload):
            assert op == "renew"
            renewed.append(time.monotonic())

    started = time.monotonic()
    with lease.Keeper(SimpleNamespace(hosts=[Lost(), Alive()]), every_s=0.05):
        time.sleep(0.6)
        never.set()  # (the lost node answers at last, so that stopping need not wait)
    assert len(renewed) >= 5, renewed  # every 0.05 s for 0.6 s, on a busy machine: >= 5
    assert renewed[0] - started < 0.3


def _no_command(*args, **kwargs):
    raise AssertionError(f"a command ran: {args}")


def test_slurm_and_another_cluster_are_refused_together_and_slurm_is_found_in_a_job(tmp_path):
    done = lossbed("run", "--slurm", "--cluster", "x", "--", "torchrun", "a.py")
    assert done.returncode == 2 and "--slurm: the allocation is the cluster" in done.stderr
    done = lossbed("run", "--", "torchrun", "a.py", env={**os.environ, "SLURM_JOB_ID": "7"})
    # found from SLURM_JOB_ID: the allocation is read (and here it names no nodes)
    assert done.returncode == 2, done.stderr
    assert "SLURM_JOB_NODELIST: job 7 names no nodes" in done.stderr


def test_a_bench_asking_for_more_hosts_than_its_allocation_is_refused_and_none_takes_all():
    import argparse
    from types import SimpleNamespace

    from harness.cli import bench_hosts

    two = SimpleNamespace(name="slurm-42", hosts=[object(), object()])
    in_job = argparse.Namespace(slurm=True, cluster=None, inventory=None)
    with pytest.raises(UsageError) as err:
        bench_hosts(4, two, in_job)
    assert err.value.field == "--hosts" and str(err.value).startswith(
        "--hosts: 4 hosts asked, but the Slurm allocation has 2"), str(err.value)
    assert "Leave --hosts out (the bench runs on all 2), or allocate 4 nodes" in str(err.value)
    # not asked, or asked as many: the allocation's; a bench of its own: --hosts or 4
    assert bench_hosts(None, two, in_job) == bench_hosts(2, two, in_job) == 2
    assert bench_hosts(None, None, in_job) == 4 and bench_hosts(3, None, in_job) == 3
    named = argparse.Namespace(slurm=False, cluster="c1", inventory=None)
    with pytest.raises(UsageError, match="3 hosts asked, but cluster slurm-42 has 2"):
        bench_hosts(3, two, named)


# ---- the admin's configuration and policy ---------------------------------------------------

def config(**changes) -> policy.AgentConfig:
    return policy.AgentConfig(**{"allowed_profiles": ("random-loss", "burst-loss"),
                                 "interface": "eth1", "max_loss": 0.2, **changes})


@pytest.mark.parametrize(("text", "said"), [
    ("interface: eth1\n", "allowed_profiles is missing"),
    ("allowed_profiles: [random-loss]\n", "interface is missing"),
    ("allowed_profiles: []\ninterface: eth1\n", "allowed_profiles: [] must be a list"),
    ("allowed_profiles: [../x]\ninterface: eth1\n", "must be a list of one or more"),
    ("allowed_profiles: [random-loss]\ninterface: eth1\nmax_loss: 10\n",
     "max_loss: 10 is not a fraction"),
    ("allowed_profiles: [random-loss]\ninterface: 'eth1; rm'\n", "is not an interface name"),
    ("allowed_profiles: [random-loss]\ninterface: eth1\nsocket: rel.sock\n",
     "socket: 'rel.sock' must be an absolute path"),
    ("allowed_profiles: [random-loss]\ninterface: eth1\nlease: 5\n", "unknown field 'lease'"),
    ("allowed_profiles: [random-loss]\ninterface: eth1\nlease_s: -1\n", "lease_s: -1"),
    ("- a\n", "must be a mapping"),
    ("allowed_profiles: [random-loss]\ninterface: eth1\naddresses: [10.0.0.1]\n",
     "addresses: must map each node to its data-plane address"),
    ("allowed_profiles: [random-loss]\ninterface: eth1\naddresses: {n1: 10.0.0.300}\n",
     "addresses: n1: '10.0.0.300' is not an IPv4 address"),
    ("allowed_profiles: [random-loss]\ninterface: eth1\naddresses: {'../n1': 10.0.0.1}\n",
     "addresses: '../n1' is not a node name"),
])
def test_the_admins_configuration_is_refused_by_field(tmp_path, text, said):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(policy.ConfigError) as err:
        policy.load_config(path)
    assert said in str(err.value) and str(path) in str(err.value)


def test_a_missing_configuration_says_who_installs_it(tmp_path):
    with pytest.raises(policy.ConfigError, match="the admin installs it"):
        policy.load_config(tmp_path / "none.yaml")


def test_a_node_name_never_becomes_a_path():
    cfg = config(socket="/run/x/{node}.sock")
    assert str(cfg.socket_path("n01")) == "/run/x/n01.sock"
    for bad in ("../n", "n/1", "", ".hidden"):
        with pytest.raises(Exception, match="is not a node name"):
            cfg.socket_path(bad)


def asked(name: str, *sets: str, loss: float | None = None) -> dict:
    return profiles.load(name, list(sets), loss=loss).model_dump(mode="json")


def test_an_allowed_profile_passes_at_its_own_rate_at_a_loss_asked_and_at_none():
    for request in (asked("random-loss"), asked("random-loss", loss=0.1),
                    asked("random-loss", loss=0), asked("burst-loss", loss=0.05)):
        assert policy.judge_profile(config(), request).name == request["name"]
    # the match (which packets) is the job's: train moves its rendezvous port into it
    from harness.train.run import impair_the_control_path

    profile, _ = impair_the_control_path(profiles.load("random-loss", loss=0.1))
    assert policy.judge_profile(config(), profile.model_dump(mode="json")) == profile


def test_clean_which_impairs_nothing_passes_unnamed_and_only_as_it_is():
    """A bench's lossless reference runs under `clean` (its packets counted, none changed):
    allowed without the admin naming it; the same name with an impairment is not."""
    assert policy.judge_profile(config(), asked("clean")).name == "clean"
    with pytest.raises(policy.Refused, match="differs from the admin's beyond its loss"):
        policy.judge_profile(config(), asked("clean", "delay_ms=5"))


@pytest.mark.parametrize(("request_", "said"), [
    (asked("wan"), "profile 'wan' is not allowed on this cluster (the admin allows: "
                   "random-loss, burst-loss"),
    (asked("random-loss", "delay_ms=5"), "differs from the admin's beyond its loss rate"),
    (asked("random-loss", loss=0.3), "a loss of 0.3 is above this cluster's max_loss 0.2"),
    ({"name": "random-loss", "impairment": {"nonsense": 1}}, "is not a lossbed profile"),
])
def test_a_profile_outside_the_policy_is_refused_with_the_reason(request_, said):
    with pytest.raises(policy.Refused) as err:
        policy.judge_profile(config(), request_)
    assert said in str(err.value)


def host_plan(profile, node="n1", **changes) -> dict:
    hosts = [plan.PlannedHost("n1", "10.0.0.1", "eth1"), plan.PlannedHost("n2", "10.0.0.2",
                                                                          "eth1")]
    made = plan.build(profile, hosts, "nft").host(node).to_dict()
    return {**made, **changes}


ADDRESSES = {"n1": "10.0.0.1", "n2": "10.0.0.2"}


def test_the_data_plane_addresses_are_the_admins_where_it_names_them(tmp_path):
    """Slurm on the management network, the data plane on another NIC: the policy maps
    each node to its data-plane address; a node it does not name keeps its NodeAddr."""
    path = tmp_path / "agent.yaml"
    path.write_text("allowed_profiles: [random-loss]\ninterface: eth1\n"
                    "addresses: {n1: 10.0.0.1, n2: 10.0.0.2}\n")
    loaded = policy.load_config(path)
    node_addr = {"n1": "192.168.0.1", "n2": "192.168.0.2", "n3": "192.168.0.3"}
    assert loaded.addresses_of(["n1", "n2", "n3"], node_addr) == {
        **ADDRESSES, "n3": "192.168.0.3"}
    assert config().addresses_of(["n1"], node_addr) == {"n1": "192.168.0.1"}
    # a plan on the management addresses is refused where the data plane is elsewhere
    profile = profiles.load("random-loss", loss=0.1)
    with pytest.raises(policy.Refused, match="its data-plane address is 10.0.0.1"):
        policy.judge_plan(loaded, profile, host_plan(profile, address="192.168.0.1"), "n1",
                          loaded.addresses_of(["n1", "n2"], node_addr))


def test_the_plan_of_an_allowed_profile_on_the_jobs_nodes_passes():
    profile = profiles.load("random-loss", loss=0.1)
    policy.judge_plan(config(), profile, host_plan(profile), "n1", ADDRESSES)


@pytest.mark.parametrize(("changes", "node", "addresses", "said"), [
    ({}, "n2", ADDRESSES, "the plan is for host 'n1', and this is node 'n2'"),
    ({"ifname": "eth0"}, "n1", ADDRESSES, "the plan impairs 'eth0'; the admin allows 'eth1'"),
    ({}, "n1", {"n1": "10.0.0.1"}, "a path to n2 (10.0.0.2), which is not another node"),
    ({"address": "10.0.0.9"}, "n1", ADDRESSES, "gives node n1 the address 10.0.0.9"),
])
def test_a_plan_beyond_the_jobs_nodes_or_interface_is_refused(changes, node, addresses, said):
    profile = profiles.load("random-loss", loss=0.1)
    with pytest.raises(policy.Refused) as err:
        policy.judge_plan(config(), profile, host_plan(profile, **changes), node, addresses)
    assert said in str(err.value)


def test_a_plan_stronger_than_its_profile_is_refused():
    profile = profiles.load("random-loss", loss=0.1)
    stronger = host_plan(profiles.load("random-loss", loss=0.15))
    with pytest.raises(policy.Refused, match="impairment of n2->n1 is not the profile's"):
        policy.judge_plan(config(), profile, stronger, "n1", ADDRESSES)


def test_the_doctor_outside_a_job_names_each_missing_piece_with_its_fix(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    done = lossbed("doctor", "--slurm", "--json",
                   env={**env, "LOSSBED_SLURM_AGENT_CONF": str(tmp_path / "none.yaml")})
    assert done.returncode == 3, done.stderr
    import json

    failing = {f["check"]: f for f in json.loads(done.stdout)["findings"] if not f["ok"]}
    assert "not inside a Slurm job" in failing["allocation"]["state"]
    assert "salloc -N 2" in failing["allocation"]["fix"]
    assert "no lossbed agent configuration here" in failing["agent policy"]["state"]
    assert "--tags lossbed_slurm" in failing["agent policy"]["fix"]
    assert "epilog" in failing
