"""Every rank lossbed launches gets NCCL over its sockets on the impaired interface (IB/RoCE
verbs off), gloo on the same, and on namespace hosts a host id each, so NCCL's traffic
between them crosses the veth links instead of P2P or shared memory; a user's variable that
says otherwise is refused before launch, naming it (testbed/impair/bypass.py). No GPU needed:
this is the environment NCCL reads."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import launch, torchrun
from testbed.errors import UsageError
from testbed.impair import bypass
from testbed.profiles.model import Profile


def _cluster(shares_this_machine: bool, hosts: int = 3):
    return SimpleNamespace(
        name="c1", mtu=1500, shares_this_machine=shares_this_machine,
        hosts=[SimpleNamespace(name=f"h{i + 1}", address=f"10.0.0.{i + 1}", ifname="eth0",
                               gpus=0, project=Path("/p")) for i in range(hosts)],
        rank_python=lambda host: "python3")


def test_train_ranks_on_namespace_hosts_get_nccl_on_sockets_and_a_host_id_each():
    cluster = _cluster(shares_this_machine=True)
    envs = [launch.rank_env(cluster, r) for r in range(3)]
    for env in envs:
        assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_NET"] == "Socket"
        assert env["NCCL_SOCKET_IFNAME"] == "=eth0" and env["GLOO_SOCKET_IFNAME"] == "eth0"
        assert env["NCCL_P2P_DISABLE"] == "1" and env["NCCL_SHM_DISABLE"] == "1"
    # three namespace hosts on one machine are three hosts to NCCL
    assert len({env["NCCL_HOSTID"] for env in envs}) == 3


def test_real_hosts_keep_nvlink_inside_a_host_but_not_verbs_between_hosts():
    cluster = _cluster(shares_this_machine=False)
    env = launch.rank_env(cluster, 1)
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_SOCKET_IFNAME"] == "=eth0"
    # the GPUs of one real host talk over NVLink/P2P: that is not the lossy network
    assert not {"NCCL_HOSTID", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"} & set(env)


def test_lossbed_run_gives_every_hosts_torchrun_the_same_settings():
    cluster = _cluster(shares_this_machine=True)
    spec = torchrun.RunSpec(command=["torchrun", "job.py"])
    profile = Profile.model_validate({"name": "p", "impairment": {
        "loss": {"model": "bernoulli", "loss_pct": 10}}})
    checked = torchrun.Checked([], ["job.py"], profile)
    made = torchrun.commands(cluster, spec, checked, "job1", None, None, None)
    assert [hc.env["NCCL_HOSTID"] for hc in made] == [
        "lossbed-c1-h1", "lossbed-c1-h2", "lossbed-c1-h3"]
    assert all(hc.env["NCCL_IB_DISABLE"] == "1" and hc.env["NCCL_NET"] == "Socket"
               for hc in made)


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("GLOO_SOCKET_IFNAME", "mgmt0", "binds the job to mgmt0"),
    ("NCCL_SOCKET_IFNAME", "ib0", "binds the job to ib0"),
    ("NCCL_IB_DISABLE", "0", "IB/RoCE verbs"),
    ("NCCL_NET", "IB", "network plugin"),
    ("NCCL_HOSTID", "same", "one host to NCCL"),
    ("NCCL_P2P_DISABLE", "0", "through memory"),
])
def test_a_user_setting_that_routes_around_the_impairment_is_refused_by_name(variable, value,
                                                                            says):
    cluster = _cluster(shares_this_machine=True)
    with pytest.raises(UsageError) as err:
        bypass.refuse_contradictions({variable: value}, cluster)
    assert err.value.field == variable and says in str(err.value)
    assert "Unset it" in str(err.value)


def test_settings_that_agree_with_lossbeds_are_kept():
    cluster = _cluster(shares_this_machine=True)
    agreeing = {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "=eth0",
                "NCCL_IB_DISABLE": "1", "NCCL_NET": "socket", "NCCL_DEBUG": "INFO"}
    assert bypass.contradictions(agreeing, cluster) == []
    # a real host's own host id is its business
    assert bypass.contradictions({"NCCL_HOSTID": "x"}, _cluster(False)) == []


class _RdmaHost(SimpleNamespace):
    def agent_call(self, op, payload):
        assert op == "traffic"
        return {"interfaces": {}, "rdma": {"mlx5_0/1": {}} if self.hardware else {}}


def _verbs_runs(transport="verbs-uc", profile="random-loss"):
    from harness.train import run
    from harness.train.config import TrainConfig

    runs = [run.Run(TrainConfig(variant="unbiased", transport=transport), profile, loss=0.1)]
    plans = {runs[0].network: (SimpleNamespace(profile=runs[0].load_profile()),)}
    return runs, plans


def test_verbs_on_a_hardware_rdma_device_is_refused_without_the_drop_mask(monkeypatch):
    from harness.train import run

    monkeypatch.delenv("LOSSBED_DROP_MASK", raising=False)
    cluster = SimpleNamespace(hosts=[_RdmaHost(name="h1", hardware=True, ifname="eth0")])
    with pytest.raises(UsageError) as err:
        run.verbs_loss(cluster, *_verbs_runs())
    assert err.value.field == "LOSSBED_DROP_MASK" and "h1" in str(err.value)
    # with the mask, the run goes on, and says which loss it had
    monkeypatch.setenv("LOSSBED_DROP_MASK", "7:0.1")
    assert run.verbs_loss(cluster, *_verbs_runs()) == "7:0.1"
    from testbed.impair import verify

    assert verify.loss_applied_by("bpf", cluster, "7:0.1") == [
        "kernel: the bpf backend on the hosts' eth0",
        "drop mask 7:0.1 (SEED:RATE) at the receivers"]


def test_soft_roce_and_udp_take_the_kernels_loss(monkeypatch):
    from harness.train import run

    monkeypatch.delenv("LOSSBED_DROP_MASK", raising=False)
    soft = SimpleNamespace(hosts=[_RdmaHost(name="h1", hardware=False, ifname="eth0")])
    assert run.verbs_loss(soft, *_verbs_runs()) is None  # rxe sends through eth0
    hard = SimpleNamespace(hosts=[_RdmaHost(name="h1", hardware=True, ifname="eth0")])
    assert run.verbs_loss(hard, *_verbs_runs(transport="udp")) is None
