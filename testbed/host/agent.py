"""The agent: lossbed's host-side operations (operations.py) as a command, for hosts that
are not this process's (a remote machine over SSH; the Ansible roles):

    python -m testbed.host.agent OP  < request.json  > reply.json

where the host is the machine the agent runs on; and the lease watchdog:

    python -m testbed.host.agent watchdog LEASE_FILE IFNAME
"""

from __future__ import annotations

import json
import sys
import traceback

from testbed.errors import LossbedError
from testbed.host.hosts import LocalHost
from testbed.host.operations import OPERATIONS, backends, dispatch


def main(argv: list[str] | None = None) -> int:
    """Run one operation on this machine: request JSON on stdin, reply JSON on stdout."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["watchdog"] and len(argv) == 3:
        return watchdog(argv[1], argv[2])
    if len(argv) != 1 or argv[0] not in OPERATIONS:
        usage = f"usage: python -m testbed.host.agent {{{','.join(OPERATIONS)}}}"
        print(json.dumps({"error": usage, "type": "UsageError"}))
        return 2
    request = json.loads(sys.stdin.read() or "{}")
    host = LocalHost(**request.get("host", {}))
    try:
        print(json.dumps({"result": dispatch(host, argv[0], request.get("payload", {}))}))
        return 0
    except LossbedError as err:
        print(json.dumps({"error": str(err), "type": type(err).__name__}))
        return 1
    except Exception as err:
        print(json.dumps({"error": f"{type(err).__name__}: {err}", "type": "AgentCrash",
                          "traceback": traceback.format_exc()}))
        return 1


def watchdog(lease_path: str, ifname: str) -> int:
    """Detached beside an impairment: clears it when its lease expires (testbed.host.lease)."""
    from pathlib import Path

    from testbed.host import lease

    host = LocalHost(name="local", ifname=ifname)

    def clear_all():
        errors = []
        for name, module in backends().items():
            try:
                module.clear(host, ifname)
            except Exception as err:  # clear the others too, then say what failed
                errors.append(f"{name}: {err}")
        if errors:
            raise LossbedError("; ".join(errors))

    lease.watch(Path(lease_path), ifname, clear_all)
    return 0


if __name__ == "__main__":
    sys.exit(main())
