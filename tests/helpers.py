"""Helpers shared by the privileged tests."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from testbed import netns_cluster, state

REPO = Path(__file__).resolve().parents[1]
LOSSBED = [sys.executable, "-m", "testbed.cli"]


def unique_name() -> str:
    """A cluster name no other test uses: leftovers can be traced to the test by name."""
    return "t" + uuid.uuid4().hex[:6]


def lossbed(*args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    return subprocess.run(
        [*LOSSBED, *args], capture_output=True, text=True, timeout=timeout, check=check,
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def leftovers(name: str) -> dict:
    """Everything of cluster `name` that is still on this machine."""
    return {
        "namespaces": netns_cluster.cluster_namespaces(name),
        "etc_netns": sorted(p.name for p in netns_cluster.NETNS_ETC.glob(f"lossbed-{name}-*")),
        "state": state.cluster_dir(name).exists(),
    }


NOTHING = {"namespaces": [], "etc_netns": [], "state": False}
