"""What `lossbed bench` runs (`make bench LOSS=0.1`): every training variant at the given
loss rates, each against its lossless reference of the same seed (same initialisation, same
data order).

The runs of one bench, all in one launch of the ranks (the profile changes between runs):

    reference     per seed, `reliable` without loss under each optimizer a variant trains
                  with: under AdamW the reference of zero_fill, unbiased and unbiased_drift
                  (which train the same model as it at 0% loss), under SGD (`reliable/sgd`)
                  the reference of rps (lossless RPS under SGD trains the same model: model
                  averaging after a linear step is gradient averaging); `rps/adamw`, another
                  algorithm, against itself without loss (Δppl is the loss's effect alone),
                  its collective waiting for every packet (no deadline: nothing comes late)
    lossy         per seed and loss, every variant but reliable, the full run; the profile
                  is seeded (a loss realisation of its own per run, replayable)
    realisation   the first seed again, with other loss seeds, for the variants the question is
                  about (unbiased_drift, rps): the spread of Δppl over loss realisations at a
                  fixed seed, the noise floor a paired comparison has
    speed         `reliable` under loss, for its throughput and tail only: speed_steps steps
                  on the bench's first speed_seeds seeds,
                  and as many without loss (speed_reference) to check that under loss it
                  trains exactly the same model
    twin          with stability (the default): every lossless reference again on every
                  seed, with one step as a lossy one (the bench's loss rate of its
                  gradient's blocks zeroed): is its regime chaotic? (stability.py)

Δppl (%) compares a run's headline perplexity (harness.eval.models) with its reference's;
per variant and loss it is averaged over seeds, with a 95% interval (Student's t).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from harness import launch, variants
from harness.bench import stability
from harness.metrics.verdict import BAND_PCT
from harness.model import presets
from harness.names import (
    LOSSY_STAGES,
    OPTIMIZERS,
    REGIMES,
    VARIANTS,
    LossyStage,
    Optimizer,
    Regime,
)
from harness.options import option
from harness.train.config import TrainConfig
from harness.transport.semantics import Semantics
from testbed import checks, profiles
from testbed.errors import UsageError
from testbed.impair.coverage import DEFAULT_MIN_COVERAGE

# The default question (#54), chosen from measurements (tests/benchmarks/
# bench_regime_choice.py; docs/results.md has the table): fine-tune each seed's lossless
# checkpoint (PRETRAIN_STEPS at AdamW 2e-3, cached) for DEFAULT_STEPS steps, AdamW at
# FINETUNE_LR for the variants, SGD at SGD_LR["finetune"] for rps. Measured on 2 seeds:
# fine-tuning moved the references' ppl by -3 to -4% (AdamW) and -17 to -20% (SGD), so a
# verdict within ±0.8% is about a real change; one lossy step's twin moved nothing; Δppl
# per seed was +0.16 to +0.23 (unbiased_drift) and +0.10 to +0.11 (rps), a paired sd of
# 0.05 and 0.01, so DEFAULT_SEEDS = 4 gives intervals far inside the band. From scratch
# (--regime scratch: SCRATCH_STEPS at AdamW 2e-3, rps then under AdamW against itself) the
# record's answer was decisive for unbiased_drift, +10.99 ± 7.73 in 4 seeds (does not
# hold), and rps's inconclusive, +1.05 ± 1.57 (2a5d533, docs/results.md).
DEFAULT_STEPS = 150
SCRATCH_STEPS = 300  # --regime scratch's default: the length of the record's scratch answer
PRETRAIN_STEPS = 300
DEFAULT_SEEDS = 4
# The seeds the choices above were made on (the pilots: the regime, its rates, the seed
# count; docs/explanation/methodology.md lists each choice with its pilot). A run that
# confirms them must not reuse them: the bench's seeds start after them (FIRST_SEED), and
# its records and question say which seeds are which
PILOT_SEEDS = (0, 1)
FIRST_SEED = max(PILOT_SEEDS) + 1
# The lossy variants' replicas are measured against the model they are bounded by every
# DRIFT_EVERY steps (five times in the default's 150): drift over the run, not only at its end
DRIFT_EVERY = 30
# The lossless references' held-out perplexity every PROGRESS_EVERY steps (ten points in the
# default's 150, each scored by all ranks together: ~0.2 s): the curve each lossy row's final
# perplexity is placed on, in steps behind (harness/bench/progress.py)
PROGRESS_EVERY = 15
# The default variants: the two the papers are about, and the reliable baseline; the
# ablations (zero_fill, unbiased) cost runs the question does not need: --variants adds them
DEFAULT_VARIANTS = ("reliable", "unbiased_drift", "rps")
REALISATION_VARIANTS = ("unbiased_drift", "rps")
# --regime finetune: every variant starts from a lossless checkpoint of its seed (trained
# for pretrain_steps at --lr, cached: harness/bench/checkpoints.py) and trains at this peak
# rate, a twentieth of the scratch default, where one step moves the parameters little
FINETUNE_LR = 1e-4
# Every SGD run's peak rate (momentum 0.9), by regime: the fine-tune's measured with the
# default question (above: stable, -17 to -20% ppl in 150 steps); scratch's from the same
# measurement, 300 steps from scratch, 2 seeds: at 0.01 the twin moved -0.034% and rps's
# Δppl was +0.014/+0.004; at 0.03 the twin moved +0.196% (the tolerance is 0.2) and Δppl
# -0.44/-4.39: at the edge of chaos
SGD_LR = {"scratch": 0.01, "finetune": 0.1}
VARIANT_FORM = ("NAME[/reduce|/broadcast][/resync=K][/adamw|/sgd][@TRANSPORT], e.g. "
                "unbiased_drift, unbiased_drift/reduce, unbiased_drift/resync=5, rps/adamw, "
                "unbiased@roce-uc")
# The optimizer a variant trains with unless its text names another: RPS's paper analyses
# SGD (with momentum), where RPS without loss is reliable training (model averaging after
# a linear step is gradient averaging); under AdamW it is another algorithm. The others
# train as the bench's --optimizer says (AdamW by default).
RPS_OPTIMIZER = variants.of("rps").own_optimizer


def chosen_regime(asked: str | None, shares_this_machine: bool) -> tuple[str, str | None]:
    """The bench's regime, decided before its spec is made, and why where it is not the one
    asked for: fine-tuning unless asked otherwise, but the default fine-tune's checkpoints
    live on this machine's file system, so hosts that do not share it (VM, remote) run from
    scratch unless --regime finetune was asked."""
    if asked is not None or shares_this_machine:
        return asked or "finetune", None
    return "scratch", ("regime scratch: these hosts do not share this machine's file system, "
                       "where the default fine-tune's checkpoints live (--regime finetune "
                       "there: train --save-model and --preset DIR by hand)")


def default_steps(regime: str) -> int:
    """A bench's --steps where none is given: the length of the record's answer in that
    regime (DEFAULT_STEPS fine-tuning, SCRATCH_STEPS from scratch)."""
    return SCRATCH_STEPS if regime == "scratch" else DEFAULT_STEPS


@dataclass(frozen=True)
class Variant:
    """One --variants entry: a training variant, optionally with the loss on one stage
    alone (the other over gloo, delivered in full), a reliable resync every K steps, its
    optimizer, and the loss semantics of its transport. Its text is the run's `variant` in
    the records; the optimizer is written when it is not the variant's own (rps: sgd; the
    others: adamw)."""

    name: str
    lossy_stage: LossyStage = "both"
    resync_every: int = 0
    transport: str = "udp"
    optimizer: Optimizer | None = None  # None: not written (resolved: the bench's choice)

    @classmethod
    def parse(cls, text: str) -> Variant:
        head, _, transport = text.partition("@")
        name, *parts = head.split("/")
        if name not in VARIANTS:
            raise UsageError("--variants", f"unknown variant {name!r} in {text!r}",
                             f"Use some of: {', '.join(VARIANTS)}, as {VARIANT_FORM}")
        stage, resync, optimizer = "both", 0, None
        for part in parts:
            if part in LOSSY_STAGES and part != "both" and stage == "both":
                stage = part
            elif part.startswith("resync=") and part[7:].isdigit() and not resync:
                resync = int(part[7:])
            elif part in OPTIMIZERS and optimizer is None:
                optimizer = part
            else:
                raise UsageError("--variants", f"{text!r}: {part!r} is not an option of a "
                                 "variant (or is given twice)", f"Write {VARIANT_FORM}")
        if transport:
            Semantics.parse(transport)
        return cls(name, stage, resync, transport or "udp", optimizer)

    @property
    def own_optimizer(self) -> str:
        return variants.of(self.name).own_optimizer

    def resolved(self, default_optimizer: str = "adamw") -> Variant:
        """With its optimizer decided: the one its text names, rps's own (SGD), or the
        bench's --optimizer for the others."""
        if self.optimizer is not None:
            return self
        kind = variants.of(self.name)
        chosen = kind.own_optimizer if kind.optimizer_fixed else default_optimizer
        return replace(self, optimizer=chosen)

    @property
    def text(self) -> str:
        stage = f"/{self.lossy_stage}" if self.lossy_stage != "both" else ""
        resync = f"/resync={self.resync_every}" if self.resync_every else ""
        optimizer = (f"/{self.optimizer}" if self.optimizer not in (None, self.own_optimizer)
                     else "")
        transport = f"@{self.transport}" if self.transport != "udp" else ""
        return self.name + stage + resync + optimizer + transport


def base_variant(text: str) -> str:
    """The training variant a --variants entry (or a record's `variant`) runs."""
    return text.partition("@")[0].split("/")[0]


def reference_variant(variant: str) -> str:
    """Whose lossless run a variant (a record's resolved text) is compared with: reliable
    training under the same optimizer, the run the claim is about (lossless RPS under SGD,
    and every other variant at 0% loss, trains its model); RPS under AdamW, another
    algorithm, with itself without loss (Δppl is then the loss's effect alone)."""
    v = Variant.parse(variant).resolved()
    kind = variants.of(v.name)
    if kind.self_reference_off_own_optimizer and v.optimizer != kind.own_optimizer:
        return Variant(v.name, optimizer=v.optimizer).text
    return Variant("reliable", optimizer=v.optimizer).text


# Every run's training settings where the bench's command line gives none: TrainConfig's
# fields (declared there, once), at the bench's values. Smaller batches and sequences than
# `lossbed train`'s own defaults: a bench trains tens of runs, one train run one.
BENCH_TRAINING = TrainConfig(steps=DEFAULT_STEPS, batch=8, seq_len=64, log_every=20,
                             drift_every=DRIFT_EVERY, progress_every=PROGRESS_EVERY)


@dataclass(frozen=True)
class BenchSpec:
    """A bench, checked whole when it is made (every value, before anything is built):
    UsageError naming the option and the fix. `train` holds the runs' training settings
    (the model, data and optimisation: steps, batch, lr, ...; drift_every for the lossy
    variants, progress_every for the reliable references), the rest is the bench's own."""

    train: TrainConfig = BENCH_TRAINING
    losses: tuple[float, ...] = (0.1,)
    profile: str = option("random-loss", "a profile whose one loss rate --loss sets "
                          "(random-loss, burst-loss, or a file of yours)", path="name_or_path")
    hosts: int = option(4, "hosts of the bench's own cluster")
    # --unsealed: the profiles say isolated, and the datagrams go without their MAC
    isolated: bool = False
    seeds: int = option(DEFAULT_SEEDS, "seeds (initialisation and data order) per variant "
                        "and loss")
    first_seed: int = option(FIRST_SEED, "the first of the seeds (after the pilot seeds that "
                             "chose the defaults, so that the bench confirms them on others)")
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    sgd_lr: float | None = option(None, "the peak rate of every run under SGD (rps's, its "
                                  "reference's; all with --optimizer sgd) (default: "
                                  + ", ".join(f"{v:g} {k}" for k, v in SGD_LR.items()) + ")")
    # The default spends the runs on seeds instead: each seed has a loss realisation of its
    # own already
    realisations: int = option(1, "loss seeds at the first seed for unbiased_drift and rps "
                               "(1: no more)")
    # scratch: every run from the seed's initialisation at train.lr; finetune: from the
    # seed's cached lossless checkpoint (pretrain_steps at train.lr) at finetune_lr. Decided
    # before the spec is made (the CLI: scratch where the hosts do not share this machine)
    regime: Regime = "finetune"
    finetune_lr: float = option(FINETUNE_LR, f"finetune: the runs' peak rate (default "
                                f"{FINETUNE_LR:g})")
    pretrain_steps: int = option(PRETRAIN_STEPS, f"finetune: the checkpoints' steps (default "
                                 f"{PRETRAIN_STEPS})")
    # `reliable` under loss, for its speed and tail only: speed_steps steps on the first
    # speed_seeds seeds (the quality answer does not use them: its budget goes to seeds;
    # 2 x 55 steady steps still back a p99)
    speed_steps: int = option(60, "steps of reliable under loss (its speed; its model is "
                              "checked)")
    speed_seeds: int = option(2, "seeds of reliable's speed runs (the first ones)")
    # the chaos check every Δppl verdict waits for (harness/bench/stability.py)
    stability: bool = option(True, "the chaos check: every lossless reference again on every "
                             "seed, with one step as a lossy one; the rows of a reference "
                             "whose twins' 95%% interval reaches past a quarter of the band "
                             "get no verdict, nor do any without it (summary: stability)")
    mtu: int = option(1500, "MTU of the bench's own cluster")
    # the band every lossy row's Δppl is judged against (harness/metrics/verdict.py)
    band_pct: float = option(BAND_PCT, "each lossy row's Δppl is judged against ±this many "
                             "percent: holds when its whole 95%% interval is inside, does not "
                             f"hold when outside (default: {BAND_PCT:g}, arXiv 2507.07114's "
                             "bound)")
    # the least share of the hosts' bytes a run's traffic must have put through the
    # impairment to count (testbed/impair/coverage.py); a run below it is left out, named
    min_coverage: float = DEFAULT_MIN_COVERAGE
    # the bench's one launch: past this many seconds its ranks are stopped (TimedOut)
    timeout_s: float = option(launch.BENCH_TIMEOUT_S, launch.TIMEOUT_MEANS)

    @classmethod
    def make(cls, **settings) -> BenchSpec:
        """A spec from flat settings: a BenchSpec field is the bench's, a TrainConfig field
        goes into `train` (over BENCH_TRAINING); TypeError for one that is neither."""
        own = {f.name for f in fields(cls)} - {"train"}
        trained = {f.name for f in fields(TrainConfig)}
        unknown = sorted(set(settings) - own - trained)
        if unknown:
            raise TypeError(f"BenchSpec.make: no setting {', '.join(unknown)}")
        train = replace(BENCH_TRAINING, **{k: v for k, v in settings.items() if k in trained})
        return cls(train=train, **{k: v for k, v in settings.items() if k in own})

    def __post_init__(self):
        # lists given are kept as tuples: the spec does not change once made
        object.__setattr__(self, "losses", tuple(self.losses))
        object.__setattr__(self, "variants", tuple(self.variants))
        self._check()

    def to_dict(self) -> dict:
        """The spec as summary.json's `config` writes it: the bench's fields and the
        training settings it chose, side by side (as before `train` held them)."""
        flat = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "train"}
        t = self.train
        return {**flat, "losses": list(self.losses), "variants": list(self.variants),
                "steps": t.steps, "preset": t.preset, "device": t.device, "batch": t.batch,
                "seq_len": t.seq_len, "lr": t.lr, "optimizer": t.optimizer,
                "schedule": t.schedule, "tokenizer": t.tokenizer,
                "drift_every": t.drift_every, "progress_every": t.progress_every}

    def _check(self) -> None:
        checks.share("--min-coverage", self.min_coverage, checks.MIN_COVERAGE_EXAMPLE)
        checks.seconds("--timeout-s", self.timeout_s, launch.BENCH_TIMEOUT_S,
                       launch.TIMEOUT_MEANS, positive=True)
        if not (math.isfinite(self.band_pct) and 0 < self.band_pct < 100):
            raise UsageError("--band-pct", f"{self.band_pct:g} is not a band in percent",
                             f"e.g. --band-pct {BAND_PCT} (the paper's: Δppl within "
                             f"±{BAND_PCT}%)")
        checks.loss_fraction("--loss", *self.losses)
        for v in self.variants:
            parsed = Variant.parse(v)
            if parsed.name == "reliable" and (parsed.lossy_stage != "both"
                                              or parsed.resync_every):
                raise UsageError("--variants", f"{v!r}: reliable has no lossy stage to "
                                 "choose and no drift to resync", "Write plain reliable")
            if parsed.resync_every and parsed.name != "unbiased_drift":
                raise UsageError("--variants", f"{v!r}: resync applies to unbiased_drift "
                                 "only (its parameter broadcasts)", f"Write {VARIANT_FORM}")
        if self.sgd_lr is not None:
            checks.positive_rate("--sgd-lr", self.sgd_lr, SGD_LR["scratch"])
        if self.regime not in REGIMES:
            raise UsageError("--regime", f"unknown regime {self.regime!r}",
                             f"Use one of: {', '.join(REGIMES)}")
        if self.regime == "finetune":
            if self.train.preset not in presets.PRESETS:
                raise UsageError("--regime", f"finetune trains its own checkpoints from a "
                                 f"preset, not from {self.train.preset!r}", "Use --preset tiny or "
                                 "small, or --regime scratch --preset DIR for your own")
            checks.positive_rate("--finetune-lr", self.finetune_lr, FINETUNE_LR)
            if self.pretrain_steps < 1:
                raise UsageError("--pretrain-steps", "must be 1 or more", "e.g. 300")
            self.pretrain_config(0)  # (checked as it is made)
        if self.first_seed < 0:
            raise UsageError("--first-seed", f"{self.first_seed} is not a seed",
                             f"Give 0 or more (default {FIRST_SEED}: after the pilot seeds "
                             f"{', '.join(map(str, PILOT_SEEDS))})")
        if (self.seeds < 1 or self.realisations < 1 or self.speed_steps < 1
                or self.speed_seeds < 1):
            raise UsageError("--seeds/--steps/--realisations/--speed-steps/--speed-seeds",
                             "must be 1 or more", "e.g. --seeds 3")
        if self.hosts < 2:
            raise UsageError("--hosts", f"{self.hosts} host cannot train distributed",
                             "Use --hosts 2 or more (4 by default)")
        for loss in self.losses:
            if loss > 0:  # refuses early, seeded as the runs will be
                profiles.load(self.profile, loss=loss, loss_seed=0, isolated=self.isolated)
        # `train` was checked as it was made; its speed runs' length against its warm-up
        self.config(variant="reliable", seed=0, steps=self.speed_steps)

    def config(self, variant: str, seed: int, steps: int | None = None,
               wait_for_all: bool = False, init_noise: float = 0.0,
               checkpoints: dict[int, str] | None = None) -> TrainConfig:
        """A run of `variant` on `seed`: `train` with the variant's settings, its optimizer's
        rate, and in the finetune regime its seed's checkpoint (`checkpoints`: seed ->
        folder, once trained; before, the preset, to check)."""
        v = Variant.parse(variant).resolved(self.train.optimizer)
        preset, lr = self.train.preset, self.train.lr
        if self.regime == "finetune":
            preset, lr = (checkpoints or {}).get(seed, preset), self.finetune_lr
        if v.optimizer == "sgd":
            lr = self.sgd_peak
        return replace(self.train, variant=v.name, transport=v.transport, preset=preset,
                       lossy_stage=v.lossy_stage, resync_every=v.resync_every,
                       wait_for_all=wait_for_all, steps=steps or self.train.steps, seed=seed,
                       lr=lr, optimizer=v.optimizer, init_noise=init_noise, progress_every=0,
                       drift_every=self.train.drift_every if v.name != "reliable" else 0)

    @property
    def sgd_peak(self) -> float:
        return self.sgd_lr if self.sgd_lr is not None else SGD_LR[self.regime]

    def pretrain_config(self, seed: int) -> TrainConfig:
        """The lossless run whose model a finetune-regime run of `seed` starts from: AdamW
        at train.lr, whatever the runs' optimizers (one checkpoint serves them all)."""
        return replace(self.train, variant="reliable", steps=self.pretrain_steps, seed=seed,
                       optimizer="adamw", drift_every=0, progress_every=0)

    @property
    def regime_text(self) -> str:
        """The regime, as every Δppl is to be read (optimizer, peak rate, steps)."""
        optimizers = {Variant.parse(v).resolved(self.train.optimizer).optimizer
                      for v in self.variants}
        rates = []
        if "adamw" in optimizers:
            peak = self.finetune_lr if self.regime == "finetune" else self.train.lr
            rates.append(f"adamw peak {peak:g}")
        if "sgd" in optimizers:
            rates.append(f"sgd (momentum 0.9) peak {self.sgd_peak:g}")
        if self.regime == "finetune":
            return (f"finetune: from a lossless checkpoint ({self.pretrain_steps} steps at "
                    f"adamw peak {self.train.lr:g}), {self.train.steps} steps at "
                    + ", ".join(rates))
        return f"scratch: {self.train.steps} steps at " + ", ".join(rates)

    def resolved_text(self, variant: str) -> str:
        """A --variants entry as its runs' records name it (its optimizer decided)."""
        return Variant.parse(variant).resolved(self.train.optimizer).text

    @property
    def seed_list(self) -> list[int]:
        """The bench's seeds: `seeds` of them from first_seed."""
        return list(range(self.first_seed, self.first_seed + self.seeds))

    @property
    def pilot_seeds_used(self) -> list[int]:
        """Those of the bench's seeds that chose its defaults (none by default)."""
        return sorted(set(self.seed_list) & set(PILOT_SEEDS))

    def cases(self, checkpoints: dict[int, str] | None = None) -> list[BenchRun]:
        """Every run of the bench, the references first (see the module's docstring); in
        the finetune regime each from its seed's checkpoint (seed -> folder)."""
        seeds = self.seed_list

        def config(variant, seed, steps=None, **settings):
            return self.config(variant, seed, steps, checkpoints=checkpoints, **settings)

        speed_seeds = seeds[:self.speed_seeds]
        lossy = [loss for loss in self.losses if loss > 0]
        others = [v for v in self.variants if base_variant(v) != "reliable"]
        runs = []
        # reliable under the bench's optimizer (reliable's own row, the others'
        # reference), then each lossy variant's (rps: reliable under SGD)
        references = ([self.resolved_text("reliable")] if "reliable" in
                      map(base_variant, self.variants) else [])
        for v in others:
            ref = reference_variant(self.resolved_text(v))
            if ref not in references:
                references.append(ref)
        for s in seeds:
            for ref in references:
                # a lossy collective's reference (rps/adamw) waits for every packet: a rank
                # that falls behind would make its packets late, late is lost, and the
                # reference would be a perturbed run
                waits = base_variant(ref) != "reliable"
                # reliable's curve of held-out ppl: where its lossy rows sit, in steps
                cfg = replace(config(ref, s, wait_for_all=waits),
                              progress_every=0 if waits else self.train.progress_every)
                runs.append(BenchRun(cfg, 0.0, "reference"))
        if self.stability:
            lossy_rates = [x for x in self.losses if x > 0]
            drop = max(lossy_rates) if lossy_rates else stability.DEFAULT_DROP
            # every reference a verdict leans on, on every seed: its own chaos check
            runs += [BenchRun(replace(config(ref, s, wait_for_all=base_variant(ref)
                                                  != "reliable"), drop_once=drop), 0.0,
                              "twin") for s in seeds for ref in references]
        if lossy and "reliable" in self.variants:
            runs += [BenchRun(config("reliable", s, self.speed_steps), 0.0,
                              "speed_reference") for s in speed_seeds]
        if 0.0 in self.losses:  # the variants themselves at 0%: a check, not a reference
            runs += [BenchRun(config(v, s), 0.0, "lossy") for v in others
                     if base_variant(v) != "rps" for s in seeds]
        for loss in lossy:
            for s in seeds:
                # the loss seed: one realisation per (seed, loss), replayable
                runs += [BenchRun(config(v, s), loss, "lossy", s) for v in others]
                if "reliable" in self.variants and s in speed_seeds:
                    runs.append(BenchRun(config("reliable", s, self.speed_steps), loss,
                                         "speed", s))
            for extra in range(1, self.realisations):
                runs += [BenchRun(config(v, seeds[0]), loss, "realisation",
                                  1000 * extra)
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
        return Variant(c.variant, c.lossy_stage, c.resync_every, c.transport, c.optimizer).text
