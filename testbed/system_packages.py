"""The system packages each of lossbed's make targets needs, per distribution family, in one
table; and the apt command that installs the missing ones.

    python3 -m testbed.system_packages bench|test [--print]

(`make setup`, `make bench` and `make test` run it; `make setup PRINT=1` only prints.) It
runs with the system's python3 before lossbed's virtual environment exists: the standard
library only.

Nothing here changes how the host boots: no kernel package is ever installed. VM hosts boot
the distribution's kernel from lossbed's own cache (testbed/clusters/vm/kernel.py fetches
it), and busybox comes from there too. Every install is --no-install-recommends (qemu's
recommends alone are GTK, GStreamer and a desktop's worth of libraries).

On a system outside the table it prints what to install by hand and carries on: setup goes
on with what it can, and a command that lacks something says so when it runs.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

# What each need is for, and its packages per family. The names are the same on Debian 12
# and 13 and on Ubuntu 22.04 and 24.04 but for the guest kernel (fetched, not installed).
NEEDS = {
    # the data plane's C core: gcc against Python's headers and OpenSSL's libcrypto
    "build": ["gcc", "python3-dev", "libssl-dev", "python3-venv"],
    # namespace hosts, their links and loss: ip, tc, nft, ethtool (offloads off), modprobe
    "netns": ["iproute2", "nftables", "ethtool", "procps", "kmod", "iputils-ping"],
    # `lossbed up --ssh` (remote clusters tried on one machine)
    "ssh": ["openssh-server"],
    # VM hosts (netem and Soft-RoCE on a real kernel): qemu; the kernel and busybox are
    # fetched into the cache (GUEST_PACKAGES)
    "vm": ["qemu-system-x86"],
    # Soft-RoCE and real RDMA queue pairs: the verbs userland, its Python binding, perftest
    "rdma": ["rdma-core", "ibverbs-utils", "python3-pyverbs", "perftest"],
    # the provisioning tests run Ansible's apt module in check mode
    "ansible": ["python3-apt"],
    # a real Slurm on namespace hosts (tests/slurm_cluster.py): the controller, a node
    # daemon, the client commands and munge, Debian's (their daemons do not start on install)
    "slurm": ["slurmctld", "slurmd", "slurm-client", "munge"],
    # a real Prometheus that scrapes lossbed in the tests (tests/prometheus_server.py),
    # promtool, which checks what lossbed serves, and the Pushgateway a bench pushes to
    "prometheus": ["prometheus", "prometheus-pushgateway"],
}
# make targets: what each needs (make test runs every test that runs today, so all of it)
TARGETS = {"bench": ["build", "netns"],
           "test": ["build", "netns", "ssh", "vm", "rdma", "ansible", "slurm", "prometheus"]}
# What a target needs on one family alone: the test that opens a bench's report.html in a
# real browser (Debian packages Chromium's headless shell; Ubuntu has Chromium as a snap
# only, and there the test says it skipped)
FAMILY_ONLY = {("test", "debian"): ["chromium-headless-shell"]}
# Per family: the packages VM hosts fetch into the cache (never installed): the kernel's
# meta package, whose image (and, on Ubuntu, modules) packages it names are downloaded,
# and busybox-static's one binary
GUEST_PACKAGES = {"debian": {"kernel": "linux-image-amd64", "busybox": "busybox-static"},
                  "ubuntu": {"kernel": "linux-image-generic", "busybox": "busybox-static"}}
SUPPORTED = {("debian", "12"), ("debian", "13"), ("ubuntu", "22.04"), ("ubuntu", "24.04")}


def os_release(path: Path = Path("/etc/os-release")) -> dict[str, str]:
    """The fields of an os-release file (empty if there is none)."""
    try:
        return os_release_text(path.read_text())
    except OSError:
        return {}


def os_release_text(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.startswith("#"):
            fields[key.strip()] = " ".join(shlex.split(value)) if value.strip() else ""
    return fields


def family(release: dict[str, str]) -> str | None:
    """debian or ubuntu for a supported release (its ID and VERSION_ID), else None: a
    derivative or another version may name packages otherwise, so it is not guessed."""
    ident, version = release.get("ID", ""), release.get("VERSION_ID", "")
    if (ident, version) in SUPPORTED:
        return ident
    return None


def packages_for(target: str) -> list[str]:
    if target not in TARGETS:
        raise ValueError(f"no make target {target!r}: one of {', '.join(TARGETS)}")
    return [p for need in TARGETS[target] for p in NEEDS[need]]


def missing(packages: list[str]) -> list[str]:
    """Those of `packages` dpkg does not list as installed."""
    out = []
    for name in packages:
        status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name],
                                capture_output=True, text=True)
        if "install ok installed" not in status.stdout:
            out.append(name)
    return out


def apt_command(packages: list[str]) -> list[str]:
    return ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]


# lossbed's Python (pyproject's requires-python); the distributions' own python3: Debian 12
# 3.11, Debian 13 3.13, Ubuntu 24.04 3.12, Ubuntu 22.04 3.10 (too old: its python3.11 package)
LEAST_PYTHON = (3, 11)


def python_refusal(version: tuple[int, int]) -> str | None:
    """Why this Python cannot run lossbed, with the fix; None where it can."""
    if tuple(version[:2]) >= LEAST_PYTHON:
        return None
    have, need = ".".join(map(str, version[:2])), ".".join(map(str, LEAST_PYTHON))
    return (f"lossbed setup: this python3 is {have}; lossbed needs {need} or newer. On Ubuntu "
            f"22.04, as root: apt-get install python{need} python{need}-venv python{need}-dev, "
            f"then make setup PYTHON=python{need} (Debian 12/13 and Ubuntu 24.04's python3 "
            "will do)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m testbed.system_packages",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("target", choices=sorted(TARGETS))
    parser.add_argument("--print", dest="print_only", action="store_true",
                        help="print the apt command, install nothing")
    parser.add_argument("--os-release", type=Path, default=Path("/etc/os-release"),
                        help=argparse.SUPPRESS)  # (tests: sample files)
    args = parser.parse_args(argv)
    refused = python_refusal(sys.version_info[:2])
    if refused:  # before any package: the venv this Python would make cannot hold lossbed
        print(refused, file=sys.stderr)
        return 2
    release = os_release(args.os_release)
    wanted = packages_for(args.target)
    if family(release) is None:
        print(f"lossbed setup: {release.get('PRETTY_NAME', 'this system')} is not one lossbed "
              "has a package table for (Debian 12/13, Ubuntu 22.04/24.04): install by hand "
              f"what provides {' '.join(wanted)}; setup goes on without them", file=sys.stderr)
        return 0
    wanted += FAMILY_ONLY.get((args.target, family(release)), [])
    needed = missing(wanted)
    command = apt_command(needed)
    if args.print_only:  # what it would run, to read before running it as root
        print(shlex.join(command) if needed else f"# make {args.target}: nothing to install")
        return 0
    if not needed:
        return 0
    if os.geteuid() != 0:
        print(f"lossbed setup: missing system packages; as root run: {shlex.join(command)}",
              file=sys.stderr)
        return 0
    print(f"lossbed setup: {shlex.join(command)}", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(command, env=env).returncode == 0:
        return 0
    # a stale package list is the usual cause: refresh it once and try again
    subprocess.run(["apt-get", "update", "-q"], env=env)
    rc = subprocess.run(command, env=env).returncode
    if rc != 0:
        print(f"lossbed setup: {shlex.join(command)} failed (exit {rc}), also after apt-get "
              "update: apt's message is above; install those packages by hand, then run "
              "make again", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
