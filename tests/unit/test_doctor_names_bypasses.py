"""`lossbed doctor` names every way around the impaired interface it can see before a run:
a second interface that reaches a peer, hardware RDMA devices (NCCL's IB transport), and the
controller's gloo/NCCL variables that ranks on this machine would inherit (judged from
constructed facts; the facts themselves are read on namespace hosts in
tests/netns/test_coverage.py)."""

from __future__ import annotations

from types import SimpleNamespace

from testbed import doctor
from testbed.doctor import judge


def _cluster(shares_this_machine=True):
    return SimpleNamespace(name="c1", shares_this_machine=shares_this_machine,
                           hosts=[SimpleNamespace(name=f"h{i}", ifname="eth0") for i in (1, 2)])


def _facts(other=None, rdma=()):
    return {f"h{i}": {"host": f"h{i}", "nic": {"addresses": [f"10.201.0.{i}"]},
                      "other_interfaces": {"mgmt0": [f"10.202.0.{i}/24"]} if other else {},
                      "hardware_rdma": list(rdma)} for i in (1, 2)}


def _judged(cluster, facts, environ=None):
    typed = {name: doctor.HostFacts.from_dict(f) for name, f in facts.items()}
    return judge.bypass_findings(cluster, typed, environ or {})


def test_a_management_network_that_reaches_the_peers_is_named_with_the_fix():
    found = _judged(_cluster(), _facts(other=True))
    assert [(f.host, f.check, f.ok, f.needed) for f in found] == [
        ("h1", "second path to peers", False, False), ("h2", "second path to peers", False,
                                                        False)]
    assert "mgmt0 (10.202.0.1/24) reaches h2 around the impaired eth0" in found[0].state
    assert "coverage" in found[0].fix


def test_an_interface_that_reaches_no_peer_is_no_bypass():
    facts = _facts(other=True)
    facts["h2"]["other_interfaces"] = {"docker0": ["172.17.0.1/16"]}
    found = _judged(_cluster(), facts)
    assert found == []


def test_rdma_devices_are_named_once_per_machine():
    assert [f.host for f in _judged(_cluster(True), _facts(rdma=["mlx5_0"]))] == ["h1"]
    found = _judged(_cluster(False), _facts(rdma=["mlx5_0"]))
    assert [f.host for f in found] == ["h1", "h2"]
    assert "NCCL_IB_DISABLE=1" in found[0].fix and "mlx5_0" in found[0].state


def test_the_controllers_variables_that_ranks_would_inherit_block_the_run():
    found = _judged(_cluster(), _facts(), {"NCCL_IB_DISABLE": "0"})
    assert [(f.host, f.check, f.ok, f.needed) for f in found] == [
        ("controller", "NCCL_IB_DISABLE", False, True)]
    # remote ranks do not inherit this environment
    assert _judged(_cluster(False), _facts(), {"NCCL_IB_DISABLE": "0"}) == []
