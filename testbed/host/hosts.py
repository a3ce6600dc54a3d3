"""A host: something that runs commands and has a netlink session, wherever it lives.

The rest of lossbed (impairment backends, verification, the training launcher) talks to hosts
only through this interface, so the same code drives a namespace on this machine, a VM, or a
real machine over SSH.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from pyroute2 import IPRoute, netns
from pyroute2.ethtool.ioctl import IoctlEthtool

from testbed.host import namespaces, operations

log = logging.getLogger(__name__)
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])

# Offloads that merge packets into super-packets larger than the MTU. With them on, a loss
# rule would drop one 64 KB GSO packet where the wire would have lost one 1500 B packet.
# Matched by the kernel's feature names (ethtool -k names them), because the list grows with
# kernels: 6.18 added tx-tcp-accecn-segmentation, which the legacy TSO switch does not cover.
_MERGING_FEATURE = re.compile(r"(-segmentation$|^tx-gso-|^rx-gro|^rx-lro$|^rx-udp-gro-forwarding$)")


@runtime_checkable
class Host(Protocol):
    name: str
    """The host's name in its cluster (validated: never a path)."""
    address: str
    """Its address on the impaired (data-plane) network."""
    ifname: str
    """The interface lossbed impairs."""
    gpus: int
    """GPUs its ranks use, one rank each (an inventory's lossbed_gpus); 0: one rank, none."""
    project: str
    """Where lossbed's checkout lives on the host (ranks and the agent start there)."""
    mgmt_address: str
    """Where SSH reaches it when that is not `address` (a management network); "": none."""

    def run(
        self, argv: Sequence[str], *, check: bool = False, timeout: float | None = None,
        input: bytes | None = None,
    ) -> subprocess.CompletedProcess: ...

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen: ...

    def netlink(self) -> IPRoute: ...

    def agent_call(self, op: str, payload: dict): ...

    def exec_passthrough(self, argv: Sequence[str]) -> int:
        """Become `argv` inside the host (`lossbed exec`): output, input, signals and the
        exit code pass straight through."""

    def socket(self, family: int = socket.AF_INET, kind: int = socket.SOCK_DGRAM
               ) -> socket.socket:
        """A socket in the host's network, made in this process; refused (LossbedError,
        saying where its sockets live) for a host whose network is elsewhere (a VM, a
        remote machine)."""

    def offloads(self, ifname: str | None = None) -> dict[str, bool]:
        """The impaired interface's (or ifname's) merging offloads, on or off; refused as
        socket() is where the host's network is elsewhere."""


@dataclass(frozen=True)
class NamespaceHost:
    """A host that is a network namespace on this machine."""

    name: str
    namespace: str
    address: str
    ifname: str
    mgmt_address: str = ""  # with --ssh: where SSH reaches the host (management network)

    @property
    def gpus(self) -> int:
        return 0  # namespace hosts share this machine's GPUs: one rank each

    @property
    def project(self) -> str:
        return PROJECT_ROOT  # this machine's checkout

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        # pyroute2 has no API to start a process the way `ip netns exec` does: besides setns()
        # it enters a private mount namespace with /etc/netns/<ns>/hosts bound over /etc/hosts,
        # which is how each host resolves the others by name. So this one step shells out.
        return ["ip", "netns", "exec", self.namespace, *argv]

    def run(self, argv, *, check=False, timeout=None, input=None):
        return subprocess.run(
            self.exec_argv(argv), capture_output=True, check=check, timeout=timeout, input=input
        )

    def popen(self, argv, **kwargs):
        return subprocess.Popen(self.exec_argv(argv), **kwargs)

    def exec_passthrough(self, argv) -> int:
        """Become the command inside the host: output, input, signals and exit code pass
        straight through."""
        os.execvp("ip", self.exec_argv(argv))
        return 127  # not reached

    def netlink(self) -> IPRoute:
        return namespaces.netlink(self.namespace)

    def socket(self, family=socket.AF_INET, kind=socket.SOCK_DGRAM) -> socket.socket:
        """A socket that lives in this host's namespace, made without a child process."""
        return namespaces.socket_in(self.namespace, family, kind)

    def offloads(self, ifname: str | None = None) -> dict[str, bool]:
        return read_offloads(self.socket(), ifname or self.ifname)

    def agent_call(self, op: str, payload: dict):
        """Host-side work runs in this process, reaching into the namespace."""
        return operations.dispatch(self, op, payload)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LocalHost:
    """The machine this process runs on, as a host: what the agent uses inside a VM or on a
    remote machine."""

    name: str = "local"
    address: str = ""
    ifname: str = ""
    gpus: int = 0
    project: str = ""
    mgmt_address: str = ""

    def run(self, argv, *, check=False, timeout=None, input=None):
        return subprocess.run(list(argv), capture_output=True, check=check, timeout=timeout,
                              input=input)

    def popen(self, argv, **kwargs):
        return subprocess.Popen(list(argv), **kwargs)

    def netlink(self) -> IPRoute:
        return IPRoute()

    def exec_passthrough(self, argv) -> int:
        os.execvp(argv[0], list(argv))
        return 127  # not reached

    def socket(self, family=socket.AF_INET, kind=socket.SOCK_DGRAM) -> socket.socket:
        return socket.socket(family, kind)

    def offloads(self, ifname: str | None = None) -> dict[str, bool]:
        return read_offloads(self.socket(), ifname or self.ifname)

    def agent_call(self, op: str, payload: dict):
        return operations.dispatch(self, op, payload)


def _ethtool_in(sock: socket.socket, ifname: str) -> IoctlEthtool:
    # pyroute2's ioctl ethtool works on the namespace of its socket: hand it one made inside
    # the host's namespace instead of the one it opens in ours.
    tool = IoctlEthtool()
    tool.sock.close()
    tool.sock = sock
    tool.change_ifname(ifname)
    return tool


def read_offloads(sock: socket.socket, ifname: str) -> dict[str, bool]:
    """Each packet-merging feature the device offers, and whether it is on now."""
    tool = _ethtool_in(sock, ifname)
    try:
        features = tool.get_features()
        return {
            name: bool(features.is_active(name))
            for name in features.keys()
            if _MERGING_FEATURE.search(name) and features.is_available(name)
        }
    finally:
        tool.close()


def disable_offloads(sock: socket.socket, ifname: str) -> None:
    """Turn every segmentation/GRO/LRO offload off, so one packet on the link is one
    MTU-sized packet."""
    tool = _ethtool_in(sock, ifname)
    try:
        features = tool.get_features()
        for name in features.keys():
            if _MERGING_FEATURE.search(name) and features.is_available(name):
                features.set_value(name, False)
        tool.set_features(features)
    finally:
        tool.close()


def processes_in_namespaces(namespaces: Sequence[str]) -> dict[str, list[int]]:
    """PIDs of the processes living in each of the given namespaces (by namespace inode)."""
    wanted = set(namespaces)
    return {ns: pids for ns, pids in netns.ns_pids().items() if ns in wanted}


def kill_namespace_processes(namespaces: Sequence[str], grace_s: float = 2.0) -> int:
    """SIGTERM every process inside the namespaces, SIGKILL what is left after grace_s.

    Only processes whose network namespace is one of ours are touched: never a pattern match
    on command lines.
    """
    victims = [pid for pids in processes_in_namespaces(namespaces).values() for pid in pids]
    for pid in victims:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    alive = victims
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [pid for pid in alive if is_running(pid)]
    for pid in alive:
        log.warning("process %d did not stop on SIGTERM: killing it", pid)
        _signal(pid, signal.SIGKILL)
    return len(victims)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def is_running(pid: int) -> bool:
    """True while the process runs; a zombie (dead, not yet reaped by its parent) is not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
