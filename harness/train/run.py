"""The controller side of `lossbed train`: check everything, apply the profile, launch one
rank per host, collect, verify the loss the kernel applied, clear, write the record.

The record (one JSON object) has the config, the per-step loss (rank 0), step and
collective latency histograms merged over ranks (p50/p99/p99.9), tokens/s, bytes and
packets sent and lost, the measured link loss with its interval and the receivers' own
socket drops (both counted around this run alone), drift, and perplexity of the
rank-averaged model and of rank 0's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness import launch, rank_protocol
from harness.data.corpus import load_documents, prepare
from harness.data.sampler import Batches
from harness.rank_protocol import ControllerEnv
from harness.train import record as run_record
from harness.train.config import TrainConfig
from harness.train.record import RunRecord
from testbed import doctor, profiles
from testbed.errors import LossbedError, UsageError
from testbed.host import lease
from testbed.impair import bypass, coverage, engine, plan, verify

if TYPE_CHECKING:  # (the contract, for annotations: no import at run time)
    from testbed.clusters.contract import Cluster


log = logging.getLogger(__name__)


def check(cfg: TrainConfig, cluster=None) -> None:
    """Every input problem, found before a process starts or a link is touched (cfg's own
    values were checked as it was made)."""
    launch.check_environment()
    from harness.verbs import device

    device.require_for([cfg.transport], cluster)
    documents, source = load_documents(cfg.corpus, cfg.hf_dataset,
                                       hf_text_field=cfg.hf_text_field)
    _, corpus = prepare(documents, source, cfg.tokenizer, cfg.seq_len)
    world = len(launch.rank_slots(cluster)) if cluster is not None else 1
    Batches(corpus.train, 0, world, cfg.batch, cfg.seq_len, cfg.seed)  # enough samples?


def doctor_request(cfgs: list[TrainConfig], cluster) -> doctor.Request:
    """What `lossbed doctor` checks before ranks are launched for these runs (the profiles
    are judged by engine.make_plan, which refuses what no backend can apply)."""
    transports = [c.transport for c in cfgs]
    return doctor.Request(
        device="cuda" if any(c.device == "cuda" for c in cfgs) else "cpu",
        backend=ControllerEnv.from_env().backend or "gloo",
        transport=next((t for t in transports if t.startswith("verbs")), transports[0]),
        ranks_per_host=doctor.ranks_per_host(cluster))


def impair_the_control_path(profile):
    """The profile a training run uses: the rendezvous store's port is impaired too, so the
    lossy variants' per-step control (their step alignment) crosses the same lossy links as
    gloo's data does. Setup stays clean because each run's profile is applied only when its
    model is built and wrapped (the ranks met, DDP broadcast the parameters). Returns
    (profile, what stays exempt)."""
    from testbed import ports
    from testbed.profiles.model import Flow, Match, PortRange

    exclude = []
    for flow in profile.match.exclude:
        kept = []
        for r in flow.ports:
            if r.first <= ports.RENDEZVOUS <= r.last:  # cut the rendezvous port out
                if r.first < ports.RENDEZVOUS:
                    kept.append(PortRange(first=r.first, last=ports.RENDEZVOUS - 1))
                if r.last > ports.RENDEZVOUS:
                    kept.append(PortRange(first=ports.RENDEZVOUS + 1, last=r.last))
            else:
                kept.append(r)
        if kept or not flow.ports:
            exclude.append(Flow(protocol=flow.protocol, ports=kept))
    match = Match(include=profile.match.include, exclude=exclude)
    exempt = ["setup (rendezvous, gloo's connections, DDP's parameter broadcast): the "
              "profile is applied when the run's model is built and wrapped",
              "the evaluation after training (gathering the ranks' models): the profile is "
              "cleared when training ends"]
    exempt += [f"{f.protocol} ports {', '.join(map(str, f.ports)) or 'all'}" for f in exclude]
    return profile.model_copy(update={"match": match}), exempt


@dataclass(frozen=True)
class Run:
    """One training run of a launch, and the network it runs under: a profile, its --set
    overrides, and the typed values a command sets on it (profiles.load)."""

    cfg: TrainConfig
    profile: str = "clean"
    sets: tuple[str, ...] = ()
    loss: float | None = None       # every path's loss rate, a fraction (0: none; None:
    #                                 the profile's own rates)
    loss_seed: int | None = None    # which realisation of that loss (None: the profile's)
    isolated: bool = False          # the run's datagrams go unsealed (--unsealed)

    @property
    def network(self) -> tuple:
        """What the run's profile is made of: runs with equal ones share one plan."""
        return (self.profile, self.sets, self.loss, self.loss_seed, self.isolated)

    def load_profile(self):
        return profiles.load(self.profile, list(self.sets), loss=self.loss,
                             loss_seed=self.loss_seed, isolated=self.isolated)


def train(cluster: Cluster, cfg: TrainConfig, profile_name: str = "clean", sets: list[str] = (),
          out_dir: Path | None = None, echo=print, isolated: bool = False,
          loss: float | None = None, failure_grace_s: float = launch.FAILURE_GRACE_S,
          min_coverage: float = coverage.DEFAULT_MIN_COVERAGE,
          timeout_s: float = launch.TRAIN_TIMEOUT_S, metrics=None) -> RunRecord:
    """One run. metrics: the command's endpoint (harness/live_metrics.Served), or None."""
    the_run = Run(cfg, profile_name, tuple(sets), loss=loss, isolated=isolated)
    echo(f"[train] profile {profile_name}: "
         f"{plan.stated_loss(the_run.load_profile(), loss)}")
    return train_runs(cluster, [the_run], out_dir, echo, failure_grace_s=failure_grace_s,
                      min_coverage=min_coverage, timeout_s=timeout_s, metrics=metrics)[0]


def train_many(cluster: Cluster, cfgs: list[TrainConfig], profile_name: str = "clean",
               sets: list[str] = (), out_dir: Path | None = None, echo=print) -> list[RunRecord]:
    """Several runs under one profile, one after the other in one launch of the ranks."""
    return train_runs(cluster, [Run(c, profile_name, tuple(sets)) for c in cfgs], out_dir,
                      echo)


class _Boundaries:
    """The controller's side of the run boundaries (harness.train.worker.wait_at_boundary).
    Before a run: nothing (the previous run's profile is already cleared). When its model
    is built and wrapped (DDP's parameter broadcast done): apply its profile and read the
    kernel's counters (its window starts).
    When its training ends: read them again (the window ends) and clear the profile, so the
    evaluation (the ranks' models gathered over gloo) crosses a clean network: under 30%
    loss TCP took over 300 s for it, and its packets were no part of the experiment."""

    def __init__(self, cluster, runs: list[Run], plans: dict,
                 min_coverage: float = coverage.DEFAULT_MIN_COVERAGE,
                 rdma_by_drop_mask: bool = False, on_applied=None):
        self.cluster, self.runs, self.plans = cluster, runs, plans
        self.on_applied = on_applied  # (a run's first reading: the metrics' window)
        self.min_coverage, self.rdma_by_drop_mask = min_coverage, rdma_by_drop_mask
        self.applied = None      # the (profile, sets) applied now
        self.start = None        # the counters at the start of the current run
        # per run: (report, profile, coverage) of its window
        self.windows: list = [None] * len(runs)
        # when each run's "start" boundary came, and the one after the last run: a run's
        # wall time, setup and evaluation included, is the gap to the next one
        self.started_at: list = [None] * (len(runs) + 1)
        self.error: BaseException | None = None

    def run_s(self, index: int) -> float | None:
        """Run `index`'s wall time (s): from its start boundary to the next one."""
        begun, ended = self.started_at[index], self.started_at[index + 1]
        return ended - begun if begun is not None and ended is not None else None

    def answer(self, line: str) -> str | None:
        boundary = rank_protocol.Boundary.read(line)
        if boundary is None:
            return None
        index, phase = boundary.index, boundary.phase
        try:
            if phase == "start":
                self.started_at[index] = time.monotonic()
            elif phase == "trained":
                end = verify.read(self.cluster)
                profile = self.plans[self.applied][0].profile
                self.windows[index] = (verify.report(self.cluster, end, self.start), profile,
                                       verify.measure_coverage(self.cluster, end, self.start,
                                                               self.min_coverage,
                                                               self.rdma_by_drop_mask))
                engine.clear(self.cluster)
                self.applied = None
            elif phase == "ready":
                key = self.runs[index].network
                engine.apply(self.cluster, *self.plans[key])
                self.applied = key
                self.start = verify.read(self.cluster)
                if self.on_applied is not None:
                    self.on_applied(self.start)
        except BaseException as err:  # rank 0 is told to stop; the launch reports this
            self.error = err
            return rank_protocol.STOP
        return boundary.go()


def train_runs(cluster: Cluster, runs: list[Run], out_dir: Path | None = None,
               echo=print, control_exempt: bool = False, on_progress=None,
               failure_grace_s: float = launch.FAILURE_GRACE_S,
               min_coverage: float = coverage.DEFAULT_MIN_COVERAGE,
               timeout_s: float = launch.TRAIN_TIMEOUT_S, metrics=None) -> list[RunRecord]:
    """Runs one after the other in one launch of the ranks, each under its own profile (the
    profile changes between runs where it differs). Each run's measured loss, socket
    drops and coverage are counted around that run alone; a run under an impairment whose
    coverage is below min_coverage is marked `invalid` (with what carried its traffic
    instead). The profile also impairs the rendezvous port (impair_the_control_path) unless
    control_exempt. Once a rank failed, the others get failure_grace_s to end by
    themselves. Rank 0's progress (rank_protocol.Progress) goes to on_progress, or to echo
    as its text, and to the metrics endpoint (harness/live_metrics.Served) where one is
    given; its other lines to echo."""
    for r in runs:
        check(r.cfg, cluster)
    bypass.refuse_contradictions(os.environ, cluster)
    doctor.require(cluster, doctor_request([r.cfg for r in runs], cluster))
    plans, exempt = {}, {}
    for r in runs:  # every profile refused before anything is applied
        key = r.network
        if key not in plans:
            profile = r.load_profile()
            if control_exempt:
                exempt[key] = ["the rendezvous store's port (asked for)"]
            else:
                profile, exempt[key] = impair_the_control_path(profile)
            plans[key] = engine.make_plan(cluster, profile)
    drop_mask = verbs_loss(cluster, runs, plans)
    # The ranks' files (absolute: they write from their own working folder). Without
    # out_dir, a temporary folder of this launch's, removed when it ends; none where the
    # ranks write nothing on this machine (hosts that do not share it send all over
    # stdout), so a controller killed there mid-run leaves no folder behind
    temporary = out_dir is None
    if out_dir is None and not cluster.shares_this_machine:
        work = None
    else:
        work = Path(out_dir or tempfile.mkdtemp(prefix="lossbed-train-")).resolve()
        work.mkdir(parents=True, exist_ok=True)
    boundaries = _Boundaries(cluster, runs, plans, min_coverage, drop_mask is not None,
                             on_applied=metrics.impairment.watch_from if metrics else None)
    started = time.monotonic()
    # Remote hosts: renew the impairment's lease while the run lasts; if this controller
    # dies, the hosts revert by themselves.
    keeper = (lease.Keeper(cluster, cluster.lease_s / 3) if cluster.lease_s is not None
              else contextlib.nullcontext())
    # files only where this controller reads them (harness.train.worker.WRITES_FILES)
    told = {**launch.rank_settings(plans[runs[0].network][0].profile),
            "work_local": cluster.shares_this_machine, "live": metrics is not None}
    # One key per launch: unless every run's profile says the network is isolated
    authenticate = not all(p.profile.isolated for p, _ in plans.values())
    try:
        with keeper:
            results = launch.run(cluster, "harness.train.worker",
                                 [json.dumps([r.cfg.to_dict() for r in runs]),
                                  str(work or "-")],  # ("-": the ranks write nothing)
                                 timeout_s=timeout_s,
                                 echo_rank0=_progress_to(
                                     echo, on_progress,
                                     metrics.run.take_progress if metrics else None),
                                 told=told, answer_rank0=boundaries.answer,
                                 live=metrics.run.take_live if metrics else None,
                                 authenticate=authenticate,
                                 failure_grace_s=failure_grace_s)
    finally:
        engine.clear(cluster)
        if temporary and work is not None:
            shutil.rmtree(work, ignore_errors=True)
    if boundaries.error is not None:
        raise boundaries.error
    failed = [r for r in results if r.returncode != 0]
    if failed:
        raise LossbedError(launch.failure_report(failed, "training"))
    said = [rank_protocol.marks(r.stdout.splitlines()) for r in results]  # each rank's, once
    lines = rank_protocol.run_results(said[0])  # rank 0's result, per run
    # every rank's metrics, per run: each rank prints them after each run, in order
    metrics = [rank_protocol.train_metrics(marks) for marks in said]
    wall = time.monotonic() - started
    records = []
    for i, r in enumerate(runs):
        window, profile, covered = boundaries.windows[i]
        backend = plans[r.network][1].backend
        records.append(run_record.make(
            r.cfg, hosts=len(cluster.hosts), profile=profile, report=window,
            backend=backend, result=lines[i], ranks=[m[i] for m in metrics],
            work=None if temporary else work / f"run{i}", wall_s=wall / len(runs),
            run_s=boundaries.run_s(i), exempt=exempt[r.network], coverage=covered,
            loss_applied_by=verify.loss_applied_by(
                None if profile.impairs_nothing() else backend, cluster, drop_mask)))
    return records


def _progress_to(echo, on_progress, also=None):
    """What takes rank 0's stderr lines: its progress to on_progress (or echo, as text) and
    to `also`, the rest to echo."""
    def rank0_said(line: str) -> None:
        progress = rank_protocol.Progress.read(line)
        if progress is not None and also is not None:
            also(progress)
        if progress is None:
            echo(line)
        elif on_progress is not None:
            on_progress(progress)
        else:
            echo(progress.text())

    return rank0_said


def verbs_loss(cluster: Cluster, runs: list[Run], plans: dict) -> str | None:
    """The receivers' drop mask (LOSSBED_DROP_MASK) the runs use, or None; refused before
    launch: a verbs run under a lossy profile on hardware RDMA devices without one (the
    NIC's traffic passes no qdisc, nft rule or BPF program: the kernel's loss would miss
    it, and the run would say 10% and lose nothing)."""
    from harness.transport.semantics import Semantics

    drop_mask = ControllerEnv.from_env().drop_mask
    lossy_verbs = sorted({r.cfg.transport for r in runs if Semantics.parse(r.cfg.transport).verbs
                          and not plans[r.network][0].profile.impairs_nothing()})
    if not lossy_verbs or drop_mask:
        return drop_mask
    hardware = [h.name for h in cluster.hosts if verify.read_traffic(h)["rdma"]]
    if hardware:
        raise UsageError(
            "LOSSBED_DROP_MASK", f"--transport {lossy_verbs[0]} runs on the hardware RDMA "
            f"devices of {', '.join(hardware)}, whose traffic no qdisc, nft rule or BPF "
            "program sees: the profile's loss would not reach it",
            "Set LOSSBED_DROP_MASK=SEED:RATE (e.g. 7:0.1 for 10%): the receivers drop by "
            "lossbed's seeded mask, and each record says so (loss_applied_by)")
    return None
