"""Start one rank per host of a cluster, torchrun-style, and collect what they print.

Each rank gets RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT (rank 0's host; the rendezvous
port, which profiles keep reliable), gloo's and NCCL's settings that keep its collectives on
the host's emulated interface (testbed/impair/bypass.py) and lossbed's own settings: what a
rank is told is harness/rank_protocol.py's RankEnv.
If any rank fails, the others are stopped; no rank outlives the launch.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness import rank_protocol
from harness.rank_protocol import ControllerEnv, RankEnv
from harness.transport import auth
from testbed import ports
from testbed.errors import TimedOut
from testbed.impair import bypass

if TYPE_CHECKING:  # (the contract, for annotations: no import at run time)
    from testbed.clusters.contract import Cluster
    from testbed.host.hosts import Host


log = logging.getLogger(__name__)
@dataclass
class RankResult:
    rank: int
    host: str
    returncode: int
    stdout: str
    stderr: str


def check_environment() -> None:
    """The controller's LOSSBED_* settings that ranks get, parsed here before anything is
    applied or launched (a rank would only fail with them minutes later)."""
    ControllerEnv.from_env().check()


def rank_slots(cluster: Cluster) -> list[tuple[Host, int]]:
    """(host, local rank) for every rank: one per host, or one per GPU where the inventory
    gives lossbed_gpus. The local rank counts the ranks of one machine (it picks a rank's
    GPU): namespace hosts all live on this machine, so there it is the rank itself."""
    slots = [(host, local) for host in cluster.hosts
             for local in range(max(1, host.gpus))]
    if cluster.shares_this_machine:
        return [(host, rank) for rank, (host, _) in enumerate(slots)]
    return slots


def rank_env(cluster: Cluster, rank: int, told: dict | None = None) -> dict:
    """Rank `rank`'s environment: its place and what it is told (rank_protocol.RankEnv:
    `told` sets its other fields, typed), the settings that keep its collectives on the
    impaired interface (bypass), the controller's forwarded choices."""
    slots = rank_slots(cluster)
    host, local = slots[rank]
    chosen = ControllerEnv.from_env()
    fields = dict(rank=rank, world=len(slots), local_rank=local,
                  master_addr=cluster.hosts[0].address, master_port=ports.RENDEZVOUS,
                  address=host.address, mtu=cluster.mtu, drop_mask=chosen.drop_mask,
                  backend=chosen.backend or "gloo", rdma_device=chosen.rdma_device)
    env = {**RankEnv(**{**fields, **(told or {})}).to_env(), **bypass.pinned_env(cluster, host),
           "PYTHONPATH": host.project, "OMP_NUM_THREADS": "1"}
    return env


def segmentation_faithful(profile) -> bool:
    """Whether the ranks' transports may hand the kernel whole sends to cut (UDP
    segmentation offload) under the impairment `profile` applies: only where the impairment
    sees the datagrams after they were cut, at the receiver's ingress (hosts run with
    receive offloads off, so nothing merges them again). At the sender's egress, tc and
    nftables see the send before it is cut and would lose its datagrams together, as one
    burst."""
    return profile.direction == "ingress"


def rank_settings(profile) -> dict:
    """What the ranks are told about the impairment `profile` applies: RankEnv's fields."""
    return {"segmentation": segmentation_faithful(profile)}


def failure_report(failed: list[RankResult], what: str) -> str:
    """Which ranks failed and why. The rank that failed first is usually not the one a
    peer's error names ("Connection closed by peer" is the consequence): ranks killed by
    the launcher (-9) come last, the others each with the end of their output."""
    ordered = sorted(failed, key=lambda r: (r.returncode == -9, "closed by peer" in r.stderr,
                                            r.rank))
    first = ordered[0]
    lines = [f"{what} failed on rank {first.rank} ({first.host}), exit {first.returncode}:",
             first.stderr.strip()[-3000:]]
    for other in ordered[1:]:
        tail = other.stderr.strip().splitlines()[-3:]
        lines.append(f"--- rank {other.rank} ({other.host}), exit {other.returncode}: "
                     + " / ".join(tail))
    return "\n".join(lines)


def _kill(proc) -> None:
    """SIGKILL to a rank's process group (a VM's rank: in the VM, see
    testbed/clusters/vm/process.py)."""
    if isinstance(proc, subprocess.Popen):
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.kill_group()


# Once one rank (or host) failed, how long the others get to notice and say why before they
# are stopped: a peer of a dead rank fails only at its next collective's timeout, and what
# it says is often the clearest account of the failure.
FAILURE_GRACE_S = 30.0
FAILURE_GRACE_MEANS = ("once one host failed, how long the others get to end by themselves "
                       "(and say why) before they are stopped")
# A launch's limit unless --timeout-s says otherwise: past it the ranks are stopped and the
# impairment cleared (testbed.errors.TimedOut, exit 124). A run of train's defaults takes
# about a minute here, the default bench's one launch about 13 minutes
TRAIN_TIMEOUT_S = 2 * 3600.0
BENCH_TIMEOUT_S = 4 * 3600.0
TIMEOUT_MEANS = ("the whole launch's limit in seconds: past it the ranks are stopped, the "
                 "impairment cleared, and the command exits 124 (timed out)")


def run(cluster: Cluster, module: str, args: list[str], *, timeout_s: float = 600,
        told: dict | None = None, echo_rank0=None, answer_rank0=None, live=None,
        authenticate: bool = True,
        failure_grace_s: float = FAILURE_GRACE_S) -> list[RankResult]:
    """Run `python -m module args` as one rank per host and wait for all; `told`: fields
    of what every rank is told (rank_protocol.RankEnv's, e.g. segmentation, transport). If
    one fails, the others get failure_grace_s to notice and say why, then are stopped.
    echo_rank0(line) is called with each line rank 0 writes to stderr as it comes
    (progress). authenticate=False (a network only the experiment uses: the profile says
    `isolated`) gives the ranks no key, and their datagrams go unsealed.

    answer_rank0(line) is called with each line rank 0 writes to stdout as it comes; what it
    returns (a string, or None for nothing) is written to rank 0's stdin. That is how the
    controller and rank 0 take turns (the train worker waits at each run boundary while the
    controller reads the kernel's counters). Every rank's stdin is a pipe from here: on a
    remote host through SSH and testbed.host.guard, on a VM through its exec channel.
    live(said) is called with each live mark (rank_protocol.Live) any rank prints, as it
    comes (the ranks print them where told `live`: metrics served)."""
    procs = []
    slots = rank_slots(cluster)
    # A fresh key for this launch's datagrams (harness.transport.auth), to every rank in
    # its environment: never through the store or the network lossbed impairs.
    key = auth.new_key() if authenticate else None
    local = cluster.shares_this_machine
    try:
        for rank, (host, _) in enumerate(slots):
            env = rank_env(cluster, rank, {**(told or {}), "key": key})
            if local:  # a local rank inherits this environment; a remote or VM one has its own
                # the project first, then what this process had on its path (kept, not lost)
                path = [env["PYTHONPATH"], *filter(None, [os.environ.get("PYTHONPATH")])]
                env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(path)}
                if not authenticate:
                    env.pop(rank_protocol.KEY, None)
            procs.append(host.popen([cluster.rank_python(host), "-m", module, *args], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True,
                                    cwd=host.project))
        outputs = [([], []) for _ in procs]

        def pump(stream, sink, echo, live_marks=False):
            for line in stream:
                sink.append(line)
                if echo:
                    echo(line.rstrip("\n"))
                if live_marks and (said := rank_protocol.Live.read(line)) is not None:
                    live(said)

        def answer(line: str) -> None:
            reply = answer_rank0(line.rstrip("\n"))
            if reply is not None:
                try:
                    procs[0].stdin.write(reply + "\n")
                    procs[0].stdin.flush()
                except (BrokenPipeError, OSError):
                    pass  # rank 0 is gone: its exit code tells why

        threads = []
        for i, p in enumerate(procs):
            threads.append(threading.Thread(
                target=pump, args=(p.stdout, outputs[i][0],
                                   answer if i == 0 and answer_rank0 else None,
                                   live is not None),
                daemon=True))
            threads.append(threading.Thread(
                target=pump, args=(p.stderr, outputs[i][1], echo_rank0 if i == 0 else None),
                daemon=True))
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout_s
        while any(t.is_alive() for t in threads):
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                # One rank failed: give the others the chance to notice and say why, then
                # stop them.
                grace = time.monotonic() + failure_grace_s
                while any(t.is_alive() for t in threads) and time.monotonic() < grace:
                    time.sleep(0.1)
                break
            if time.monotonic() > deadline:
                raise TimedOut(f"{module} timed out: its ranks ran past --timeout-s "
                               f"{timeout_s:g} and were stopped (the impairment is cleared); "
                               "give a longer --timeout-s for a longer run")
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                _kill(p)
        for p in procs:
            p.wait()
    for t in threads:
        t.join(5)
    return [RankResult(rank, slots[rank][0].name, p.returncode,
                       "".join(outputs[rank][0]), "".join(outputs[rank][1]))
            for rank, p in enumerate(procs)]
