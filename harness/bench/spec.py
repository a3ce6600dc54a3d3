"""What `lossbed bench` runs (`make bench LOSS=0.1`): every training variant at the given
loss rates, each against its lossless reference of the same seed (same initialisation, same
data order).

The runs of one bench, all in one launch of the ranks (the profile changes between runs):

    reference     per seed, `reliable` without loss: the reference of zero_fill, unbiased
                  and unbiased_drift (which train the same model as it at 0% loss); and
                  `rps` without loss, the reference of rps (model averaging is another
                  algorithm: compared with itself, Δppl is the loss's effect alone), its
                  collective waiting for every packet (no deadline: nothing comes late)
    lossy         per seed and loss, every variant but reliable, the full run; the profile
                  is seeded (a loss realisation of its own per run, replayable)
    realisation   seed 0 again, with other loss seeds, for the variants the question is
                  about (unbiased_drift, rps): the spread of Δppl over loss realisations at a
                  fixed seed, the noise floor a paired comparison has
    speed         `reliable` under loss, for its throughput and tail only: speed_steps steps,
                  and as many without loss (speed_reference) to check that under loss it
                  trains exactly the same model
    twin          with --stability (reproduce sets it): seed 0's lossless reference again,
                  its initial weights moved by 1e-6: is the regime chaotic? (stability.py)

Δppl (%) compares a run's headline perplexity (harness.eval.models) with its reference's;
per variant and loss it is averaged over seeds, with a 95% interval (Student's t).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from harness import launch
from harness.bench import stability
from harness.collectives.lossy import LOSSY_STAGES
from harness.metrics.verdict import BAND_PCT
from harness.model import presets
from harness.train.config import VARIANTS, TrainConfig
from harness.transport.semantics import Semantics
from testbed import profiles
from testbed.errors import UsageError
from testbed.impair.coverage import DEFAULT_MIN_COVERAGE

DEFAULT_STEPS = 300
# Chosen from a bench of 8 seeds (2026-12-01, 27 min on 2 cores; README): a seed costs
# 3.0 min; rps's Δppl has a seed-to-seed sd of 0.75, so ±1.0 needs 5 seeds (18 min), more
# than the 15 minutes the default may take; 4 seeds (±1.2 projected) and 2 loss
# realisations at seed 0 (not 3: 1.3 min) fit. unbiased_drift's effect itself differs by
# seed (sd 3.8): its ±1.0 would take 60 seeds, and 4 already tell it from ±0.8%.
DEFAULT_SEEDS = 4
# The default variants: the two the papers are about, and the reliable baseline; the
# ablations (zero_fill, unbiased) cost runs the question does not need: --variants adds them
DEFAULT_VARIANTS = ("reliable", "unbiased_drift", "rps")
REALISATION_VARIANTS = ("unbiased_drift", "rps")
REGIMES = ("scratch", "finetune")
# --regime finetune: every variant starts from a lossless checkpoint of its seed (trained
# for pretrain_steps at --lr, cached: harness/bench/checkpoints.py) and trains at this peak
# rate, a twentieth of the scratch default, where one step moves the parameters little
FINETUNE_LR = 1e-4
VARIANT_FORM = ("NAME[/reduce|/broadcast][/resync=K][@TRANSPORT], e.g. unbiased_drift, "
                "unbiased_drift/reduce, unbiased_drift/resync=5, unbiased@roce-uc")


@dataclass(frozen=True)
class Variant:
    """One --variants entry: a training variant, optionally with the loss on one stage
    alone (the other over gloo, delivered in full), a reliable resync every K steps, and
    the loss semantics of its transport. Its text is the run's `variant` in the records."""

    name: str
    lossy_stage: str = "both"
    resync_every: int = 0
    transport: str = "udp"

    @classmethod
    def parse(cls, text: str) -> Variant:
        head, _, transport = text.partition("@")
        name, *options = head.split("/")
        if name not in VARIANTS:
            raise UsageError("--variants", f"unknown variant {name!r} in {text!r}",
                             f"Use some of: {', '.join(VARIANTS)}, as {VARIANT_FORM}")
        stage, resync = "both", 0
        for option in options:
            if option in LOSSY_STAGES and option != "both" and stage == "both":
                stage = option
            elif option.startswith("resync=") and option[7:].isdigit() and not resync:
                resync = int(option[7:])
            else:
                raise UsageError("--variants", f"{text!r}: {option!r} is not an option of a "
                                 "variant (or is given twice)", f"Write {VARIANT_FORM}")
        if transport:
            Semantics.parse(transport)
        return cls(name, stage, resync, transport or "udp")

    @property
    def text(self) -> str:
        stage = f"/{self.lossy_stage}" if self.lossy_stage != "both" else ""
        resync = f"/resync={self.resync_every}" if self.resync_every else ""
        transport = f"@{self.transport}" if self.transport != "udp" else ""
        return self.name + stage + resync + transport


def base_variant(text: str) -> str:
    """The training variant a --variants entry (or a record's `variant`) runs."""
    return text.partition("@")[0].split("/")[0]


@dataclass
class BenchSpec:
    losses: list[float] = field(default_factory=lambda: [0.1])
    profile: str = "random-loss"
    hosts: int = 4
    # --unsealed: the profiles say isolated, and the datagrams go without their MAC
    isolated: bool = False
    steps: int = DEFAULT_STEPS
    seeds: int = DEFAULT_SEEDS
    variants: list[str] = field(default_factory=lambda: list(DEFAULT_VARIANTS))
    preset: str = "tiny"
    device: str = "cpu"
    batch: int = 8
    seq_len: int = 64
    lr: float = 2e-3
    optimizer: str = "adamw"
    schedule: str = "cosine"
    tokenizer: str = "bpe"
    realisations: int = 2      # loss seeds at seed 0 for REALISATION_VARIANTS (1: none more)
    # scratch: every run from the seed's initialisation at --lr; finetune: from the seed's
    # cached lossless checkpoint (pretrain_steps at --lr) at finetune_lr
    regime: str = "scratch"
    finetune_lr: float = FINETUNE_LR
    pretrain_steps: int = DEFAULT_STEPS
    # filled in by run_bench in the finetune regime: seed -> the checkpoint's folder
    checkpoints: dict = field(default_factory=dict)
    speed_steps: int = 40      # `reliable` under loss: a speed measurement
    # run seed 0's lossless reference twice, the twin's initial weights moved by 1e-6: the
    # chaos check every Δppl verdict of reproduce waits for (harness/bench/stability.py)
    stability: bool = False
    mtu: int = 1500
    # the band every lossy row's Δppl is judged against (harness/metrics/verdict.py), percent
    band_pct: float = BAND_PCT
    # the least share of the hosts' bytes a run's traffic must have put through the
    # impairment to count (testbed/impair/coverage.py); a run below it is left out, named
    min_coverage: float = DEFAULT_MIN_COVERAGE

    def validate(self) -> None:
        if not 0 <= self.min_coverage <= 1:
            raise UsageError("--min-coverage", f"{self.min_coverage:g} is not a fraction in "
                             "[0, 1]", "e.g. --min-coverage 0.9")
        if not (math.isfinite(self.band_pct) and 0 < self.band_pct < 100):
            raise UsageError("--band-pct", f"{self.band_pct:g} is not a band in percent",
                             f"e.g. --band-pct {BAND_PCT} (the paper's: Δppl within "
                             f"±{BAND_PCT}%)")
        bad = [x for x in self.losses if not 0 <= x < 1]
        if bad:
            raise UsageError("--loss", f"{bad[0]} is not a fraction in [0, 1)",
                             "LOSS is a fraction: LOSS=0.1 means 10%")
        for v in self.variants:
            parsed = Variant.parse(v)
            if parsed.name == "reliable" and (parsed.lossy_stage != "both"
                                              or parsed.resync_every):
                raise UsageError("--variants", f"{v!r}: reliable has no lossy stage to "
                                 "choose and no drift to resync", "Write plain reliable")
            if parsed.resync_every and parsed.name != "unbiased_drift":
                raise UsageError("--variants", f"{v!r}: resync applies to unbiased_drift "
                                 "only (its parameter broadcasts)", f"Write {VARIANT_FORM}")
        if self.regime not in REGIMES:
            raise UsageError("--regime", f"unknown regime {self.regime!r}",
                             f"Use one of: {', '.join(REGIMES)}")
        if self.regime == "finetune":
            if self.preset not in presets.PRESETS:
                raise UsageError("--regime", f"finetune trains its own checkpoints from a "
                                 f"preset, not from {self.preset!r}", "Use --preset tiny or "
                                 "small, or --regime scratch --preset DIR for your own")
            if not (self.finetune_lr > 0 and math.isfinite(self.finetune_lr)):
                raise UsageError("--finetune-lr", f"{self.finetune_lr} is not a positive "
                                 "learning rate", f"e.g. --finetune-lr {FINETUNE_LR}")
            if self.pretrain_steps < 1:
                raise UsageError("--pretrain-steps", "must be 1 or more", "e.g. 300")
            self.pretrain_config(0).validate()
        if self.seeds < 1 or self.steps < 1 or self.realisations < 1 or self.speed_steps < 1:
            raise UsageError("--seeds/--steps/--realisations/--speed-steps",
                             "must be 1 or more", "e.g. --seeds 3")
        if self.hosts < 2:
            raise UsageError("--hosts", f"{self.hosts} host cannot train distributed",
                             "Use --hosts 2 or more (4 by default)")
        for loss in self.losses:
            if loss > 0:  # refuses early, seeded as the runs will be
                profiles.load(self.profile, loss=loss, loss_seed=0, isolated=self.isolated)
        self.config(variant="reliable", seed=0).validate()
        self.config(variant="reliable", seed=0, steps=self.speed_steps).validate()
        launch.check_environment()

    def config(self, variant: str, seed: int, steps: int | None = None,
               wait_for_all: bool = False, init_noise: float = 0.0) -> TrainConfig:
        v = Variant.parse(variant)
        preset, lr = self.preset, self.lr
        if self.regime == "finetune":  # (before the checkpoints exist: the preset, to check)
            preset, lr = self.checkpoints.get(seed, self.preset), self.finetune_lr
        return TrainConfig(variant=v.name, transport=v.transport, preset=preset,
                           lossy_stage=v.lossy_stage, resync_every=v.resync_every,
                           wait_for_all=wait_for_all,
                           steps=steps or self.steps, seed=seed, batch=self.batch,
                           seq_len=self.seq_len, lr=lr, optimizer=self.optimizer,
                           device=self.device, schedule=self.schedule,
                           tokenizer=self.tokenizer, init_noise=init_noise, log_every=20)

    def pretrain_config(self, seed: int) -> TrainConfig:
        """The lossless run whose model a finetune-regime run of `seed` starts from."""
        return TrainConfig(variant="reliable", preset=self.preset, steps=self.pretrain_steps,
                           seed=seed, batch=self.batch, seq_len=self.seq_len, lr=self.lr,
                           optimizer=self.optimizer, device=self.device,
                           schedule=self.schedule, tokenizer=self.tokenizer, log_every=20)

    @property
    def regime_text(self) -> str:
        """The regime, as every Δppl is to be read (optimizer, peak rate, steps)."""
        if self.regime == "finetune":
            return (f"finetune: from a lossless checkpoint ({self.pretrain_steps} steps at "
                    f"{self.optimizer} peak {self.lr:g}), {self.steps} steps at peak "
                    f"{self.finetune_lr:g}")
        return f"scratch: {self.steps} steps at {self.optimizer} peak {self.lr:g}"

    def cases(self) -> list[BenchRun]:
        """Every run of the bench, the references first (see the module's docstring)."""
        seeds = range(self.seeds)
        lossy = [loss for loss in self.losses if loss > 0]
        others = [v for v in self.variants if base_variant(v) != "reliable"]
        runs = []
        for s in seeds:
            runs.append(BenchRun(self.config("reliable", s), 0.0, "reference"))
            if any(base_variant(v) == "rps" for v in others):
                # waiting for every packet: a rank that falls behind would make its packets
                # late, late is lost, and the reference would be a perturbed run
                runs.append(BenchRun(self.config("rps", s, wait_for_all=True), 0.0,
                                     "reference"))
        if self.stability:
            runs.append(BenchRun(self.config("reliable", stability.TWIN_SEED,
                                             init_noise=stability.NOISE), 0.0, "twin"))
        if lossy and "reliable" in self.variants:
            runs += [BenchRun(self.config("reliable", s, self.speed_steps), 0.0,
                              "speed_reference") for s in seeds]
        if 0.0 in self.losses:  # the variants themselves at 0%: a check, not a reference
            runs += [BenchRun(self.config(v, s), 0.0, "lossy") for v in others
                     if base_variant(v) != "rps" for s in seeds]
        for loss in lossy:
            for s in seeds:
                # the loss seed: one realisation per (seed, loss), replayable
                runs += [BenchRun(self.config(v, s), loss, "lossy", s) for v in others]
                if "reliable" in self.variants:
                    runs.append(BenchRun(self.config("reliable", s, self.speed_steps), loss,
                                         "speed", s))
            for extra in range(1, self.realisations):
                runs += [BenchRun(self.config(v, 0), loss, "realisation", 1000 * extra)
                         for v in others if base_variant(v) in REALISATION_VARIANTS]
        return [r.on_network(self.profile, self.isolated) for r in runs]


@dataclass
class BenchRun:
    cfg: TrainConfig
    loss: float
    role: str             # reference, lossy, realisation, speed, speed_reference, twin
    loss_seed: int = 0    # the profile's seed: which loss realisation
    profile: str = "clean"
    isolated: bool = False

    def on_network(self, profile: str, isolated: bool) -> BenchRun:
        """This run under `profile` at its loss; a lossless run stays on `clean`."""
        return replace(self, profile=profile if self.loss > 0 else "clean", isolated=isolated)

    def train_run(self):
        """The run as training takes it: its loss and seed typed (profiles.load)."""
        from harness.train.run import Run  # (torch: not for parsing a command line)

        lossy = self.loss > 0
        return Run(self.cfg, self.profile, loss=self.loss,
                   loss_seed=self.loss_seed if lossy else None, isolated=self.isolated)

    @property
    def variant(self) -> str:
        c = self.cfg
        return Variant(c.variant, c.lossy_stage, c.resync_every, c.transport).text
