"""The record of what a cluster created, kept under /run/lossbed/<cluster>/.

The record is written before the first kernel object is made and updated as the cluster
grows, so a crash at any point leaves enough behind for `lossbed down` to finish the job
(which also scans by name prefix, in case the record itself was never written).
/run is a tmpfs: after a reboot the kernel objects are gone and so is the record.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from testbed.errors import ClusterError

STATE_ROOT_ENV = "LOSSBED_STATE_DIR"
DEFAULT_STATE_ROOT = "/run/lossbed"
CLUSTER_FILE = "cluster.json"


def state_root() -> Path:
    return Path(os.environ.get(STATE_ROOT_ENV, DEFAULT_STATE_ROOT))


def cluster_dir(cluster: str) -> Path:
    return state_root() / cluster


def claim(cluster: str) -> Path:
    """Create the cluster's state folder; fails if it exists, so two `up`s cannot share a name."""
    state_root().mkdir(parents=True, exist_ok=True)
    path = cluster_dir(cluster)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        raise ClusterError(
            f"cluster {cluster!r} is already up (state in {path}). "
            f"Use another --name, or remove it first with: lossbed down {cluster}"
        ) from None
    return path


def write(cluster: str, record: dict[str, Any]) -> None:
    """Replace the cluster's record atomically (write a temporary file, then rename)."""
    path = cluster_dir(cluster) / CLUSTER_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read(cluster: str) -> dict[str, Any] | None:
    """The cluster's record, or None if it has none (never created, or crashed before writing)."""
    path = cluster_dir(cluster) / CLUSTER_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        # A record cut short by a crash: `down` still works from the name prefix.
        return None


def recorded_clusters() -> list[str]:
    root = state_root()
    if not root.is_dir():
        return []
    # dot-folders are lossbed's own (remote clusters' records), not local clusters
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def forget(cluster: str) -> None:
    """Remove the cluster's state folder, and the state root when it is left empty."""
    shutil.rmtree(cluster_dir(cluster), ignore_errors=True)
    try:
        state_root().rmdir()
    except OSError:
        pass  # not empty (other clusters) or already gone
