"""The Ansible roles and playbooks lint clean (production profile) and parse; the nightly
workflow validates against GitHub's workflow schema and only runs commands that exist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers import ansible_env

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
WORKFLOW = REPO / ".github" / "workflows" / "nightly.yml"


def test_ansible_lint_production_profile_passes(tmp_path):
    result = subprocess.run([str(BIN / "ansible-lint"), "--profile", "production", "--offline",
                             "--nocolor"], cwd=REPO / "ansible", capture_output=True, text=True,
                            timeout=600, env=ansible_env(tmp_path), stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Profile 'production' was required, and it passed" in result.stderr + result.stdout


def syntax_check(tmp_path) -> subprocess.CompletedProcess:
    # stdin of its own: Ansible refuses a non-blocking stdin, and the test process's may be
    # left non-blocking by an earlier test (seen in full suites started in the background)
    return subprocess.run([str(BIN / "ansible-playbook"), "--syntax-check", "-i",
                           "inventory.example.yml", "provision.yml", "teardown.yml",
                           "bench.yml"], cwd=REPO / "ansible", capture_output=True, text=True,
                          env=ansible_env(tmp_path), stdin=subprocess.DEVNULL, timeout=300)


def test_playbooks_pass_the_syntax_check(tmp_path):
    result = syntax_check(tmp_path)
    assert result.returncode == 0, result.stderr


def test_ansible_runs_when_the_test_process_stdin_is_non_blocking(tmp_path):
    """The full suite failed three Ansible tests with "Ansible requires blocking IO ...
    <stdin>": the test process's stdin had been left non-blocking, and Ansible inherited it."""
    import fcntl
    import os

    flags = fcntl.fcntl(0, fcntl.F_GETFL)
    fcntl.fcntl(0, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    try:
        result = syntax_check(tmp_path)
    finally:
        fcntl.fcntl(0, fcntl.F_SETFL, flags)
    assert result.returncode == 0, result.stderr


def test_every_role_variable_is_prefixed_and_defaulted():
    for role in (REPO / "ansible" / "roles").iterdir():
        defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
        assert defaults, role.name
        for name in defaults:
            assert name.startswith(role.name + "_"), (role.name, name)


def test_the_example_inventory_is_one_lossbed_reads():
    from testbed.clusters import inventory

    hosts = inventory.load(REPO / "ansible" / "inventory.example.yml")
    assert set(hosts) == {"gpu1", "gpu2"} and hosts["gpu1"].lossbed_gpus == 8


def test_workflow_validates_against_the_github_schema():
    result = subprocess.run([str(BIN / "check-jsonschema"), "--builtin-schema",
                             "vendor.github-workflows", str(WORKFLOW)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_workflow_commands_exist():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert "schedule" in workflow[True] and "workflow_dispatch" in workflow[True]  # "on:"
    job = workflow["jobs"]["bench"]
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    runs = " ".join(step.get("run", "") for step in job["steps"])
    for target in ("setup-bench", "provision"):
        assert f"make {target} VENV=\"$LOSSBED_VENV\"" in runs
        dry = subprocess.run(["make", "-n", target, "INVENTORY=ansible/inventory.example.yml"],
                             cwd=REPO, capture_output=True, text=True)
        assert dry.returncode == 0, dry.stderr
    for sub in ("doctor", "bench", "compare", "clear"):
        assert f'"$LOSSBED_VENV/bin/lossbed" {sub}' in runs
        help_ = subprocess.run([sys.executable, "-m", "harness.cli", sub, "--help"], cwd=REPO,
                               capture_output=True, text=True)
        assert help_.returncode == 0, help_.stderr
        if sub != "compare":  # compare reads two files; the others reach the hosts
            assert "--inventory" in help_.stdout, sub


def test_update_baseline_also_runs_after_a_regression():
    """The compare step fails on a regression; replacing the baseline is what a person asks
    for exactly then, so that step must not be skipped by the failure before it."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    steps = {s["name"]: s for s in workflow["jobs"]["bench"]["steps"]}
    condition = steps["Store this run as the baseline"]["if"]
    assert "update_baseline" in condition
    assert "!cancelled()" in condition or "always()" in condition, condition
    script = steps["Store this run as the baseline"]["run"]
    assert 'if [ -f "results/$profile/summary.json" ]' in script  # only completed benches


def test_the_base_role_installs_the_bench_set_only_into_the_ranks_python():
    """A GPU host gets setup-bench's system packages and `make setup-bench` (none of the test
    set-up: qemu, sshd, the RDMA userland, a guest kernel), into the environment of
    lossbed_python when the inventory names one."""
    from testbed import system_packages

    role = REPO / "ansible" / "roles" / "lossbed_base"
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    assert set(defaults["lossbed_base_packages"]) - {"python3"} == set(
        system_packages.packages_for("bench"))
    tasks = yaml.safe_load((role / "tasks" / "main.yml").read_text())
    commands = [t["ansible.builtin.command"] for t in tasks if "ansible.builtin.command" in t]
    assert len(commands) == 1 and "setup-bench VENV={{ lossbed_base_venv }}" in commands[0]
    assert "lossbed_python" in defaults["lossbed_base_python"]
    assert defaults["lossbed_base_venv"] == "{{ lossbed_base_python | dirname | dirname }}"
    verify = yaml.safe_load((REPO / "ansible" / "roles" / "lossbed_verify" / "tasks" /
                             "main.yml").read_text())
    assert any("-m testbed.doctor" in str(t.get("ansible.builtin.raw", "")) for t in verify)
