"""A real Slurm on namespace hosts, for the tests: Debian's munged, slurmctld and one slurmd
per namespace host (NodeAddr = the host's address), started here and stopped after, with
lossbed's privileged agent on every node and its Epilog configured as an admin would
(docs/guides/slurm.md). ../shared/recipes/slurm-and-prometheus.md is how it was first run.

    with slurm_on(cluster, folder, allowed=["random-loss"]) as slurm:
        slurm.sbatch(script, user="nobody")

Everything lives in `folder` (configuration, keys, spools, logs) and in the cluster's own
namespaces; the daemons' PIDs are recorded at start and stopped at the end, and what the
cluster's namespaces still run is then killed with them (slurmstepd is reparented to PID 1).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.host.hosts import is_running, kill_namespace_processes, processes_in_namespaces

REPO = Path(__file__).resolve().parents[1]
CTLD_PORT, SLURMD_PORT = 16817, 16818
CTLD_HOSTNAME = "slurmctl"  # (slurmctld runs in the first node's namespace, under this name)
READY_S = 30.0


def available() -> str | None:
    """Why a real Slurm cannot run here, or None."""
    missing = [c for c in ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol",
                           "nsenter", "unshare") if shutil.which(c) is None]
    if missing:
        return f"needs {', '.join(missing)} (make setup installs slurmctld, slurmd, munge)"
    if os.geteuid() != 0:
        return "needs root (slurmd, namespaces)"
    return None


@dataclass
class Slurm:
    """A running Slurm: its configuration and how to reach it from the test."""

    cluster: object
    folder: Path
    conf: Path
    agent_conf: Path
    pids: list[int] = field(default_factory=list)
    ctld_pid: int = 0

    @property
    def nodes(self) -> list[str]:
        return [h.name for h in self.cluster.hosts]

    def daemons(self) -> list[int]:
        """The PIDs of munged, slurmctld (and its slurmscriptd), the slurmds and the agents,
        and the hosts' own sshd where they have a management network: what runs in the
        nodes' namespaces between jobs."""
        from testbed.clusters import sshd

        sshds = [sshd.running_pid(self.cluster.state_dir, h) for h in self.cluster.hosts]
        return [*self.pids, *_children(self.ctld_pid), *filter(None, sshds)]

    def env(self) -> dict[str, str]:
        """What a Slurm command needs to find this Slurm (inherited by the jobs)."""
        return {**os.environ, "SLURM_CONF": str(self.conf),
                "LOSSBED_SLURM_AGENT_CONF": str(self.agent_conf)}

    def command(self, argv: list[str], *, user: str | None = None, timeout: float = 60,
                check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command, run from the first node (where slurmctld listens), as
        `user` (default: root)."""
        prefix = ["nsenter", f"--net=/run/netns/{self.cluster.hosts[0].namespace}"]
        if user is not None:
            prefix += ["setpriv", f"--reuid={user}", f"--regid={_gid(user)}", "--clear-groups"]
        done = subprocess.run([*prefix, *argv], env=self.env(), capture_output=True,
                              text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: "
                                 f"{done.stdout}\n{done.stderr}")
        return done

    def sbatch(self, script: str, *, user: str | None = None, workdir: Path,
               nodes: int = 2) -> str:
        """Submit `script` (a shell script's body) to `nodes` nodes; the job's id. Not
        requeued when a node fails (Slurm's default for batch jobs): an experiment's run
        is not started again on its own."""
        path = workdir / "job.sh"
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)
        done = self.command(["sbatch", "--parsable", "--no-requeue", f"--nodes={nodes}",
                             f"--chdir={workdir}", f"--output={workdir}/job.out",
                             str(path)], user=user)
        return done.stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        """The job's state (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...)."""
        done = self.command(["scontrol", "-o", "show", "job", job], check=False)
        for word in done.stdout.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "GONE"

    def wait(self, job: str, timeout: float = 300) -> str:
        """Until the job ended: its final state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(job)
            if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job} still {self.state(job)} after {timeout:.0f} s")

    def idle(self, timeout: float = READY_S) -> None:
        """Until every node is idle (no job left, its Epilog done)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = self.command(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
            if set(states) == set(self.nodes) and set(states.values()) == {"idle"}:
                return
            time.sleep(0.3)
        raise AssertionError(f"nodes not idle after {timeout:.0f} s: {done.stdout}"
                             f"{self.logs()}")

    def lose(self, host) -> None:
        """The node goes down as a machine does: its links down, then every process on it
        killed outright (slurmd, the job's steps, lossbed's agent: none gets to say or
        clear anything). It stays down."""
        links = subprocess.run(["ip", "-n", host.namespace, "-o", "link", "show"],
                               capture_output=True, text=True, check=True).stdout
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if name != "lo":
                subprocess.run(["ip", "-n", host.namespace, "link", "set", "dev", name,
                                "down"], check=True)
        for pids in processes_in_namespaces([host.namespace]).values():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                         for p in sorted(self.folder.glob("log/*.log")))


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(") ", 1)[1]
                                            .split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            pass
    return found


def _gid(user: str) -> int:
    return pwd.getpwnam(user).pw_gid


def role_files(**variables) -> dict[str, str]:
    """What the Ansible role lossbed_slurm writes (each copy task's dest and content), with
    its defaults and `variables` over them: the tests install exactly that."""
    import jinja2
    import yaml

    role = REPO / "ansible" / "roles" / "lossbed_slurm"
    values = {**yaml.safe_load((role / "defaults" / "main.yml").read_text()), **variables}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["to_json"] = json.dumps  # (Ansible's filter of that name)
    for _ in range(5):  # (defaults name other defaults)
        values = {k: env.from_string(v).render(values) if isinstance(v, str) else v
                  for k, v in values.items()}
    block = yaml.safe_load((role / "tasks" / "main.yml").read_text())[0]["block"]
    return {env.from_string(t["ansible.builtin.copy"]["dest"]).render(values):
            env.from_string(t["ansible.builtin.copy"]["content"]).render(values)
            for t in block if "ansible.builtin.copy" in t}


def _write_conf(folder: Path, cluster) -> Path:
    first = cluster.hosts[0]
    # Slurm on the management network where the hosts have one (the data plane apart, as on
    # a GPU cluster: the agent's policy names the data-plane addresses)
    nodes = "\n".join(f"NodeName={h.name} NodeHostname={h.name} "
                      f"NodeAddr={h.mgmt_address or h.address} CPUs=2 "
                      "RealMemory=1000 State=UNKNOWN" for h in cluster.hosts)
    conf = folder / "slurm.conf"
    conf.write_text(f"""\
ClusterName=lossbedtest
SlurmctldHost={CTLD_HOSTNAME}({first.mgmt_address or first.address})
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge/munge.sock
StateSaveLocation={folder}/ctld
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/run/slurmctld.pid
SlurmdPidFile={folder}/run/slurmd-%n.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
ReturnToService=2
MpiDefault=none
Epilog={folder}/epilog.d/*
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
{nodes}
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    return conf


def _start_munge(folder: Path) -> subprocess.Popen:
    munge = folder / "munge"
    munge.mkdir(mode=0o755)
    munge.chmod(0o755)  # munged refuses a socket folder others cannot search
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    proc = subprocess.Popen(["munged", "-F", "--force", f"--socket={munge}/munge.sock",
                             f"--key-file={key}", f"--log-file={folder}/log/munged.log",
                             f"--pid-file={munge}/munged.pid",
                             f"--seed-file={munge}/munged.seed"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(lambda: (munge / "munge.sock").exists(), "munged's socket", folder)
    return proc


def _wait_for(ready, what: str, folder: Path, timeout: float = READY_S) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not there after {timeout:.0f} s")
        time.sleep(0.1)


def _closed_to_others(path: Path) -> tuple[Path, Path] | None:
    """The folder on the way to `path` that other users cannot enter (a Python installed
    under /root, 0700), and its child on that way; None if every folder lets them through."""
    for parent in reversed(path.parents):
        if parent != Path("/") and not parent.stat().st_mode & 0o001:
            return parent, parent / path.relative_to(parent).parts[0]
    return None


def _opening(folder: Path) -> str:
    """Shell lines that, in a mount namespace of slurmd's own, let its jobs' users reach
    this Python (sys.executable, the interpreter it links to): the closed folder on its way
    is covered with an empty one that holds only that child (bound in). Nothing outside
    that namespace sees it; it ends with slurmd."""
    lines = []
    for target in {Path(sys.executable).resolve(), Path(sys.prefix).resolve()}:
        closed = _closed_to_others(target)
        if closed is None or any(str(closed[0]) in line for line in lines):
            continue
        blocked, child = closed
        stash = folder / "open" / child.name
        stash.mkdir(parents=True, exist_ok=True)
        lines.append(f"mount --bind {child} {stash} && mount -t tmpfs -o mode=755 tmpfs "
                     f"{blocked} && mkdir {child} && mount --bind {stash} {child}")
    return " && ".join(lines) or "true"


def _in_namespace(host, argv: list[str], folder: Path, name: str,
                  hostname: str | None = None, open_python: bool = False) -> subprocess.Popen:
    """`argv` inside the host's network namespace, with a hostname of its own (default: the
    host's; slurmd and slurmctld know themselves by it), logging to folder/log/NAME.out.
    open_python: in a mount namespace of its own where other users reach this Python."""
    out = open(folder / "log" / f"{name}.out", "wb")  # noqa: SIM115 (the daemon's, kept)
    mounts = ["--mount"] if open_python else []
    opening = f"{_opening(folder)} && " if open_python else ""
    return subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{host.namespace}", "unshare", "--uts", *mounts,
         "sh", "-c", f'{opening}hostname {hostname or host.name} && exec "$@"', "sh", *argv],
        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)})


@contextlib.contextmanager
def slurm_on(cluster, folder: Path, *, allowed: list[str], max_loss: float = 0.5):
    """Slurm on the cluster's hosts, lossbed's agent on each node allowing `allowed`
    profiles up to `max_loss`; stopped, and checked gone, on the way out."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    for sub in ("log", "run", "ctld", "spool", "agent"):
        (folder / sub).mkdir(mode=0o755, exist_ok=True)
    for h in cluster.hosts:
        (folder / "spool" / h.name).mkdir(mode=0o755)
    conf = _write_conf(folder, cluster)
    # the agent's policy, its service's command and the Epilog: the Ansible role's files
    agent_conf = folder / "agent.yaml"
    written = role_files(
        lossbed_slurm_allowed_profiles=allowed, lossbed_slurm_max_loss=max_loss,
        lossbed_slurm_interface=cluster.hosts[0].ifname, lossbed_slurm_project=str(REPO),
        lossbed_slurm_python=sys.executable, lossbed_slurm_config=str(agent_conf),
        lossbed_slurm_socket=f"{folder}/agent/{{node}}.sock",
        lossbed_slurm_state=f"{folder}/agent", lossbed_slurm_epilog_dir=f"{folder}/epilog.d",
        lossbed_slurm_addresses={h.name: h.address for h in cluster.hosts if h.mgmt_address})
    (folder / "epilog.d").mkdir(mode=0o755)
    for dest, content in written.items():
        if dest.endswith(".service"):
            agent_command = next(line.split("=", 1)[1] for line in content.splitlines()
                                 if line.startswith("ExecStart=")).split()
            continue
        Path(dest).write_text(content)
        Path(dest).chmod(0o755 if "epilog.d" in dest else 0o644)
    slurm = Slurm(cluster, folder, conf, agent_conf)
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_start_munge(folder))
        env = {"SLURM_CONF": str(conf)}
        os.environ.update(env)  # (the daemons below inherit it: nsenter keeps the environment)
        procs.append(_in_namespace(cluster.hosts[0], ["slurmctld", "-D", "-i", "-f", str(conf)],
                                   folder, "slurmctld", CTLD_HOSTNAME))
        slurm.ctld_pid = procs[-1].pid
        for h in cluster.hosts:
            procs.append(_in_namespace(h, ["slurmd", "-D", "-N", h.name, "-f", str(conf)],
                                       folder, f"slurmd-{h.name}", open_python=True))
            procs.append(_in_namespace(h, [*agent_command, "--node", h.name], folder,
                                       f"agent-{h.name}"))
        slurm.pids = [p.pid for p in procs]
        slurm.idle()
        yield slurm
    finally:
        os.environ.pop("SLURM_CONF", None)
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM) if p.pid != procs[0].pid else p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        # slurmstepd and a job's processes are reparented to PID 1: what still runs in the
        # cluster's namespaces is this Slurm's
        kill_namespace_processes([h.namespace for h in cluster.hosts])
        assert not [pid for pid in slurm.pids if is_running(pid)]
