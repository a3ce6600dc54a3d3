"""Setting lossbed up: the packages each make target needs, per distribution, from one
table (testbed/system_packages.py); no kernel package among them (VM hosts boot a kernel
from lossbed's cache: testbed/clusters/vm/kernel.py)."""

from __future__ import annotations

import lzma
import shutil
import subprocess
import sys

import pytest

from testbed import system_packages
from testbed.clusters.vm import image, kernel
from testbed.errors import EnvironmentProblem
from tests.helpers import REPO

RELEASES = {
    "debian-12": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n',
    "debian-13": 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nID=debian\nVERSION_ID="13"\n',
    "ubuntu-22.04": 'PRETTY_NAME="Ubuntu 22.04.4 LTS"\nID=ubuntu\nID_LIKE=debian\n'
                    'VERSION_ID="22.04"\n',
    "ubuntu-24.04": 'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nID=ubuntu\nID_LIKE=debian\n'
                    'VERSION_ID="24.04"\n',
}


def printed(tmp_path, release: str, target: str, monkeypatch) -> subprocess.CompletedProcess:
    path = tmp_path / "os-release"
    path.write_text(release)
    # as if nothing were installed: the command it prints is the whole set
    monkeypatch.setattr(system_packages, "missing", lambda packages: list(packages))
    return system_packages.main([target, "--print", "--os-release", str(path)])


@pytest.mark.parametrize("name", sorted(RELEASES))
def test_each_supported_release_gets_an_apt_command_without_a_kernel(name, tmp_path,
                                                                     monkeypatch, capsys):
    release = system_packages.os_release_text(RELEASES[name])
    assert system_packages.family(release) == name.split("-")[0]
    for target in ("bench", "test"):
        assert printed(tmp_path, RELEASES[name], target, monkeypatch) == 0
        command = capsys.readouterr().out.split()
        assert command[:2] == ["apt-get", "install"] and "--no-install-recommends" in command
        packages = [w for w in command if not w.startswith("-")][2:]
        family = name.split("-")[0]
        assert packages == (system_packages.packages_for(target)
                            + system_packages.FAMILY_ONLY.get((target, family), []))
        assert not [p for p in packages if p.startswith(("linux-image", "linux-modules"))]
        if target == "bench":  # no VM hosts: no qemu, no busybox
            assert "qemu-system-x86" not in packages and "busybox-static" not in packages


def test_an_unknown_system_is_told_what_to_install_and_setup_goes_on(tmp_path, monkeypatch,
                                                                   capsys):
    rc = printed(tmp_path, 'PRETTY_NAME="Fedora Linux 41"\nID=fedora\nVERSION_ID=41\n',
                 "bench", monkeypatch)
    err = capsys.readouterr().err
    assert rc == 0 and "Fedora Linux 41" in err and "install by hand" in err and "gcc" in err


def test_an_apt_that_fails_twice_is_named_with_its_command_not_a_traceback(tmp_path,
                                                                          monkeypatch, capsys):
    (tmp_path / "os-release").write_text(RELEASES["debian-12"])
    monkeypatch.setattr(system_packages, "missing", lambda packages: ["gcc"])
    monkeypatch.setattr(system_packages.os, "geteuid", lambda: 0)
    ran = []

    def failing_apt(command, **_):
        ran.append(command)
        return subprocess.CompletedProcess(command, 100)
    monkeypatch.setattr(system_packages.subprocess, "run", failing_apt)
    rc = system_packages.main(["bench", "--os-release", str(tmp_path / "os-release")])
    err = capsys.readouterr().err
    assert rc == 1 and [c[:2] for c in ran] == [["apt-get", "install"], ["apt-get", "update"],
                                                ["apt-get", "install"]]
    assert "apt-get install -y -q --no-install-recommends gcc failed (exit 100)" in err, err


def test_the_debian_names_exist_in_this_machines_package_lists():
    """Debian 12's names checked against apt's lists here (the Ubuntu names cannot be: this
    machine has Debian's lists only; they are the same names, by Ubuntu's package pages)."""
    if shutil.which("apt-cache") is None:
        pytest.skip("no apt-cache here")
    if system_packages.family(system_packages.os_release()) != "debian":
        pytest.skip("not a Debian machine")
    names = sorted({p for ps in system_packages.NEEDS.values() for p in ps}
                   | set(system_packages.GUEST_PACKAGES["debian"].values()))
    policy = subprocess.run(["apt-cache", "policy", *names], capture_output=True, text=True,
                            check=True).stdout
    for name in names:
        assert f"{name}:\n" in policy, f"apt's lists here do not know {name}"
        block = policy.split(f"{name}:\n", 1)[1].split("\n", 3)
        assert "Candidate: (none)" not in "\n".join(block[:3]), name


def test_make_setup_print_installs_nothing():
    done = subprocess.run(["make", "-s", "setup", "PRINT=1", f"PYTHON={sys.executable}"],
                          cwd=kernel.ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("apt-get install") or line == "# make test: nothing to install"


def fake_kernel(root, version="6.1.0-99-amd64", depmod=True):
    (root / "lib" / "modules" / version).mkdir(parents=True)
    (root / "vmlinuz").write_bytes(b"not really a kernel")
    if depmod:
        (root / "lib" / "modules" / version / "modules.dep").write_text("")
    return root


def test_a_kernel_the_user_has_is_booted_from_lossbed_vm_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel.KERNEL_ENV, str(fake_kernel(tmp_path / "k")))
    found = kernel.find_kernel(cache=tmp_path / "empty")
    assert found.version == "6.1.0-99-amd64" and found.image == tmp_path / "k" / "vmlinuz"
    assert found.modules == tmp_path / "k" / "lib" / "modules" / "6.1.0-99-amd64"
    monkeypatch.setenv(kernel.KERNEL_ENV, str(fake_kernel(tmp_path / "nodep", depmod=False)))
    with pytest.raises(EnvironmentProblem, match="depmod -b"):
        kernel.find_kernel(cache=tmp_path / "empty")


def test_without_a_cached_kernel_vm_hosts_say_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.delenv(kernel.KERNEL_ENV, raising=False)
    half = fake_kernel(tmp_path / "cache" / "kernel-linux-image-x_1")  # no .complete: half
    assert half.is_dir()
    with pytest.raises(EnvironmentProblem, match="make setup.*LOSSBED_VM_KERNEL"):
        kernel.find_kernel(cache=tmp_path / "cache")
    (half / kernel.COMPLETE).write_text("{}")
    assert kernel.find_kernel(cache=tmp_path / "cache").root == half


def test_the_guest_init_binds_the_cached_modules_and_xz_modules_are_unpacked(tmp_path):
    guest = kernel.GuestKernel(tmp_path / "vmlinuz", "6.1.0-99-amd64", tmp_path / "a b")
    script = image.init_script(guest)
    assert "mount --bind '" + str(guest.modules) + "' /lib/modules/6.1.0-99-amd64" in script
    module = tmp_path / "virtio.ko.xz"
    module.write_bytes(lzma.compress(b"\x7fELF module"))
    assert image.module_bytes(module) == b"\x7fELF module"


def test_a_python_too_old_for_lossbed_is_refused_with_the_distributions_fix(monkeypatch,
                                                                             capsys, tmp_path):
    """Ubuntu 22.04's python3 is 3.10: setup stops before any package, naming the fix."""
    assert system_packages.python_refusal((3, 11)) is None
    assert system_packages.python_refusal((3, 13)) is None
    said = system_packages.python_refusal((3, 10))
    assert "this python3 is 3.10" in said and "make setup PYTHON=python3.11" in said
    monkeypatch.setattr(system_packages.sys, "version_info", (3, 10, 12))
    ran = []
    monkeypatch.setattr(system_packages, "missing", lambda packages: ran.append(1) or [])
    path = tmp_path / "os-release"
    path.write_text(RELEASES["ubuntu-22.04"])
    assert system_packages.main(["bench", "--print", "--os-release", str(path)]) == 2
    assert "python3.11-venv" in capsys.readouterr().err and ran == []


def test_make_chooses_a_python_new_enough_when_python3_is_too_old(tmp_path):
    """Ubuntu 22.04: python3 is 3.10, python3.12 installed beside it. make takes the first of
    python3, python3.13, python3.12, python3.11 that is 3.11 or newer (a PYTHON given is kept);
    with none, python3, which setup refuses with the fix (the test above)."""
    import os

    too_old = "#!/bin/sh\nexit 1\n"  # what a 3.10 answers to the version check
    for name in ("python3", "python3.13", "python3.11"):
        (tmp_path / name).write_text(too_old)
        (tmp_path / name).chmod(0o755)
    (tmp_path / "python3.12").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}
    env.pop("PYTHON", None)

    def dry_run(*args):
        done = subprocess.run(["make", "-n", "--no-print-directory", "setup", "PRINT=1", *args],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "python3.12 -m testbed.system_packages test --print" in dry_run()
    assert "/opt/py -m testbed.system_packages" in dry_run("PYTHON=/opt/py")
    (tmp_path / "python3.12").unlink()
    (tmp_path / "python3.12").write_text(too_old)
    (tmp_path / "python3.12").chmod(0o755)
    assert "python3 -m testbed.system_packages test --print" in dry_run()
