"""What `lossbed run` checks on the hosts before anything is impaired or started: torchrun
and the script are where each host will look for them, and the ranks' Python imports what
a rank imports. A job refused here has touched nothing. (The hosts' commands are
harness.torchrun's HostCommand: host, argv, env, cwd; its Checked: torchrun_options and
script.)"""

from __future__ import annotations

import os
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from testbed.errors import UsageError
from testbed.host.checkup import RANK_IMPORTS

if TYPE_CHECKING:  # (the joins, for annotations)
    from testbed.clusters.contract import Cluster


def check_script(cluster: Cluster, checked, hosts: list) -> None:
    """torchrun and the script are where each host will look for them, checked before
    anything is impaired (a missing script is refused, not found on the hosts mid-run)."""
    runs_a_file = not {"-m", "--module", "--no-python", "--no_python"} & {
        o.split("=", 1)[0] for o in checked.torchrun_options}
    script = checked.script[0]

    def missing(hc) -> list[tuple[str, str, str]]:
        wanted = [("torchrun", hc.argv[0], "-x")] if hc.argv[1:2] != ["-m"] else []
        if runs_a_file:
            wanted.append(("script", script if script.startswith("/") else
                           f"{hc.cwd.rstrip('/')}/{script}", "-f"))
        if cluster.shares_this_machine:
            return [(what, path, test) for what, path, test in wanted
                    if not (os.access(path, os.X_OK) if test == "-x" else os.path.isfile(path))]
        # every path in one command (an SSH round trip, or a Slurm job step, each)
        said = _text(hc.host.run(["sh", "-c", "; ".join(
            f"test {test} {shlex.quote(path)}; echo $?" for _, path, test in wanted)],
            timeout=30).stdout).split()
        return [w for i, w in enumerate(wanted) if said[i:i + 1] != ["0"]]

    machines = hosts[:1] if cluster.shares_this_machine else hosts
    with ThreadPoolExecutor(max_workers=min(8, len(machines) or 1)) as pool:
        found = list(pool.map(missing, machines))
    for hc, lacking in zip(machines, found, strict=True):
        for what, path, test in lacking:
            raise UsageError("--", f"{path}: no such {'program' if test == '-x' else 'file'}"
                             f" on {hc.host.name} ({what}; started in {hc.cwd})",
                             "Start lossbed run in the script's folder, give its path, or "
                             "name the folder it is in on the hosts with --workdir DIR")


def ranks_python(hc, here: bool) -> str | None:
    """The Python that the host's ranks will run: `python -m torch.distributed.run`'s, or
    the one torchrun's first line (#!) names (read here where the host shares this
    machine); None where that line names none."""
    if hc.argv[1:2] == ["-m"]:
        return hc.argv[0]
    if here:
        with open(hc.argv[0], "rb") as f:
            first = f.readline(4096).decode(errors="replace")
    else:
        read = _text(hc.host.run(["head", "-c", "4096", hc.argv[0]], timeout=30).stdout)
        first = read.splitlines()[0] if read else ""
    words = first[2:].split() if first.startswith("#!") else []
    if words[:1] and words[0].endswith("/env") and len(words) > 1:
        return words[1]  # (#!/usr/bin/env python3: found on the host's PATH)
    return words[0] if words else None


def check_ranks_python(cluster: Cluster, hosts: list) -> None:
    """The ranks' Python imports what a rank imports (harness.api: torch, numpy and
    lossbed's other packages), checked on each machine before anything is impaired: a
    venv with torch alone had every rank die on ModuleNotFoundError after the profile was
    applied (#66). The machines at once (each imports torch: seconds)."""
    def imports(hc):
        python = ranks_python(hc, cluster.shares_this_machine)
        # (lossbed's own Python has lossbed's packages; by its path, not the binary it links
        # to: every venv's python links to one interpreter, its packages are the venv's)
        if python is None or (cluster.shares_this_machine
                              and os.path.abspath(python) == os.path.abspath(sys.executable)):
            return hc, python, None
        return hc, python, hc.host.run(["env", f"PYTHONPATH={hc.env['PYTHONPATH']}", python,
                                        "-c", RANK_IMPORTS.strip()], timeout=300)

    machines = hosts[:1] if cluster.shares_this_machine else hosts
    with ThreadPoolExecutor(max_workers=min(8, len(machines) or 1)) as pool:
        checked = list(pool.map(imports, machines))
    for hc, python, done in checked:
        if done is not None and done.returncode != 0:
            said = _text(done.stderr).strip().splitlines()
            from testbed.doctor.judge import venv_of

            raise UsageError("--", f"{python}, which runs the ranks on {hc.host.name}, "
                             f"cannot import what a rank imports: "
                             f"{said[-1] if said else f'exit {done.returncode}'}",
                             f"Install lossbed's packages there: make setup "
                             f"VENV={venv_of(python)} (keeps its torch), or run the torchrun "
                             "of lossbed's own .venv")


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
