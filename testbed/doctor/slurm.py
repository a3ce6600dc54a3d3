"""`lossbed doctor --slurm`: what lossbed needs on a Slurm cluster, checked from a node, each
missing piece with its fix (the same findings and table as every other doctor):

    commands       srun and scontrol on PATH (the user's: module load slurm)
    allocation     inside a job of two or more nodes (salloc, sbatch)
    policy         the admin's configuration of lossbed's agent (policy.py)
    agent          every node's agent answers, on the admin's interface (through srun)
    epilog         Slurm's Epilog runs lossbed's (testbed/slurm/epilog.py)

Nothing is applied, nothing is changed.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess

from testbed.doctor.request import Finding, Report
from testbed.errors import LossbedError
from testbed.slurm import hostlist, policy

ADMIN_FIX = ("the admin installs it: ansible-playbook provision.yml --tags lossbed_slurm -e "
             "lossbed_slurm_enabled=true (docs/guides/slurm.md)")


def examine(env=None) -> Report:
    env = os.environ if env is None else env
    here = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    found: list[Finding] = []
    for command in ("srun", "scontrol"):
        where = shutil.which(command)
        found.append(Finding(here, f"command {command}", where or "not on PATH",
                             ok=where is not None, needed=True,
                             fix="module load slurm, or apt-get install slurm-client"))
    nodes = _allocation(env, here, found)
    try:
        config = policy.load_config()
        found.append(Finding(here, "agent policy", f"{config.source}: allows "
                             f"{', '.join(config.allowed_profiles)} up to a loss of "
                             f"{config.max_loss:g} on {config.interface}", ok=True,
                             needed=True, fix=""))
    except LossbedError as err:
        found.append(Finding(here, "agent policy", str(err), ok=False, needed=True,
                             fix=ADMIN_FIX))
    if nodes and shutil.which("srun"):
        found += _agents(env, nodes)
    found.append(_epilog(here))
    return Report(facts={}, findings=found)


def _allocation(env, here: str, found: list[Finding]) -> list[str]:
    job, listed = env.get("SLURM_JOB_ID"), env.get("SLURM_JOB_NODELIST", "")
    try:
        nodes = hostlist.expand(listed) if job and listed else []
    except LossbedError as err:
        found.append(Finding(here, "allocation", str(err), ok=False, needed=True,
                             fix="run inside an allocation: salloc -N 2"))
        return []
    ok = len(nodes) >= 2
    state = (f"job {job} on {len(nodes)} node(s): {', '.join(nodes)}" if job
             else "not inside a Slurm job (SLURM_JOB_ID is not set)")
    found.append(Finding(here, "allocation", state, ok=ok, needed=True,
                         fix="salloc -N 2 lossbed doctor --slurm (a network needs two nodes)"))
    return nodes if job else []


def _agents(env, nodes: list[str]) -> list[Finding]:
    from concurrent.futures import ThreadPoolExecutor

    from testbed.clusters.slurm import SrunHost

    def asked(node: str) -> Finding:
        host = SrunHost(name=node, address="", job=env["SLURM_JOB_ID"])
        try:
            said = host.agent_call("describe", {})
            ok = said.get("mtu") is not None
            state = (f"answers: impairs {said['interface']} (MTU {said['mtu']})" if ok else
                     f"answers, but the node has no interface {said['interface']!r}")
            fix = "" if ok else "the admin fixes lossbed_slurm_interface (the data-plane NIC)"
        except (LossbedError, subprocess.SubprocessError) as err:
            ok, state, fix = False, str(err), ADMIN_FIX
        return Finding(node, "agent", state, ok=ok, needed=True, fix=fix)

    with ThreadPoolExecutor(max_workers=min(8, len(nodes))) as pool:  # (a job step each)
        return list(pool.map(asked, nodes))


def _epilog(here: str) -> Finding:
    """Whether Slurm's Epilog (scontrol show config) runs lossbed's."""
    fix = ("the admin sets Epilog=/etc/slurm/epilog.d/* with lossbed's there (the "
           "lossbed_slurm role does); without it a cancelled job's impairment lasts until "
           "its lease ends")
    try:
        done = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        return Finding(here, "epilog", f"scontrol show config: {err}", ok=False, needed=True,
                       fix=fix)
    if done.returncode != 0:
        return Finding(here, "epilog", f"scontrol show config failed: "
                       f"{(done.stderr.strip().splitlines() or ['no reason given'])[-1]}",
                       ok=False, needed=True, fix="reach slurmctld (SLURM_CONF, munge)")
    setting = next((line.split("=", 1)[1].strip() for line in done.stdout.splitlines()
                    if line.split("=", 1)[0].strip() == "Epilog"), "")
    scripts = [p for pattern in setting.split(",") if pattern and pattern != "(null)"
               for p in sorted(glob.glob(pattern.strip()))]
    ours = [p for p in scripts if _runs_lossbeds(p)]
    return Finding(here, "epilog", f"Epilog={setting or '(none)'}" + (
        f": {ours[0]} runs lossbed's" if ours else ": none of it runs lossbed's"),
        ok=bool(ours), needed=True, fix=fix)


def _runs_lossbeds(path: str) -> bool:
    try:
        with open(path, errors="replace") as f:
            return "testbed.slurm.epilog" in f.read(65536)
    except OSError:
        return False
