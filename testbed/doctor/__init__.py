"""`lossbed doctor`: per host, what each lossbed feature needs and whether it is there, judged
against the run that is asked for, with the command that fixes each missing piece.

In three rooms, one job each:

    facts.py     gathered on every host at once (the `checkup` agent operation), typed
    judge.py     typed facts and the run asked for (request.py) in, findings out
    render.py    the table `lossbed doctor` prints, and the refusal before a run

`python -m testbed.doctor` (__main__.py) runs the checks on this machine alone.
"""

from __future__ import annotations

from testbed.doctor import judge
from testbed.doctor.facts import HostFacts, gather
from testbed.doctor.render import refusal, render
from testbed.doctor.request import Finding, Report, Request

__all__ = ["Finding", "HostFacts", "Report", "Request", "examine", "gather", "judge",
           "ranks_per_host", "render", "require"]  # (judge: the module)


def ranks_per_host(cluster) -> int:
    """The most ranks one host runs: one per GPU where the inventory gives lossbed_gpus."""
    return max(max(1, h.gpus) for h in cluster.hosts)


def examine(cluster, request: Request, with_python: bool = True) -> Report:
    return judge.judge(cluster, gather(cluster, with_python), request)


def require(cluster, request: Request) -> Report:
    """The checks a run needs, before ranks are launched: EnvironmentProblem naming every
    failing one with its fix."""
    report = examine(cluster, request)
    if report.blocking:
        raise refusal(report)
    return report
