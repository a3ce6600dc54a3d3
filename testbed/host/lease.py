"""Impairment leases on remote hosts: an impairment reverts by itself unless renewed.

When the agent applies a profile on a remote host it writes a lease file and starts a
watchdog beside it (`python -m testbed.host.agent watchdog …`, detached). The controller renews
the lease (touches the file over SSH) while it runs; `clear` removes the file and the
impairment at once. If the controller is killed or loses the network, renewals stop, and
after `lease_s` the watchdog clears every lossbed object from the interface: a lost SSH
session never leaves a host impaired.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from pathlib import Path

from testbed.errors import UsageError

log = logging.getLogger(__name__)

LEASE_DIR = Path("/run/lossbed-leases")
DEFAULT_LEASE_S = 120.0
WATCH_EVERY_S = 0.5


# What a host name or an interface name may hold to become part of a lease file's name (the
# inventory checks names with a stricter rule first; this guard stands on its own, on the host)
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:@-]{0,62}")


def lease_file(host: str, ifname: str) -> Path:
    """The lease's file: always directly inside LEASE_DIR, whatever the names hold."""
    for what, part in (("host name", host), ("interface name", ifname)):
        if not isinstance(part, str) or not _PART.fullmatch(part) or ".." in part:
            raise UsageError(what, f"{part!r} cannot name a lease file (it would be a path)",
                             "Use letters, digits, '.', '-', '_' (fix the inventory)")
    return LEASE_DIR / f"{host}-{ifname}.lease"


def start(host: str, ifname: str, seconds: float) -> Path:
    """Write the lease and start its watchdog (on the host: called by the agent)."""
    import subprocess
    import sys

    LEASE_DIR.mkdir(parents=True, exist_ok=True)
    path = lease_file(host, ifname)
    path.write_text(f"{seconds}\n")
    subprocess.Popen([sys.executable, "-m", "testbed.host.agent", "watchdog", str(path), ifname],
                     start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    return path


def renew(host: str, ifname: str) -> bool:
    path = lease_file(host, ifname)
    if not path.exists():
        return False
    os.utime(path)
    return True


def seconds_left(host: str, ifname: str) -> float | None:
    """How long the lease has until its watchdog clears the impairment, unless renewed; None
    where there is no lease (a host lossbed owns)."""
    path = lease_file(host, ifname)
    try:
        seconds = float(path.read_text().strip() or DEFAULT_LEASE_S)
        return max(0.0, seconds - (time.time() - path.stat().st_mtime))
    except (FileNotFoundError, ValueError):
        return None


def end(host: str, ifname: str) -> None:
    path = lease_file(host, ifname)
    path.unlink(missing_ok=True)
    error_file(path).unlink(missing_ok=True)


def error_file(path: Path) -> Path:
    """Where the watchdog says why it could not clear an expired lease (it keeps trying)."""
    return path.with_suffix(".error")


def failure(host: str, ifname: str) -> str | None:
    """Why the watchdog of this lease could not clear the impairment, if it could not."""
    try:
        return error_file(lease_file(host, ifname)).read_text().strip() or None
    except FileNotFoundError:
        return None


def watch(path: Path, ifname: str, clear, retry_max_s: float = 30.0) -> str:
    """The watchdog's loop: until the lease ends (file gone) or expires. An expired lease is
    removed only once `clear` succeeded: when it fails, the error is written beside the lease
    (error_file; the agent's `check` reports it) and clearing is tried again, every second at
    first, then less often, up to every `retry_max_s`."""
    seconds = float(path.read_text().strip() or DEFAULT_LEASE_S)
    retry_s = min(1.0, retry_max_s)
    while True:
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return "ended"
        if age > seconds:
            try:
                clear()
            except Exception as err:
                log.error("lease %s expired, but clearing failed (retrying in %.0f s): %s",
                          path, retry_s, err)
                error_file(path).write_text(f"{time.strftime('%Y-%m-%d %H:%M:%S')}: the "
                                            f"lease expired but clearing failed: {err}\n")
                time.sleep(retry_s)
                retry_s = min(retry_s * 2, retry_max_s)
                continue
            path.unlink(missing_ok=True)
            error_file(path).unlink(missing_ok=True)
            return "expired"
        time.sleep(WATCH_EVERY_S)


class Keeper:
    """Controller side: renew every host's lease until stopped, each host from a daemon
    thread of its own: a host that does not answer (a lost node, srun or SSH waiting for
    it) delays no other host's renewal, whose lease would otherwise run out mid-run."""

    def __init__(self, cluster, every_s: float):
        if not every_s > 0:  # 0 or NaN would renew in a tight loop
            raise ValueError(f"renewing every {every_s} s: the lease must be positive")
        self.cluster, self.every_s = cluster, every_s
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(host,), daemon=True,
                                          name=f"lease-keeper-{host.name}")
                         for host in cluster.hosts]

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        deadline = time.monotonic() + 5  # (a thread still waiting on its host is a daemon)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, host):
        while not self._stop.wait(self.every_s):
            try:
                host.agent_call("renew", {})
            except Exception as err:  # the watchdog will clear it: say so, go on
                log.warning("could not renew the lease on %s: %s", host.name, err)
