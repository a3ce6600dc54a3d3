"""Runs inside each VM (its PID 1's child, as root): bring up the host from its config,
then serve the exec channel until the VM is switched off.

Standard library only at boot, and `ip`/`ethtool`/`modprobe` for the network: under TCG,
importing pyroute2 alone takes ~3 s, which every `lossbed up --kind vm` would pay. lossbed's
host-side work (testbed.host.agent) is imported on its first request and then served in-process.

The config comes through fw_cfg as JSON: name, address, prefixlen, mtu, hosts (name ->
address), modules, rdma, ssh (host key and authorized key).

The exec channel is a virtio-serial port named "lossbed.0": one JSON request per line
({"id", "argv", "stdin" (base64), "timeout"}), one JSON reply per line ({"id", "rc",
"stdout", "stderr"} base64), requests served concurrently. Long-running processes (a
training rank) are started with {"spawn": argv, "env", "cwd"}, which replies with their
pid at once; {"poll": pid, "stdout_from", "stderr_from"} returns what they wrote since, and
their exit code once they ended; {"write": pid, "data" (base64), "close"} feeds their stdin;
{"kill": pid} ends their process group. Every call stays
short, so the channel (qemu serves one client at a time) is never held by a process.
"""

from __future__ import annotations

import base64
import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

PORT_NAME = "lossbed.0"
CONFIG = "/sys/firmware/qemu_fw_cfg/by_name/opt/lossbed/config/raw"
MERGING_FEATURE = re.compile(r"(-segmentation$|^tx-gso-|^rx-gro|^rx-lro$|^rx-udp-gro-forwarding$)")
BASE_MODULES = ("virtio_net", "virtio_console", "sch_netem", "ifb", "act_mirred", "act_gact",
                "cls_u32", "sch_htb", "sch_ingress", "cls_bpf", "nf_tables")


def log(message: str) -> None:
    print(f"lossbed-guest: {message}", flush=True)


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result


def load_modules(names) -> list[str]:
    missing = []
    for name in names:
        if sh("modprobe", name, check=False).returncode != 0:
            missing.append(name)
    return missing


def configure_network(cfg: dict) -> None:
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "set", "eth0", "mtu", str(cfg["mtu"]), "up")
    sh("ip", "addr", "add", f"{cfg['address']}/{cfg['prefixlen']}", "dev", "eth0")
    features = sh("ethtool", "-k", "eth0").stdout.splitlines()
    off = []
    for line in features:
        name, _, value = line.strip().partition(": ")
        if MERGING_FEATURE.search(name) and value.startswith("on") and "[fixed]" not in value:
            off += [name, "off"]
    if off:
        sh("ethtool", "-K", "eth0", *off)


def write_identity(cfg: dict) -> None:
    with open("/etc/hostname", "w") as f:
        f.write(cfg["name"] + "\n")
    sh("hostname", cfg["name"])
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost"]
    lines += [f"{address}\t{name}" for name, address in cfg["hosts"].items()]
    with open("/etc/hosts", "w") as f:
        f.write("\n".join(lines) + "\n")


def start_sshd(cfg: dict) -> None:
    ssh = cfg["ssh"]
    os.makedirs("/run/lossbed-ssh", mode=0o700, exist_ok=True)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    key = "/run/lossbed-ssh/ssh_host_ed25519_key"
    with open(key, "w") as f:
        f.write(ssh["host_key"])
    os.chmod(key, 0o600)
    with open("/run/lossbed-ssh/authorized_keys", "w") as f:
        f.write(ssh["authorized_key"])
    with open("/run/lossbed-ssh/sshd_config", "w") as f:
        f.write(f"HostKey {key}\nAuthorizedKeysFile /run/lossbed-ssh/authorized_keys\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nPrintMotd no\n"
                "Subsystem sftp internal-sftp\nStrictModes no\n")
    fresh_login_files()
    sh("/usr/sbin/sshd", "-f", "/run/lossbed-ssh/sshd_config",
       "-o", f"ListenAddress={cfg['address']}:22")


def fresh_login_files() -> None:
    """Give root a fresh Debian host's shell start-up files (from /etc/skel).

    The VM's root is this machine's, so root's ~/.bashrc is this machine's user's: bash
    runs it for every SSH command, and what it does (pyenv init, say) takes seconds per
    command under TCG; Ansible runs one SSH command per task. The copies land in the VM's
    memory overlay: the machine's own files are untouched.
    """
    for name in (".bashrc", ".profile"):
        skel = os.path.join("/etc/skel", name)
        if os.path.exists(skel):
            with open(skel, "rb") as src, open(os.path.join("/root", name), "wb") as dst:
                dst.write(src.read())


def start_rdma() -> None:
    # crc32_generic first, else rdma_rxe fails with "failed to init crc32 algorithm err:-2"
    for name in ("crc32_generic", "rdma_rxe"):
        sh("modprobe", name)
    sh("rdma", "link", "add", "rxe0", "type", "rxe", "netdev", "eth0")


def find_port() -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for path in glob.glob("/sys/class/virtio-ports/*/name"):
            with open(path) as f:
                if f.read().strip() == PORT_NAME:
                    return "/dev/" + path.split("/")[-2]
        time.sleep(0.1)
    raise RuntimeError(f"no virtio-serial port named {PORT_NAME}")


class Server:
    def __init__(self, port: str, info: dict):
        self.fd = os.open(port, os.O_RDWR)
        self.lock = threading.Lock()
        self.import_lock = threading.Lock()
        self.info = info
        # pid: (the process, its stdout lines, its stderr lines, the threads reading them)
        self.spawned: dict[int, tuple] = {}

    def reply(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self.lock:
            try:
                while data:
                    data = data[os.write(self.fd, data):]
            except OSError:
                pass  # nobody is connected on the host side: the reply is dropped

    def agent(self, rid, request: dict) -> None:
        """lossbed's host-side work (testbed.host.agent), in this long-lived process: the heavy
        imports (pyroute2, pydantic: ~5 s under TCG) are paid once per boot, not per call."""
        try:
            with self.import_lock:
                from testbed.errors import LossbedError
                from testbed.host import operations
                from testbed.host.hosts import LocalHost
            host = LocalHost(**request.get("host", {}))
            result = operations.dispatch(host, request["agent_op"],
                                         request.get("payload", {}))
            self.reply({"id": rid, "result": result})
        except LossbedError as err:
            self.reply({"id": rid, "error": str(err), "type": type(err).__name__})
        except Exception as err:
            import traceback
            self.reply({"id": rid, "error": f"{type(err).__name__}: {err}", "type": "AgentCrash",
                        "traceback": traceback.format_exc()})

    def spawn(self, rid, request: dict) -> None:
        try:
            proc = subprocess.Popen(
                request["spawn"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                stdin=subprocess.PIPE, start_new_session=True,
                env={**os.environ, **request.get("env", {})}, cwd=request.get("cwd") or None)
        except OSError as err:
            self.reply({"id": rid, "error": str(err)})
            return
        out, err = [], []
        readers = [threading.Thread(target=lambda f=stream, s=sink: s.extend(iter(f.readline,
                                                                                  b"")),
                                    daemon=True)
                   for stream, sink in ((proc.stdout, out), (proc.stderr, err))]
        for reader in readers:
            reader.start()
        self.spawned[proc.pid] = (proc, out, err, readers)
        self.reply({"id": rid, "pid": proc.pid})

    def poll(self, rid, request: dict) -> None:
        """What a spawned process wrote since (whole lines), and its exit code once it ended
        and everything it wrote was read."""
        entry = self.spawned.get(request["poll"])
        if entry is None:
            self.reply({"id": rid, "error": f"no spawned process {request['poll']}"})
            return
        proc, out, err, readers = entry
        code = proc.poll()
        ended = code is not None and not any(r.is_alive() for r in readers)
        o, e = len(out), len(err)  # the lines so far (the readers may still be appending)
        self.reply({"id": rid, "rc": code if ended else None, "stdout_to": o, "stderr_to": e,
                    "stdout": base64.b64encode(b"".join(out[request["stdout_from"]:o])).decode(),
                    "stderr": base64.b64encode(b"".join(err[request["stderr_from"]:e])).decode()})
        if ended:
            del self.spawned[proc.pid]

    def write(self, rid, request: dict) -> None:
        """Feed a spawned process's stdin (and close it when asked)."""
        entry = self.spawned.get(request["write"])
        if entry is None:
            self.reply({"id": rid, "error": f"no spawned process {request['write']}"})
            return
        stdin = entry[0].stdin
        try:
            stdin.write(base64.b64decode(request.get("data", "")))
            stdin.flush()
            if request.get("close"):
                stdin.close()
        except (OSError, ValueError):
            pass  # it closed its stdin or ended: its exit code says the rest
        self.reply({"id": rid, "rc": 0})

    def kill(self, rid, request: dict) -> None:
        entry = self.spawned.get(request["kill"])
        if entry is not None and entry[0].poll() is None:
            try:
                os.killpg(entry[0].pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.reply({"id": rid, "rc": 0})

    def handle(self, request: dict) -> None:
        rid = request.get("id")
        if "agent_op" in request:
            self.agent(rid, request)
            return
        for op in ("spawn", "poll", "write", "kill"):
            if op in request:
                getattr(self, op)(rid, request)
                return
        if "argv" not in request:
            self.reply({"id": rid, "rc": 0, "info": self.info})
            return
        try:
            result = subprocess.run(
                request["argv"], input=base64.b64decode(request.get("stdin", "")),
                capture_output=True, timeout=request.get("timeout"),
                env={**os.environ, **request.get("env", {})}, cwd=request.get("cwd") or None)
            self.reply({"id": rid, "rc": result.returncode,
                        "stdout": base64.b64encode(result.stdout).decode(),
                        "stderr": base64.b64encode(result.stderr).decode()})
        except subprocess.TimeoutExpired:
            self.reply({"id": rid, "rc": 124, "stdout": "",
                        "stderr": base64.b64encode(b"timed out in the VM").decode()})
        except OSError as err:
            self.reply({"id": rid, "rc": 127, "stdout": "",
                        "stderr": base64.b64encode(str(err).encode()).decode()})

    def serve(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                time.sleep(0.02)  # the host side is not connected: wait for it
                continue
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                try:
                    request = json.loads(line)
                except ValueError:
                    continue
                threading.Thread(target=self.handle, args=(request,), daemon=True).start()


def main() -> int:
    with open(CONFIG) as f:
        cfg = json.load(f)
    missing = load_modules(BASE_MODULES + tuple(cfg.get("modules", ())))
    info = {"kernel": os.uname().release, "missing_modules": missing, "errors": []}
    for step in (write_identity, configure_network):
        try:
            step(cfg)
        except Exception as err:  # reported through the channel, where the controller looks
            info["errors"].append(f"{step.__name__}: {err}")
    if cfg.get("ssh"):
        try:
            start_sshd(cfg)
        except Exception as err:
            info["errors"].append(f"sshd: {err}")
    if cfg.get("rdma"):
        try:
            start_rdma()
        except Exception as err:
            info["errors"].append(f"rdma: {err}")
    log(f"ready: {json.dumps(info)}")
    Server(find_port(), info).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
