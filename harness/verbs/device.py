"""Is there an RDMA device on every host? (`--transport verbs-*` asks before anything starts.)"""

from __future__ import annotations

import sys

from harness.verbs.api import SYSTEM_PACKAGES
from testbed.errors import EnvironmentProblem

# What the ranks will do (harness/verbs/api.py): load pyverbs in the Python that runs them,
# from the system's packages if it has none of its own
PYVERBS_CHECK = [sys.executable, "-c", "import sys\ntry:\n import pyverbs.device\nexcept "
                 f"ImportError:\n sys.path.append('{SYSTEM_PACKAGES}')\n import pyverbs.device"]


def require_for(transports: list[str], cluster) -> None:
    """require(cluster) if any of `transports` (as --transport takes them) is a verbs one
    (cluster None: no hosts to ask)."""
    from harness.transport.semantics import Semantics

    if cluster is not None and any(Semantics.parse(t).verbs for t in transports if t):
        require(cluster)


def require(cluster) -> None:
    """Every host has an RDMA device, and the Python that runs its ranks loads pyverbs."""
    for host in cluster.hosts:
        listing = host.run(["sh", "-c", "ls /sys/class/infiniband 2>/dev/null"])
        devices = listing.stdout.decode().split()
        if not devices:
            raise EnvironmentProblem(
                f"--transport verbs: host {host.name} has no RDMA device "
                "(/sys/class/infiniband is empty). Use VM hosts with Soft-RoCE "
                "(lossbed up --kind vm --rdma) or hosts with RDMA NICs; the emulated "
                "semantics roce-ud, roce-uc and roce-rc need none")
        check = [cluster.rank_python(host), *PYVERBS_CHECK[1:]]
        loaded = host.run(check)
        if loaded.returncode != 0:
            raise EnvironmentProblem(
                f"--transport verbs: host {host.name} has {', '.join(devices)} but its ranks' "
                f"Python cannot load pyverbs: {loaded.stderr.decode().strip()[-300:]}")
