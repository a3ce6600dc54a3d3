"""`python -m testbed.doctor --interface IF`: the checks on this machine alone (the Ansible
verify role runs it on every host). Exit 0, or 3 when something is missing."""

from __future__ import annotations

import sys

from testbed.doctor import examine, render
from testbed.doctor.request import BACKENDS, DEVICES, Request


class _ThisMachine:
    """This machine as a one-host cluster (testbed/clusters/contract.py): what the Ansible
    verify role examines on a host. Its ranks run on this machine's own network, not in
    namespaces of it: it does not share the machine the way namespace hosts do."""

    kind = "local"
    shares_this_machine = False
    lease_s = None
    force_interface = False

    def __init__(self, ifname: str, mtu: int):
        import socket

        from testbed.host.hosts import LocalHost

        self.name = socket.gethostname()
        self.mtu = mtu
        self.hosts = [LocalHost(name=self.name, ifname=ifname)]

    def connect(self) -> None:
        pass

    def close(self) -> None:
        pass

    def rank_python(self, host) -> str:
        return sys.executable

    def status(self) -> dict:
        return {"name": self.name, "kind": self.kind, "mtu": self.mtu}


def main(argv: list[str] | None = None) -> int:
    """`python -m testbed.doctor --interface IF`: the checks on this machine alone (the
    Ansible verify role runs it on every host). Exit 0, or 3 when something is missing."""
    import argparse
    import json
    import os

    parser = argparse.ArgumentParser(prog="python -m testbed.doctor",
                                     description=main.__doc__.splitlines()[0])
    parser.add_argument("--interface", required=True, help="the NIC lossbed impairs here")
    parser.add_argument("--mtu", type=int, default=1500, help="the data-plane MTU")
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--process-group", choices=BACKENDS,
                        default=os.environ.get("LOSSBED_BACKEND", "gloo"))
    parser.add_argument("--ranks", type=int, default=1, help="ranks on this host")
    parser.add_argument("--force-interface", action="store_true",
                        help="the run impairs the interface even if it carries SSH")
    parser.add_argument("--skip-interpreter", action="store_true",
                        help="leave out the ranks' Python (version, torch, CUDA, the compiled "
                             "core): for hosts whose training Python is checked elsewhere")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    machine = _ThisMachine(args.interface, args.mtu)
    report = examine(machine, Request(device=args.device, backend=args.process_group,
                                      ranks_per_host=args.ranks,
                                      force_interface=args.force_interface),
                     with_python=not args.skip_interpreter)
    print(json.dumps(report.to_dict(), indent=2) if args.json else render(report))
    return 3 if report.blocking else 0


if __name__ == "__main__":
    sys.exit(main())
