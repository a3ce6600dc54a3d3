"""lossbed's version, with the commit of the checkout it runs from (`lossbed --version`)."""

from __future__ import annotations

import argparse
import subprocess
from importlib import metadata
from pathlib import Path


def commit() -> str | None:
    """The short commit of the checkout lossbed runs from, or None (not a git checkout)."""
    root = Path(__file__).resolve().parents[1]
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def text() -> str:
    """lossbed's release, with the commit of its checkout where there is one."""
    try:
        release = metadata.version("lossbed")
    except metadata.PackageNotFoundError:
        release = "unknown (not installed)"
    found = commit()
    return f"lossbed {release}" + (f" (commit {found})" if found else "")


class Version(argparse.Action):
    """--version, worked out only when asked for (it asks git for the commit)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(text())
        parser.exit()
