"""What each host has, gathered on every host at once (the `checkup` agent operation:
testbed/host/checkup.py) and typed here: the judge reads attributes, not keys, and a host
that cannot be reached is a fact too (its reason), not a crash."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import LossbedError

PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


def _known(cls, values: dict) -> dict:
    """The keys of values cls declares (a newer host's checkup may say more)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in values.items() if k in names}


@dataclass(frozen=True, kw_only=True)
class PythonFacts:
    """The ranks' interpreter on a host: its version, lossbed's compiled core, torch, CUDA,
    GPUs and NCCL; error: why it could not be examined."""

    executable: str | None = None
    version: str | None = None
    error: str | None = None
    core: str | None = None
    core_error: str | None = None
    torch: str | None = None
    torch_error: str | None = None
    cuda_build: str | None = None
    cuda_available: bool = False
    gpus: list[str] = field(default_factory=list)
    nccl: str | None = None
    api_error: str | None = None  # harness.api (what the ranks import) could not be imported

    def get(self, name: str, default=None):  # (the JSON's readers: facts["python"].get)
        value = getattr(self, name, default)
        return default if value is None else value


@dataclass(frozen=True, kw_only=True)
class NicFacts:
    """The interface lossbed impairs; error: why it could not be examined."""

    name: str | None = None
    error: str | None = None
    mtu: int | None = None
    speed_mbit: int | None = None
    addresses: list[str] = field(default_factory=list)
    carries_default_route: bool = False
    carries_ssh_session: bool = False
    offloads_on: list[str] | None = None  # None: not known (offloads_error says why)
    offloads_error: str | None = None


@dataclass(frozen=True, kw_only=True)
class HostFacts:
    """One host's facts; unreachable: why none could be read (the rest then empty)."""

    host: str
    unreachable: str | None = None
    kernel: str | None = None
    namespaces: bool = False
    cap_net_admin: bool = False
    commands: dict[str, str | None] = field(default_factory=dict)  # name -> path, or None
    modules: dict[str, str | None] = field(default_factory=dict)   # name -> state, or None
    backends: dict[str, str | None] = field(default_factory=dict)  # name -> None, or why not
    nic: NicFacts = field(default_factory=NicFacts)
    python: PythonFacts | None = None  # None: not examined (one interpreter per machine)
    rdma_devices: list[str] = field(default_factory=list)
    hardware_rdma: list[str] = field(default_factory=list)
    other_interfaces: dict[str, list[str]] = field(default_factory=dict)
    gpu_driver: str | None = None
    clock_offset_s: float = 0.0
    clock_uncertainty_s: float = 0.0

    @classmethod
    def from_dict(cls, values: dict) -> HostFacts:
        known = _known(cls, values)
        known["nic"] = NicFacts(**_known(NicFacts, values.get("nic") or {}))
        if values.get("python") is not None:
            known["python"] = PythonFacts(**_known(PythonFacts, values["python"]))
        return cls(**known)

    def backend_is_best(self, name: str) -> bool:
        """Whether `name` is the best loss backend this host's kernel offers (the engine's
        order of preference)."""
        from testbed.impair.registry import PREFERENCE

        available = [b for b in PREFERENCE if self.backends.get(b, "absent") is None]
        return bool(available) and available[0] == name


def clock_offset(host, rounds: int = 5) -> tuple[float, float]:
    """(the host's clock minus this machine's, ± half the shortest round trip): the round
    trip with the least delay bounds the offset tightest, as NTP takes it. The host reads its
    clock with date(1): one exec, no interpreter starting inside the round trip."""
    best = None
    for _ in range(rounds):
        before = time.time()
        read = host.run(["date", "+%s.%N"], check=True)
        after = time.time()
        there = float(read.stdout.decode().strip())
        if best is None or after - before < best[1] * 2:
            best = (there - (before + after) / 2, (after - before) / 2)
    return best


# What reaching a host can fail with: its agent or SSH (LossbedError, OSError), a
# command that failed or timed out, an answer that is not what checkup writes
UNREACHABLE = (LossbedError, OSError, subprocess.SubprocessError, ValueError, KeyError)


def gather(cluster, with_python: bool = True) -> dict[str, HostFacts]:
    """Every host's facts, hosts at once; each with its clock offset against this machine."""
    hosts = list(cluster.hosts)
    local = cluster.shares_this_machine

    def one(indexed):
        index, host = indexed
        payload = {"python": cluster.rank_python(host),
                   "project": host.project or PROJECT_ROOT,
                   # hosts on this machine share one interpreter: examine it once
                   "python_facts": with_python and (index == 0 or not local)}
        try:
            facts = host.agent_call("checkup", payload)
            facts["clock_offset_s"], facts["clock_uncertainty_s"] = clock_offset(host)
        except UNREACHABLE as err:  # an unreachable host is a finding, not a crash
            return host.name, HostFacts(host=host.name,
                                        unreachable=f"{type(err).__name__}: {err}")
        return host.name, HostFacts.from_dict(facts)

    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        found = dict(pool.map(one, enumerate(hosts)))
    if local and with_python and hosts:
        first = found[hosts[0].name].python
        for name, facts in found.items():
            if first is not None and facts.unreachable is None:
                found[name] = dataclasses.replace(facts, python=first)
    return found
