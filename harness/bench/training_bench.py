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

from harness import launch
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
        launch.check_environment()

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
    """All runs in one launch of the ranks (one start-up): the profile changes between runs
    where the loss does, and each run's loss is measured around that run alone."""
    spec.validate()
    out.mkdir(parents=True, exist_ok=True)
    cases = spec.cases()
    runs, losses = [], []
    for profile_name, loss, cfgs in cases:
        sets = (f"loss_pct={loss * 100}",) if loss > 0 else ()
        runs += [run.Run(cfg, profile_name, sets) for cfg in cfgs]
        losses += [loss] * len(cfgs)
    total = len(runs)
    started = time.monotonic()

    def progress(line: str) -> None:
        if not line.startswith("[run"):
            return  # the ranks' other chatter (library warnings): in the ranks' output
        index = _index(line)
        elapsed = time.monotonic() - started
        left = f"; about {elapsed / index * (total - index) / 60:.1f} min left" if index else ""
        echo(f"[bench {index + 1}/{total}] {losses[index]:.0%} loss, "
             f"{line.split('] ', 1)[-1]}{left}")

    echo(f"[bench] {total} runs: " + ", ".join(
        f"{len(cfgs)} at {loss:.0%} loss ({name})" for name, loss, cfgs in cases))
    records = run.train_runs(cluster, runs, out / "runs", echo=progress)
    for rec, loss in zip(records, losses, strict=True):
        rec["loss"] = loss
    echo(f"[bench] {total} runs done in {(time.monotonic() - started) / 60:.1f} min")
    summary = report.summarise(records, spec_dict=asdict(spec), backend=records[-1]["backend"])
    report.write_outputs(out, records, summary)
    if summary["checks"]["reliable_exact_under_loss"] is False:
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
    """A bench's summary.json (or its folder), checked: `compare` refuses what it cannot
    compare with the reason, instead of failing on a missing key or a division by zero."""
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    fix = "Give a summary.json written by lossbed bench, or its folder"
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError("BASE/NEW", f"no bench summary at {path}", fix) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError("BASE/NEW", f"{path} is not a bench summary: {err}", fix) from None
    rows = summary.get("rows") if isinstance(summary, dict) else None
    if not isinstance(rows, list):
        raise UsageError("BASE/NEW", f"{path} has no list of rows", fix)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise UsageError("BASE/NEW", f"{path}: rows[{i}] is not an object", fix)
        for key in ("loss", "variant", "tokens_per_s", "step_max_ms"):
            if key not in row:
                raise UsageError("BASE/NEW", f"{path}: rows[{i}] has no {key!r}", fix)
        for key in ("tokens_per_s", "step_max_ms", "step_p99_ms"):
            value = row.get(key)
            if key == "step_p99_ms" and value is None:
                continue  # fewer than 100 steps: compare uses the maximum
            value = row[key]
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise UsageError("BASE/NEW", f"{path}: rows[{i}] ({row['variant']} at "
                                 f"{row['loss']}) has {key} {value!r}: a ratio against it "
                                 "means nothing", "Compare benches whose runs completed")
    return summary
