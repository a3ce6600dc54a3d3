"""`lossbed run ... -- torchrun [torchrun options] script.py [args]`: your training job on every
host of a cluster, under an impairment, measured.

One torchrun per host (each host's share of the ranks: --nnodes from the cluster,
--nproc-per-node from its GPUs, one where it has none), meeting in torchrun's c10d rendezvous
on the first host. Every rank gets lossbed's environment (harness/api.py: the job's key, the
host's address on the impaired network, its MTU, the loss semantics). The profile is applied
once the job has joined (rank 0's lossbed.join() says so) and the ranks wait for it; or, with
--impair-from start, before torchrun starts (for a script that does not use harness.api: a
reliable baseline). The kernel's counters are read around the impaired part, the ranks'
metrics gathered into one report under --out, the job's output passed through, and the
impairment cleared on exit, failure or Ctrl-C; the job's exit code is lossbed run's.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from harness import job_checks, launch, rank_protocol, run_report
from harness.job_output import Job
from harness.live_metrics import Served
from harness.metrics.counts import summed
from harness.metrics.hdr import Histogram
from harness.rank_protocol import ControllerEnv, RankEnv
from harness.transport import auth
from testbed import checks, ports, profiles, stats
from testbed.errors import NotAResult, TimedOut, UsageError
from testbed.host import lease
from testbed.impair import bypass, coverage, engine, plan, verify

if TYPE_CHECKING:  # (the contracts, for annotations: no import at run time)
    from testbed.clusters.contract import Cluster
    from testbed.profiles.model import Profile

# torchrun's options that lossbed run sets from the cluster: given by the user, refused
OURS = ("--nnodes", "--nproc-per-node", "--nproc_per_node", "--node-rank", "--node_rank",
        "--rdzv-backend", "--rdzv_backend", "--rdzv-endpoint", "--rdzv_endpoint",
        "--rdzv-id", "--rdzv_id", "--rdzv-conf", "--rdzv_conf", "--master-addr",
        "--master_addr", "--master-port", "--master_port", "--standalone", "--local-addr",
        "--local_addr")
IMPAIR_FROM = ("joined", "start")
JOB_ENV = rank_protocol.JOB  # the job's id, in every process of it (found by it at the end)
GRACE_S = launch.FAILURE_GRACE_S  # the other hosts' time once one failed (--grace-s)
GRACE_MEANS = launch.FAILURE_GRACE_MEANS
STOP_GRACE_S = 20.0  # torchrun's time to stop its workers before it is killed (or --grace-s)
# once a rank said what ended it (its error mark), every host is stopped this soon after
SAID_GRACE_S = 2.0


class Checked(NamedTuple):
    """A RunSpec as validate() found it: what the hosts' commands are made of."""

    torchrun_options: list[str]
    script: list[str]           # the script and its arguments
    profile: Profile            # the profile, loaded once


@dataclass
class Impaired:
    """What the run applied and what the kernel counted of it: the counters when the profile
    went on (start: None until it did), its backend, and at the end the loss report and the
    coverage (what of the hosts' traffic met the impairment)."""

    start: object | None = None
    backend: str | None = None
    report: object | None = None
    coverage: object | None = None

    @property
    def on(self) -> bool:
        return self.start is not None


@dataclass
class RunSpec:
    command: list[str]                    # torchrun [options] script.py [args]
    profile: str = "random-loss"
    sets: tuple[str, ...] = ()
    loss: float | None = None             # every path's loss rate, a fraction (0: none;
    #                                       None: the profile's own rates)
    transport: str = "udp"
    impair_from: str = "joined"
    unsealed: bool = False
    grace_s: float = GRACE_S              # after one host's torchrun failed: the others' time
    timeout_s: float = 0.0                # the whole job's limit (0: none): then it is stopped
    min_coverage: float = coverage.DEFAULT_MIN_COVERAGE  # of the hosts' bytes, impaired
    metrics_port: int | None = None       # serve Prometheus metrics there while it runs
    metrics_address: str = "127.0.0.1"    # (0: a free port; the address: loopback unless told)
    # where the command starts on every host (None: the folder lossbed run was started in,
    # on hosts that share this machine; each host's lossbed checkout on the others)
    workdir: str | None = None
    out: Path = field(default_factory=lambda: Path(f"results/run-{time.strftime('%Y%m%d-%H%M%S')}"))

    def validate(self) -> Checked:
        """torchrun's own options, the script with its arguments and the profile, everything
        refused with the field and the fix before anything is built."""
        if not self.command or Path(self.command[0]).name != "torchrun":
            raise UsageError("--", f"{shlex.join(self.command) or 'nothing'} is not a "
                             "torchrun command",
                             "Write: lossbed run --profile P -- torchrun script.py [args]")
        options, rest = _split_torchrun(self.command[1:])
        for option in options:
            name = option.split("=", 1)[0]
            if name in OURS:
                raise UsageError(name, "lossbed run sets it from the cluster (hosts, GPUs, "
                                 "the first host's rendezvous)",
                                 "Leave it out, or print the commands with --print and "
                                 "start them yourself")
        if not rest:
            raise UsageError("--", "no training script after torchrun's options",
                             "Write: -- torchrun [options] script.py [args]")
        if self.impair_from not in IMPAIR_FROM:
            raise UsageError("--impair-from", f"{self.impair_from!r}",
                             f"Use one of: {', '.join(IMPAIR_FROM)}")
        checks.seconds("--grace-s", self.grace_s, GRACE_S, GRACE_MEANS)
        checks.seconds("--timeout-s", self.timeout_s, 3600, launch.TIMEOUT_MEANS)
        checks.loss_fraction("--loss", *checks.given(self.loss))
        if self.metrics_port is not None:
            checks.port("--metrics-port", self.metrics_port)
            from testbed.exporter.server import check_address

            check_address("--metrics-address", self.metrics_address)
        from harness.transport.semantics import Semantics

        if Semantics.parse(self.transport).verbs:
            raise UsageError("--transport", f"{self.transport}: harness.api runs on UDP",
                             "Use udp, roce-ud, roce-uc[:BYTES] or roce-rc[:BYTES]")
        profile = profiles.load(self.profile, list(self.sets), loss=self.loss,
                                isolated=self.unsealed)
        return Checked(options, rest, profile)


def _split_torchrun(args: list[str]) -> tuple[list[str], list[str]]:
    """torchrun's options (each with its value), then the script and its arguments."""
    options, i = [], 0
    while i < len(args) and args[i].startswith("-"):
        options.append(args[i])
        takes_value = "=" not in args[i] and args[i] not in ("--standalone", "--no-python",
                                                              "--no_python", "-m", "--module",
                                                              "--run-path", "--run_path")
        if takes_value and i + 1 < len(args):
            options.append(args[i + 1])
            i += 1
        i += 1
    return options, args[i:]


@dataclass
class HostCommand:
    host: object
    argv: list[str]
    env: dict[str, str]
    cwd: str  # the folder it starts in

    def shell(self) -> str:
        """The command as one line a job script can run on its host."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"cd {shlex.quote(self.cwd)} && env {env} {shlex.join(self.argv)}"


def workdir(cluster: Cluster, host, spec: RunSpec) -> str:
    """Where the user's command starts on `host`: --workdir; else the folder the user typed
    it in (a host that shares this machine sees it), else the host's lossbed checkout."""
    if spec.workdir:
        return spec.workdir
    return os.getcwd() if cluster.shares_this_machine else str(host.project)


def launcher(cluster: Cluster, host, spec: RunSpec) -> list[str]:
    """torchrun as the user named it: a path as given; a bare `torchrun`, the one on the
    user's PATH where the host shares this machine; else torch.distributed.run of the
    Python the cluster names for its ranks (an inventory's lossbed_python)."""
    named = spec.command[0]
    if "/" in named:
        return [os.path.abspath(named) if cluster.shares_this_machine else named]
    found = shutil.which(named) if cluster.shares_this_machine else None
    if found:
        return [found]
    return [cluster.rank_python(host), "-m", "torch.distributed.run"]


def commands(cluster: Cluster, spec: RunSpec, checked: Checked, job_id: str, key: str | None,
             gate: str | None, metrics_dir: str | None) -> list[HostCommand]:
    """The torchrun of every host (checked: spec.validate()'s)."""
    first = cluster.hosts[0]
    chosen = ControllerEnv.from_env()
    per_host = [max(1, h.gpus) for h in cluster.hosts]
    made = []
    for i, host in enumerate(cluster.hosts):
        argv = [*launcher(cluster, host, spec),
                "--nnodes", str(len(cluster.hosts)), "--nproc-per-node", str(per_host[i]),
                "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{first.address}:{ports.RENDEZVOUS}",
                "--rdzv-id", job_id, "--rdzv-conf", f"is_host={1 if i == 0 else 0}",
                "--local-addr", host.address, "--max-restarts", "0",
                *checked.torchrun_options, *checked.script]
        # what each host's ranks are told (torchrun adds their places)
        told = RankEnv(job=job_id, address=host.address, mtu=cluster.mtu,
                       transport=spec.transport, host=host.name, key=key or None,
                       gate=gate or None, metrics_dir=metrics_dir or None,
                       live=spec.metrics_port is not None,
                       segmentation=launch.segmentation_faithful(checked.profile))
        # harness.api from the checkout the controller runs (its protocol), then the user's
        user_path = os.environ.get("PYTHONPATH") if cluster.shares_this_machine else None
        env = {**told.to_env(), **bypass.pinned_env(cluster, host), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": ":".join(filter(None, (str(host.project), user_path))),
               **chosen.forwarded()}  # the controller's choices (the drop mask, ...)
        made.append(HostCommand(host, argv, env, workdir(cluster, host, spec)))
    return made


def run(cluster: Cluster, spec: RunSpec, echo=print, checked: Checked | None = None) -> int:
    """Run the job; its exit code (130 on Ctrl-C). The report is in spec.out. checked:
    spec.validate()'s, where the caller has it already."""
    checked = checked or spec.validate()
    bypass.refuse_contradictions(os.environ, cluster)
    the_plan, choice = engine.make_plan(cluster, checked.profile)
    out = spec.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    job_id = f"lossbed-{os.getpid()}-{int(time.time())}"
    key = None if spec.unsealed else auth.new_key()
    gate = f"/tmp/{job_id}.gate" if spec.impair_from == "joined" else None
    metrics_dir = str(out / "ranks") if cluster.shares_this_machine else None
    hosts = commands(cluster, spec, checked, job_id, key, gate, metrics_dir)
    # torchrun, the script and the ranks' Python, before anything is impaired or started
    job_checks.check_script(cluster, checked, hosts)
    job_checks.check_ranks_python(cluster, hosts)
    # The job's TMPDIR on each machine, removed with it: torchrun's agent makes a log
    # folder there (torchelastic_*) that it never removes, nor do scripts always their own
    scratch = f"/tmp/{job_id}.tmp"
    # the metrics endpoint first: a port in use is refused before anything is impaired
    served = Served.if_asked(cluster, spec.metrics_port, spec.metrics_address, job_id,
                             spec.min_coverage, echo)
    job = Job(out / "logs", live=served.run.take_live if served else None)
    procs, threads, applied = [], [], Impaired()

    def impair() -> None:  # the profile on; the metrics' coverage from its first reading
        _impair(cluster, the_plan, choice, applied, echo)
        if served is not None:
            served.impairment.watch_from(applied.start)

    keeper = (lease.Keeper(cluster, cluster.lease_s / 3) if cluster.lease_s is not None
              else contextlib.nullcontext())
    started = time.monotonic()
    code = 1
    try:
        with keeper:
            _on_each_machine(cluster, lambda host: host.run(
                ["mkdir", "-p", "-m", "700", scratch], timeout=30, check=True))
            if spec.impair_from == "start":
                impair()
            for hc in hosts:
                env = {**(os.environ if cluster.shares_this_machine else {}), **hc.env,
                       "TMPDIR": scratch}
                procs.append(hc.host.popen(hc.argv, env=env, stdin=subprocess.DEVNULL,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True, start_new_session=True,
                                           cwd=hc.cwd))
                for stream, sink in ((procs[-1].stdout, sys.stdout),
                                     (procs[-1].stderr, sys.stderr)):
                    t = threading.Thread(target=job.pump, args=(stream, sink, hc.host.name),
                                         daemon=True)
                    t.start()
                    threads.append(t)
            echo(f"[run] torchrun on {len(hosts)} host(s), job {job_id}; profile "
                 f"{checked.profile.name}: {plan.stated_loss(checked.profile, spec.loss)}")
            code = _wait(procs, job, lambda: _on_joined(cluster, impair, applied, gate), gate,
                         spec.grace_s, spec.timeout_s)
            if job.timed_out:
                echo(f"[run] timed out: the job ran past --timeout-s {spec.timeout_s:g}; "
                     "stopping it and clearing the impairment")
    except KeyboardInterrupt:
        echo("[run] interrupted: stopping the job and clearing the impairment")
        code = 130
    finally:
        _stop(procs, min(STOP_GRACE_S, spec.grace_s))
        _kill_left_behind(cluster, job_id)
        for t in threads:
            t.join(5)
        if applied.on:  # the kernel's count of the impaired part, before it is cleared
            with contextlib.suppress(Exception):
                end = verify.read(cluster)
                applied.report = verify.report(cluster, end, applied.start)
                applied.coverage = verify.measure_coverage(cluster, end, applied.start,
                                                              spec.min_coverage)
        engine.clear(cluster)
        if served is not None:
            served.endpoint.stop()
        with contextlib.suppress(Exception):  # (names lossbed made: job_id is its own)
            _on_each_machine(cluster, lambda host: host.run(
                ["rm", "-rf", "--", scratch, *([gate] if gate else [])], timeout=60))
    summary = summarise(cluster, spec, job, applied, code, time.monotonic() - started, hosts)
    summary["invalid"] = not_a_result(spec, checked.profile, applied, code)
    _write(out, job, summary)
    covered = summary["coverage"]["fraction"] if summary["coverage"] else None
    echo(f"[run] exit {code}; measured loss {_pct(summary['measured_loss'])}, "
         f"missing {_pct(summary['missing_fraction'])}, coverage {_pct(covered)}; "
         f"report in {out}/summary.json")
    failure = job.failure_line(code, [hc.host.name for hc in hosts])
    if failure:
        echo(f"[run] {failure}")
    if summary["invalid"] and code == 0:
        # the job went well, but not under the impairment: no result, and no exit 0
        echo(f"[run] no result: {summary['invalid']}")
        return NotAResult.exit_code
    return code


def not_a_result(spec: RunSpec, profile, applied: Impaired, code: int) -> str | None:
    """Why the run measured something other than the profile it names, or None."""
    if profile.impairs_nothing() or code != 0:
        return None  # nothing to miss; or the job's own failure, which its exit code says
    if not applied.on:
        return (f"the profile {spec.profile} was never applied: the job never joined "
                "(harness.api's lossbed.join(), or a scheme it wraps its model with), and "
                "--impair-from joined waits for that. Run a script that does not use "
                "harness.api with --impair-from start")
    covered = applied.coverage
    if covered is None:
        return "the impairment's counters could not be read at the end of the job"
    return covered.no_result(profile)


def _stop(procs, grace_s: float) -> None:
    """Every torchrun still running: SIGTERM first (torchrun stops its workers, which live
    in sessions of their own, then exits), SIGKILL to what is left after grace_s."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        if isinstance(p, subprocess.Popen):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        else:  # a remote host's guard: it stops its process group itself
            launch._kill(p)
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in running) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in running:
        if p.poll() is None:
            launch._kill(p)
    for p in procs:
        p.wait()


# What finds the job's processes on a host by their environment (JOB_ENV=the job's id, which
# no other process has): torchrun's workers live in sessions of their own and outlive a
# torchrun that was killed before it stopped them. Never a match on command lines.
_KILL_BY_ENVIRONMENT = """
import os, signal, sys
mark = b"\\0" + ("%s=" + sys.argv[1]).encode() + b"\\0"
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if mark in b"\\0" + f.read() + b"\\0" and int(pid) != os.getpid():
                os.kill(int(pid), signal.SIGKILL)
    except (OSError, ValueError):
        pass
"""


def _kill_left_behind(cluster: Cluster, job_id: str) -> None:
    """SIGKILL any process of this job still alive on any host (a worker whose torchrun was
    killed before it could stop it)."""
    script = _KILL_BY_ENVIRONMENT % JOB_ENV
    with contextlib.suppress(Exception):
        _on_each_machine(cluster, lambda host: host.run(
            [cluster.rank_python(host), "-c", script, job_id], timeout=60))


def _one_per_machine(cluster: Cluster) -> list:
    """A host of each machine: namespace hosts share this machine's process table and /tmp,
    so what is done there for one is done for all."""
    return cluster.hosts[:1] if cluster.shares_this_machine else list(cluster.hosts)


def _on_each_machine(cluster: Cluster, do) -> None:
    """do(host) on a host of each machine, the machines at once (each is an SSH round trip
    or a Slurm job step elsewhere); the first error is raised once all are done."""
    from concurrent.futures import ThreadPoolExecutor

    machines = _one_per_machine(cluster)
    with ThreadPoolExecutor(max_workers=min(8, len(machines))) as pool:
        for _ in pool.map(do, machines):
            pass


def _impair(cluster: Cluster, the_plan, choice, applied: Impaired, echo) -> None:
    engine.apply(cluster, the_plan, choice)
    applied.start = verify.read(cluster)
    applied.backend = the_plan.backend
    echo(f"[run] profile {the_plan.profile.name} applied ({the_plan.backend})")


def _on_joined(cluster: Cluster, impair, applied: Impaired, gate) -> None:
    """The job joined: apply the profile (impair()), then open every host's gate."""
    if not applied.on:
        impair()
    _on_each_machine(cluster, lambda host: host.run(["touch", gate], check=True))


def _wait(procs, job: Job, on_joined, gate, grace_s: float, timeout_s: float = 0.0) -> int:
    """Until every torchrun ended (one failed: the others get grace_s, SAID_GRACE_S where a
    rank said why, then are stopped), or the job ran past timeout_s (0: no limit; then
    job.timed_out, and TimedOut's exit code); the profile applied when the job joins. The
    first non-zero exit code, else 0."""
    opened = gate is None
    failed_at = None
    deadline = time.monotonic() + timeout_s if timeout_s else math.inf
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline:
            job.timed_out = True
            job.stopped_by = f"--timeout-s {timeout_s:g}"
            return TimedOut.exit_code
        if not opened and job.joined.is_set():
            on_joined()
            opened = True
        if failed_at is None and (job.errors or any(p.poll() not in (None, 0) for p in procs)):
            failed_at = time.monotonic()
        # a rank that said what ended it (harness.api's error mark) needs no peer to say
        # it again: its peers, waiting in a collective for it, are stopped at once
        limit = min(grace_s, SAID_GRACE_S) if job.errors else grace_s
        if failed_at is not None and time.monotonic() - failed_at > limit:
            job.stopped_by = (f"rank {job.errors[0].get('rank')}'s error" if job.errors
                              else f"--grace-s {grace_s:g} after a host failed")
            break
        time.sleep(0.05)
    codes = [p.poll() for p in procs]
    return next((c for c in codes if c not in (None, 0)), 0 if None not in codes else 1)


def summarise(cluster: Cluster, spec: RunSpec, job: Job, applied: Impaired, code: int,
              wall_s: float, hosts: list[HostCommand]) -> dict:
    """The run's report: what the kernel lost, what the ranks measured, who failed."""
    ranks = sorted(job.metrics, key=lambda m: m.rank)
    step_us = Histogram.merged(m.step_us for m in ranks)
    collective_us = Histogram.merged(m.collective_us for m in ranks)
    counters = summed(m.counters for m in ranks)
    totals = summed(m.collective_totals for m in ranks)
    measured, interval = None, None
    report = applied.report
    if report is not None:
        if report.total_seen:
            measured = report.total_dropped / report.total_seen
            interval = list(stats.wilson_interval(report.total_dropped, report.total_seen))
    received, missing = counters.get("packets_received", 0), counters.get("missing", 0)
    rank0 = next((m for m in ranks if m.rank == 0), None)
    train_s = max((m.train_s for m in ranks), default=None)
    steps = rank0.steps if rank0 else None
    script = dict(rank0.script) if rank0 else {}
    tokens = script.get("tokens")
    return {
        "command": shlex.join(spec.command), "profile": spec.profile, "sets": list(spec.sets),
        "loss": spec.loss, "transport": spec.transport, "impair_from": spec.impair_from,
        "hosts": [h.host.name for h in hosts], "ranks": len(ranks), "exit_code": code,
        "workdir": hosts[0].cwd if hosts else None,
        "torchrun": hosts[0].argv[:hosts[0].argv.index("--nnodes")] if hosts else None,
        "joined": job.joined.is_set(), "applied": applied.on,
        "coverage": applied.coverage.to_dict() if applied.coverage is not None else None,
        "loss_applied_by": verify.loss_applied_by(applied.backend, cluster,
                                                  ControllerEnv.from_env().drop_mask),
        "measured_loss": measured, "measured_loss_interval": interval,
        "missing_fraction": missing / (received + missing) if received + missing else None,
        "steps": steps, "steps_per_s": steps / train_s if steps and train_s else None,
        "tokens_per_s": tokens / train_s if tokens and train_s else None,
        "step_ms": step_us.summary_ms(), "collective_ms": collective_us.summary_ms(),
        "transport_counters": counters, "collective_totals": totals, "script": script,
        "drift": max((m.drift for m in ranks if m.drift is not None), default=None),
        "failed": job.errors, "wall_s": wall_s, "timed_out": job.timed_out,
        "stopped_by": job.stopped_by,
        "timeout_s": spec.timeout_s or None,
        "exempt": [f"tcp port {p}" for p in ports.ALWAYS_RELIABLE_TCP] + [
            "the job's start (rendezvous, DDP's first broadcast): the profile is applied "
            "once the job has joined" if spec.impair_from == "joined" else
            "nothing of the job: the profile was applied before torchrun started"],
    }


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.2%}"


def _write(out: Path, job: Job, summary: dict) -> None:
    ranks = out / "ranks"
    ranks.mkdir(exist_ok=True)
    for m in job.metrics:
        (ranks / f"rank{m.rank}.json").write_text(json.dumps(m.to_dict()))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    run_report.write(out, summary)  # summary.md and report.html, as a bench writes
