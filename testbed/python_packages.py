"""The pip constraints `make setup` installs with: requirements.lock, less what must be kept.

    python -m testbed.python_packages constraints requirements.lock [--keep-installed]

It runs under the Python that lossbed is being installed into (before lossbed is), so the
standard library only. The lock pins every package for this project's CI; a GPU host brings
its own torch (a CUDA build for its driver), which the lock's pin would replace. So:

- a torch already visible to that Python is kept: the constraint pins it to its own version
  (and is refused, with the fix, when it is older than pyproject's floor); when it differs
  from the lock's, the lock's pins of torch's own requirements are dropped too, so pip keeps
  what that torch was installed with;
- a package visible from outside the environment (a venv made with --system-site-packages
  sees the system's) is kept as it is;
- with --keep-installed (an environment lossbed did not make: `make setup VENV=path`), every
  package already there is kept; pip upgrades one only if it is below pyproject's range.

Everything else follows the lock.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def normalize(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """{name: version} of every `name==version` line."""
    pins = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise SystemExit(f"{path}:{number}: expected 'name==version', got {line!r}")
        pins[normalize(name.strip())] = version.strip()
    return pins


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version ('2.11.0+cu130' -> (2, 11, 0)), for floor checks."""
    numbers = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(n) for n in numbers.group(0).split(".")) if numbers else ()


def floor_of(package: str, pyproject: Path = PYPROJECT) -> str | None:
    """The `>=` floor pyproject.toml gives the package, if any."""
    for requirement in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
        if normalize(name) == normalize(package):
            found = re.search(r">=\s*([0-9][0-9.]*)", requirement)
            return found.group(1) if found else None
    return None


def _installed() -> dict[str, metadata.Distribution]:
    found: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions():  # the first on sys.path wins, as for imports
        name = dist.metadata["Name"]
        if name:
            found.setdefault(normalize(name), dist)
    return found


def _outside_this_environment(dist: metadata.Distribution) -> bool:
    where = Path(str(dist.locate_file(""))).resolve()
    return not where.is_relative_to(Path(sys.prefix).resolve())


def _requirement_names(dist: metadata.Distribution) -> set[str]:
    names = set()
    for requirement in dist.requires or []:
        if "extra ==" in requirement:
            continue
        names.add(normalize(re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)))
    return names


class TorchTooOld(SystemExit):
    pass


def constraints(lock: dict[str, str], keep_installed: bool = False,
                installed: dict[str, metadata.Distribution] | None = None,
                torch_floor: str | None = None) -> tuple[dict[str, str], list[str]]:
    """(the constraints {name: version}, what was kept and why: one line each)."""
    installed = _installed() if installed is None else installed
    kept: list[str] = []
    out: dict[str, str] = {}
    for name, version in lock.items():
        dist = installed.get(name)
        if dist is not None and (keep_installed or _outside_this_environment(dist)):
            if dist.version != version:
                kept.append(f"{name} {dist.version} (already installed; the lock has {version})")
            continue
        out[name] = version
    torch = installed.get("torch")
    if torch is not None:
        if torch_floor and release(torch.version) < release(torch_floor):
            raise TorchTooOld(
                f"torch {torch.version} is installed in {sys.prefix}, and lossbed needs "
                f"torch>={torch_floor}. lossbed never replaces an installed torch: upgrade it "
                f"(the build for your CUDA), or install lossbed into another environment.")
        out["torch"] = torch.version
        # a local label (+cpu, +cu130) names the build, not another release
        if torch.version.split("+")[0] != lock.get("torch", "").split("+")[0]:
            kept.append(f"torch {torch.version} (already installed; never replaced)")
            for name in _requirement_names(torch):
                out.pop(name, None)
    return out, kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.python_packages")
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("constraints", help="print the pip constraints for this Python")
    make.add_argument("lock", type=Path, help="the lock file (requirements.lock)")
    make.add_argument("--keep-installed", action="store_true",
                      help="keep every package already installed (an environment lossbed "
                           "did not make)")
    args = parser.parse_args(argv)
    try:
        pins, kept = constraints(read_lock(args.lock), args.keep_installed,
                                 torch_floor=floor_of("torch"))
    except TorchTooOld as err:
        print(f"make setup: {err}", file=sys.stderr)
        return 2
    for line in kept:
        print(f"make setup: keeping {line}", file=sys.stderr)
    sys.stdout.write("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
