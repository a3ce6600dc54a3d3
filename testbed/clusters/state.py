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

from testbed.errors import ClusterError, UsageError

STATE_ROOT_ENV = "LOSSBED_STATE_DIR"
DEFAULT_STATE_ROOT = "/run/lossbed"
CLUSTER_FILE = "cluster.json"


def state_root() -> Path:
    """LOSSBED_STATE_DIR, else /run/lossbed for root; a user's own (a Slurm job's, who is
    not root) in their runtime folder, or /tmp/lossbed-UID."""
    if os.environ.get(STATE_ROOT_ENV):
        return Path(os.environ[STATE_ROOT_ENV])
    if os.geteuid() == 0:
        return Path(DEFAULT_STATE_ROOT)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "lossbed" if runtime else Path(f"/tmp/lossbed-{os.getuid()}")


def cluster_dir(cluster: str) -> Path:
    """The cluster's folder: always a direct child of the state root, whatever `cluster` is.

    This is the state module's own guard, independent of the name rule the commands apply
    first (naming.check_cluster_name): a name that would lead anywhere else ('..', '/x',
    'a/b', '') is refused here too, so nothing can be created or removed outside the root."""
    if (not isinstance(cluster, str) or cluster in ("", ".", "..") or "/" in cluster
            or "\0" in cluster or cluster.startswith(".")):
        raise UsageError("NAME", f"{cluster!r} would be a path outside lossbed's state folder "
                         f"{state_root()}", "Use a cluster name (lower-case letters and digits)")
    return state_root() / cluster


def _inside_root(path: Path) -> bool:
    """True when `path`, with every link resolved, is a folder directly inside the root."""
    try:
        return path.resolve().parent == state_root().resolve() and path.is_dir() \
            and not path.is_symlink()
    except OSError:
        return False


def claim(cluster: str) -> Path:
    """Create the cluster's state folder; fails if it exists, so two `up`s cannot share a name."""
    path = cluster_dir(cluster)
    state_root().mkdir(parents=True, exist_ok=True)
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
    """Remove the cluster's state folder, and the state root when it is left empty. Only a
    real folder directly inside the root is ever removed (not a link out of it)."""
    path = cluster_dir(cluster)
    if path.is_symlink() or (path.exists() and not _inside_root(path)):
        raise UsageError("NAME", f"{path} is outside lossbed's state folder {state_root()} "
                         "(a link?): not removing it", "Remove it by hand if it is yours")
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
    try:
        state_root().rmdir()
    except OSError:
        pass  # not empty (other clusters) or already gone
