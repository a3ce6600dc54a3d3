"""What a rank is told and what it reports: the one protocol between lossbed's controller
(harness/launch.py for its own ranks, harness/torchrun.py for a user's torchrun job) and every
rank (harness/runtime.py, harness/api.py, harness/train/worker.py).

- A rank is told its place and its network through its environment: torchrun's RANK,
  WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and lossbed's LOSSBED_* (RankEnv, written
  with to_env() by every launcher, read with from_env() by every rank, one set of defaults).
  The job's key travels only this way, never over the network lossbed impairs.
- The controller's own LOSSBED_* choices that ranks inherit (a drop mask, the reliable
  baseline's backend, an RDMA device) are read and checked once (ControllerEnv).
- A rank reports on stdout/stderr as marked JSON lines (mark(), read_mark()): that it joined,
  its metrics (ScriptRankMetrics for a user's script, TrainRankMetrics for lossbed's own
  training), and the error that ended it.

Nothing else in harness/ reads LOSSBED_* from the environment (tests/unit/
test_rank_protocol.py holds that).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

from testbed.errors import UsageError

# lossbed's part of a rank's environment
KEY = "LOSSBED_KEY"                    # the job's key, 64 hex digits (harness/transport/auth.py)
TRANSPORT = "LOSSBED_TRANSPORT"        # loss semantics: udp, roce-ud, roce-uc[:BYTES], ...
ADDRESS = "LOSSBED_ADDRESS"            # this host's address on the impaired network
MTU = "LOSSBED_MTU"                    # that network's MTU
SEGMENTATION = "LOSSBED_UDP_SEGMENTATION"  # "1": UDP segmentation offload is faithful
METRICS_DIR = "LOSSBED_METRICS_DIR"    # where a script's rank writes rank<N>.json
GATE = "LOSSBED_GATE"                  # a file whose existence opens the first lossy step
HOST = "LOSSBED_HOST"                  # the host's name in its cluster
JOB = "LOSSBED_JOB"                    # the job's id, in every process of it
WORK_LOCAL = "LOSSBED_WORK_LOCAL"      # "1": the controller reads the ranks' files
LIVE = "LOSSBED_LIVE"                  # "1": each rank sends its live mark (metrics served)
# the controller's choices, forwarded to ranks that do not inherit its environment
DROP_MASK = "LOSSBED_DROP_MASK"        # SEED:RATE, the receivers' drop mask
BACKEND = "LOSSBED_BACKEND"            # gloo or nccl: the reliable baseline's process group
RDMA_DEVICE = "LOSSBED_RDMA_DEVICE"    # the verbs device to use
FORWARDED = (DROP_MASK, RDMA_DEVICE, BACKEND)
# the controller's own: where the bench's lossless checkpoints are cached
CHECKPOINTS = "LOSSBED_CHECKPOINTS"

DEFAULT_TRANSPORT = "udp"
DEFAULT_MTU = 1500
BACKENDS = ("gloo", "nccl")

# what a rank prints (one JSON object per line, the mark its only key)
JOINED_MARK = "lossbed_joined"          # rank 0: every rank's endpoints are exchanged
METRICS_MARK = "lossbed_rank_metrics"   # a script's rank at its end: ScriptRankMetrics
ERROR_MARK = "lossbed_rank_error"       # what ended a rank: {"rank", "error"}
TRAIN_METRICS_MARK = "rank_metrics"     # lossbed's worker after each run: TrainRankMetrics
BOUNDARY_MARK = "lossbed_boundary"      # rank 0 of the worker at a run boundary: Boundary
RUN_RESULT_MARK = "lossbed_run_result"  # rank 0 of the worker after each run: its result
PROGRESS_MARK = "lossbed_progress"      # rank 0 of the worker every log_every steps: Progress
LIVE_MARK = "lossbed_live"              # a script's rank, about once a second if asked: Live
MARKS = (JOINED_MARK, METRICS_MARK, ERROR_MARK, TRAIN_METRICS_MARK, BOUNDARY_MARK,
         RUN_RESULT_MARK, PROGRESS_MARK, LIVE_MARK)
LIVE_EVERY_S = 1.0
# the live mark's histogram of the collective's time: Prometheus' buckets, in seconds
COLLECTIVE_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
                        2.0, 5.0, 10.0)


def _int(environ: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = environ.get(name)
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise UsageError(name, f"{text!r} is not a whole number",
                         f"Set {name} to an integer, or leave it unset") from None


@dataclass(frozen=True, kw_only=True)
class RankEnv:
    """One rank's environment. None: not set (to_env leaves it out; the reader's default)."""

    # torchrun's (lossbed run leaves them to torchrun)
    rank: int | None = None
    world: int | None = None
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    # lossbed's
    key: str | None = None
    transport: str = DEFAULT_TRANSPORT
    address: str | None = None
    mtu: int = DEFAULT_MTU
    segmentation: bool = False
    metrics_dir: str | None = None
    gate: str | None = None
    host: str | None = None
    job: str | None = None
    work_local: bool = True
    live: bool = False
    drop_mask: str | None = None
    backend: str = "gloo"
    rdma_device: str | None = None

    def to_env(self) -> dict[str, str]:
        """The variables that say this (unset fields left out)."""
        pairs = {
            "RANK": self.rank, "WORLD_SIZE": self.world, "LOCAL_RANK": self.local_rank,
            "MASTER_ADDR": self.master_addr, "MASTER_PORT": self.master_port,
            KEY: self.key, TRANSPORT: self.transport, ADDRESS: self.address, MTU: self.mtu,
            SEGMENTATION: "1" if self.segmentation else "0", METRICS_DIR: self.metrics_dir,
            GATE: self.gate, HOST: self.host, JOB: self.job,
            WORK_LOCAL: "1" if self.work_local else "0", LIVE: "1" if self.live else None,
            DROP_MASK: self.drop_mask,
            BACKEND: self.backend, RDMA_DEVICE: self.rdma_device,
        }
        return {name: str(value) for name, value in pairs.items() if value is not None}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RankEnv:
        """What this process was told (os.environ unless given); a malformed number is
        refused naming its variable."""
        e = os.environ if environ is None else environ
        return cls(
            rank=_int(e, "RANK", None), world=_int(e, "WORLD_SIZE", None),
            local_rank=_int(e, "LOCAL_RANK", 0), master_addr=e.get("MASTER_ADDR") or None,
            master_port=_int(e, "MASTER_PORT", None), key=e.get(KEY) or None,
            transport=e.get(TRANSPORT) or DEFAULT_TRANSPORT, address=e.get(ADDRESS) or None,
            mtu=_int(e, MTU, DEFAULT_MTU), segmentation=e.get(SEGMENTATION) == "1",
            metrics_dir=e.get(METRICS_DIR) or None, gate=e.get(GATE) or None,
            host=e.get(HOST) or None, job=e.get(JOB) or None,
            work_local=e.get(WORK_LOCAL, "1") == "1", live=e.get(LIVE) == "1",
            drop_mask=e.get(DROP_MASK) or None,
            backend=e.get(BACKEND) or "gloo", rdma_device=e.get(RDMA_DEVICE) or None)

    def required(self) -> RankEnv:
        """This, with the fields a rank cannot start without (rank, world, rendezvous)."""
        missing = [name for name, value in (("RANK", self.rank), ("WORLD_SIZE", self.world),
                                            ("MASTER_ADDR", self.master_addr),
                                            ("MASTER_PORT", self.master_port))
                   if value is None]
        if missing:
            raise SystemExit(f"{', '.join(missing)} not set: launch ranks with lossbed (or "
                             "torchrun conventions: RANK, WORLD_SIZE, MASTER_ADDR, "
                             "MASTER_PORT)")
        return self


@dataclass(frozen=True)
class ControllerEnv:
    """The controller's own LOSSBED_* settings: the choices its ranks get (FORWARDED),
    checked before anything is applied or launched (a rank would only fail with them
    minutes later), and its checkpoint cache."""

    drop_mask: str | None = None
    backend: str | None = None
    rdma_device: str | None = None
    checkpoints: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ControllerEnv:
        e = os.environ if environ is None else environ
        return cls(e.get(DROP_MASK) or None, e.get(BACKEND) or None,
                   e.get(RDMA_DEVICE) or None, e.get(CHECKPOINTS) or None)

    def check(self) -> ControllerEnv:
        from harness.transport.dropmask import parse_drop_mask

        parse_drop_mask(self.drop_mask)
        if self.backend and self.backend not in BACKENDS:
            raise UsageError(BACKEND, f"unknown backend {self.backend!r}",
                             f"Use one of: {', '.join(BACKENDS)} (or leave it unset: gloo)")
        return self

    def forwarded(self) -> dict[str, str]:
        """The variables ranks that do not inherit this environment are given."""
        return {name: value for name, value in ((DROP_MASK, self.drop_mask),
                                                (RDMA_DEVICE, self.rdma_device),
                                                (BACKEND, self.backend)) if value}


def mark(name: str, payload) -> str:
    """A rank's report as the one line it prints."""
    return json.dumps({name: payload})


def read_mark(line: str) -> tuple[str, object] | None:
    """(mark, payload) of a line a rank printed, or None for any other line."""
    if not line.startswith('{"'):
        return None
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or len(value) != 1:
        return None
    (name, payload), = value.items()
    if name not in MARKS:
        return None
    return name, payload


@dataclass(frozen=True)
class Boundary:
    """Rank 0 of lossbed's worker at a run boundary (harness.train.worker.wait_at_boundary):
    before run `index` ("start", and once after the last run), when its model is built and
    wrapped ("ready"), when its training ends ("trained"). The controller answers on rank
    0's stdin with go() once it has done its part (harness.train.run: apply, read, clear),
    or with STOP."""

    index: int
    phase: str = "start"

    PHASES = ("start", "ready", "trained")

    def __post_init__(self):
        if self.phase not in self.PHASES:
            raise ValueError(f"a run boundary's phase is one of {', '.join(self.PHASES)}, "
                             f"not {self.phase!r}")

    def line(self) -> str:
        """What rank 0 prints."""
        return mark(BOUNDARY_MARK, {"index": self.index, "phase": self.phase})

    @classmethod
    def read(cls, line: str) -> Boundary | None:
        """The boundary a line of rank 0's says, or None for any other line."""
        said = read_mark(line)
        return cls(**said[1]) if said is not None and said[0] == BOUNDARY_MARK else None

    def go(self) -> str:
        """The controller's answer that lets rank 0 go on."""
        return f"go {self.index}" + ("" if self.phase == "start" else f" {self.phase}")


STOP = "stop"  # the controller's answer when its part failed: rank 0 stops


@dataclass(frozen=True)
class Progress:
    """Rank 0 of lossbed's worker, on stderr every log_every steps: where run `run` (0-based)
    of the launch's `runs` stands. The controller shows it as text() (train) or reads its
    fields (the bench's own progress): it is never parsed back from the text."""

    run: int
    runs: int
    variant: str
    seed: int
    step: int            # steps done
    steps: int
    loss: float
    tokens_per_s: float
    eta_s: float         # about this long left in this run

    def line(self) -> str:
        """What rank 0 prints."""
        return mark(PROGRESS_MARK, dataclasses.asdict(self))

    @classmethod
    def read(cls, line: str) -> Progress | None:
        """The progress a line of rank 0's says, or None for any other line."""
        said = read_mark(line)
        return cls(**said[1]) if said is not None and said[0] == PROGRESS_MARK else None

    def status(self) -> str:
        return (f"step {self.step}/{self.steps} loss {self.loss:.3f} {self.tokens_per_s:.0f} "
                f"tok/s, about {self.eta_s:.0f} s left in this run")

    def text(self) -> str:
        """As a person reads it."""
        return (f"[run {self.run + 1}/{self.runs} {self.variant} seed {self.seed}] "
                f"{self.status()}")


@dataclass(frozen=True)
class Live:
    """A script's rank, about every LIVE_EVERY_S while it trains, where metrics are served
    (RankEnv.live): its steps, its collective calls' times as counts at or below each of
    COLLECTIVE_BUCKETS_S (cumulative, as Prometheus' buckets) with their count and sum, and
    its collectives' packets received and missing; all since it joined. Its seconds since
    it joined (`train_s`) and the tokens its script reported so far (lossbed.report(
    tokens=N), None before any): tokens/s the way the summary divides them. Read by the
    controller as it comes (harness/live_metrics.py)."""

    rank: int
    step: int
    buckets: list[int]
    count: int
    sum_s: float
    received: int
    missing: int
    train_s: float = 0.0
    tokens: float | None = None

    @classmethod
    def of(cls, rank: int, steps: int, collective_us, counted: dict, train_s: float = 0.0,
           tokens: float | None = None) -> Live:
        """From a rank's collective times (a Histogram of µs) and its transport's counters
        since it joined."""
        return cls(rank=rank, step=steps, buckets=collective_us.counts_at_or_below(
                       [b * 1e6 for b in COLLECTIVE_BUCKETS_S]),
                   count=collective_us.total, sum_s=collective_us.sum() / 1e6,
                   received=counted["packets_received"], missing=counted["missing"],
                   train_s=train_s, tokens=tokens)

    def line(self) -> str:
        return mark(LIVE_MARK, dataclasses.asdict(self))

    @classmethod
    def read(cls, line: str) -> Live | None:
        """The live mark a rank's line says, or None for any other line (or shape)."""
        if not line.startswith('{"' + LIVE_MARK):  # (every line of every rank comes here)
            return None
        said = read_mark(line)
        return cls.from_payload(said[1]) if said is not None and said[0] == LIVE_MARK \
            else None

    @classmethod
    def from_payload(cls, payload) -> Live | None:
        try:
            said = cls(**payload)
        except TypeError:
            return None
        return said if len(said.buckets) == len(COLLECTIVE_BUCKETS_S) else None


def marks(lines: list[str]) -> list[tuple[str, object]]:
    """Every (mark, payload) of the lines a rank printed, in order (read_mark's)."""
    return [said for said in map(read_mark, lines) if said is not None]


def run_results(said: list[tuple[str, object]]) -> list[RunResult]:
    """Rank 0's result of each run (RUN_RESULT_MARK), in order, from its marks()."""
    return [RunResult.from_dict(payload) for name, payload in said if name == RUN_RESULT_MARK]


def train_metrics(said: list[tuple[str, object]]) -> list[TrainRankMetrics]:
    """A rank's TrainRankMetrics of each run (TRAIN_METRICS_MARK), in order, from its
    marks()."""
    return [TrainRankMetrics.from_dict(payload) for name, payload in said
            if name == TRAIN_METRICS_MARK]


class _Record:
    """to_dict/from_dict for the metrics records (JSON on a rank's stdout)."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping):
        """The record a rank printed; TypeError where it is not one (not an object, or a
        required field missing)."""
        if not isinstance(values, Mapping):
            raise TypeError(f"{cls.__name__}: {type(values).__name__} is not an object")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


@dataclass(frozen=True, kw_only=True)
class ScriptRankMetrics(_Record):
    """What a rank of a user's script measured (harness.api), read by `lossbed run`."""

    rank: int
    world: int
    host: str | None = None
    steps: int = 0
    train_s: float = 0.0
    step_us: dict = field(default_factory=dict)        # Histogram.to_dict()
    collective_us: dict = field(default_factory=dict)  # Histogram.to_dict()
    counters: dict = field(default_factory=dict)       # the transport's, over the job
    collective_totals: dict = field(default_factory=dict)
    transport: str = DEFAULT_TRANSPORT
    authenticated: bool = False
    script: dict = field(default_factory=dict)         # what the script reported itself
    gc: dict = field(default_factory=dict)
    # bounded_drift, rps: this rank's distance from the model its replicas are bounded by
    # (the owners', the ranks' mean), relative, at the end (None: no such scheme, or none
    # measured: the process group was gone, or the script failed)
    drift: float | None = None


@dataclass(frozen=True, kw_only=True)
class TrainRankMetrics(_Record):
    """What a rank of lossbed's own training measured in one run (harness/train/worker.py),
    read by harness/train/run.py."""

    rank: int
    losses: list = field(default_factory=list)
    train_s: float = 0.0
    drift_steps: list = field(default_factory=list)     # rank 0's: [step, distance]
    progress_steps: list = field(default_factory=list)  # [step, held-out ppl]
    step_us: dict = field(default_factory=dict)
    collective_us: dict = field(default_factory=dict)
    warmup_step_us: list = field(default_factory=list)
    slow_steps: list = field(default_factory=list)
    counters: dict = field(default_factory=dict)
    collective_totals: dict = field(default_factory=dict)
    device_counters: dict = field(default_factory=dict)
    authenticated: bool = False
    max_rss_mb: float | None = None
    tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class RunResult(_Record):
    """What rank 0 of lossbed's own training says after each run (RUN_RESULT_MARK): its
    models' scores (harness/eval/models.py: measure) and what they were trained on, read by
    harness/train/run.py into the run's record."""

    index: int                      # which run of the launch
    headline: str                   # which perplexity is the variant's answer
    ppl: float
    ppl_rank0: float
    ppl_ranks: list
    ppl_rank_mean: float
    ppl_rank_worst: float
    ppl_average_model: float
    ppl_owners: float | None        # unbiased_drift's owners' model (None: the others)
    ce_per_token: float
    bits_per_byte: float
    bytes_per_token: float
    eval_tokens: int
    drift: float                    # max over ranks of ||x_i - mean||, at the end
    parameters: int
    corpus: str
    corpus_sha: str
    split_sha: str
    heldout_windows: int
    heldout_dropped: int
    tokenizer: str
    vocab_size: int
    epochs: int
    model_sha: str
