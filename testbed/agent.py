"""The work lossbed does *on* a host, behind one entry point, so the same code runs wherever
the host is: in this process for a namespace host (through a netlink session opened into its
namespace), or inside a VM or on a remote machine as

    python -m testbed.agent OP  < request.json  > reply.json

where the host is the machine the agent runs on. Operations: probe (which impairment
backends the kernel has), apply, clear, counters (of an applied plan), udp_snmp.
"""

from __future__ import annotations

import json
import sys
import traceback

from testbed.errors import LossbedError


def _backends():
    from testbed.impair.registry import BACKENDS

    return BACKENDS


def probe(host, payload: dict) -> dict:
    results = {}
    for name, module in _backends().items():
        try:
            results[name] = module.probe(host)
        except Exception as err:  # a probe must never take the run down: report it instead
            results[name] = f"probe failed: {err}"
    return results


def apply(host, payload: dict) -> dict:
    from testbed.impair.plan import HostPlan

    return _backends()[payload["backend"]].apply(host, HostPlan.from_dict(payload["plan"]))


def clear(host, payload: dict) -> list[str]:
    """Remove lossbed's objects of every backend (also those of a crashed run)."""
    cleared, errors = [], []
    for name, module in _backends().items():
        try:
            if module.clear(host, host.ifname):
                cleared.append(name)
        except Exception as err:
            errors.append(f"{name}: {err}")
    if errors:
        raise LossbedError(f"host {host.name}: could not clear everything: " + "; ".join(errors))
    return cleared


def counters(host, payload: dict) -> list[dict]:
    from testbed.impair.plan import HostPlan

    module = _backends()[payload["backend"]]
    found = module.read_counters(host, HostPlan.from_dict(payload["plan"]),
                                 payload.get("handles") or {})
    return [c.to_dict() for c in found]


def udp_snmp(host, payload: dict) -> dict:
    result = host.run(["cat", "/proc/net/snmp"], check=True)
    rows = [line.split() for line in result.stdout.decode().splitlines()
            if line.startswith("Udp:")]
    return {name: int(value) for name, value in zip(rows[0][1:], rows[1][1:], strict=True)}


OPERATIONS = {"probe": probe, "apply": apply, "clear": clear, "counters": counters,
              "udp_snmp": udp_snmp}


def dispatch(host, op: str, payload: dict):
    return OPERATIONS[op](host, payload)


def main(argv: list[str] | None = None) -> int:
    """Run one operation on this machine: request JSON on stdin, reply JSON on stdout."""
    from testbed.hosts import LocalHost

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in OPERATIONS:
        print(json.dumps({"error": f"usage: python -m testbed.agent {{{','.join(OPERATIONS)}}}",
                          "type": "UsageError"}))
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


if __name__ == "__main__":
    sys.exit(main())
