"""A training run's settings, checked before any process starts."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from harness import variants
from harness.model import presets
from harness.model import tokenizer as tokenizers
from harness.names import (
    LOSSY_STAGES,
    SCHEDULES,
    VARIANTS,
    Device,
    LossyStage,
    Optimizer,
    Schedule,
    Variant,
)
from harness.options import option
from testbed import checks
from testbed.errors import UsageError

# One name per concept, in the CLI, the code and the records. A variant names what travels
# and how; the estimator (harness/collectives/rebuild.py) how a missing contribution is
# rebuilt. collective-bench times the same names, and `rescale`, an estimator no training
# variant uses.
ESTIMATOR_OF = {**variants.estimators(), "rescale": "rescale"}  # (harness/variants.py)


@dataclass(kw_only=True, frozen=True)
class TrainConfig:
    """A run's settings, checked as they are made (UsageError naming the option and the
    fix). Those made with option() are `lossbed train`'s options too (the CLI is built from
    them: harness/options.py); the others are set by the bench and the tests."""

    variant: Variant = option("reliable", "the training scheme")
    steps: int = option(300, "training steps")
    seed: int = option(0, "the initialisation and data order's seed")
    preset: str = option("tiny", "tiny, small, or a local HF model folder",
                         path="name_or_path")
    device: Device = option("cpu", "where ranks train (cuda: GPU hosts; rank r uses GPU r %% "
                            "the GPUs on its host)")
    batch: int = option(16, "sequences per rank per step")
    seq_len: int = option(128, "tokens per sequence")
    lr: float = option(2e-3, "the peak learning rate")
    optimizer: Optimizer = option("adamw", "sgd: momentum 0.9, as RPS's paper trains")
    schedule: Schedule = option("cosine", "cosine: warm-up, then decay to 10%%")
    tokenizer: str = option("bpe", "bpe (subword, trained on the training split), bpe:N, "
                            "bytes, or a local HF tokenizer folder", path="name_or_path")
    warmup_steps: int | None = option(None, "learning-rate warm-up (default: 5%% of the "
                                      "steps)")
    transport: str = option("udp", "loss semantics of the lossy variants: udp, roce-ud, "
                            "roce-uc[:BYTES], roce-rc[:BYTES]; or real RDMA queue pairs: "
                            "verbs-ud, verbs-uc[:BYTES], verbs-rc[:BYTES] (verbs = verbs-uc)")
    resync_every: int = option(0, "unbiased_drift: reliable parameter resync every K steps "
                               "(0: never)")
    # Write rank 0's trained model here (HF save_pretrained, with the tokenizer), for a
    # later run's --preset DIR (a warm start); an absolute path on the ranks' file system
    save_model: str | None = option(None, "write rank 0's trained model and its tokenizer "
                                    "to DIR (on rank 0's host), for a later --preset DIR "
                                    "--tokenizer DIR", metavar="DIR", path="path")
    # Lossy variants: which stage crosses the lossy transport ("both": the scheme; "reduce"
    # or "broadcast": that stage alone, the other over gloo, delivered in full), to tell
    # which stage a Δppl comes from (harness/collectives/lossy.py)
    lossy_stage: LossyStage = option("both", "lossy variants: the stage that crosses the "
                                     "lossy transport; the other goes over gloo, delivered "
                                     "in full")
    eval_tokens: int = option(0, "0: the whole held-out split")
    corpus: str | None = option(None, "a text file (default: pydoc_data.topics)",
                                path="path")
    hf_dataset: str | None = option(None, "an HF dataset in the local cache, or a saved "
                                    "folder", path="name_or_path")
    hf_text_field: str = option("text", "the HF dataset's column with the text")
    plain_ddp: bool = False   # reliable without lossbed's timing hook (to check it changes nothing)
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
    log_every: int = 10

    def __post_init__(self):
        self.validate()  # every value, as the settings are made (and remade by replace())

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
