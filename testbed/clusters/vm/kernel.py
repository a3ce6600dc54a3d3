"""Where VM hosts' guest kernel and busybox come from: lossbed's own cache, never the host's
boot. Setting lossbed up must not change how the host boots (no kernel package installed,
nothing in /boot, no bootloader update), and a GPU host's next reboot must run the kernel
its owner chose.

    python3 -m testbed.clusters.vm.kernel fetch      (make test's setup runs it)

fetch() downloads the distribution's kernel package (`apt-get download`: the image package
the meta package names, and on Ubuntu its modules packages) and busybox-static, unpacks them
with `dpkg-deb -x` into .cache/vm/ in the project (a folder per package and version), and
runs `depmod -b` there. VM hosts boot that kernel (image.py builds their initramfs from its
modules) and their /init binds its modules over /lib/modules/VERSION of the machine's root
they run on, so modprobe in a guest finds them.

LOSSBED_VM_KERNEL=DIR boots a kernel the user already has instead: DIR/vmlinuz (or
DIR/boot/vmlinuz-VERSION) and DIR/lib/modules/VERSION with its modules.dep.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from testbed import system_packages
from testbed.errors import EnvironmentProblem

ROOT = Path(__file__).resolve().parents[3]
CACHE = ROOT / ".cache" / "vm"
KERNEL_ENV = "LOSSBED_VM_KERNEL"
COMPLETE = ".complete"  # written last: a folder without it is a fetch that did not finish
# a cache folder's name comes from a package's name and version: only these characters
_SAFE = re.compile(r"[A-Za-z0-9.+~_-]+")


@dataclass(frozen=True)
class GuestKernel:
    image: Path      # vmlinuz
    version: str     # its release (uname -r in the guest)
    root: Path       # a folder with lib/modules/VERSION (modinfo -b, the guest's bind)

    @property
    def modules(self) -> Path:
        return self.root / "lib" / "modules" / self.version


def _versions(root: Path) -> list[str]:
    folder = root / "lib" / "modules"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def _from_folder(root: Path, what: str) -> GuestKernel:
    """The kernel in a folder laid out as a package unpacks (boot/vmlinuz-V, lib/modules/V)
    or as LOSSBED_VM_KERNEL may give it (vmlinuz, lib/modules/V)."""
    versions = _versions(root)
    if len(versions) != 1:
        raise EnvironmentProblem(f"{what} {root} must hold exactly one lib/modules/VERSION "
                                 f"(it holds {versions or 'none'})")
    version = versions[0]
    image = root / "vmlinuz"
    if not image.is_file():
        image = root / "boot" / f"vmlinuz-{version}"
    if not image.is_file():
        raise EnvironmentProblem(f"{what} {root} has no vmlinuz (or boot/vmlinuz-{version})")
    if not (root / "lib" / "modules" / version / "modules.dep").is_file():
        raise EnvironmentProblem(f"{what} {root}: lib/modules/{version} has no modules.dep: "
                                 f"run depmod -b {root} {version}")
    return GuestKernel(image, version, root)


def find_kernel(cache: Path | None = None) -> GuestKernel:
    """The kernel VM hosts boot: LOSSBED_VM_KERNEL's, else the newest one fetched into the
    cache (CACHE unless another is given)."""
    cache = CACHE if cache is None else cache
    given = os.environ.get(KERNEL_ENV)
    if given:
        return _from_folder(Path(given), KERNEL_ENV)
    fetched = sorted(p for p in cache.glob("kernel-*") if (p / COMPLETE).is_file())
    if not fetched:
        raise EnvironmentProblem(
            f"no guest kernel for VM hosts in {cache}: `make setup` fetches the "
            "distribution's there (python3 -m testbed.clusters.vm.kernel fetch), or set "
            f"{KERNEL_ENV}=DIR (DIR/vmlinuz and DIR/lib/modules/VERSION)")
    return _from_folder(fetched[-1], "the cached kernel")


def find_busybox(cache: Path | None = None) -> Path:
    """busybox for the initramfs: the one fetched into the cache, else an installed one
    (reading a binary changes nothing on the host)."""
    cache = CACHE if cache is None else cache
    fetched = sorted(p / "bin" / "busybox" for p in cache.glob("busybox-*")
                     if (p / COMPLETE).is_file())
    for path in [*reversed(fetched), Path("/bin/busybox")]:
        if path.is_file():
            return path
    raise EnvironmentProblem(f"no busybox for VM hosts in {cache}: `make setup` fetches "
                             "busybox-static's there (python3 -m testbed.clusters.vm.kernel "
                             "fetch)")


def _apt(args: list[str], cwd: Path | None = None) -> str:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise EnvironmentProblem(f"{' '.join(args)} failed: "
                                 f"{(result.stderr or result.stdout).strip()[-500:]}")
    return result.stdout


def depends(package: str) -> list[str]:
    """The packages `package` depends on (apt-cache depends, direct dependencies only)."""
    out = _apt(["apt-cache", "depends", "--no-recommends", "--no-suggests", "--no-conflicts",
                "--no-breaks", "--no-replaces", "--no-enhances", package])
    return [line.split(":", 1)[1].strip() for line in out.splitlines()
            if line.strip().startswith(("Depends:", "|Depends:"))]


def kernel_packages(meta: str) -> list[str]:
    """The packages that hold the kernel `meta` stands for: its image package, and the
    modules packages it or the image depends on (Ubuntu splits them out)."""
    named = depends(meta)
    images = [p for p in named if p.startswith("linux-image-")]
    if not images:
        raise EnvironmentProblem(f"{meta} names no linux-image package (apt-cache depends)")
    modules = [p for p in [*named, *depends(images[0])] if p.startswith("linux-modules-")]
    return [images[0], *dict.fromkeys(modules)]


def cache_name(kind: str, package: str) -> str:
    """The cache folder of the version of `package` apt would download now:
    KIND-PACKAGE_VERSION (an epoch's ':' made '_'; checked to be a plain name)."""
    fields = dict(line.split(": ", 1) for line in _apt(
        ["apt-cache", "show", "--no-all-versions", package]).splitlines()
        if ": " in line and not line.startswith(" "))
    name = f"{kind}-{fields.get('Package', package)}_{fields.get('Version', '')}"
    name = name.replace(":", "_")
    if not _SAFE.fullmatch(name) or name.endswith("_"):
        raise EnvironmentProblem(f"package {package} ({name!r}) does not make a cache name")
    return name


def _fetch_one(kind: str, packages: list[str], cache: Path, echo) -> Path:
    """Download and unpack `packages` into cache/KIND-PACKAGE_VERSION/, unless the same
    version is there already."""
    final = cache / cache_name(kind, packages[0])
    if (final / COMPLETE).is_file():
        echo(f"[vm] {final.name} is in the cache already")
        return final
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)  # apt's _apt user writes the download here where it can
        echo(f"[vm] fetching {' '.join(packages)} (apt-get download, into {cache})")
        _apt(["apt-get", "download", *packages], cwd=work)
        unpacked = work / "root"
        for deb in sorted(work.glob("*.deb")):
            _apt(["dpkg-deb", "-x", str(deb), str(unpacked)])
        if kind == "kernel":
            for version in _versions(unpacked):
                _apt(["depmod", "-b", str(unpacked), version])
        (unpacked / COMPLETE).write_text(json.dumps({"packages": packages}) + "\n")
        if final.exists():  # a fetch that stopped half-way, in lossbed's own cache
            shutil.rmtree(final)
        unpacked.rename(final)
        echo(f"[vm] {final.name} ready")
        return final


def fetch(cache: Path = CACHE, release: dict | None = None, echo=print) -> GuestKernel:
    """The distribution's kernel and busybox into the cache; the kernel found there."""
    release = system_packages.os_release() if release is None else release
    family = system_packages.family(release)
    if family is None:
        raise EnvironmentProblem(
            f"{release.get('PRETTY_NAME', 'this system')} is not one lossbed knows the kernel "
            f"package of: set {KERNEL_ENV}=DIR to a kernel for VM hosts (DIR/vmlinuz, "
            "DIR/lib/modules/VERSION)")
    guest = system_packages.GUEST_PACKAGES[family]
    try:
        packages = kernel_packages(guest["kernel"])
    except EnvironmentProblem:
        if os.geteuid() != 0:
            raise
        # a machine whose package lists were never fetched (its packages came with it)
        echo("[vm] apt knows no kernel package: apt-get update")
        _apt(["apt-get", "update", "-q"])
        packages = kernel_packages(guest["kernel"])
    kernel = _fetch_one("kernel", packages, cache, echo)
    _fetch_one("busybox", [guest["busybox"]], cache, echo)
    return _from_folder(kernel, "the cached kernel")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["fetch"]:
        print("usage: python3 -m testbed.clusters.vm.kernel fetch", file=sys.stderr)
        return 2
    try:
        kernel = fetch()
    except EnvironmentProblem as err:
        print(f"lossbed setup: VM hosts: {err}", file=sys.stderr)
        return 0  # setup goes on: VM hosts say what they lack when asked for
    print(f"[vm] guest kernel {kernel.version}: {kernel.image}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
