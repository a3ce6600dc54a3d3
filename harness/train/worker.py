"""One rank of a training run (started by `lossbed train` through harness.launch).

build model (same seed everywhere) -> wrap it for the variant -> train on batches drawn the
DistributedSampler way, under the learning-rate schedule -> every rank scores its own model,
rank 0 the averaged and the owners' model too (harness.eval.models) -> write this rank's
metrics; rank 0 prints the run's result as one JSON line.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from harness import api, barrier, rank_protocol, runtime, variants
from harness.data.corpus import load_documents, prepare
from harness.data.sampler import Batches
from harness.ddp.hooks import ReliableTiming
from harness.ddp.wrap import wrap_ddp
from harness.eval import models
from harness.metrics.hdr import Histogram
from harness.model import presets
from harness.rank_protocol import RankEnv, TrainRankMetrics
from harness.train import one_lossy_step, schedule
from harness.train.config import TrainConfig


def wrap(cfg: TrainConfig, model, r):
    """(module to call, optimizer, object holding the collective-time histogram), wrapped
    by the public API (harness/api.py) as a user's own script is."""
    transport = r.transport_for(cfg.transport)
    # the lossy collectives' step alignment, and whether they wait for every packet; a rank
    # computes between steps: the timed late end markers of its last broadcast go from a
    # thread meanwhile (api.Job: background_late_ends)
    job = api.Job.attach(transport, r.store, rank=r.rank, world=r.world,
                         collective_options=dict(align_every=cfg.align_every,
                                                 wait_for_all=cfg.wait_for_all,
                                                 lossy_stage=cfg.lossy_stage),
                         live=RankEnv.from_env().live)
    if cfg.optimizer == "sgd":
        optimizer_class, options = torch.optim.SGD, dict(lr=cfg.lr, momentum=0.9)
    else:
        optimizer_class = torch.optim.AdamW
        options = dict(lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    device = next(model.parameters()).device  # (a preset's model has no .device)
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = wrap_ddp(model, device_ids=device_ids)
    optimizer = optimizer_class(ddp.parameters(), **options)
    return (ddp, *WRAPPERS[variants.of(cfg.variant).wrapper](cfg, job, ddp, optimizer))


def _reliable(cfg, job, ddp, optimizer):
    if not cfg.plain_ddp:
        job.reliable(ddp)
    return optimizer, job.collective_timer() or ReliableTiming()


def _gradient_hook(cfg, job, ddp, optimizer):
    job.lossy_gradients(ddp, cfg.variant)
    return optimizer, job.collective_timer()


def _sharded_optimizer(cfg, job, ddp, optimizer):
    wrapped = job.bounded_drift(ddp, optimizer, resync_every=cfg.resync_every)
    return wrapped, wrapped


def _rps_optimizer(cfg, job, ddp, optimizer):
    wrapped = job.rps(ddp, optimizer)
    return wrapped, wrapped


# How each variant's model and optimizer are wrapped (harness/variants.py: its `wrapper`):
# (optimizer to step, what holds its collective's timing)
WRAPPERS = {"reliable": _reliable, "gradient_hook": _gradient_hook,
            "sharded_optimizer": _sharded_optimizer, "rps_optimizer": _rps_optimizer}


# Ranks write their files (metrics, rank 0's parameters) only where the controller reads
# them: on its own machine. A remote or VM host gets everything through stdout and keeps
# nothing on its disk (harness.train.run sets it).
WRITES_FILES = RankEnv.from_env().work_local


# The first steps of a run are slow for reasons of their own (lazy initialisation, caches,
# the collectives' adaptive deadlines learning the path): their times are reported apart,
# not in the step and collective percentiles.
TIMING_WARMUP_STEPS = 5
# A steady step slower than this many medians is listed with what its collectives counted
SLOW_FACTOR = 5.0


def _lossy_totals(timing) -> dict:
    """What a variant's lossy collective has counted so far (nothing for reliable):
    `timing` is its CollectiveTiming (harness/ddp/timing.py)."""
    collective = timing.lossy_collective()
    return dict(collective.totals) if collective is not None else {}


def train_one(r, cfg: TrainConfig, out_dir: Path, place: tuple[int, int], ready=lambda: None,
              trained=lambda: None) -> dict | None:
    """One run on an already started rank, `place`: (its 0-based index, the launch's runs);
    rank 0 returns the run's result and reports its progress (rank_protocol.Progress). ready() is
    called when the model is built and wrapped, before the first step (the run boundary
    where the controller applies the run's profile); trained() when training ends, before
    the models are gathered and scored (where it clears the profile)."""
    documents, source = load_documents(cfg.corpus, cfg.hf_dataset,
                                       hf_text_field=cfg.hf_text_field)
    tok, corpus = prepare(documents, source, cfg.tokenizer, cfg.seq_len)
    batches = Batches(corpus.train, r.rank, r.world, cfg.batch, cfg.seq_len, cfg.seed)
    model = presets.build(cfg.preset, tok.vocab_size, cfg.seed)
    if cfg.init_noise:
        presets.perturb(model, cfg.init_noise, cfg.seed)
    device = torch.device("cpu")
    if cfg.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"rank {r.rank}: --device cuda, but this host has no GPU")
        # several ranks may share one GPU (tests, small hosts)
        local = RankEnv.from_env().local_rank
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    model.to(device)
    module, optimizer, timing = wrap(cfg, model, r)
    # DDP's construction broadcast rank 0's parameters over gloo (TCP). A real job does that
    # once, before training; here every run of a launch does it again, and under a heavy
    # profile TCP's backoff holds ranks in it for a minute. So the profile comes after it:
    # the run's impairment starts with its training.
    ready()
    step_us, warmup_us, per_step = Histogram(), [], []
    losses, drift_steps, progress_steps, aside_s = [], [], [], 0.0
    transport = r.transport_for(cfg.transport)
    before = transport.counters.to_dict()
    started = time.perf_counter()
    # (a run of a handful of steps keeps a quarter of them apart)
    timing_warmup = min(TIMING_WARMUP_STEPS, cfg.steps // 4)
    lossy_step = one_lossy_step.step_of(cfg.steps, cfg.warmup_steps) if cfg.drop_once else -1
    for step in range(cfg.steps):
        if step == timing_warmup:
            timing.collective_us = Histogram()  # the steady state from here on
        schedule.set_lr(optimizer, schedule.lr_at(step, cfg.steps, cfg.lr, cfg.schedule,
                                                  cfg.warmup_steps))
        counted = (transport.counters.to_dict(), _lossy_totals(timing))
        t0 = time.perf_counter()
        inputs, targets = (t.to(device) for t in batches.next())
        logits = module(input_ids=inputs).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        if step == lossy_step:  # the chaos check's twin: one step as a lossy one
            one_lossy_step.drop_blocks(module.parameters(), cfg.drop_once,
                                       transport.per_packet, cfg.seed)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = float(loss.detach())
        elapsed_us = (time.perf_counter() - t0) * 1e6
        if step < timing_warmup:
            warmup_us.append(elapsed_us)
        else:
            step_us.record(elapsed_us)
            per_step.append((step, elapsed_us, counted))
        losses.append(value)
        t_aside = time.perf_counter()  # measurements, not training: off its time
        if (cfg.drift_every and variants.of(cfg.variant).replicas_differ
                and (step + 1) % cfg.drift_every == 0):
            distance = models.replica_distance(r, cfg.variant, model, transport.per_packet)
            if distance is not None:
                drift_steps.append([step + 1, distance])
        if cfg.progress_every and (step + 1) % cfg.progress_every == 0 and step + 1 < cfg.steps:
            # (the last step's is the run's own score, measured after training)
            progress_steps.append([step + 1, models.heldout_ppl(r, model, corpus.heldout,
                                                                tok.token_bytes)])
        aside_s += time.perf_counter() - t_aside
        if not math.isfinite(value):
            raise FloatingPointError(f"rank {r.rank}: loss became {value} at step {step}")
        if r.rank == 0 and (step % cfg.log_every == 0 or step == cfg.steps - 1):
            elapsed = time.perf_counter() - started
            rate = (step + 1) * cfg.batch * cfg.seq_len * r.world / elapsed
            eta = elapsed / (step + 1) * (cfg.steps - step - 1)
            print(rank_protocol.Progress(
                run=place[0], runs=place[1], variant=cfg.variant, seed=cfg.seed, step=step + 1,
                steps=cfg.steps, loss=value, tokens_per_s=rate, eta_s=eta).line(),
                file=sys.stderr, flush=True)
    train_s = time.perf_counter() - started - aside_s
    collective = timing.lossy_collective()
    if collective is not None:  # its last timed late markers, and its background sender
        collective.finish()
    after = transport.counters.to_dict()
    metrics = TrainRankMetrics(
        rank=r.rank, losses=losses, train_s=train_s,
        drift_steps=drift_steps,  # rank 0's: [step, largest replica distance]
        progress_steps=progress_steps,  # [step, held-out ppl] (progress_every)
        step_us=step_us.to_dict(), collective_us=timing.collective_us.to_dict(),
        warmup_step_us=warmup_us, slow_steps=_slow_steps(per_step, transport, timing),
        counters={k: after[k] - before[k] for k in after},
        # the lossy collective's own counts over the run: stages that ended at their
        # deadline, time spent aligning steps (nothing for reliable)
        collective_totals=_lossy_totals(timing),
        # RDMA queue pairs: what the device counted (retransmissions, sequence errors, ...)
        device_counters=transport.device_counters(),
        authenticated=transport.authenticated,
        # the most memory this rank ever held (what forged packets could have grown)
        max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        tokens=cfg.steps * cfg.batch * cfg.seq_len,
    ).to_dict()
    if WRITES_FILES:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"rank{r.rank}.json").write_text(json.dumps(metrics))
    # ... and on stdout, which the controller always gets: a host's folders may not be the
    # controller's (a VM writes into its own memory; a cluster may share no file system)
    print(rank_protocol.mark(rank_protocol.TRAIN_METRICS_MARK, metrics), flush=True)
    trained()
    if cfg.save_model and r.rank == 0:
        presets.save(model, tok, Path(cfg.save_model))
    result = models.measure(r, cfg.variant, model, corpus.heldout, tok.token_bytes,
                            cfg.eval_tokens or None, transport.per_packet)
    if result is None:
        return None
    own = models.flat(model)
    if WRITES_FILES:
        torch.save(own, out_dir / "rank0_params.pt")
    result.update(parameters=sum(p.numel() for p in model.parameters()), corpus=source,
                  corpus_sha=corpus.corpus_sha, split_sha=corpus.split_sha,
                  heldout_windows=len(corpus.heldout), heldout_dropped=corpus.heldout_dropped,
                  tokenizer=tok.name, vocab_size=tok.vocab_size, epochs=batches.epoch,
                  model_sha=_digest(own))
    return result


def _slow_steps(per_step, transport, timing) -> list[dict]:
    """The steady steps slower than SLOW_FACTOR medians, each with what the transport and
    the lossy collective counted during it (deadlines hit, time in step alignment, ...)."""
    if not per_step:
        return []
    times = sorted(us for _, us, _ in per_step)
    median = times[len(times) // 2]
    ends = [counted for _, _, counted in per_step[1:]]
    ends.append((transport.counters.to_dict(), _lossy_totals(timing)))
    slow = []
    for (step, us, (c0, l0)), (c1, l1) in zip(per_step, ends, strict=True):
        if us > SLOW_FACTOR * median:
            during = {k: c1[k] - c0[k] for k in c1 if c1[k] != c0[k]}
            during |= {k: round(l1[k] - l0.get(k, 0), 6) for k in l1 if l1[k] != l0.get(k, 0)}
            slow.append({"step": step, "ms": us / 1000, "median_ms": median / 1000, **during})
    return slow


# How long ranks wait at a run boundary for the controller (it reads the kernel's counters
# and may apply the next run's profile: seconds here, longer over SSH)
BOUNDARY_TIMEOUT_S = 1800.0


def wait_at_boundary(r, index: int, phase: str = "start") -> None:
    """Before run `index` (phase "start", and after the last run), when its model is built
    and wrapped (phase "ready") and when its training ends (phase "trained"): rank 0 tells
    the controller, which applies the run's profile and reads the kernel's counters when
    the run is ready, and reads them again and clears the profile when training ends; rank
    0 waits for its answer ("go INDEX", "go INDEX ready", "go INDEX trained"), every rank
    waits for rank 0. So each run's measured loss is its own training's. A rank 0 whose
    stdin is at its end (started without lossbed's controller, e.g. by hand with
    </dev/null) does not wait."""
    boundary = rank_protocol.Boundary(index, phase)
    expected = boundary.go()
    if r.rank == 0:
        print(boundary.line(), flush=True)
        answer = sys.stdin.readline() if sys.stdin is not None else ""
        if answer and answer.strip() != expected:
            raise SystemExit(f"rank 0: the controller answered {answer.strip()!r} at run "
                             f"boundary {index}, not {expected!r}")
    barrier.wait_for_all(r.store, f"lossbed/boundary/{index}/{phase}", r.world,
                         BOUNDARY_TIMEOUT_S)


def main(argv=None) -> int:
    """argv: a JSON list of run configs, and the output folder. The runs go one after the
    other in these processes (one start-up for many runs), with a boundary before each and
    after the last; rank 0 prints a JSON line per run."""
    args = argv or sys.argv[1:]
    configs = [TrainConfig(**c) for c in json.loads(args[0])]
    out_dir = Path(args[1])
    r = runtime.start(timeout_s=300)
    try:
        for i, cfg in enumerate(configs):
            wait_at_boundary(r, i)
            result = train_one(r, cfg, out_dir / f"run{i}", (i, len(configs)),
                               ready=lambda i=i: wait_at_boundary(r, i, "ready"),
                               trained=lambda i=i: wait_at_boundary(r, i, "trained"))
            if result is not None:
                said = rank_protocol.RunResult(index=i, **result)  # (every field, or none)
                print(rank_protocol.mark(rank_protocol.RUN_RESULT_MARK, said.to_dict()),
                      flush=True)
        wait_at_boundary(r, len(configs))
    finally:
        r.close()
    return 0


def _digest(values: torch.Tensor) -> str:
    import hashlib

    return hashlib.sha256(values.numpy().tobytes()).hexdigest()[:16]


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    runtime.run_and_exit(main)
