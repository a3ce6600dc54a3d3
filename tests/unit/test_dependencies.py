"""pyproject.toml holds ranges and requirements.lock the exact versions CI installs; the lock
satisfies the ranges. Installing into an environment that already holds torch keeps that
torch: shown with a stand-in torch 2.5.0 (its metadata only) in a new venv and pip run offline
(--no-index), where any attempt to replace it fails."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from testbed import python_packages
from tests.helpers import REPO

LOCK = REPO / "requirements.lock"


def _requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + project["optional-dependencies"]["dev"]
    return [Requirement(text) for text in listed]


def test_pyproject_holds_ranges_not_pins():
    for requirement in _requirements():
        assert not any(spec.operator in ("==", "===") for spec in requirement.specifier), (
            f"{requirement}: an exact pin belongs in requirements.lock, not pyproject.toml")
    torch = next(r for r in _requirements() if r.name == "torch")
    assert torch.specifier.contains("2.4.0"), "torch's floor is no newer than 2.4"


def test_the_lock_satisfies_every_range():
    pins = python_packages.read_lock(LOCK)
    for requirement in _requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is in pyproject.toml but not in the lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"the lock's {name}=={pins[name]} is outside pyproject's {requirement}")


def _fake_distribution(site: Path, name: str, version: str, requires: list[str]) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    """A minimal pure-Python wheel with only its metadata, built by hand (no build backend)."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{info}/METADATA": "\n".join(["Metadata-Version: 2.1", f"Name: {name}",
                                       f"Version: {version}",
                                       *(f"Requires-Dist: {r}" for r in requires)]) + "\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def _venv_with_torch(root: Path, torch_version: str) -> Path:
    venv.create(root, with_pip=False)
    python = root / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    # torch 2.5 pinned sympy exactly: a lock pin of sympy would fight it
    site = Path(site.stdout.strip())
    _fake_distribution(site, "torch", torch_version, ["sympy==1.13.1", "filelock"])
    _fake_distribution(site, "sympy", "1.13.1", [])
    _fake_distribution(site, "filelock", "3.13.0", [])
    return python


def _constraints(python: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "testbed.python_packages", "constraints", str(LOCK),
                           *flags], capture_output=True, text=True, cwd=REPO)


def _torch_version(python: Path) -> str:
    return subprocess.run([python, "-c", "from importlib.metadata import version; "
                           "print(version('torch'))"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_an_installed_torch_is_kept_and_its_own_pins_win(tmp_path):
    python = _venv_with_torch(tmp_path / "env", "2.5.0")
    made = _constraints(python)
    assert made.returncode == 0, made.stderr
    pins = dict(line.split("==") for line in made.stdout.split())
    assert pins["torch"] == "2.5.0"
    assert "sympy" not in pins and "filelock" not in pins, "torch's own requirements are its"
    assert pins["numpy"] == python_packages.read_lock(LOCK)["numpy"], "the rest is locked"
    assert "keeping torch 2.5.0" in made.stderr

    # pip, offline, installs a package that needs torch>=2.4 with those constraints: nothing
    # to fetch, torch untouched. With the lock's own torch pin it would have to replace it.
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "needs_torch", "1.0", ["torch>=2.4"])
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"torch=={pins['torch']}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index",
           "--find-links", str(wheels), "--no-compile", "--disable-pip-version-check"]
    kept = subprocess.run([*pip, "-c", str(constraints), "needs_torch"], capture_output=True,
                          text=True)
    assert kept.returncode == 0, kept.stderr
    assert _torch_version(python) == "2.5.0"
    locked = tmp_path / "locked.txt"
    locked.write_text(f"torch=={python_packages.read_lock(LOCK)['torch']}\n")
    replaced = subprocess.run([*pip, "--force-reinstall", "-c", str(locked), "needs_torch"],
                              capture_output=True, text=True)
    assert replaced.returncode != 0 and "torch" in replaced.stderr, replaced.stderr
    assert _torch_version(python) == "2.5.0"


def test_a_torch_below_the_floor_is_refused_with_the_fix(tmp_path):
    python = _venv_with_torch(tmp_path / "env", "2.3.1")
    made = _constraints(python)
    assert made.returncode == 2
    assert "torch 2.3.1" in made.stderr and "torch>=2.4" in made.stderr
    assert "never replaces" in made.stderr


def test_an_environment_lossbed_did_not_make_keeps_everything_there(tmp_path):
    python = _venv_with_torch(tmp_path / "env", "2.13.0")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    _fake_distribution(site, "numpy", "1.26.4", [])
    locked = _constraints(python)
    kept = _constraints(python, "--keep-installed")
    assert "numpy==" + python_packages.read_lock(LOCK)["numpy"] in locked.stdout.split()
    assert "numpy==" not in kept.stdout and "keeping numpy 1.26.4" in kept.stderr
