"""What a VM boots: the distribution's kernel from lossbed's cache (kernel.py: never one
installed on the host), and an initramfs built here at run time.

The initramfs holds busybox, the few modules needed to reach the machine's root (virtio,
9p, overlay, fw_cfg) and an /init that mounts that root read-only over 9p with a tmpfs
overlay on top, binds the guest kernel's modules (from the cache, seen through 9p) over its
/lib/modules/VERSION, then chroots into it and runs the command lossbed passed through
fw_cfg. The VM thus runs this machine's own Python, venv and project, and nothing it writes
reaches the machine's disk.
"""

from __future__ import annotations

import gzip
import io
import logging
import lzma
import os
import shlex
import shutil
import stat
import subprocess
import time
from pathlib import Path

from testbed.clusters.vm.kernel import GuestKernel, find_busybox
from testbed.errors import EnvironmentProblem

log = logging.getLogger(__name__)

# insmod order matters: each module's dependencies come before it.
INITRAMFS_MODULES = ("virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev",
                     "virtio_pci", "netfs", "fscache", "9pnet", "9pnet_virtio", "9p", "overlay",
                     "qemu_fw_cfg")
QEMU = "qemu-system-x86_64"
FW_CFG_COMMAND = "opt/lossbed/cmd"
FW_CFG_CONFIG = "opt/lossbed/config"

INIT_SCRIPT = """#!/bin/busybox sh
# lossbed VM init: the machine's root read-only over 9p, a tmpfs overlay, then lossbed's
# command (from fw_cfg) in a chroot. Everything written in the VM stays in its memory.
# cache=loose: the guest keeps what it read of the machine's files (Python, the venv, the
# project do not change while a VM lives): torch's first import, 82 s -> 63 s under TCG.
B=/bin/busybox
$B mount -t proc proc /proc; $B mount -t sysfs sys /sys; $B mount -t devtmpfs dev /dev
for m in {modules}; do
  [ -f /mods/$m.ko ] && {{ $B insmod /mods/$m.ko || echo "lossbed-init: insmod $m failed"; }}
done
$B mkdir -p /lower /rw /root
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /lower \\
  || {{ echo "lossbed-init: 9p mount failed"; $B poweroff -f; }}
$B mount -t tmpfs tmpfs /rw; $B mkdir -p /rw/upper /rw/work
$B mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /root \\
  || {{ echo "lossbed-init: overlay failed"; $B poweroff -f; }}
$B mount -t proc proc /root/proc; $B mount -t sysfs sys /root/sys
$B mount -t devtmpfs dev /root/dev; $B mkdir -p /root/dev/pts; $B mount -t devpts devpts /root/dev/pts
# A fresh /run (no host pid files or sockets). /tmp stays the host's, seen through the
# overlay (writes stay in the VM): the project or its venv may live under /tmp.
$B mount -t tmpfs tmpfs /root/run
# The guest kernel's modules (lossbed's cache, not the host's /lib/modules): bound over its
# /lib/modules/VERSION inside the root, so that modprobe there (netem, ifb, rdma_rxe) finds
# them; the binding is the guest's alone
$B chroot /root /bin/sh -c "mkdir -p /lib/modules/{version} && mount --bind {guest_modules} /lib/modules/{version}" \\
  || echo "lossbed-init: guest modules not bound"
CMD=$($B cat /sys/firmware/qemu_fw_cfg/by_name/{fw_cfg_command}/raw)
echo "lossbed-init: up, kernel $($B uname -r)"
$B chroot /root /bin/sh -c "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root; $CMD"
echo "lossbed-init: command exited with $?"
$B poweroff -f
"""


def require_qemu() -> str:
    path = shutil.which(QEMU)
    if path is None:
        raise EnvironmentProblem(f"{QEMU} is missing: install qemu-system-x86 (make setup does)")
    return path


def module_path(kernel: GuestKernel, name: str) -> Path | None:
    """The module's file in the guest kernel's tree, or None when it is built in."""
    result = subprocess.run(["modinfo", "-b", str(kernel.root), "-k", kernel.version, "-n",
                             name], capture_output=True, text=True)
    path = result.stdout.strip()
    if result.returncode != 0 or not path:
        raise EnvironmentProblem(f"kernel {kernel.version} ({kernel.root}) has no module "
                                 f"{name}: the VM cannot reach the machine's root")
    return None if path.startswith("(builtin)") else Path(path)


def module_bytes(path: Path) -> bytes:
    """A module as busybox's insmod takes it: plain (Debian 13's are xz-compressed)."""
    if path.suffix == ".xz":
        return lzma.decompress(path.read_bytes())
    if path.suffix == ".zst":
        raise EnvironmentProblem(f"{path} is zstd-compressed; lossbed unpacks .ko and .ko.xz")
    return path.read_bytes()


def _cpio_newc(entries: list[tuple[str, bytes, int]]) -> bytes:
    """A cpio archive in the "newc" format the kernel unpacks (no external cpio needed)."""
    out = io.BytesIO()
    for ino, (name, data, mode) in enumerate([*entries, ("TRAILER!!!", b"", 0)], start=1):
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out.write(b"070701" + "".join(f"{f:08x}" for f in fields).encode() + encoded)
        out.write(b"\0" * (-(110 + len(encoded)) % 4))
        out.write(data)
        out.write(b"\0" * (-len(data) % 4))
    return out.getvalue()


def init_script(kernel: GuestKernel) -> str:
    # (the sh -c line is in double quotes: the path goes in single ones)
    return INIT_SCRIPT.format(modules=" ".join(INITRAMFS_MODULES), version=kernel.version,
                              guest_modules=shlex.quote(str(kernel.modules)),
                              fw_cfg_command=FW_CFG_COMMAND)


def build_initramfs(kernel: GuestKernel, dest: Path) -> Path:
    entries = [(d, b"", stat.S_IFDIR | 0o755)
               for d in ("bin", "proc", "sys", "dev", "lower", "rw", "root", "mods")]
    entries.append(("bin/busybox", find_busybox().read_bytes(), stat.S_IFREG | 0o755))
    entries.append(("init", init_script(kernel).encode(), stat.S_IFREG | 0o755))
    for name in INITRAMFS_MODULES:
        path = module_path(kernel, name)
        if path is not None:
            entries.append((f"mods/{name}.ko", module_bytes(path), stat.S_IFREG | 0o644))
    dest.write_bytes(gzip.compress(_cpio_newc(entries), compresslevel=1))
    return dest


def kvm_works(kernel: Path, initramfs: Path, workdir: Path, timeout_s: float = 6.0) -> bool:
    """Whether a VM boots with KVM here. /dev/kvm can exist and still hang (nested
    virtualisation without support): boot a VM that powers off at once, with a deadline."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    command = workdir / "kvm-probe.cmd"
    command.write_text("true")
    started = time.monotonic()
    try:
        result = subprocess.run(
            [QEMU, "-enable-kvm", "-m", "256", "-nodefaults", "-display", "none",
             "-serial", "stdio", "-no-reboot", "-kernel", str(kernel), "-initrd", str(initramfs),
             "-append", "console=ttyS0 quiet panic=-1",
             "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,"
                        "multidevs=remap",
             "-fw_cfg", f"name={FW_CFG_COMMAND},file={command}"],
            capture_output=True, timeout=timeout_s)
        works = b"command exited with 0" in result.stdout
    except subprocess.TimeoutExpired:
        works = False
    finally:
        command.unlink(missing_ok=True)
    log.info("KVM %s (probe took %.1f s)", "works" if works else "does not work here",
             time.monotonic() - started)
    return works
