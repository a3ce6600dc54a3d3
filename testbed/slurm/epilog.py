"""Slurm's Epilog for lossbed: at the end of every job on a node, completed, failed or
cancelled, as root (slurmd runs it with SLURM_JOB_ID and SLURMD_NODENAME set):

    Epilog=/etc/slurm/epilog.d/lossbed     # a script that runs python -m testbed.slurm.epilog

It tells the node's agent that the job ended; the agent clears the job's impairment if it
held one. If the agent does not answer, the Epilog clears it itself from the agent's
record. It exits non-zero only if an impairment of the job could not be cleared: Slurm then
drains the node, which is right for a node whose link may still drop packets.
"""

from __future__ import annotations

import os
import sys

from testbed.errors import LossbedError
from testbed.slurm import agent, policy


def main() -> int:
    job, node = os.environ.get("SLURM_JOB_ID", ""), os.environ.get("SLURMD_NODENAME", "")
    try:
        config = policy.load_config()
        node = policy.node_name(node)
    except LossbedError as err:
        print(f"lossbed epilog: {err}", file=sys.stderr)
        return 0  # no lossbed here, or nothing it can name: nothing of lossbed's to clear
    try:
        reply = agent.ask(config, node, {"op": "release", "job": job}, timeout=60)
        if "result" in reply:
            return 0
        print(f"lossbed epilog: the agent said: {reply.get('error')}", file=sys.stderr)
    except LossbedError as err:
        print(f"lossbed epilog: {err}; clearing from the agent's record", file=sys.stderr)
    try:  # the agent is not there: its own release, from its record, run here
        agent.Agent(config, node).release(job)
        return 0
    except Exception as err:
        print(f"lossbed epilog: could not clear job {job}'s impairment on {node}: {err}",
              file=sys.stderr)
        return 1

if __name__ == "__main__":
    sys.exit(main())
