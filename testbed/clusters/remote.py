"""Real machines as a cluster: hosts from an inventory, reached over SSH with Fabric.

Commands and file transfer go through Fabric connections (opened one host at a time first,
so an unreachable host or a rejected key gets its own clear error before anything is
applied anywhere; then used in parallel). lossbed's netlink work runs on each host through
its agent (`python -m testbed.host.agent`), the same code that runs locally. Ranks are started
under `testbed.host.guard`, which stops them when the controller's SSH channel closes.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from testbed.clusters import inventory, state
from testbed.clusters.contract import NamedHosts
from testbed.errors import ClusterError, LossbedError, UsageError

log = logging.getLogger(__name__)
KIND = "remote"
CONNECT_TIMEOUT_S = 10


@dataclass
class RemoteHost:
    name: str
    address: str          # data plane
    ifname: str
    ssh_host: str
    ssh_port: int
    ssh_user: str
    key_file: str | None
    known_hosts: str | None
    python: str
    project: str
    gpus: int = 0
    rdma_device: str | None = None
    _connection: object = field(default=None, repr=False, compare=False)

    @property
    def mgmt_address(self) -> str:
        """Where SSH reaches the host, where that is not its data-plane address."""
        return self.ssh_host if self.ssh_host != self.address else ""

    # ---- the connection ------------------------------------------------------------------

    def connection(self):
        if self._connection is None or not self._connection.is_connected:
            if self._connection is not None:
                self._connection = None
            self._open()
        return self._connection

    def _open(self):
        if self._connection is None:
            from fabric import Connection

            kwargs = {"banner_timeout": CONNECT_TIMEOUT_S,
                      "auth_timeout": CONNECT_TIMEOUT_S, "allow_agent": False,
                      "look_for_keys": self.key_file is None}
            if self.key_file:
                kwargs["key_filename"] = str(Path(self.key_file).expanduser())
            conn = Connection(self.ssh_host, user=self.ssh_user, port=self.ssh_port,
                              connect_kwargs=kwargs, connect_timeout=CONNECT_TIMEOUT_S)
            if self.known_hosts:
                import paramiko

                conn.client.load_host_keys(self.known_hosts)
                conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
            try:
                conn.open()
            except Exception as err:
                raise ClusterError(f"host {self.name} ({self.ssh_user}@{self.ssh_host}:"
                                   f"{self.ssh_port}) is not reachable over SSH: "
                                   f"{type(err).__name__}: {err}") from None
            self._connection = conn

    def connect(self) -> None:
        """Open the SSH connection now, or fail with what went wrong for this host."""
        try:
            self.connection()
        except ClusterError:
            raise
        except Exception as err:
            self._connection = None
            raise ClusterError(f"host {self.name} ({self.ssh_user}@{self.ssh_host}:"
                               f"{self.ssh_port}) is not reachable over SSH: "
                               f"{type(err).__name__}: {err}") from None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # ---- the Host interface ----------------------------------------------------------

    def run(self, argv, *, check=False, timeout=None, input=None):
        code, out, err = self._exec(shlex.join(str(a) for a in argv), input, timeout)
        done = subprocess.CompletedProcess(list(argv), code, out, err)
        if check:
            done.check_returncode()
        return done

    def agent_call(self, op: str, payload: dict):
        request = json.dumps({"host": {"name": self.name, "address": self.address,
                                       "ifname": self.ifname}, "payload": payload})
        command = (f"cd {shlex.quote(self.project)} && PYTHONPATH={shlex.quote(self.project)} "
                   f"exec {shlex.quote(self.python)} -m testbed.host.agent {shlex.quote(op)}")
        code, out, err = self._exec(command, request.encode(), timeout=300)
        lines = [ln for ln in out.decode(errors="replace").strip().splitlines()
                 if ln.startswith("{")]
        if not lines:
            raise LossbedError(f"host {self.name}: the agent gave no answer (exit "
                               f"{code}): {err.decode(errors='replace').strip()[-2000:]}")
        reply = json.loads(lines[-1])
        if "error" in reply:
            raise LossbedError(f"host {self.name}: {reply['error']}")
        return reply["result"]

    def _exec(self, command: str, stdin: bytes | None, timeout: float | None):
        """Run one command on this host over its SSH connection: (exit code, stdout, stderr).

        A channel of its own, not Fabric's run(): invoke feeds a command's stdin one byte per
        10 ms (made for echoing typed input): a 1.3 KB request would take 14 s.
        `timeout`: seconds the command may stay silent before it is given up."""
        import threading

        channel = self.connection().client.get_transport().open_session()
        try:
            channel.settimeout(timeout)
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            errors = []
            stderr_reader = threading.Thread(  # both pipes at once: neither can fill and block
                target=lambda: errors.append(channel.makefile_stderr("rb").read()), daemon=True)
            stderr_reader.start()
            out = channel.makefile("rb").read()
            stderr_reader.join(timeout)
            return channel.recv_exit_status(), out, errors[0] if errors else b""
        except TimeoutError:
            raise LossbedError(f"host {self.name}: `{command[:200]}` gave no output for "
                               f"{timeout:g} s: gave up on it") from None
        finally:
            channel.close()

    def popen(self, argv, env=None, cwd=None, **kwargs):
        """A rank on this host: `ssh … testbed.host.guard argv`, a local process whose pipes are
        the remote ones; when it ends (or is killed), the guard stops the remote ranks."""
        exports = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (env or {}).items())
        command = (f"cd {shlex.quote(self.project)} && exec env {exports} "
                   f"{shlex.quote(self.python)} -m testbed.host.guard "
                   + shlex.join(str(a) for a in argv))
        # the guard reads its liveness from this pipe, whatever stdin the caller asked for
        kwargs["stdin"] = subprocess.PIPE
        return subprocess.Popen(self.ssh_argv(command), **kwargs)

    def ssh_argv(self, command: str) -> list[str]:
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
                "-p", str(self.ssh_port)]
        if self.key_file:
            argv += ["-i", str(Path(self.key_file).expanduser())]
        if self.known_hosts:
            argv += ["-o", f"UserKnownHostsFile={self.known_hosts}",
                     "-o", "StrictHostKeyChecking=yes"]
        return [*argv, f"{self.ssh_user}@{self.ssh_host}", command]

    def netlink(self):
        raise LossbedError(f"host {self.name} is remote: its netlink work runs there "
                           "(testbed.host.agent)")

    def exec_passthrough(self, argv) -> int:
        return subprocess.call(self.ssh_argv(shlex.join(argv)))

    def socket(self, family=None, kind=None):
        raise LossbedError(f"host {self.name} is remote: its sockets live there, not in the "
                           "controller")

    def offloads(self, ifname: str | None = None) -> dict[str, bool]:
        raise LossbedError(f"host {self.name} is remote: its offloads are read there "
                           "(lossbed doctor's checkup runs on it)")


@dataclass
class RemoteCluster(NamedHosts):
    name: str
    hosts: list[RemoteHost]
    mtu: int
    inventory_path: str
    lease_s: float
    force_interface: bool = False
    kind: str = KIND

    # ---- the Cluster contract (testbed/clusters/contract.py); lease_s, force_interface,
    # connect() and close() are the fields and methods above and below ------------------

    @property
    def shares_this_machine(self) -> bool:
        return False

    def rank_python(self, host: RemoteHost) -> str:
        return host.python  # lossbed_python of the inventory

    @property
    def state_dir(self) -> Path:
        # Not a local cluster: kept apart, so `lossbed down` and name lookups ignore it.
        return state.state_root() / ".remote" / self.name

    @property
    def ssh(self) -> bool:
        return False  # lossbed made no sshd here: the operator's own keys reach these hosts

    def connect(self) -> None:
        """Every host reachable, or a per-host error and nothing done anywhere."""
        errors = []
        for h in self.hosts:  # one at a time first: clear errors, one host at a time
            try:
                h.connect()
            except ClusterError as err:
                errors.append(str(err))
        if errors:
            raise ClusterError("; ".join(errors))

    def close(self) -> None:
        for h in self.hosts:
            h.close()

    def status(self) -> dict:
        with ThreadPoolExecutor(max_workers=min(16, len(self.hosts))) as pool:
            checks = list(pool.map(lambda h: h.agent_call("check", {}), self.hosts))
        return {"name": self.name, "kind": KIND, "inventory": self.inventory_path,
                "mtu": self.mtu, "hosts": [{"name": h.name, "ssh": f"{h.ssh_host}:{h.ssh_port}",
                                            "interface": h.ifname, "address": h.address,
                                            **c} for h, c in zip(self.hosts, checks, strict=True)]}


def from_inventory(path: str, lease_s: float = 120.0, force_interface: bool = False):
    if not lease_s > 0:  # also refuses NaN: the keeper would renew in a tight loop
        raise UsageError("--lease-s", f"{lease_s} is not a positive number of seconds",
                         "e.g. --lease-s 120")
    entries = inventory.load(path)
    mtus = {e.lossbed_mtu for e in entries.values()}
    if len(mtus) > 1:
        by_mtu = {m: sorted(n for n, e in entries.items() if e.lossbed_mtu == m)
                  for m in sorted(mtus)}
        said = "; ".join(f"{m}: {', '.join(names)}" for m, names in by_mtu.items())
        raise UsageError("--inventory", f"hosts disagree on lossbed_mtu ({said})",
                         "Give every host the data plane's one MTU (lossbed_mtu under "
                         "all: vars)")
    hosts = [RemoteHost(name=n, address=e.lossbed_address, ifname=e.lossbed_interface,
                        ssh_host=e.ansible_host, ssh_port=e.ansible_port,
                        ssh_user=e.ansible_user, key_file=e.ansible_ssh_private_key_file,
                        known_hosts=e.lossbed_known_hosts, python=e.python,
                        project=e.lossbed_project, gpus=e.lossbed_gpus,
                        rdma_device=e.lossbed_rdma_device) for n, e in entries.items()]
    name = re.sub(r"[^a-z0-9]", "", Path(path).stem.lower()) or "inventory"
    return RemoteCluster(name=name, hosts=hosts, mtu=mtus.pop(), inventory_path=str(path),
                         lease_s=lease_s, force_interface=force_interface)
