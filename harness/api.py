"""lossbed's lossy collectives for your own DDP training script: one import, one call around
your model (and, for the parameter broadcast and RPS, your optimizer). Nothing of the model
or the optimizer's code changes.

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import harness.api as lossbed

    dist.init_process_group("gloo")               # as any torchrun script does
    model = DDP(MyModel())
    lossbed.lossy_gradients(model)                # the gradient reduce goes lossy
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ... your training loop, unchanged ...
    lossbed.report(eval_loss=final_loss)          # your own final metric (optional)

The three schemes, each one call (and the baseline, measured the same way):

    reliable(ddp_model)                           DDP's own all-reduce, timed

    lossy_gradients(ddp_model, estimator)         zero_fill or unbiased: DDP's gradient
                                                  all-reduce over the lossy transport
    bounded_drift(ddp_model, optimizer)           unbiased_drift (arXiv 2507.07114): the
                                                  optimizer step on shard owners, parameters
                                                  broadcast, stale where a packet is lost
    rps(ddp_model, optimizer)                     RPS (arXiv 1810.07766): a local step, then
                                                  lossy model averaging

The last two wrap your optimizer and return a torch.optim.Optimizer to use in its place:
your param_groups (learning rates, weight decays), LR schedulers, GradScaler, zero_grad and
state_dict/load_state_dict (bounded_drift's: each rank saves and loads its own shard).

Where it runs comes from the environment, so one script runs under torchrun, Slurm (through
torchrun) or `lossbed run`: torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT, and lossbed's (which `lossbed run` sets on every host):

    LOSSBED_KEY          the job's key (64 hex digits) every datagram is sealed with; from
                         the environment only, never over the network it impairs
    LOSSBED_TRANSPORT    loss semantics: udp (default), roce-ud, roce-uc[:BYTES], roce-rc[...]
    LOSSBED_ADDRESS      this host's address on the impaired network (default: the one that
                         reaches MASTER_ADDR)
    LOSSBED_MTU          that network's MTU (default 1500)
    LOSSBED_METRICS_DIR  where each rank writes what it measured (rank<N>.json)

What each rank measures (step and collective times, packets sent, missing and late, stages
ended by their deadline) goes to LOSSBED_METRICS_DIR (or metrics_dir) when the job finishes
(lossbed.finish(), or at exit under `lossbed run`). A step is an optimizer step: forwards
inside ddp.no_sync() (gradient accumulation) are not counted as steps of their own.

Under `lossbed run` a rank also does what that launcher reads: rank 0 prints a line when the
job has joined, each rank prints its metrics as one JSON line at exit (atexit), an error that
ends a rank is named on stderr (sys.excepthook), and joining moves what the script made so
far out of the garbage collector's scans (gc.freeze: a full collection of torch and a model
stops a rank for tens of milliseconds, and its peers count the stop as loss; the metrics
say how many still ran). Under plain torchrun none of these process-wide changes is made
unless Options(process_hooks=True) asks for them (False turns them off under lossbed run,
which then has no metrics to gather).
"""

from __future__ import annotations

import gc
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from harness import rank_hooks, rank_protocol, variants
from harness.rank_protocol import RankEnv, ScriptRankMetrics
from harness.transport.semantics import Semantics

# What a rank is told and prints for `lossbed run`: harness/rank_protocol.py. `lossbed run`
# applies the profile once the job has joined, then creates the gate file on every host:
# the ranks start their first lossy step only after it (a job started some other way has
# no gate)
GATE_TIMEOUT_S = 600.0
TIMING_WARMUP_STEPS = 5  # the first steps' times are kept apart (lazy set-up, caches)
# the variants lossy_gradients takes, with their estimators (harness/variants.py)
ESTIMATORS = {v.name: v.estimator for v in variants.TABLE.values()
              if v.wrapper == "gradient_hook"}

__all__ = ["Job", "LossbedSetupError", "Options", "bounded_drift", "finish", "join",
           "lossy_gradients", "reliable", "report", "rps"]


class LossbedSetupError(RuntimeError):
    """The job cannot go lossy as set up: the message says what to change."""


@dataclass(frozen=True)
class Options:
    """How a job goes lossy; every field has its environment default (see the module)."""

    transport: str | None = None      # loss semantics; None: LOSSBED_TRANSPORT or udp
    address: str | None = None        # None: LOSSBED_ADDRESS, or the one reaching MASTER_ADDR
    mtu: int | None = None            # None: LOSSBED_MTU or 1500
    metrics_dir: str | None = None    # None: LOSSBED_METRICS_DIR (nothing written if unset)
    sealed: bool = True               # False: datagrams unsealed (a network only this job uses)
    align_every: int = 0              # ranks meet in the store every N-th step (0: the first)
    # gc.freeze at join, the error mark in sys.excepthook, finish() at exit, the marks and
    # metrics on stdout: None: on under `lossbed run` (it reads them), off under plain torchrun
    process_hooks: bool | None = None


class Job:
    """One rank's part in a lossy job: its transport (made once every rank joined) and what
    it measures. Made by join(); the module's functions use one made on first call."""

    def __init__(self, options: Options | None = None):
        import torch.distributed as dist

        from harness.runtime import keep_startup_out_of_collector
        from harness.transport.auth import job_key
        from harness.transport.dropmask import parse_drop_mask
        from harness.transport.udp import UdpTransport

        self.options = options = options or Options()
        if not dist.is_available() or not dist.is_initialized():
            raise LossbedSetupError(
                "torch.distributed is not initialised: call dist.init_process_group() "
                "first (DDP needs it too), under torchrun or `lossbed run`")
        told = RankEnv.from_env()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.local_rank = told.local_rank
        if self.world < 2:
            raise LossbedSetupError(
                "a world of 1 rank has nothing to reduce over a network: start 2 or more "
                "ranks (torchrun --nproc-per-node 2 ..., or lossbed run on a cluster)")
        key = job_key(told.key)
        if key is None and options.sealed:
            raise LossbedSetupError(
                "LOSSBED_KEY is not set: every datagram is sealed with the job's key, which "
                "reaches the ranks through their environment only. `lossbed run` sets it; "
                "under plain torchrun export one per job to every host (python -c 'import "
                "os; print(os.urandom(32).hex())'), or pass Options(sealed=False) on a "
                "network only this job uses")
        semantics = Semantics.parse(options.transport or told.transport)
        if semantics.verbs:
            raise LossbedSetupError(f"{semantics}: the API runs on the UDP transport "
                                    "(udp, roce-ud, roce-uc, roce-rc); verbs needs "
                                    "`lossbed train`")
        self.store = _store()
        address = options.address or told.address or _address_towards(
            told.master_addr or "127.0.0.1")
        mtu = options.mtu or told.mtu
        self.transport = UdpTransport(
            self.rank, self.world, address, self.store, mtu=mtu, semantics=semantics,
            drop_mask=parse_drop_mask(told.drop_mask), segmentation=told.segmentation,
            key_prefix="lossbed/api/udp", key=key if options.sealed else None)
        self.metrics_dir = options.metrics_dir or told.metrics_dir
        self.host = told.host
        # lossbed run (which names the job) reads the ranks' marks; nothing process-wide
        # changes under plain torchrun unless asked for
        hooks = told.job is not None if options.process_hooks is None else options.process_hooks
        if hooks:
            keep_startup_out_of_collector()  # as lossbed's own ranks do (see there)
        self._begin(dict(align_every=options.align_every), owns_transport=True)
        self._announce = hooks
        if self.rank == 0 and hooks:  # every rank's endpoints are exchanged: joined
            print(rank_protocol.mark(rank_protocol.JOINED_MARK, {"world": self.world}),
                  flush=True)
        _wait_for_gate(told.gate)
        self._counted_from = self.transport.counters.to_dict()
        self._live_at = 0.0 if hooks and told.live else None  # (the live mark: metrics served)
        if hooks:
            rank_hooks.install(self.rank, self.host, self.finish)

    @classmethod
    def attach(cls, transport, store, *, rank: int, world: int,
               collective_options: dict | None = None, live: bool = False) -> Job:
        """A Job on a transport and store a launcher made already (lossbed's own `train`):
        the same wrapping, without the environment's set-up; collective_options go to
        every LossyCollective it makes; live: print the live mark (metrics served)."""
        job = object.__new__(cls)
        job.options, job.rank, job.world, job.local_rank = Options(), rank, world, rank
        job.transport, job.store, job.metrics_dir, job.host = transport, store, None, None
        job._begin(dict(collective_options or {}), owns_transport=False)
        job._live_at = 0.0 if live else None
        return job

    def _begin(self, collective_options: dict, owns_transport: bool) -> None:
        self._collective_options = {"background_late_ends": True, **collective_options}
        self._owns_transport = owns_transport
        self._collectives: list = []
        self._timers: list = []          # what holds a collective-time histogram
        self._script: dict = {}          # report(): the script's own figures
        self._step_marks: list[float] = []
        self._counted_from = self.transport.counters.to_dict()
        self._live_at: float | None = None  # (the live mark: where metrics are served)
        self._finished = False
        self._announce = False  # (a Job of lossbed's own train: its worker reports)
        self._started = time.perf_counter()
        self._full_collections_from = _full_collections()

    # ---- the baseline and the three schemes --------------------------------------------

    def reliable(self, model):
        """The baseline under the same impairment: DDP's own all-reduce (gloo or NCCL,
        which retransmit what is lost), timed, its steps measured as the schemes' are.
        Returns the model."""
        from harness.ddp.hooks import ReliableTiming, timed_allreduce_hook

        ddp = _ddp(model, "reliable")
        timer = ReliableTiming()
        ddp.register_comm_hook(timer, timed_allreduce_hook)
        self._watch(ddp, timer)
        return model

    def _collective(self, estimator: str):
        from harness.collectives.lossy import LossyCollective

        options = dict(self._collective_options)
        if self._owns_transport:  # (each collective of a job meets under its own keys)
            options.setdefault("key_prefix", f"lossbed/api/collective{len(self._collectives)}")
        collective = LossyCollective(self.transport, self.store, estimator=estimator,
                                     **options)
        self._collectives.append(collective)
        return collective

    def lossy_gradients(self, model, estimator: str = "unbiased", *, scaler=None):
        """DDP's gradient all-reduce over the lossy transport (a communication hook):
        `zero_fill` (a lost packet contributes zeros) or `unbiased` (the mean of what
        arrived). scaler: the GradScaler that steps the optimizer, if one does (every rank
        skips the same steps: harness/ddp/amp.py). Returns the model."""
        from harness.ddp.hooks import LossyHookState, lossy_allreduce_hook

        ddp = _ddp(model, "lossy_gradients")
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator {estimator!r}: use one of {', '.join(ESTIMATORS)}")
        state = LossyHookState(self._collective(ESTIMATORS[estimator]),
                               agree_skips=scaler is not None)
        ddp.register_comm_hook(state, lossy_allreduce_hook)
        self._watch(ddp, state)
        return model

    def bounded_drift(self, model, optimizer, *, resync_every: int = 0, scaler=None,
                      clip_grad_norm: float | None = None):
        """unbiased_drift: DDP reduces nothing (the gradients stay local); the returned
        optimizer (a torch.optim.Optimizer with your optimizer's param_groups) reduces them
        to each shard's owner, steps your optimizer's class with your groups' settings
        there and broadcasts the parameters, a rank that misses a packet keeping its stale
        values (resync_every=K: a reliable resync every K steps). Use it as you would your
        optimizer: schedulers, zero_grad, state_dict (each rank its own), GradScaler (given
        as scaler=: every rank skips the same steps). clip_grad_norm=MAX: DDP's clipping, by
        the reduced gradient's norm (last_grad_norm), in place of your clip_grad_norm_."""
        from harness.ddp.sharded import ShardedOptimizer, check_wrappable

        check_wrappable(optimizer, "bounded_drift")  # (before DDP is changed)
        ddp = _ddp(model, "bounded_drift")
        wrapped = ShardedOptimizer(ddp.module, optimizer, self._collective("received_mean"),
                                   resync_every=resync_every, scaler=scaler,
                                   clip_grad_norm=clip_grad_norm)
        _keep_gradients_local(ddp)
        self._watch(ddp, wrapped)
        return wrapped

    def rps(self, model, optimizer, *, scaler=None, clip_grad_norm: float | None = None):
        """RPS: DDP reduces nothing; the returned optimizer (your optimizer, its groups and
        state) steps on the local gradients, then averages the model over the ranks the RPS
        way. clip_grad_norm=MAX: DDP's clipping, by the ranks' mean gradient's norm (reduced
        reliably for it, each step: RPS itself reduces none)."""
        from harness.collectives.rps import RPS
        from harness.ddp.rps import RPSOptimizer
        from harness.ddp.sharded import check_wrappable

        check_wrappable(optimizer, "rps")
        ddp = _ddp(model, "rps")
        _keep_gradients_local(ddp)
        options = dict(self._collective_options)
        if self._owns_transport:
            options.setdefault("key_prefix", "lossbed/api/rps")
        rps = RPS(self.transport, self.store, **options)
        self._collectives.append(rps.collective)
        wrapped = RPSOptimizer(ddp.module, optimizer, rps, scaler=scaler,
                               clip_grad_norm=clip_grad_norm)
        self._watch(ddp, wrapped)
        return wrapped

    def _watch(self, ddp, timer) -> None:
        """Steps are told apart by the model's training forwards that reduce gradients (not
        those inside ddp.no_sync(): a step of gradient accumulation is one optimizer step,
        however many micro-batches it has); by lossbed's optimizer's steps where it returns
        one (its gradients stay local: every forward is outside the reduce)."""
        self._timers.append(timer)
        if isinstance(timer, torch_optimizer()):
            timer.register_step_pre_hook(lambda *_: self._stepped())
            return

        def mark(module, args):
            if module.training and module.require_backward_grad_sync:
                self._stepped()

        ddp.register_forward_pre_hook(mark)

    def _stepped(self) -> None:
        now = time.perf_counter()
        self._step_marks.append(now)
        if self._live_at is not None and now - self._live_at >= rank_protocol.LIVE_EVERY_S:
            self._live_at = now  # (tokens: what the script reported so far, if it did)
            print(rank_protocol.Live.of(self.rank, len(self._step_marks), self._collective_us(),
                                        self._counted(), now - self._started,
                                        self._script.get("tokens")).line(), flush=True)

    # ---- what it measured ---------------------------------------------------------------

    def _collective_us(self):
        """Every wrapped model's collective times (µs), in one histogram."""
        from harness.metrics.hdr import Histogram

        return Histogram.combined(timer.collective_us for timer in self._timers)

    def _counted(self) -> dict:
        """The transport's counters since this rank joined."""
        now = self.transport.counters.to_dict()
        return {k: now[k] - self._counted_from[k] for k in now}

    def collective_timer(self):
        """What holds the collective-time histogram (`collective_us`) of the model wrapped
        last; None before any is."""
        return self._timers[-1] if self._timers else None

    def report(self, **figures) -> None:
        """The script's own figures (its final loss, perplexity, accuracy, ...): kept in
        this rank's metrics; `lossbed run` puts rank 0's in its summary. `tokens` reported
        as it goes (the total so far) is served live as tokens/s (--metrics-port)."""
        for name, value in figures.items():
            json.dumps(value)  # (refused here if it cannot be written)
            self._script[name] = value

    def _replica_drift(self) -> float | None:
        """The largest drift of this rank's lossy optimizers' replicas (a collective); None
        without one, without the process group, or after a failure (peers may be gone)."""
        import torch.distributed as dist

        if not self._timers or getattr(sys, "last_value", None) or not dist.is_initialized():
            return None
        try:
            drifts = [d for t in self._timers if (d := t.replica_drift()) is not None]
            return max(drifts) if drifts else None
        except Exception as err:  # noqa: BLE001 - the metrics are still written
            self._script.setdefault("lossbed_drift_error", str(err))
            return None

    def metrics(self) -> dict:
        from harness.metrics.counts import summed
        from harness.metrics.hdr import Histogram

        marks = self._step_marks
        gaps = [(b - a) * 1e6 for a, b in zip(marks, marks[1:], strict=False)]
        steady = gaps[TIMING_WARMUP_STEPS:] if len(gaps) > 2 * TIMING_WARMUP_STEPS else gaps
        step_us = Histogram.of(steady)
        totals = summed(c.totals for c in self._collectives)
        return ScriptRankMetrics(
            rank=self.rank, world=self.world, host=self.host, steps=len(marks),
            train_s=time.perf_counter() - self._started, step_us=step_us.to_dict(),
            collective_us=self._collective_us().to_dict(), counters=self._counted(),
            collective_totals=totals, transport=str(self.transport.semantics),
            authenticated=self.transport.authenticated, script=dict(self._script),
            gc={"frozen_objects": gc.get_freeze_count(),
                "full_collections": _full_collections() - self._full_collections_from},
            drift=getattr(self, "_drift", None)).to_dict()

    def finish(self) -> None:
        """Send what the collectives still owe their peers, write this rank's metrics, close
        the transport. Called at exit if the script does not."""
        if self._finished:
            return
        self._finished = True
        self._drift = self._replica_drift()
        for collective in self._collectives:
            try:
                collective.finish()
            except Exception as err:  # noqa: BLE001 - the metrics are still written
                self._script.setdefault("lossbed_finish_error", str(err))
        metrics = self.metrics()
        if self.metrics_dir:
            folder = Path(self.metrics_dir)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"rank{self.rank}.json").write_text(json.dumps(metrics))
        if self._announce:
            print(rank_protocol.mark(rank_protocol.METRICS_MARK, metrics), flush=True)
        if self._owns_transport:
            self.transport.close()


_job: Job | None = None
_job_lock = threading.Lock()


def join(options: Options | None = None) -> Job:
    """This rank's Job (made on the first call, with `options`; every rank must call it, as
    the transports of all ranks meet)."""
    global _job
    with _job_lock:
        if _job is None:
            _job = Job(options)
        elif options is not None and options != _job.options:
            raise LossbedSetupError("join() was already called with other options")
        return _job


def reliable(model):
    return join().reliable(model)


def lossy_gradients(model, estimator: str = "unbiased", *, scaler=None):
    return join().lossy_gradients(model, estimator, scaler=scaler)


def bounded_drift(model, optimizer, *, resync_every: int = 0, scaler=None,
                  clip_grad_norm: float | None = None):
    return join().bounded_drift(model, optimizer, resync_every=resync_every, scaler=scaler,
                                clip_grad_norm=clip_grad_norm)


def rps(model, optimizer, *, scaler=None, clip_grad_norm: float | None = None):
    return join().rps(model, optimizer, scaler=scaler, clip_grad_norm=clip_grad_norm)


def report(**figures) -> None:
    join().report(**figures)


def finish() -> None:
    if _job is not None:
        _job.finish()


for _public in (reliable, lossy_gradients, bounded_drift, rps, report, finish):
    _public.__doc__ = getattr(Job, _public.__name__).__doc__
del _public


# ---- pieces ---------------------------------------------------------------------------------

def torch_optimizer() -> type:
    import torch

    return torch.optim.Optimizer


def _full_collections() -> int:
    """The garbage collector's full (generation 2) collections in this process so far."""
    return gc.get_stats()[2]["collections"]


def _ddp(model, what: str):
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        raise TypeError(f"{what} takes your model wrapped in DistributedDataParallel (got "
                        f"{type(model).__name__}): model = DDP(model) first")
    return model


def _keep_gradients_local(ddp) -> None:
    """DDP reduces nothing from now on: its backward leaves every gradient local, as inside
    ddp.no_sync(), without the reducer's bucket copies (the optimizer lossbed returns
    reduces or averages them itself). DDP still met the ranks and broadcast the parameters
    when it was made."""
    ddp.require_backward_grad_sync = False


def _store():
    """The store the default process group met in (torchrun's, or rank 0's): the ranks'
    transports exchange their endpoints there."""
    import torch.distributed as dist

    get = getattr(dist.distributed_c10d, "_get_default_store", None)
    if get is not None:
        try:
            return dist.PrefixStore("lossbed", get())
        except Exception:  # noqa: BLE001 - fall back to a client of MASTER_ADDR's store
            pass
    told = RankEnv.from_env().required()
    return dist.PrefixStore("lossbed", dist.TCPStore(
        told.master_addr, told.master_port, dist.get_world_size(),
        is_master=False, timeout=timedelta(seconds=300)))


def _address_towards(peer: str) -> str:
    """This host's address on the route to `peer` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return s.getsockname()[0]


def _wait_for_gate(gate: str | None) -> None:
    if not gate:
        return
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise LossbedSetupError(f"the impairment was not applied within "
                                    f"{GATE_TIMEOUT_S:.0f} s ({gate} never appeared)")
        time.sleep(0.05)
