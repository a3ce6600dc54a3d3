"""Is there an RDMA device on a host? (`--transport verbs` asks before anything starts.)"""

from __future__ import annotations

from testbed.errors import EnvironmentProblem, LossbedError

PYVERBS_CHECK = ["/usr/bin/python3", "-c", "import pyverbs.device"]


def require(hosts) -> None:
    for host in hosts:
        listing = host.run(["sh", "-c", "ls /sys/class/infiniband 2>/dev/null"])
        devices = listing.stdout.decode().split()
        if not devices:
            raise EnvironmentProblem(
                f"--transport verbs: host {host.name} has no RDMA device "
                "(/sys/class/infiniband is empty). Use VM hosts with Soft-RoCE "
                "(lossbed up --kind vm --rdma) or hosts with RDMA NICs; the emulated "
                "semantics roce-ud, roce-uc and roce-rc need none")
        if host.run(PYVERBS_CHECK).returncode != 0:
            raise EnvironmentProblem(
                f"--transport verbs: host {host.name} has {', '.join(devices)} but no "
                "pyverbs: install rdma-core and python3-pyverbs there")
    raise LossbedError(
        "--transport verbs: the RDMA devices are there, but the lossy collectives do not "
        "run over verbs queue pairs yet; use roce-ud, roce-uc or roce-rc (emulated on "
        "UDP); over real queue pairs, python3 -m harness.verbs.collective runs the lossy "
        "all-reduce between two hosts (torch-free), and harness.verbs.transfer moves messages")
