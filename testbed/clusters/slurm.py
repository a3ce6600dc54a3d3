"""A Slurm allocation as a cluster: `lossbed run|train|bench --slurm` inside salloc or an
sbatch script (or anywhere SLURM_JOB_ID is set and no other cluster is named).

    hosts      the job's nodes (SLURM_JOB_NODELIST, expanded as `scontrol show hostnames`
               does), in that order, each at its NodeAddr or, where the admin's policy
               names another (its `addresses`: a data-plane NIC on its own network), there
    commands   through srun, one step per command on one node (--overlap: beside the job's
               other steps); torchrun's agents too, one per node, the rendezvous on the first
    impairment the node's lossbed agent (testbed/slurm/agent.py), which runs as root and
               applies what the admin allows; the user needs no root and no SSH. Its lease
               reverts a node whose job stopped renewing; the Epilog clears at job end.

scancel ends the job's steps (torchrun and its ranks with them) and runs the Epilog on every
node. Nothing here is root's: lossbed's state for the job is the user's own
(testbed/clusters/state.py), removed when the command ends.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from testbed.clusters import state
from testbed.clusters.contract import NamedHosts
from testbed.errors import ClusterError, EnvironmentProblem, LossbedError, UsageError
from testbed.host.hosts import PROJECT_ROOT
from testbed.slurm import hostlist, scontrol

log = logging.getLogger(__name__)
KIND = "slurm"
DEFAULT_LEASE_S = 120.0
AGENT_TIMEOUT_S = 120.0
# A clear waits less: it runs as the job ends, when Slurm gives lossbed KillWait seconds
# (30 by default) before it kills it, and srun to a node that died but is not declared down
# yet does not return. What a clear could not reach, the node's Epilog clears at job end
# (and its agent's lease reverts if the node comes back before that).
CLEAR_TIMEOUT_S = 20.0
# what srun says when the job it would add a step to has ended
JOB_ENDED = ("has expired", "already completing or completed", "Job has already finished")
ALLOCATION_FIX = ("Run it inside an allocation: salloc -N 2 lossbed run --slurm ..., or "
                  "from an sbatch script")


def in_allocation(env=os.environ) -> bool:
    """Whether this process runs inside a Slurm job (SLURM_JOB_ID is set)."""
    return bool(env.get("SLURM_JOB_ID"))


@dataclass
class SrunHost:
    """A node of the allocation: commands run there through srun, its impairment through
    its lossbed agent."""

    name: str
    address: str
    job: str
    ifname: str = ""
    gpus: int = 0
    python: str = sys.executable  # (the user's environment, on the cluster's shared file system)
    project: str = PROJECT_ROOT
    mgmt_address: str = ""

    def srun_argv(self, argv) -> list[str]:
        """`argv` as one step of the job on this node, beside its other steps."""
        return ["srun", f"--jobid={self.job}", "--overlap", "--nodes=1", "--ntasks=1",
                f"--nodelist={self.name}", "--quiet", "--kill-on-bad-exit=1",
                *[str(a) for a in argv]]

    def _env(self, given: dict | None) -> dict[str, str]:
        # srun itself needs the job's environment (SLURM_*, PATH); the step gets it all
        # (srun's --export=ALL), the caller's variables over it
        return {**os.environ, **(given or {})}

    def run(self, argv, *, check=False, timeout=None, input=None):
        done = subprocess.run(self.srun_argv(argv), capture_output=True, timeout=timeout,
                              input=input, env=self._env(None))
        done.args = list(argv)
        if check:
            done.check_returncode()
        return done

    def popen(self, argv, **kwargs):
        kwargs["env"] = self._env(kwargs.get("env"))
        return subprocess.Popen(self.srun_argv(argv), **kwargs)

    def exec_passthrough(self, argv) -> int:
        os.execvpe("srun", self.srun_argv(argv), self._env(None))
        return 127  # not reached

    def agent_call(self, op: str, payload: dict):
        """One operation by the node's lossbed agent (through testbed.slurm.client there)."""
        request = json.dumps({"payload": payload}).encode()
        argv = [self.python, "-m", "testbed.slurm.client", op]
        waits = CLEAR_TIMEOUT_S if op == "clear" else AGENT_TIMEOUT_S
        try:
            done = subprocess.run(self.srun_argv(argv), capture_output=True, timeout=waits,
                                  input=request, env=self._env({"PYTHONPATH": self.project}))
        except subprocess.TimeoutExpired:
            raise ClusterError(f"node {self.name}: no answer from srun in {waits:.0f} s (a "
                               "node lost?)" + (": its Epilog clears what the job held there "
                                                "when the job ends" if op == "clear" else "")
                               ) from None
        lines = [ln for ln in done.stdout.decode(errors="replace").splitlines()
                 if ln.startswith("{")]
        said = done.stderr.decode(errors="replace").strip()
        if not lines and any(words in said for words in JOB_ENDED):
            # (cancelled, timed out, a node failed: Slurm says which in the job's output)
            raise ClusterError(f"node {self.name}: the Slurm job ended before lossbed was "
                               f"done there ({said.splitlines()[-1]}): its Epilog clears "
                               "what the job held on its nodes")
        if not lines:
            raise ClusterError(f"node {self.name}: srun gave no answer (exit "
                               f"{done.returncode}): {said[-1500:]}")
        reply = json.loads(lines[-1])
        if "error" in reply:
            from testbed.slurm.policy import Refused

            kind = Refused if reply.get("type") == "Refused" else LossbedError
            raise kind(f"node {self.name}: {reply['error']}")
        return reply["result"]

    def netlink(self):
        raise LossbedError(f"node {self.name}: its network is reached through its lossbed "
                           "agent, not from this process")

    def socket(self, *args, **kwargs):
        raise LossbedError(f"node {self.name}: its sockets live on that node: run there "
                           "(srun), not in this process")

    def offloads(self, ifname: str | None = None) -> dict[str, bool]:
        raise LossbedError(f"node {self.name}: its interface is read by its agent (doctor)")


@dataclass
class SlurmCluster(NamedHosts):
    """The allocation's nodes, as the Cluster contract (testbed/clusters/contract.py)."""

    job: str
    hosts: list[SrunHost]
    mtu: int
    lease: float = DEFAULT_LEASE_S
    kind: str = field(default=KIND, init=False)
    ssh: bool = field(default=False, init=False)

    @property
    def name(self) -> str:
        return f"slurm-{self.job}"

    @property
    def state_dir(self) -> Path:
        return state.state_root() / ".slurm" / self.name

    @property
    def shares_this_machine(self) -> bool:
        return False

    @property
    def lease_s(self) -> float:
        return self.lease

    @property
    def force_interface(self) -> bool:
        return False  # (the admin named the interface; the agent never forces another)

    def connect(self) -> None:
        pass  # (every node's agent answered when the cluster was made)

    def close(self) -> None:
        """lossbed's record of this job, the user's own, removed (the kernel's side is the
        agents', cleared at the run's end and, whatever happens, by the Epilog)."""
        folder = self.state_dir
        if folder.is_dir() and not folder.is_symlink() and folder.parent.name == ".slurm":
            shutil.rmtree(folder, ignore_errors=True)

    def rank_python(self, host) -> str:
        return host.python

    def status(self) -> dict:
        return {"kind": KIND, "job": self.job, "mtu": self.mtu,
                "hosts": [{"name": h.name, "address": h.address, "interface": h.ifname}
                          for h in self.hosts]}


def from_allocation(env=None, *, lease_s: float = DEFAULT_LEASE_S) -> SlurmCluster:
    """The allocation this process runs in, every node's agent asked what it impairs; or a
    clear error, before anything is applied or started anywhere."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID", "")
    if not job:
        raise UsageError("--slurm", "no Slurm allocation here (SLURM_JOB_ID is not set)",
                         ALLOCATION_FIX)
    if not job.isdigit():
        raise UsageError("SLURM_JOB_ID", f"{job!r} is not a job id", ALLOCATION_FIX)
    listed = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not listed:
        raise UsageError("SLURM_JOB_NODELIST", f"job {job} names no nodes", ALLOCATION_FIX)
    nodes = hostlist.expand(listed)
    twice = sorted({n for n in nodes if nodes.count(n) > 1})
    if twice:
        raise UsageError("SLURM_JOB_NODELIST", f"names {twice[0]} twice", ALLOCATION_FIX)
    counted = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    if counted and counted.isdigit() and int(counted) != len(nodes):
        raise UsageError("SLURM_JOB_NODELIST", f"names {len(nodes)} nodes, and "
                         f"SLURM_JOB_NUM_NODES says {counted}", ALLOCATION_FIX)
    if len(nodes) < 2:
        raise UsageError("--slurm", f"job {job} holds one node ({nodes[0]}): there is no "
                         "link to impair", "Ask for two nodes or more: salloc -N 2 ...")
    for command in ("srun", "scontrol"):
        if shutil.which(command) is None:
            raise EnvironmentProblem(f"{command} is not on PATH: load Slurm's module (module "
                                     "load slurm) or install slurm-client")
    addresses = scontrol.node_addresses(nodes)
    hosts = [SrunHost(name=n, address=addresses[n], job=job) for n in nodes]
    with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
        described = list(pool.map(_describe, hosts))
    for host, facts in zip(hosts, described, strict=True):
        host.ifname = facts["interface"]
        if facts.get("address") and facts["address"] != host.address:
            # the data plane is another network than Slurm's: the agent's admin says where
            host.mgmt_address, host.address = host.address, facts["address"]
    mtus = {facts["mtu"] for facts in described}
    if len(mtus) != 1 or None in mtus:
        raise ClusterError("the nodes' data-plane interfaces differ in MTU or lack one: "
                           + ", ".join(f"{h.name} {f['interface']} MTU {f['mtu']}"
                                       for h, f in zip(hosts, described, strict=True)))
    return SlurmCluster(job=job, hosts=hosts, mtu=mtus.pop(), lease=lease_s)


def _describe(host: SrunHost) -> dict:
    try:
        return host.agent_call("describe", {})
    except LossbedError as err:
        raise ClusterError(f"{err} (lossbed needs its agent on every node of the job)") \
            from None
