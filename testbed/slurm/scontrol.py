"""What slurmctld says of a job and of nodes, read with scontrol (the one place lossbed asks):
a job's user, state and nodes; the nodes' addresses."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from testbed.errors import ClusterError
from testbed.slurm import hostlist

TIMEOUT_S = 60


@dataclass(frozen=True)
class Job:
    id: str
    state: str          # RUNNING, COMPLETING, ...
    uid: int
    nodes: tuple[str, ...]


def _records(argv: list[str]) -> tuple[list[dict[str, str]], str]:
    """scontrol -o's records (one line each, KEY=VALUE words), and what it said on stderr."""
    done = subprocess.run(["scontrol", "-o", *argv], capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    records = [dict(w.split("=", 1) for w in line.split() if "=" in w)
               for line in done.stdout.splitlines() if line.strip()]
    return records, done.stderr.strip()


def job(job_id: str) -> Job | None:
    """The job as slurmctld knows it now, or None if it knows none by that id."""
    if not job_id.isdigit():
        return None
    records, _ = _records(["show", "job", job_id])
    fields = next((r for r in records if r.get("JobId") == job_id), None)
    if fields is None:
        return None
    uid = fields.get("UserId", "").rsplit("(", 1)[-1].rstrip(")")
    listed = fields.get("NodeList", "")
    return Job(job_id, fields.get("JobState", ""), int(uid) if uid.isdigit() else -1,
               tuple(hostlist.expand(listed, "NodeList")) if listed not in ("", "(null)")
               else ())


def node_addresses(nodes: list[str]) -> dict[str, str]:
    """Each node's address, as slurmctld has it (NodeAddr); ClusterError naming a node it
    has none for."""
    records, said = _records(["show", "node", ",".join(nodes)])
    found = {r["NodeName"]: r["NodeAddr"] for r in records
             if r.get("NodeName") in nodes and r.get("NodeAddr")}
    missing = [n for n in nodes if n not in found]
    if missing:
        raise ClusterError(f"Slurm gives no address for node(s) {', '.join(missing)}: "
                           f"{said or 'scontrol show node found none'}")
    return found
