"""A training run's settings, checked before any process starts."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from harness.model import presets
from harness.model import tokenizer as tokenizers
from harness.train.schedule import SCHEDULES
from testbed import checks
from testbed.errors import UsageError

# One name per concept, in the CLI, the code and the records. A variant names what travels
# and how; the estimator (harness/collectives/rebuild.py) how a missing contribution is
# rebuilt. collective-bench times the same names, and `rescale`, an estimator no training
# variant uses.
VARIANTS = ("reliable", "zero_fill", "unbiased", "unbiased_drift", "rps")
ESTIMATOR_OF = {"zero_fill": "zero_fill", "unbiased": "received_mean",
                "unbiased_drift": "received_mean", "rescale": "rescale"}


@dataclass
class TrainConfig:
    variant: str = "reliable"
    preset: str = "tiny"
    steps: int = 300
    seed: int = 0
    batch: int = 16
    seq_len: int = 128
    lr: float = 2e-3
    optimizer: str = "adamw"  # or "sgd" (momentum 0.9): RPS's own setting
    plain_ddp: bool = False   # reliable without lossbed's timing hook (to check it changes nothing)
    transport: str = "udp"    # loss semantics of the lossy variants: udp, roce-ud, roce-uc, roce-rc
    device: str = "cpu"       # or "cuda": rank r uses GPU r % (GPUs on its host)
    resync_every: int = 0
    eval_tokens: int = 0  # 0: the whole held-out split
    corpus: str | None = None
    hf_dataset: str | None = None
    hf_text_field: str = "text"  # the HF dataset's column that holds the text
    tokenizer: str = "bpe"    # bpe (subword, trained on the training split), bpe:N, bytes, PATH
    schedule: str = "cosine"  # warm-up then cosine decay to 10%; or constant
    # Lossy variants: every align_every-th step starts together, through the rendezvous
    # store (1: every step; 0: never, past the first). Never by default: training impairs the
    # store's port (a fair control path), and TCP's recovery on it makes ranks start late,
    # which costs more (in step time and in packets late, so lost) than the packets a rank
    # that falls behind makes its peers miss (docs/results.md, "Step alignment"). A rank that
    # falls behind catches up (harness/transport/early.py), and a run whose collective
    # missed far more than the network lost is flagged `disturbed` in its record.
    align_every: int = 0
    # Lossy variants: every stage waits for all its packets instead of a deadline (a bench's
    # lossless reference of rps, whose packets a rank that falls behind would make late,
    # and late is lost): harness/collectives/lossy.py
    wait_for_all: bool = False
    # Lossy variants: which stage crosses the lossy transport ("both": the scheme; "reduce"
    # or "broadcast": that stage alone, the other over gloo, delivered in full), to tell
    # which stage a Δppl comes from (harness/collectives/lossy.py)
    lossy_stage: str = "both"
    # Write rank 0's trained model here (HF save_pretrained, with the tokenizer), for a
    # later run's --preset DIR (a warm start); an absolute path on the ranks' file system
    save_model: str | None = None
    # Add this much Gaussian noise (sd) to every initial weight, seeded apart from the
    # model's seed: the twin of a run for the chaos check (harness/bench/stability.py)
    init_noise: float = 0.0
    # Zero this fraction of one step's aggregated gradient (in datagram-sized blocks, at the
    # warm-up's last step): the twin of a run at the loss's own scale (one_lossy_step.py)
    drop_once: float = 0.0
    # Lossy variants: every drift_every steps, measure how far the replicas are from the
    # model the variant bounds them by (the owners', or the ranks' mean), over the process
    # group, outside the timed step (0: only at the end)
    drift_every: int = 0
    # Reliable runs (all ranks hold one model): every progress_every steps, its held-out
    # perplexity, outside the timed step: the curve a lossy run's final perplexity is placed
    # on, in steps (the bench's iso-progress; harness/bench/progress.py). 0: none
    progress_every: int = 0
    warmup_steps: int | None = None  # None: 5% of the steps
    log_every: int = 10

    def validate(self) -> None:
        if self.variant not in VARIANTS:
            raise UsageError("--variant", f"unknown variant {self.variant!r}",
                             f"Use one of: {', '.join(VARIANTS)}")
        presets.check(self.preset)
        for name in ("steps", "batch", "seq_len"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')}", f"{getattr(self, name)} is "
                                 "too small", "Use 1 or more")
        from harness.transport.semantics import Semantics

        Semantics.parse(self.transport)  # verbs-*: the hosts' devices are checked by run.check
        if self.device not in ("cpu", "cuda"):
            raise UsageError("--device", f"unknown device {self.device!r}", "Use cpu or cuda")
        if self.optimizer not in ("adamw", "sgd"):
            raise UsageError("--optimizer", f"unknown optimizer {self.optimizer!r}",
                             "Use adamw or sgd")
        checks.positive_rate("--lr", self.lr, 2e-3)
        if self.resync_every < 0:
            raise UsageError("--resync-every", "must be 0 (never) or more", "e.g. 100")
        if self.eval_tokens < 0:
            raise UsageError("--eval-tokens", f"{self.eval_tokens} is negative",
                             "Use 0 (the whole held-out split) or a number of tokens")
        if self.seed < 0:
            raise UsageError("--seed", f"{self.seed} is negative", "Use 0 or more")
        if self.schedule not in SCHEDULES:
            raise UsageError("--schedule", f"unknown schedule {self.schedule!r}",
                             f"Use one of: {', '.join(SCHEDULES)}")
        if self.warmup_steps is not None and not 0 <= self.warmup_steps < self.steps:
            raise UsageError("--warmup-steps", f"{self.warmup_steps} is not in 0.."
                             f"{self.steps - 1} (the run has {self.steps} steps)",
                             "Leave it out for 5% of the steps")
        tokenizers.check(self.tokenizer)
        from harness.collectives.lossy import LOSSY_STAGES

        if self.lossy_stage not in LOSSY_STAGES:
            raise UsageError("--lossy-stage", f"unknown stage {self.lossy_stage!r}",
                             f"Use one of: {', '.join(LOSSY_STAGES)}")
        if self.lossy_stage != "both" and self.variant == "reliable":
            raise UsageError("--lossy-stage", f"{self.lossy_stage!r} with --variant reliable: "
                             "reliable has no lossy stage", "Use a lossy variant, or leave "
                             "--lossy-stage out")
        if self.align_every < 0:
            raise UsageError("align_every", f"{self.align_every} is negative (a "
                             "TrainConfig field; no command sets it)",
                             "Use 0 (never), 1 (every step) or K (every K-th step)")
        if not (math.isfinite(self.init_noise) and self.init_noise >= 0):
            raise UsageError("init_noise", f"{self.init_noise} is not a noise level",
                             "Use 0 or a small positive sd, e.g. 1e-6")
        if self.drift_every < 0:
            raise UsageError("drift_every", f"{self.drift_every} is negative",
                             "Use 0 (at the end only) or K (every K-th step)")
        if self.progress_every < 0:
            raise UsageError("progress_every", f"{self.progress_every} is negative",
                             "Use 0 (none) or K (every K-th step)")
        if self.progress_every and self.variant != "reliable":
            raise UsageError("progress_every", f"a {self.variant} run's ranks hold models of "
                             "their own: the curve is of one model", "Use it on reliable runs")
        checks.loss_fraction("drop_once", self.drop_once)  # 0: off
        if self.log_every < 1:
            raise UsageError("log_every", f"{self.log_every} is too small", "Use 1 or more")

    def to_dict(self) -> dict:
        return asdict(self)
