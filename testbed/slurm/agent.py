"""lossbed's agent on a Slurm node: the one process that runs as root and impairs the node's
data-plane interface for the jobs on it, within the admin's policy (policy.py).

    python -m testbed.slurm.agent [--config FILE] [--node NAME]

(a systemd service the Ansible role installs; --node defaults to the short host name, as
slurmd names the node). It listens on a Unix socket that any local process may open, and
answers one request per connection: a JSON line {"op", "job", "payload"}, a JSON line back
({"result": ...} or {"error": ..., "type": ...}). Who asks is the kernel's word
(SO_PEERCRED), never the request's:

- describe: the node's interface and its MTU, and the policy (anyone);
- probe, check, udp_snmp, traffic, checkup: what lossbed's operations read (a process of a
  job running on this node, or root);
- apply: the job's profile on this node, if the job is the caller's, runs here, and the
  admin allows the profile and its plan (policy.judge_*), with a lease (the agent's
  watchdog clears it if the job stops renewing: a job that dies, or a lost node);
- renew, reading, clear: the job that holds the impairment (or root);
- release: the Epilog (root), at the end of a job, cancelled or not: clear if it held it.

One request at a time, no threads: the agent forks (scontrol, the lease's watchdog) only
while nothing else runs. testbed.host.operations does the work, the same code as on every
other kind of host.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pwd
import signal
import socket
import struct
import sys
import time

from testbed.errors import LossbedError
from testbed.host import operations
from testbed.host.hosts import LocalHost
from testbed.slurm import policy, scontrol

log = logging.getLogger("lossbed.slurm.agent")

MAX_REQUEST_BYTES = 4 << 20
REQUEST_TIMEOUT_S = 30.0
READ_OPS = ("probe", "check", "udp_snmp", "traffic", "checkup")
HOLDER_OPS = ("renew", "reading", "clear")


class Agent:
    def __init__(self, config: policy.AgentConfig, node: str):
        self.config = config
        self.node = policy.node_name(node)
        self.host = LocalHost(name=self.node, ifname=config.interface)

    # ---- who asks ------------------------------------------------------------------------

    def _job_of_caller(self, job_id, uid: int) -> scontrol.Job:
        """The caller's running job on this node, or Refused."""
        job = scontrol.job(str(job_id)) if job_id is not None else None
        if job is None:
            raise policy.Refused(f"no Slurm job {job_id!r}: lossbed's agent serves the "
                                 "processes of a running job (run inside salloc or sbatch)")
        if uid != 0 and job.uid != uid:
            raise policy.Refused(f"job {job.id} is not yours (uid {uid})")
        if job.state != "RUNNING":
            raise policy.Refused(f"job {job.id} is {job.state}, not running")
        if self.node not in job.nodes:
            raise policy.Refused(f"job {job.id} does not hold node {self.node}")
        return job

    def holder(self) -> dict | None:
        try:
            return json.loads(self.config.holder_file(self.node).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def _set_holder(self, job: scontrol.Job | None, profile: str = "") -> None:
        path = self.config.holder_file(self.node)
        if job is None:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"job": job.id, "uid": job.uid, "profile": profile,
                                    "since": time.time()}) + "\n")

    # ---- the requests --------------------------------------------------------------------

    def handle(self, request: dict, uid: int):
        op, payload = request.get("op"), request.get("payload") or {}
        if op == "describe":
            return self._describe()
        if op == "release":
            if uid != 0:
                raise policy.Refused("release is the Epilog's (root)")
            return self.release(str(request.get("job")))
        if op not in (*READ_OPS, "apply", *HOLDER_OPS):
            raise policy.Refused(f"unknown request {op!r}")
        job = self._job_of_caller(request.get("job"), uid)
        held = self.holder()
        if op in READ_OPS:
            return operations.dispatch(self.host, op, payload)
        if op == "apply":
            if held and held["job"] != job.id:
                raise policy.Refused(f"node {self.node}'s interface is impaired for job "
                                     f"{held['job']}: one job's impairment at a time")
            return self._apply(job, payload)
        if not held or held["job"] != job.id:
            if op == "clear":
                return []  # nothing of this job's to clear
            raise policy.Refused(f"job {job.id} holds no impairment on {self.node}")
        result = operations.dispatch(self.host, op, payload)
        if op == "clear":
            self._set_holder(None)
        return result

    def _describe(self) -> dict:
        with self.host.netlink() as ipr:
            found = ipr.link_lookup(ifname=self.config.interface)
            mtu = ipr.get_links(found[0])[0].get_attr("IFLA_MTU") if found else None
        return {"node": self.node, "interface": self.config.interface, "mtu": mtu,
                "address": dict(self.config.addresses).get(self.node),  # (None: NodeAddr)
                "allowed_profiles": list(self.config.allowed_profiles),
                "max_loss": self.config.max_loss, "lease_s": self.config.lease_s,
                "holder": self.holder()}

    def _apply(self, job: scontrol.Job, payload: dict):
        profile = policy.judge_profile(self.config, payload.get("profile") or {})
        nodes = list(job.nodes)
        policy.judge_plan(self.config, profile, payload.get("plan") or {}, self.node,
                          self.config.addresses_of(nodes, scontrol.node_addresses(nodes)))
        asked = payload.get("lease_s")
        lease_s = min(float(asked), self.config.lease_s) if isinstance(asked, int | float) \
            and asked > 0 else self.config.lease_s
        self._set_holder(job, profile.name)  # (before the kernel: a crash leaves it named)
        try:
            return operations.dispatch(self.host, "apply", {
                "backend": payload.get("backend"), "plan": payload["plan"],
                "lease_s": lease_s, "force": False})
        except BaseException:
            operations.dispatch(self.host, "clear", {})
            self._set_holder(None)
            raise

    def release(self, job_id: str) -> list[str]:
        """The job ended (the Epilog): its impairment, if it held one, cleared."""
        held = self.holder()
        if not held or held["job"] != job_id:
            return []
        cleared = operations.dispatch(self.host, "clear", {})
        self._set_holder(None)
        log.info("job %s ended: cleared %s on %s", job_id, cleared, self.node)
        return cleared

    # ---- the socket ----------------------------------------------------------------------

    def serve(self) -> None:
        path = self.config.socket_path(self.node)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        path.chmod(0o666)  # any process may ask; who it is, SO_PEERCRED says
        server.listen(16)
        log.info("lossbed agent of node %s on %s (interface %s, allowed: %s)", self.node, path,
                 self.config.interface, ", ".join(self.config.allowed_profiles))
        try:
            while True:
                conn, _ = server.accept()
                with conn:
                    self._answer(conn)
                _reap()
        finally:
            server.close()
            path.unlink(missing_ok=True)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(REQUEST_TIMEOUT_S)
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        try:
            request = json.loads(read_line(conn))
            reply = {"result": self.handle(request, uid)}
        except LossbedError as err:
            reply = {"error": str(err), "type": type(err).__name__}
        except Exception as err:  # the agent answers, and goes on serving the others
            log.exception("request failed")
            reply = {"error": f"{type(err).__name__}: {err}", "type": "AgentCrash"}
        if "error" in reply:
            log.info("refused for uid %d (%s): %s", uid, _user(uid), reply["error"])
        try:
            conn.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass


def _reap() -> None:
    """Collect the lease watchdogs that ended (apply starts them; each ends with its lease)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def read_line(conn: socket.socket) -> bytes:
    """One JSON line from the socket (at most MAX_REQUEST_BYTES)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            raise LossbedError(f"request longer than {MAX_REQUEST_BYTES} bytes")
    return data


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "?"


def ask(config: policy.AgentConfig, node: str, request: dict,
        timeout: float = REQUEST_TIMEOUT_S * 4) -> dict:
    """One request to `node`'s agent on this machine: its reply ({"result"} or {"error"})."""
    path = config.socket_path(node)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        try:
            conn.connect(str(path))
        except OSError as err:
            raise LossbedError(f"node {node}: lossbed's agent does not answer on {path} "
                               f"({err.strerror}): the admin installs and starts it "
                               "(docs/guides/slurm.md; `lossbed doctor` on the node)") from None
        conn.sendall(json.dumps(request).encode() + b"\n")
        return json.loads(read_line(conn) or b'{"error": "the agent closed the connection"}')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.slurm.agent",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help=f"default: ${policy.CONFIG_ENV} or "
                        f"{policy.DEFAULT_CONFIG}")
    parser.add_argument("--node", default=socket.gethostname().split(".")[0],
                        help="this node's Slurm name (default: the short host name)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        agent = Agent(policy.load_config(args.config), args.node)
    except LossbedError as err:
        print(f"lossbed agent: {err}", file=sys.stderr)
        return err.exit_code
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # (serve's finally removes the socket)
    try:
        agent.serve()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
