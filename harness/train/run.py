"""The controller side of `lossbed train`: check everything, apply the profile, launch one
rank per host, collect, verify the loss the kernel applied, clear, write the record.

The record (one JSON object) has the config, the per-step loss (rank 0), step and
collective latency histograms merged over ranks (p50/p99/p99.9), tokens/s, bytes and
packets sent and lost, the measured link loss with its interval, the receivers' own socket
drops, drift, and perplexity of the rank-averaged model and of rank 0's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import time
from collections import Counter
from pathlib import Path

from harness import launch
from harness.data.corpus import Corpus, load_text
from harness.metrics.hdr import Histogram
from harness.model import tokenizer as tokenizers
from harness.train.config import TrainConfig
from testbed import profiles, stats
from testbed.errors import LossbedError
from testbed.host import lease
from testbed.impair import engine, verify

log = logging.getLogger(__name__)


def check(cfg: TrainConfig, cluster=None) -> None:
    """Every input problem, found before a process starts or a link is touched."""
    cfg.validate()
    from harness.verbs import device

    device.require_for([cfg.transport], cluster.hosts if cluster is not None else [])
    tok = tokenizers.load(cfg.tokenizer)
    text, source = load_text(cfg.corpus, cfg.hf_dataset)
    Corpus.build(text, tok, source, cfg.seq_len)


def train(cluster, cfg: TrainConfig, profile_name: str = "clean", sets: list[str] = (),
          out_dir: Path | None = None, echo=print) -> dict:
    return train_many(cluster, [cfg], profile_name, sets, out_dir, echo)[0]


def train_many(cluster, cfgs: list[TrainConfig], profile_name: str = "clean",
               sets: list[str] = (), out_dir: Path | None = None, echo=print) -> list[dict]:
    """Several runs under one profile, one after the other in one launch of the ranks."""
    for cfg in cfgs:
        check(cfg, cluster)
    profile = profiles.load(profile_name, list(sets))
    the_plan, choice = engine.make_plan(cluster, profile)
    # absolute: ranks on remote hosts write under it from their own working folder
    work = Path(out_dir or tempfile.mkdtemp(prefix="lossbed-train-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    engine.apply(cluster, the_plan, choice)
    started = time.monotonic()
    remote = getattr(cluster, "kind", "") == "remote"
    # Remote hosts: renew the impairment's lease while the run lasts; if this controller
    # dies, the hosts revert by themselves.
    keeper = lease.Keeper(cluster, cluster.lease_s / 3) if remote else contextlib.nullcontext()
    try:
        with keeper:
            results = launch.run(cluster, "harness.train.worker",
                                 [json.dumps([c.to_dict() for c in cfgs]), str(work)],
                                 timeout_s=24 * 3600, echo_rank0=echo,
                                 extra_env=launch.transport_env(profile))
            report = verify.verify(cluster)
    finally:
        engine.clear(cluster)
    failed = [r for r in results if r.returncode != 0]
    if failed:
        first = min(failed, key=lambda r: (r.returncode == -9, r.rank))
        raise LossbedError(f"training failed on rank {first.rank} ({first.host}), exit "
                           f"{first.returncode}:\n{first.stderr.strip()[-3000:]}")
    printed = [[json.loads(line) for line in r.stdout.strip().splitlines()
                if line.startswith("{")] for r in results]
    lines = [x for x in printed[0] if "rank_metrics" not in x]  # rank 0's results, per run
    # every rank's metrics, per run: each rank prints them after each run, in order
    metrics = [[x["rank_metrics"] for x in rank if "rank_metrics" in x] for rank in printed]
    wall = time.monotonic() - started
    return [record(cfg, cluster, profile, choice.backend, report, lines[i],
                   [m[i] for m in metrics], work / f"run{i}", wall / len(cfgs))
            for i, cfg in enumerate(cfgs)]


def record(cfg, cluster, profile, backend, report, result, ranks, work, wall_s) -> dict:
    step_us, collective_us = Histogram(), Histogram()
    for m in ranks:
        step_us.merge(Histogram.from_dict(m["step_us"]))
        collective_us.merge(Histogram.from_dict(m["collective_us"]))
    tokens = sum(m["tokens"] for m in ranks)
    train_s = max(m["train_s"] for m in ranks)
    sent = sum(m["counters"]["packets_sent"] for m in ranks)
    missing = sum(m["counters"]["missing"] for m in ranks)
    seen, dropped = report.total_seen, report.total_dropped
    interval = stats.wilson_interval(dropped, seen) if seen else None
    loss = profile.impairment.loss
    return {
        "variant": cfg.variant + (f"@{cfg.transport}" if cfg.transport != "udp" else ""),
        "transport": cfg.transport, "profile": profile.name,
        "loss": loss.stationary_loss() if loss else 0.0, "seed": cfg.seed, "steps": cfg.steps,
        "hosts": len(cluster.hosts), "config": cfg.to_dict(), "backend": backend,
        "tokens_per_s": tokens / train_s,
        "step_ms": _ms(step_us), "collective_ms": _ms(collective_us),
        "step_hist": step_us.to_dict(),
        "losses": ranks[0]["losses"],
        "ppl": result["ppl"], "ppl_rank0": result["ppl_rank0"], "drift": result["drift"],
        "packets_sent": sent, "packets_lost": missing,
        # RDMA transports: the devices' own counts (retransmissions, sequence errors, ...)
        "device_counters": dict(sum((Counter(m.get("device_counters", {})) for m in ranks),
                                    Counter())),
        "bytes_sent": sum(m["counters"]["bytes_sent"] for m in ranks),
        "measured_loss": dropped / seen if seen else 0.0,
        "measured_loss_interval": interval,
        "rcvbuf_drops": sum(report.rcvbuf_errors.values()),
        "parameters": result["parameters"], "corpus": result["corpus"],
        "model_sha": result["model_sha"], "wall_s": wall_s, "work_dir": str(work),
    }


def _ms(h: Histogram) -> dict:
    s = h.summary()
    return {k: (s[k] / 1000 if k != "count" else s[k]) for k in ("p50", "p99", "p999", "count")}
