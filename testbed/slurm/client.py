"""What a job's process on a Slurm node runs to reach the node's lossbed agent:

    python -m testbed.slurm.client OP  < request.json  > reply.json

the same request and reply as testbed.host.agent's (the controller's SrunHost starts it on
each node with srun), handed to the agent (agent.py) with the job's id; the node is the one
slurmd named (SLURMD_NODENAME), the agent's socket the admin's configuration's."""

from __future__ import annotations

import json
import os
import sys

from testbed.errors import LossbedError
from testbed.slurm import agent, policy


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(json.dumps({"error": "usage: python -m testbed.slurm.client OP",
                          "type": "UsageError"}))
        return 2
    request = json.loads(sys.stdin.read() or "{}")
    try:
        node = os.environ.get("SLURMD_NODENAME")
        if not node:
            raise LossbedError("SLURMD_NODENAME is not set: run this on a node, under srun")
        reply = agent.ask(policy.load_config(), node, {
            "op": argv[0], "job": os.environ.get("SLURM_JOB_ID"),
            "payload": request.get("payload", {})})
    except LossbedError as err:
        reply = {"error": str(err), "type": type(err).__name__}
    print(json.dumps(reply))
    return 0 if "result" in reply else 1


if __name__ == "__main__":
    sys.exit(main())
