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

Δppl (%) compares a run's headline perplexity (harness.eval.models) with its reference's;
per variant and loss it is averaged over seeds, with a 95% interval (Student's t).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness import launch
from harness.train.config import VARIANTS, TrainConfig
from harness.transport.semantics import Semantics
from testbed import profiles
from testbed.errors import UsageError

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
    speed_steps: int = 40      # `reliable` under loss: a speed measurement
    mtu: int = 1500

    def validate(self) -> None:
        bad = [x for x in self.losses if not 0 <= x < 1]
        if bad:
            raise UsageError("--loss", f"{bad[0]} is not a fraction in [0, 1)",
                             "LOSS is a fraction: LOSS=0.1 means 10%")
        unknown = [v for v in self.variants if v.partition("@")[0] not in VARIANTS]
        if unknown:
            raise UsageError("--variants", f"unknown {', '.join(unknown)}",
                             f"Use some of: {', '.join(VARIANTS)}, each optionally "
                             "@TRANSPORT (e.g. unbiased@roce-uc)")
        for v in self.variants:
            if "@" in v:
                Semantics.parse(v.partition("@")[2])
        if self.seeds < 1 or self.steps < 1 or self.realisations < 1 or self.speed_steps < 1:
            raise UsageError("--seeds/--steps/--realisations/--speed-steps",
                             "must be 1 or more", "e.g. --seeds 3")
        if self.hosts < 2:
            raise UsageError("--hosts", f"{self.hosts} host cannot train distributed",
                             "Use --hosts 2 or more (4 by default)")
        for loss in self.losses:
            if loss > 0:  # refuses early, seeded as the runs will be
                profiles.load(self.profile, self._sets(loss, 0))
        self.config(variant="reliable", seed=0).validate()
        self.config(variant="reliable", seed=0, steps=self.speed_steps).validate()
        launch.check_environment()

    def config(self, variant: str, seed: int, steps: int | None = None,
               wait_for_all: bool = False) -> TrainConfig:
        name, _, transport = variant.partition("@")
        return TrainConfig(variant=name, transport=transport or "udp", preset=self.preset,
                           wait_for_all=wait_for_all,
                           steps=steps or self.steps, seed=seed, batch=self.batch,
                           seq_len=self.seq_len, lr=self.lr, optimizer=self.optimizer,
                           device=self.device, schedule=self.schedule,
                           tokenizer=self.tokenizer, log_every=20)

    def _sets(self, loss: float, loss_seed: int) -> tuple[str, ...]:
        isolated = ("isolated=true",) if self.isolated else ()
        return isolated + ((f"loss_pct={loss * 100}", f"seed={loss_seed}") if loss > 0 else ())

    def cases(self) -> list[BenchRun]:
        """Every run of the bench, the references first (see the module's docstring)."""
        seeds = range(self.seeds)
        lossy = [loss for loss in self.losses if loss > 0]
        others = [v for v in self.variants if v.partition("@")[0] != "reliable"]
        runs = []
        for s in seeds:
            runs.append(BenchRun(self.config("reliable", s), 0.0, "reference"))
            if any(v.partition("@")[0] == "rps" for v in others):
                # waiting for every packet: a rank that falls behind would make its packets
                # late, late is lost, and the reference would be a perturbed run
                runs.append(BenchRun(self.config("rps", s, wait_for_all=True), 0.0,
                                     "reference"))
        if lossy and "reliable" in self.variants:
            runs += [BenchRun(self.config("reliable", s, self.speed_steps), 0.0,
                              "speed_reference") for s in seeds]
        if 0.0 in self.losses:  # the variants themselves at 0%: a check, not a reference
            runs += [BenchRun(self.config(v, s), 0.0, "lossy") for v in others
                     if v != "rps" for s in seeds]
        for loss in lossy:
            for s in seeds:
                # the loss seed: one realisation per (seed, loss), replayable
                runs += [BenchRun(self.config(v, s), loss, "lossy", s) for v in others]
                if "reliable" in self.variants:
                    runs.append(BenchRun(self.config("reliable", s, self.speed_steps), loss,
                                         "speed", s))
            for extra in range(1, self.realisations):
                runs += [BenchRun(self.config(v, 0), loss, "realisation", 1000 * extra)
                         for v in others if v.partition("@")[0] in REALISATION_VARIANTS]
        return [r.with_profile(self.profile, self._sets(r.loss, r.loss_seed)) for r in runs]


@dataclass
class BenchRun:
    cfg: TrainConfig
    loss: float
    role: str             # reference, lossy, realisation, speed, speed_reference
    loss_seed: int = 0    # the profile's seed: which loss realisation
    profile: str = "clean"
    sets: tuple[str, ...] = ()

    def with_profile(self, name: str, sets: tuple[str, ...]) -> BenchRun:
        """This run under profile `name` with `sets`; a lossless run stays on `clean`
        (with the sets that are not about loss: isolated)."""
        if self.loss == 0:
            name, sets = "clean", tuple(s for s in sets if s.startswith("isolated="))
        return BenchRun(self.cfg, self.loss, self.role, self.loss_seed, name, sets)

    @property
    def variant(self) -> str:
        return self.cfg.variant + (f"@{self.cfg.transport}" if self.cfg.transport != "udp"
                                   else "")
