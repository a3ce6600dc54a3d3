"""The warm starts of `--regime finetune`: one lossless `reliable` checkpoint per seed,
trained once and cached under the project's .cache/checkpoints/, keyed by a hash of
everything that determines its weights:

    the pretraining run's config (preset, seed, steps, batch, seq_len, lr, optimizer,
    schedule, warm-up, tokenizer, corpus), the number of ranks (the data order and the
    mean gradient depend on it), the corpus file's bytes when one is given, the versions of
    Python, torch and transformers, and the source of the code that trains it
    (harness/model, data, train, ddp; FORMAT below when the cache's layout changes)

A later bench with the same key reuses it and says so. LOSSBED_CHECKPOINTS=DIR puts the
cache elsewhere. A checkpoint is trained into a partial folder and renamed into place only
when its run has completed, so an interrupted bench never leaves a checkpoint that a later
one would take for whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from harness.rank_protocol import ControllerEnv
from harness.train.config import TrainConfig
from testbed.errors import UsageError

if TYPE_CHECKING:  # (the contract, for annotations: no import at run time)
    from testbed.clusters.contract import Cluster


ROOT = Path(__file__).resolve().parents[2]
FORMAT = 1
# the code whose change changes a checkpoint's weights
SOURCES = ("harness/model", "harness/data", "harness/train", "harness/ddp")
MARKER = "lossbed-checkpoint.json"  # written last: a folder without it is not whole


def cache() -> Path:
    return Path(ControllerEnv.from_env().checkpoints or ROOT / ".cache" / "checkpoints")


def _source_digest() -> str:
    h = hashlib.sha256()
    for folder in SOURCES:
        for path in sorted((ROOT / folder).glob("*.py")):
            h.update(path.relative_to(ROOT).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def key(cfg: TrainConfig, world: int) -> str:
    """The cache key of the checkpoint `cfg` trains on `world` ranks."""
    import torch
    import transformers

    settings = cfg.to_dict()
    for irrelevant in ("save_model", "log_every"):
        settings.pop(irrelevant)
    corpus = None
    if cfg.corpus:
        corpus = hashlib.sha256(Path(cfg.corpus).read_bytes()).hexdigest()
    what = {"format": FORMAT, "config": settings, "world": world, "corpus_bytes": corpus,
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "source": _source_digest()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def folder(cfg: TrainConfig, world: int) -> Path:
    return cache() / key(cfg, world)


def is_whole(path: Path) -> bool:
    return (path / MARKER).is_file() and (path / "config.json").is_file()


def ppl(path: str | Path) -> float | None:
    """The perplexity the checkpoint's own run ended with (its marker's)."""
    return json.loads((Path(path) / MARKER).read_text()).get("ppl")


def ensure(cluster: Cluster, configs: dict[int, TrainConfig], echo=print) -> dict[int, str]:
    """Per seed, the folder of its checkpoint: reused from the cache where whole, trained
    (all missing ones in one launch of the ranks, without loss) where not."""
    from harness import launch
    from harness.train import run

    if not cluster.shares_this_machine:
        raise UsageError("--regime", "finetune trains its checkpoints on rank 0's host and "
                         "starts every host from them: only namespace hosts share this "
                         "machine's file system", "On VM or remote hosts: lossbed train "
                         "--save-model DIR there, copy DIR to every host, then bench "
                         "--preset DIR --tokenizer DIR")
    world = len(launch.rank_slots(cluster))
    paths = {seed: folder(cfg, world) for seed, cfg in configs.items()}
    missing = {seed: cfg for seed, cfg in configs.items() if not is_whole(paths[seed])}
    for seed in sorted(set(configs) - set(missing)):
        echo(f"[checkpoints] seed {seed}: reused {paths[seed]} (cached)")
    if missing:
        echo(f"[checkpoints] training {len(missing)} lossless checkpoint(s), seeds "
             f"{sorted(missing)}, {next(iter(missing.values())).steps} steps each")
        partial = {seed: paths[seed].with_name(f".partial-{paths[seed].name}-{os.getpid()}")
                   for seed in missing}
        runs = [run.Run(replace(cfg, save_model=str(partial[seed])))
                for seed, cfg in sorted(missing.items())]
        try:
            records = run.train_runs(cluster, runs, echo=echo)
            for (seed, cfg), rec in zip(sorted(missing.items()), records, strict=True):
                (partial[seed] / MARKER).write_text(json.dumps(
                    {"key": paths[seed].name, "world": world, "config": cfg.to_dict(),
                     "ppl": rec.get("ppl"), "tokens_seen": cfg.steps * cfg.batch
                     * cfg.seq_len * world}, indent=1))
                if paths[seed].exists():  # an incomplete one of an earlier try
                    shutil.rmtree(paths[seed])
                os.replace(partial[seed], paths[seed])
                echo(f"[checkpoints] seed {seed}: trained into {paths[seed]} (ppl "
                     f"{rec.get('ppl', float('nan')):.2f})")
        finally:
            for path in partial.values():
                if path.exists():
                    shutil.rmtree(path)
    return {seed: str(path) for seed, path in paths.items()}
