"""Checks that the machine can do what was asked, run before anything is created."""

from __future__ import annotations

import os
import shutil

from testbed.errors import EnvironmentProblem

# Bits of /proc/self/status CapEff: creating and mounting namespaces needs both.
CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21


def effective_capabilities() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def require_root(action: str) -> None:
    """Root is checked by capability, not uid: a root shell with capabilities dropped (some
    containers) fails the same way as a normal user, and gets the same message."""
    caps = effective_capabilities()
    missing = [name for bit, name in ((CAP_NET_ADMIN, "CAP_NET_ADMIN"),
                                       (CAP_SYS_ADMIN, "CAP_SYS_ADMIN")) if not caps >> bit & 1]
    if missing:
        raise EnvironmentProblem(
            f"{action} needs root ({' and '.join(missing)} missing) to create network "
            "namespaces and links: run it with sudo (in a container: --privileged)"
        )


def require_namespaces() -> None:
    if not os.path.exists("/proc/self/ns/net"):
        raise EnvironmentProblem(
            "this kernel does not support network namespaces (no /proc/self/ns/net): "
            "use a kernel built with CONFIG_NET_NS, or the VM cluster kind"
        )


def require_commands(*names: str, package: str) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        raise EnvironmentProblem(
            f"missing command(s) {', '.join(missing)}: install {package} (make setup does)"
        )
