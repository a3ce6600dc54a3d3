"""doctor in three rooms (#55): typed facts in, findings out; an engine refusal is a finding
with its fix, and any other error is not dressed up as the sch_netem advice."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from testbed import doctor
from testbed.doctor import judge
from testbed.doctor.facts import HostFacts, PythonFacts
from testbed.errors import LossbedError
from testbed.profiles import loading

CHECKUP = {  # what the checkup agent operation answers (testbed/host/checkup.py)
    "host": "h1", "kernel": "6.1.0", "commands": {"ip": "/sbin/ip", "tc": "/sbin/tc",
                                                  "nft": None, "ethtool": "/sbin/ethtool"},
    "modules": {"sch_netem": None, "cls_bpf": "loaded"}, "namespaces": True,
    "cap_net_admin": True, "backends": {"netem": "no sch_netem", "bpf": None, "nft": "no nft"},
    "nic": {"name": "eth0", "mtu": 1500, "speed_mbit": 10000, "addresses": ["10.201.0.1/24"],
            "carries_default_route": False, "carries_ssh_session": False, "offloads_on": []},
    "rdma_devices": [], "hardware_rdma": [], "other_interfaces": {}, "gpu_driver": None,
    "python": {"executable": "/usr/bin/python3", "version": "3.11.2", "core": "/x/_wire.so",
               "torch": "2.13.0", "cuda_build": None, "cuda_available": False, "gpus": [],
               "nccl": None},
    "clock_offset_s": 0.0002, "clock_uncertainty_s": 0.0001, "a_newer_fact": 1}


def _cluster():
    return SimpleNamespace(name="c1", shares_this_machine=True,
                           hosts=[SimpleNamespace(name=f"h{i}", ifname="eth0") for i in (1, 2)])


def _facts():
    return {f"h{i}": HostFacts.from_dict({**CHECKUP, "host": f"h{i}"}) for i in (1, 2)}


def test_the_checkups_answer_is_typed_and_goes_back_to_json_unchanged():
    facts = HostFacts.from_dict(CHECKUP)
    assert isinstance(facts.python, PythonFacts) and facts.nic.mtu == 1500
    assert facts.backend_is_best("bpf") and not facts.backend_is_best("nft")
    back = dataclasses.asdict(facts)
    for key, value in CHECKUP.items():
        if key == "a_newer_fact":
            assert key not in back
        elif isinstance(value, dict) and key in ("nic", "python"):
            assert {k: back[key][k] for k in value} == value, key
        else:
            assert back[key] == value, key


def test_a_cpu_run_is_judged_ready_and_a_cuda_run_is_refused_with_the_fix():
    facts = _facts()
    ready = judge.judge(_cluster(), facts, doctor.Request())
    assert ready.blocking == []
    cuda = judge.judge(_cluster(), facts, doctor.Request(device="cuda"))
    assert {(f.check, f.fix) for f in cuda.blocking} >= {("GPUs", "a GPU, or --device cpu")}
    assert "GPUs: 0. Fix: a GPU, or --device cpu" in doctor.render(cuda)


def test_an_engine_refusal_is_a_finding_and_any_other_error_is_not_hidden(monkeypatch):
    from testbed.impair import engine

    facts = _facts()
    wan = doctor.Request(profile=loading.load("wan", []))
    refused = judge.judge(_cluster(), facts, wan).blocking
    assert [f.check for f in refused] == ["profile wan"] and "sch_netem" in refused[0].fix

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the engine")

    monkeypatch.setattr(engine, "choose", broken)
    with pytest.raises(RuntimeError, match="a bug in the engine"):
        judge.judge(_cluster(), facts, wan)
    monkeypatch.setattr(engine, "choose", lambda *a, **k: (_ for _ in ()).throw(
        LossbedError("no backend can")))
    assert judge.judge(_cluster(), facts, wan).blocking[0].state == "no backend can"


def test_an_unreachable_host_is_one_finding():
    facts = {**_facts(), "h1": HostFacts(host="h1", unreachable="LossbedError: no answer")}
    report = judge.judge(_cluster(), facts, doctor.Request())
    assert [(f.host, f.check) for f in report.blocking] == [("h1", "reachable")]


def test_a_findings_flags_are_named():
    with pytest.raises(TypeError):
        doctor.Finding("h1", "nft", "absent", False, True)  # bare booleans: refused
    with pytest.raises(TypeError):
        doctor.Request(None, "cpu")  # the request's fields are named too


def test_the_one_machine_doctor_can_leave_the_interpreter_out():
    """`python -m testbed.doctor --skip-interpreter` (the verify role's
    lossbed_verify_interpreter: false): no Python, torch or compiled-core check, the rest."""
    import json
    import subprocess
    import sys

    from tests.helpers import REPO, with_repo_on_path

    def checks(*extra):
        done = subprocess.run([sys.executable, "-m", "testbed.doctor", "--interface", "lo",
                               "--json", *extra], capture_output=True, text=True, cwd=REPO,
                              timeout=120, env={"PYTHONPATH": with_repo_on_path(),
                                                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        return {f["check"] for f in json.loads(done.stdout)["findings"]}

    skipped = checks("--skip-interpreter")
    assert not skipped & {"Python", "torch", "compiled core"}
    assert {"CAP_NET_ADMIN", "NIC", "tc"} <= skipped
    assert {"Python", "torch", "compiled core"} <= checks()


def test_a_python_without_lossbeds_packages_is_refused_with_make_setup_venv():
    """A venv with torch but not lossbed's other packages: every rank died on
    ModuleNotFoundError after the profile was applied (#66); doctor names it, and the fix."""
    python = {**CHECKUP["python"], "executable": "/home/me/venv/bin/python",
              "api_error": "ModuleNotFoundError: No module named 'pydantic'"}
    facts = {f"h{i}": HostFacts.from_dict({**CHECKUP, "host": f"h{i}", "python": python})
             for i in (1, 2)}
    said = judge.judge(_cluster(), facts, doctor.Request())
    (first, _) = [f for f in said.blocking if f.check == "lossbed's packages"]
    assert first.state == "ModuleNotFoundError: No module named 'pydantic'"
    assert first.fix.startswith("make setup VENV=/home/me/venv ")
    assert not [f for f in judge.judge(_cluster(), _facts(), doctor.Request()).blocking
                if f.check == "lossbed's packages"]
    assert judge.venv_of("/opt/env/bin/python3.12") == "/opt/env"
    assert judge.venv_of("python3") == "/path/to/venv"


def test_the_ranks_python_is_read_from_torchruns_first_line(tmp_path):
    from harness import job_checks
    from harness.torchrun import HostCommand

    direct, via_env = tmp_path / "torchrun", tmp_path / "torchrun-env"
    direct.write_text("#!/home/me/venv/bin/python3.12\nimport sys\n")
    via_env.write_text("#!/usr/bin/env python3\n")
    host = SimpleNamespace(name="h1")
    assert job_checks.ranks_python(HostCommand(host, [str(direct), "x.py"], {}, "/"),
                                   True) == "/home/me/venv/bin/python3.12"
    assert job_checks.ranks_python(HostCommand(host, [str(via_env)], {}, "/"), True) == "python3"
    assert job_checks.ranks_python(HostCommand(host, ["/usr/bin/python3", "-m",
                                                      "torch.distributed.run"], {}, "/"),
                                   True) == "/usr/bin/python3"
