"""A training run's settings, checked before any process starts."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from harness.model import presets
from testbed.errors import UsageError

VARIANTS = ("reliable", "zero_fill", "unbiased", "unbiased_drift", "rps")
# `lossbed bench` also takes VARIANT@TRANSPORT, e.g. unbiased@roce-uc: the same variant over
# another loss semantics. These are its RoCE defaults.
ROCE_VARIANTS = ("unbiased@roce-ud", "unbiased@roce-uc", "unbiased@roce-rc")
VARIANT_HELP = {
    "reliable": "torch.distributed all-reduce (gloo; NCCL on GPUs): waits for TCP",
    "zero_fill": "lossy all-reduce, missing gradients count as 0 (naive)",
    "unbiased": "lossy all-reduce, received-mean rebuild of gradients",
    "unbiased_drift": "unbiased gradients + parameter broadcast (arXiv 2507.07114)",
    "rps": "RPS model averaging (arXiv 1810.07766)",
}


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
    tokenizer: str | None = None
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
        if not self.lr > 0:
            raise UsageError("--lr", f"{self.lr} is not a positive learning rate",
                             "e.g. --lr 2e-3")
        if self.resync_every < 0:
            raise UsageError("--resync-every", "must be 0 (never) or more", "e.g. 100")

    def to_dict(self) -> dict:
        return asdict(self)
