"""The controller's side of a VM's exec channel: a unix socket that qemu connects to the
guest's virtio-serial port. Independent of the emulated network, so commands work whatever
the profile does to the links.

qemu serves one client at a time; a second caller waits until the first disconnects. Each
reply carries the request's id, so a reply left over from an earlier caller is skipped.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import time
import uuid
from pathlib import Path

from testbed.errors import ClusterError


def call(path: Path, request: dict, timeout_s: float) -> dict:
    rid = uuid.uuid4().hex
    deadline = time.monotonic() + timeout_s
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        while True:
            try:
                sock.connect(str(path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise ClusterError(f"the VM's exec channel {path} is not there: is the VM "
                                       "running? (lossbed status)") from None
                time.sleep(0.1)
        sock.sendall((json.dumps({**request, "id": rid}) + "\n").encode())
        buffer = b""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no reply from the VM within {timeout_s:.0f} s")
            sock.settimeout(remaining)
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ClusterError(f"the VM behind {path} closed its exec channel")
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                try:
                    reply = json.loads(line)
                except ValueError:
                    continue
                if reply.get("id") == rid:
                    return reply
    finally:
        sock.close()


def run(path: Path, argv, *, check=False, timeout=None, input=None, env=None,
        cwd=None) -> subprocess.CompletedProcess:
    request = {"argv": [str(a) for a in argv], "timeout": timeout, "env": env or {},
               "cwd": cwd, "stdin": base64.b64encode(input or b"").decode()}
    # the guest enforces `timeout`; the channel allows for the VM's slowness on top
    reply = call(path, request, (timeout or 3600) + 30)
    result = subprocess.CompletedProcess(
        list(argv), reply["rc"], base64.b64decode(reply.get("stdout", "")),
        base64.b64decode(reply.get("stderr", "")))
    if check:
        result.check_returncode()
    return result


def wait_ready(path: Path, timeout_s: float, alive=lambda: True) -> dict:
    """Wait until the guest answers; return what it reported about itself. Gives up at
    once when alive() says the VM is gone (it powered off: its console says why)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call(path, {}, min(5.0, max(deadline - time.monotonic(), 0.1)))["info"]
        except (TimeoutError, ClusterError, OSError):
            if time.monotonic() > deadline or not alive():
                raise
            time.sleep(0.2)
