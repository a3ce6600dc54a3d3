"""`lossbed bench` / `make bench LOSS=0.1`: every training variant at the given loss rates,
beside the lossless reliable reference, paired by seed.

Runs: for every seed, `reliable` without loss (the reference), and every variant at every
loss rate, all with the same initialisation and data order per seed. The runs under one
profile go one after the other in one launch of the ranks. Perplexity is compared with the
reference of the same seed (Δppl, %), averaged over seeds with a 95% interval, next to the
lossless runs' own seed-to-seed spread (the noise floor). `reliable` under loss must train
exactly the reference's model: that is checked, so its lossy runs measure speed only.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.bench import report
from harness.train import run
from harness.train.config import VARIANTS, TrainConfig
from harness.transport.semantics import Semantics
from testbed import profiles
from testbed.errors import LossbedError, UsageError

DEFAULT_STEPS = 120
DEFAULT_SEEDS = 3


@dataclass
class BenchSpec:
    losses: list[float] = field(default_factory=lambda: [0.1])
    profile: str = "random-loss"
    hosts: int = 4
    steps: int = DEFAULT_STEPS
    seeds: int = DEFAULT_SEEDS
    variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    preset: str = "tiny"
    batch: int = 8
    seq_len: int = 64
    lr: float = 2e-3
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
        if self.seeds < 1 or self.steps < 1:
            raise UsageError("--seeds/--steps", "must be 1 or more", "e.g. --seeds 3")
        if self.hosts < 2:
            raise UsageError("--hosts", f"{self.hosts} host cannot train distributed",
                             "Use --hosts 2 or more (4 by default)")
        for loss in self.losses:
            if loss > 0:
                profiles.load(self.profile, [f"loss_pct={loss * 100}"])  # refuses early
        self.config(variant="reliable", seed=0).validate()

    def config(self, variant: str, seed: int) -> TrainConfig:
        name, _, transport = variant.partition("@")
        return TrainConfig(variant=name, transport=transport or "udp", preset=self.preset,
                           steps=self.steps, seed=seed, batch=self.batch,
                           seq_len=self.seq_len, lr=self.lr, log_every=20)

    def cases(self) -> list[tuple[str, float, list[TrainConfig]]]:
        """(profile, loss, runs) per launch: the lossless reference first."""
        seeds = range(self.seeds)
        reference = [self.config("reliable", s) for s in seeds]
        if 0.0 in self.losses:
            reference += [self.config(v, s) for v in self.variants if v != "reliable"
                          for s in seeds]
        out = [("clean", 0.0, reference)]
        for loss in self.losses:
            if loss > 0:
                out.append((self.profile, loss,
                            [self.config(v, s) for v in self.variants for s in seeds]))
        return out


def run_bench(cluster, spec: BenchSpec, out: Path, echo=print) -> dict:
    spec.validate()
    out.mkdir(parents=True, exist_ok=True)
    cases = spec.cases()
    total = sum(len(runs) for _, _, runs in cases)
    done = 0
    started = time.monotonic()
    records = []

    def progress(line: str) -> None:
        if line.startswith("[run"):
            echo(f"[bench {done + 1 + _index(line)}/{total}] {line.split('] ', 1)[-1]}")

    for profile_name, loss, runs in cases:
        sets = [f"loss_pct={loss * 100}"] if loss > 0 else []
        echo(f"[bench] {len(runs)} runs under {profile_name}"
             f"{f' at {loss:.0%} loss' if loss else ''}")
        for rec in run.train_many(cluster, runs, profile_name, sets, out / "runs" /
                                  f"{profile_name}-{loss}", echo=progress):
            rec["loss"] = loss
            records.append(rec)
        done += len(runs)
        elapsed = time.monotonic() - started
        echo(f"[bench] {done}/{total} runs done in {elapsed / 60:.1f} min; about "
             f"{elapsed / done * (total - done) / 60:.1f} min left")
    summary = report.summarise(records, spec_dict=asdict(spec), backend=records[-1]["backend"])
    report.write_outputs(out, records, summary)
    if not summary["checks"]["reliable_exact_under_loss"]:
        raise LossbedError("reliable training under loss did not produce the lossless model: "
                           "the baseline is not reliable; see summary.json")
    return summary


def _index(line: str) -> int:
    """The 0-based run number inside its launch, from "[run 3/6 ...]"."""
    try:
        return int(line[5:].split("/", 1)[0]) - 1
    except ValueError:
        return 0


def load_summary(path: Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError("BASE/NEW", f"no bench summary at {path}",
                         "Give a summary.json written by lossbed bench, or its folder") from None


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
