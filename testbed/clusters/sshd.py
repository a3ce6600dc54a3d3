"""An sshd per host of a local cluster, listening only on that host's cluster address.

Fabric and Ansible reach the hosts through it exactly as they reach a real cluster. Keys and
configuration live in the cluster's state folder, so `down` removes them with the rest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from testbed.errors import EnvironmentProblem
from testbed.host.hosts import NamespaceHost

SSHD = "/usr/sbin/sshd"
SSH_PORT = 22

_CONFIG = """\
# Written by lossbed for one local cluster; removed by `lossbed down`.
HostKey {dir}/ssh_host_ed25519_key
AuthorizedKeysFile {dir}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PrintMotd no
Subsystem sftp internal-sftp
"""


def ssh_dir(state_dir: Path) -> Path:
    return state_dir / "ssh"


def client_key(state_dir: Path) -> Path:
    return ssh_dir(state_dir) / "id_ed25519"


def known_hosts(state_dir: Path) -> Path:
    return ssh_dir(state_dir) / "known_hosts"


def prepare(state_dir: Path, hosts: list[NamespaceHost]) -> None:
    """Make the host key, the client key, authorized_keys, known_hosts and sshd_config."""
    if not os.access(SSHD, os.X_OK) or not shutil.which("ssh-keygen"):
        raise EnvironmentProblem(
            f"--ssh needs {SSHD} and ssh-keygen: install openssh-server (make setup does)"
        )
    d = ssh_dir(state_dir)
    d.mkdir(mode=0o700)
    for key in (d / "ssh_host_ed25519_key", client_key(state_dir)):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lossbed", "-f", str(key)],
            check=True, capture_output=True,
        )
    (d / "authorized_keys").write_text(Path(f"{client_key(state_dir)}.pub").read_text())
    host_pub = Path(d / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    known_hosts(state_dir).write_text("".join(
        f"{','.join(filter(None, (h.name, h.address, h.mgmt_address)))} "
        f"{' '.join(host_pub)}\n" for h in hosts))
    (d / "sshd_config").write_text(_CONFIG.format(dir=d))
    # sshd refuses to start without its privilege-separation folder. It is the system's
    # standard folder (the ssh service makes it too), so lossbed makes it if absent and
    # leaves it in place.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)


def pidfile(state_dir: Path, host: NamespaceHost) -> Path:
    return ssh_dir(state_dir) / f"{host.name}.pid"


def start(state_dir: Path, host: NamespaceHost) -> None:
    """Start sshd inside the host; it daemonizes once its listening socket is bound."""
    listen = [host.address] + ([host.mgmt_address] if host.mgmt_address else [])
    result = host.run([
        SSHD, "-f", str(ssh_dir(state_dir) / "sshd_config"),
        *[arg for a in listen for arg in ("-o", f"ListenAddress={a}:{SSH_PORT}")],
        "-o", f"PidFile={pidfile(state_dir, host)}",
    ])
    if result.returncode != 0:
        raise EnvironmentProblem(
            f"sshd did not start on host {host.name}: {result.stderr.decode().strip()}"
        )


def running_pid(state_dir: Path, host: NamespaceHost) -> int | None:
    try:
        pid = int(pidfile(state_dir, host).read_text())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
