"""What a VM boots: the distribution's kernel, and an initramfs built here at run time.

The initramfs holds busybox, the few modules needed to reach the machine's root (virtio,
9p, overlay, fw_cfg) and an /init that mounts that root read-only over 9p with a tmpfs
overlay on top, then chroots into it and runs the command lossbed passed through fw_cfg.
The VM thus runs this machine's own Python, venv and project, and nothing it writes reaches
the machine's disk.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

from testbed.errors import EnvironmentProblem

log = logging.getLogger(__name__)

# insmod order matters: each module's dependencies come before it.
INITRAMFS_MODULES = ("virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev",
                     "virtio_pci", "netfs", "fscache", "9pnet", "9pnet_virtio", "9p", "overlay",
                     "qemu_fw_cfg")
BUSYBOX = Path("/bin/busybox")
BOOT_DIR = Path("/boot")
MODULES_DIR = Path("/lib/modules")
QEMU = "qemu-system-x86_64"
FW_CFG_COMMAND = "opt/lossbed/cmd"
FW_CFG_CONFIG = "opt/lossbed/config"

INIT_SCRIPT = f"""#!/bin/busybox sh
# lossbed VM init: the machine's root read-only over 9p, a tmpfs overlay, then lossbed's
# command (from fw_cfg) in a chroot. Everything written in the VM stays in its memory.
# cache=loose: the guest keeps what it read of the machine's files (Python, the venv, the
# project do not change while a VM lives): torch's first import, 82 s -> 63 s under TCG.
B=/bin/busybox
$B mount -t proc proc /proc; $B mount -t sysfs sys /sys; $B mount -t devtmpfs dev /dev
for m in {' '.join(INITRAMFS_MODULES)}; do
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
CMD=$($B cat /sys/firmware/qemu_fw_cfg/by_name/{FW_CFG_COMMAND}/raw)
echo "lossbed-init: up, kernel $($B uname -r)"
$B chroot /root /bin/sh -c "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root; $CMD"
echo "lossbed-init: command exited with $?"
$B poweroff -f
"""


def find_kernel() -> tuple[Path, str]:
    """The newest distribution kernel image with its modules installed: (vmlinuz, version)."""
    candidates = []
    for image in sorted(BOOT_DIR.glob("vmlinuz-*")):
        version = image.name.removeprefix("vmlinuz-")
        if (MODULES_DIR / version / "modules.dep").is_file() and os.access(image, os.R_OK):
            candidates.append((image, version))
    if not candidates:
        raise EnvironmentProblem(
            f"no kernel image with modules in {BOOT_DIR} and {MODULES_DIR} for VM hosts: "
            "install linux-image-amd64 (make setup does)")
    return candidates[-1]


def require_qemu() -> str:
    path = shutil.which(QEMU)
    if path is None:
        raise EnvironmentProblem(f"{QEMU} is missing: install qemu-system-x86 (make setup does)")
    if not BUSYBOX.is_file():
        raise EnvironmentProblem(f"{BUSYBOX} is missing: install busybox-static (make setup does)")
    return path


def module_path(version: str, name: str) -> Path | None:
    """The module's file, or None when it is built into the kernel."""
    result = subprocess.run(["modinfo", "-k", version, "-n", name], capture_output=True,
                            text=True)
    path = result.stdout.strip()
    if result.returncode != 0 or not path:
        raise EnvironmentProblem(f"kernel {version} has no module {name}: the VM cannot reach "
                                 "the machine's root. Install linux-image-amd64")
    return None if path.startswith("(builtin)") else Path(path)


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


def build_initramfs(version: str, dest: Path) -> Path:
    entries = [(d, b"", stat.S_IFDIR | 0o755)
               for d in ("bin", "proc", "sys", "dev", "lower", "rw", "root", "mods")]
    entries.append(("bin/busybox", BUSYBOX.read_bytes(), stat.S_IFREG | 0o755))
    entries.append(("init", INIT_SCRIPT.encode(), stat.S_IFREG | 0o755))
    for name in INITRAMFS_MODULES:
        path = module_path(version, name)
        if path is not None:
            data = path.read_bytes()
            if path.suffix == ".xz" or path.suffix == ".zst":
                raise EnvironmentProblem(f"{path} is compressed; lossbed needs plain .ko modules")
            entries.append((f"mods/{name}.ko", data, stat.S_IFREG | 0o644))
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
