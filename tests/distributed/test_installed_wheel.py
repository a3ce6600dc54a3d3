"""lossbed works installed, not only from a checkout: a wheel built from the working tree and
installed into a fresh venv brings up a namespace cluster, applies a named profile (found in
the wheel, not in the checkout), verifies it against the kernel's counters and trains, from a
folder outside the checkout. The venv gets lossbed's dependencies from the test environment
(a path line in a .pth file: that folder's own .pth files, the checkout's editable hook among
them, are not read), so only lossbed itself comes from the wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from testbed import clusters
from tests.helpers import NOTHING, REPO, leftovers, unique_name

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def _working_tree_copy(target: Path) -> Path:
    """The files git would commit now (tracked and new, not ignored): no build/ or .venv."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True, check=True)
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin/ folder of a fresh venv holding lossbed's wheel."""
    root = tmp_path_factory.mktemp("wheel")
    source = _working_tree_copy(root / "src")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "--disable-pip-version-check", "-w",
                            str(root / "dist"), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    env = root / "env"
    venv.create(env, with_pip=False)
    wheel = next((root / "dist").glob("lossbed-*.whl"))
    put = subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"),
                          "install", "-q", "--no-deps", "--no-index", "--no-compile",
                          "--disable-pip-version-check", str(wheel)],
                         capture_output=True, text=True)
    assert put.returncode == 0, put.stderr
    site = subprocess.run([env / "bin" / "python", "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "zz_lossbed_dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    return env / "bin"


def _run(bin_dir: Path, *args: str, cwd: Path, timeout: float = 300):
    # PYTHONPATH keeps only the fork audit's folder: nothing points at the checkout
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and Path(p).resolve() != REPO.resolve()]
    return subprocess.run([str(bin_dir / "lossbed"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(path)})


def test_the_wheel_carries_the_profiles_and_the_core(installed, tmp_path):
    where = subprocess.run(
        [installed / "python", "-c", "import harness, testbed.profiles.loading as l, "
         "harness.transport._wire as w; print(harness.__file__); print(l.profiles_dir()); "
         "print(w.__file__)"], capture_output=True, text=True, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    package, profiles, core = (Path(line) for line in where.stdout.split())
    env = installed.parent.resolve()
    for path in (package, profiles, core):
        assert path.resolve().is_relative_to(env), f"{path} is not from the installed wheel"
    assert (profiles / "random-loss.yaml").is_file()


def test_the_installed_cli_applies_a_named_profile_and_trains(installed, tmp_path):
    name = unique_name()
    try:
        up = _run(installed, "up", "--hosts", "2", "--name", name, cwd=tmp_path)
        assert up.returncode == 0, up.stderr
        applied = _run(installed, "apply", "random-loss", "--cluster", name, "--set",
                       "loss_pct=20", cwd=tmp_path)
        assert applied.returncode == 0, applied.stderr
        shown = _run(installed, "show", "--cluster", name, "--json", cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert "random-loss" in shown.stdout
        cleared = _run(installed, "clear", "--cluster", name, cwd=tmp_path)
        assert cleared.returncode == 0, cleared.stderr
        record = tmp_path / "train.json"
        trained = _run(installed, "train", "--cluster", name, "--variant", "unbiased",
                       "--profile", "random-loss", "--steps", "3", "--batch", "2",
                       "--seq-len", "32", "--eval-tokens", "256", "--tokenizer", "bytes",
                       "--json", str(record), cwd=tmp_path)
        assert trained.returncode == 0, trained.stderr[-3000:]
        result = json.loads(record.read_text())
        assert result["steps"] == 3 and result["tokens_per_s"] > 0
    finally:
        clusters.down(name)
    assert leftovers(name) == NOTHING
