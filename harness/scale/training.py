"""N ranks' data-parallel training in one process (the many-rank mode): one thread and one
model replica per rank, each with the production optimizer lossbed returns to a user
(ShardedOptimizer for unbiased_drift, RPSOptimizer for rps; for the gradient variants the
all-reduced gradient: exact for reliable, lossy for zero_fill and unbiased), their
collective the in-memory one (memory.py) with its packets' fates drawn from the loss
process (fates.py).

What is the same as a run over the real transport: the model and its initialisation per
seed, the data each rank draws (harness/data/sampler.py, the DistributedSampler way), the
optimizers and their settings (harness/train/worker.py's), the learning-rate schedule, the
layout and packetisation at the MTU, the rebuild, and which model is scored
(harness/eval/models.py's headline). What is not: no clock. Nothing is late, so the loss
a run sees is the loss process's alone; speed and tails are not measured here and are never
extrapolated from it (the real transport's runs measure those).

The global batch is fixed across n (`global_batch` sequences per step, split over the
ranks), so the compute per step does not grow with n.
"""

from __future__ import annotations

import math
import resource
import time
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Literal

import torch
import torch.nn.functional as F

from harness import names, variants
from harness.data.corpus import load_documents, prepare
from harness.data.sampler import Batches
from harness.ddp.rps import RPSOptimizer
from harness.ddp.sharded import ShardedOptimizer
from harness.eval import models
from harness.eval.perplexity import evaluate
from harness.model import presets
from harness.names import Optimizer, Schedule
from harness.scale.fates import BernoulliFate, NoLoss, SeededFate
from harness.scale.memory import MemoryExchange, on_every_rank, per_packet_at
from harness.train import one_lossy_step, schedule
from harness.transport.dropmask import DropMask
from testbed import checks

VARIANTS = names.VARIANTS  # the many-rank mode runs every variant


@dataclass(frozen=True, kw_only=True)
class ManyRankConfig:
    world: int
    variant: str = "reliable"
    steps: int = 150
    seed: int = 0
    global_batch: int = 64        # sequences per step over all ranks
    seq_len: int = 64
    preset: str = "tiny"
    tokenizer: str = "bpe"
    lr: float = 2e-3
    optimizer: Optimizer = "adamw"
    schedule: Schedule = "cosine"
    warmup_steps: int | None = None
    loss: float = 0.0             # each packet's drop probability (Bernoulli, seeded)
    loss_seed: int = 0
    # bernoulli: drawn a stage at a time (fast); mask: the UDP transport's own seeded drop
    # mask (LOSSBED_DROP_MASK=loss_seed:loss drops the same packets on real hosts)
    fate: Literal["bernoulli", "mask"] = "bernoulli"
    mtu: int = 1500
    eval_tokens: int = 0          # 0: the whole held-out split
    drift_every: int = 0          # measure the replicas' drift every K steps (0: at the end)
    scored_ranks: int = 8         # rank_mean over this many ranks (evenly spread), at most n
    start_from: str | None = None  # every replica starts from these flat values (torch.save)
    save_to: str | None = None     # rank 0's flat values after training, saved here
    # the chaos check's twin (reliable only): at the warm-up's last step this fraction of the
    # all-reduced gradient's datagram blocks zeroed, as the real worker's twin
    # (harness/train/one_lossy_step.py)
    drop_once: float = 0.0

    def validate(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"the many-rank mode runs {', '.join(VARIANTS)}, not "
                             f"{self.variant!r}")
        if self.world < 2 or self.global_batch % self.world:
            raise ValueError(f"{self.global_batch} sequences per step do not split over "
                             f"{self.world} ranks: use a world that divides the global batch")
        if self.steps < 0:
            raise ValueError(f"steps {self.steps} is negative (0: score the start alone)")
        checks.loss_fraction("loss", self.loss)
        checks.loss_fraction("drop_once", self.drop_once)
        if self.drop_once and variants.of(self.variant).wrapper != "reliable":
            raise ValueError(f"drop_once is the lossless reference's twin: variant reliable, "
                             f"not {self.variant!r}")


def run(cfg: ManyRankConfig, echo=lambda line: None) -> dict:
    """One run: its per-step training loss (over the global batch), the headline perplexity
    and the others, the drift, what the loss process dropped, wall time and peak memory."""
    cfg.validate()
    started = time.monotonic()
    documents, source = load_documents()
    tok, corpus = prepare(documents, source, cfg.tokenizer, cfg.seq_len)
    per_packet = per_packet_at(cfg.mtu)
    if cfg.loss == 0:
        fate = NoLoss()
    elif cfg.fate == "mask":
        fate = SeededFate(DropMask(cfg.loss_seed, cfg.loss), cfg.world)
    else:
        fate = BernoulliFate(cfg.loss_seed, cfg.loss)
    exchange = MemoryExchange(cfg.world, per_packet, fate,
                              variants.of(cfg.variant).estimator or "received_mean")
    replicas = [presets.build(cfg.preset, tok.vocab_size, cfg.seed) for _ in range(cfg.world)]
    if cfg.start_from:  # a warm start: the same values in every replica
        start = torch.load(cfg.start_from, weights_only=True)
        for model in replicas:
            models.load_flat(model, start)
    optimizers = [_optimizer(cfg, replicas[r], exchange.collective(r))
                  for r in range(cfg.world)]
    per_rank_losses = [[0.0] * cfg.world for _ in range(cfg.steps)]
    drift_steps: list[list] = []
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)  # the ranks' threads are the parallelism
    try:
        def rank_work(rank: int):
            batches = Batches(corpus.train, rank, cfg.world, cfg.global_batch // cfg.world,
                              cfg.seq_len, cfg.seed)
            model, optimizer = replicas[rank], optimizers[rank]
            for step in range(cfg.steps):
                schedule.set_lr(optimizer, schedule.lr_at(step, cfg.steps, cfg.lr,
                                                          cfg.schedule, cfg.warmup_steps))
                with exchange.turn:  # (one rank computes at a time: memory.py says why)
                    inputs, targets = batches.next()
                    logits = model(input_ids=inputs).logits
                    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           targets.reshape(-1))
                    loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                value = float(loss.detach())
                if not math.isfinite(value):
                    raise FloatingPointError(f"rank {rank}: loss {value} at step {step}")
                per_rank_losses[step][rank] = value
                if rank == 0:
                    if step % 10 == 0 or step == cfg.steps - 1:
                        echo(f"[many-rank n={cfg.world} {cfg.variant}] step {step + 1}/"
                             f"{cfg.steps} loss {value:.3f}")
                if cfg.drift_every and (step + 1) % cfg.drift_every == 0:
                    exchange.barrier.wait()
                    if rank == 0:
                        drift_steps.append([step + 1, _drift(cfg, replicas, per_packet)])
                    exchange.barrier.wait()

        on_every_rank(cfg.world, rank_work, abort=exchange.barrier.abort)
    finally:
        torch.set_num_threads(threads_before)
    if cfg.save_to:
        torch.save(models.flat(replicas[0]), cfg.save_to)
    collectives = [o.lossy_collective() for o in optimizers]
    expected = sum(c.expected for c in collectives)
    missing = sum(c.missing for c in collectives)
    scores = _scores(cfg, replicas, corpus, tok, per_packet)
    return {
        "mode": "many-rank", "config": asdict(cfg), "world": cfg.world,
        "variant": cfg.variant, "seed": cfg.seed, "loss": cfg.loss, "steps": cfg.steps,
        # each step's training loss over the global batch (the ranks' mean: n-independent)
        "losses": [sum(step) / cfg.world for step in per_rank_losses],
        "losses_rank0": [step[0] for step in per_rank_losses], **scores,
        "drift": _drift(cfg, replicas, per_packet), "drift_steps": drift_steps,
        "drift_max": max((d for _, d in drift_steps), default=None),
        "packets_expected": expected, "packets_missing": missing,
        "measured_loss": missing / expected if expected else 0.0,
        "wall_s": time.monotonic() - started,
        # the process's peak so far (several runs in one process: the largest of them)
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _optimizer(cfg: ManyRankConfig, model, collective):
    """The user's optimizer as harness/train/worker.py makes it, wrapped as lossbed wraps
    it for the variant."""
    if cfg.optimizer == "sgd":
        inner = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    else:
        inner = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                                  weight_decay=0.0)
    wrapper = variants.of(cfg.variant).wrapper
    if wrapper == "sharded_optimizer":
        return ShardedOptimizer(model, inner, collective)
    if wrapper == "rps_optimizer":
        return RPSOptimizer(model, inner, SimpleNamespace(average=collective.allreduce,
                                                          collective=collective))
    drop = None
    if cfg.drop_once:  # the twin: one step's blocks lost, the same ones on every rank
        drop = (one_lossy_step.step_of(cfg.steps, cfg.warmup_steps), cfg.drop_once,
                collective.transport.per_packet, cfg.seed)
    return _MeanGradient(model, inner, collective, drop)


class _MeanGradient:
    """The gradient variants: the ranks' gradients all-reduced by the collective, then the
    optimizer's step on every rank. reliable: every packet arrives, the exact mean, every rank
    alike; zero_fill and unbiased: the lossy all-reduce with their estimator, where a rank
    that misses a broadcast packet keeps its own gradient there (as the real hook does; the
    real hook reduces DDP's buckets one by one, this the whole gradient in one step, so
    the packets are the same but their step numbers are not)."""

    def __init__(self, model, inner, collective, drop=None):
        self.inner, self.collective = inner, collective
        # (step, fraction, block, seed): the chaos twin's one lossy step, or None
        self.drop, self.steps_taken = drop, 0
        self.param_groups = inner.param_groups
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.flat = torch.zeros(sum(p.numel() for p in self.params), dtype=torch.float32)

    def lossy_collective(self):
        """The many-rank collective its gradients go through (harness/ddp/timing.py)."""
        return self.collective

    def step(self) -> None:
        offset = 0
        for p in self.params:
            n = p.numel()
            self.flat[offset:offset + n] = 0 if p.grad is None else p.grad.reshape(-1)
            offset += n
        self.collective.allreduce(self.flat)
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = self.flat[offset:offset + n].view_as(p).clone()
            offset += n
        if self.drop is not None and self.steps_taken == self.drop[0]:
            _, fraction, block, seed = self.drop
            one_lossy_step.drop_blocks(self.params, fraction, block, seed)
        self.steps_taken += 1
        self.inner.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)


def _drift(cfg: ManyRankConfig, replicas, per_packet: int) -> float:
    """The largest distance of a replica from the model the variant bounds it by
    (harness/eval/models.py's, as the real ranks measure it)."""
    return models.largest_distance([models.flat(m) for m in replicas], cfg.variant,
                                   per_packet)


def _scores(cfg: ManyRankConfig, replicas, corpus, tok, per_packet: int) -> dict:
    """The held-out scores harness/eval/models.py gives, its headline per variant; the ranks'
    mean over `scored_ranks` ranks spread evenly (scoring 64 replicas costs 64 evaluations:
    the ranks scored are named)."""
    windows, sizes, limit = corpus.heldout, tok.token_bytes, cfg.eval_tokens or None
    count = min(cfg.scored_ranks, cfg.world)
    scored = sorted({round(i * (cfg.world - 1) / max(count - 1, 1)) for i in range(count)})
    ranks = {r: evaluate(replicas[r], windows, sizes, limit) for r in scored}
    probe = presets.build(cfg.preset, tok.vocab_size, cfg.seed)
    flats = [models.flat(m) for m in replicas]
    models.load_flat(probe, torch.stack(flats).mean(dim=0))
    averaged = evaluate(probe, windows, sizes, limit)
    owners = None
    if variants.of(cfg.variant).bounded_by_owners:
        models.load_flat(probe, models.owners_model(flats[0], flats, cfg.world, per_packet))
        owners = evaluate(probe, windows, sizes, limit)
    mean_ce = sum(s.ce_per_token for s in ranks.values()) / len(ranks)
    headline = models.HEADLINE[cfg.variant]
    ppl = {"rank0": ranks[0].ppl, "rank_mean": math.exp(mean_ce),
           "owners": owners.ppl if owners else None}[headline]
    return {"headline": headline, "ppl": ppl, "ppl_rank0": ranks[0].ppl,
            "ppl_scored_ranks": {r: s.ppl for r, s in ranks.items()},
            "ppl_rank_mean": math.exp(mean_ce), "ppl_average_model": averaged.ppl,
            "ppl_owners": owners.ppl if owners else None}
