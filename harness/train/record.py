"""The record of one training run: what `lossbed train --json` writes and the bench reads.

RunRecord declares every field with its type (rank 0's scores as RunResult declares
them); make() builds it whole from
what the run left (its configuration, the ranks' metrics, rank 0's result, the kernel's
counters around it, its coverage), and nothing adds to it afterwards: a bench's record is
a BenchRecord, the run's with the bench's own fields. checked() holds a record to its
declaration (every field there, of its type, none other), and make() calls it, so a field
that is renamed on one side only stops the run that builds it, not the report that reads
it later. Readers index it as the JSON object it is written as (rec["ppl"]).
"""

from __future__ import annotations

import functools
import types
import typing
from collections import Counter
from typing import TypedDict

from harness.metrics.counts import summed
from harness.metrics.hdr import Histogram
from harness.rank_protocol import RunResult, TrainRankMetrics
from testbed import stats

Percentiles = dict  # Histogram.summary_ms(): p50, p99, p999, max, count


# Rank 0's scores of a run as it says them (rank_protocol.RunResult: declared there, once),
# the launch's run number aside; ppl is the variant's headline (harness.eval.models)
RunScores = TypedDict("RunScores", {name: hint for name, hint
                                    in typing.get_type_hints(RunResult).items()
                                    if name != "index"})


class RunRecord(RunScores):
    # what was run
    variant: str
    transport: str
    profile: str
    loss: float
    seed: int
    steps: int
    hosts: int
    config: dict
    backend: str | None
    wait_for_all: bool            # a lossy collective's lossless reference: no deadline
    # speed and tails (steady state: each rank's first TIMING_WARMUP_STEPS apart)
    tokens_per_s: float
    step_ms: Percentiles
    collective_ms: Percentiles
    step_hist: dict
    warmup_step_ms: list
    slow_steps: list
    run_s: float | None
    wall_s: float
    rank_max_rss_mb: list
    # the transport and the collective, summed over ranks
    transport_counters: dict
    collective_totals: dict
    device_counters: dict         # RDMA transports: the devices' own counts
    authenticated: bool           # every datagram sealed with the launch's key, and checked
    wire_warning: str | None
    packets_sent: int
    packets_lost: int
    bytes_sent: int
    # quality: RunScores, and what rank 0 saw during training
    losses: list
    drift_steps: list             # during training (drift_every): [step, largest distance]
    drift_max: float | None
    progress_steps: list          # reliable with progress_every: [step, held-out ppl]
    work_dir: str | None
    # the impairment the traffic met, counted around this run alone
    measured_loss: float
    measured_loss_interval: list | tuple | None
    measured_packets: int
    rcvbuf_drops: int
    measured_window: str
    disturbed: str | None
    exempt: list                  # what the profile did not impair (the control path, ...)
    coverage: dict
    invalid: str | None           # why the run is no result (too little coverage), or None
    loss_applied_by: list


class BenchRecord(RunRecord):
    """A run of a bench: the run's record, its loss the bench's target, its variant the
    --variants entry's resolved text, and why the bench made it."""
    role: str                     # reference, lossy, realisation, speed, ..., twin
    loss_seed: int
    regime: str
    tokens_seen: int


def checked(record: dict, kind: type = RunRecord) -> dict:
    """`record`, held to `kind`'s declaration: TypeError naming the first field that is
    missing, not declared, or not of its type."""
    hints = _declared(kind)
    missing = sorted(set(hints) - set(record))
    extra = sorted(set(record) - set(hints))
    if missing or extra:
        raise TypeError(f"{kind.__name__}: " + "; ".join(
            ([f"missing {', '.join(missing)}"] if missing else [])
            + ([f"not declared: {', '.join(extra)}"] if extra else [])))
    for name, hint in hints.items():
        if not _is_a(record[name], hint):
            raise TypeError(f"{kind.__name__}.{name}: {record[name]!r} is not {hint}")
    return record


@functools.cache
def _declared(kind: type) -> dict:
    return typing.get_type_hints(kind)


def _is_a(value, hint) -> bool:
    unions = (typing.Union, types.UnionType)
    options = typing.get_args(hint) if typing.get_origin(hint) in unions else (hint,)
    for option in options:
        if option is type(None):
            if value is None:
                return True
        elif option is float:  # (JSON's numbers: an int where a float is declared is one)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return True
        elif option is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return True
        elif isinstance(value, typing.get_origin(option) or option):
            return True
    return False


def make(cfg, *, hosts: int, profile, report, backend: str | None, result: RunResult,
         ranks: list[TrainRankMetrics], work, wall_s: float, run_s: float | None,
         exempt: list, coverage, loss_applied_by: list) -> RunRecord:
    """One run's record, whole: `report` the kernel's counters around the run
    (testbed.impair.verify), `coverage` its Coverage, `result` rank 0's RunResult."""
    step_us = Histogram.merged(m.step_us for m in ranks)
    collective_us = Histogram.merged(m.collective_us for m in ranks)
    tokens = sum(m.tokens for m in ranks)
    train_s = max(m.train_s for m in ranks)
    missing = sum(m.counters["missing"] for m in ranks)
    seen, dropped = report.total_seen, report.total_dropped
    loss = profile.impairment.loss
    received = sum(m.counters["packets_received"] for m in ranks)
    scores = result.to_dict()
    scores.pop("index")
    return checked(RunRecord(
        variant=cfg.variant + (f"@{cfg.transport}" if cfg.transport != "udp" else ""),
        transport=cfg.transport, profile=profile.name,
        loss=loss.stationary_loss() if loss else 0.0, seed=cfg.seed, steps=cfg.steps,
        hosts=hosts, config=cfg.to_dict(), backend=backend, wait_for_all=cfg.wait_for_all,
        tokens_per_s=tokens / train_s,
        step_ms=step_us.summary_ms(), collective_ms=collective_us.summary_ms(),
        step_hist=step_us.to_dict(),
        warmup_step_ms=[[us / 1000 for us in m.warmup_step_us] for m in ranks],
        slow_steps=[{"rank": m.rank, **s} for m in ranks for s in m.slow_steps],
        run_s=run_s, wall_s=wall_s,
        rank_max_rss_mb=[m.max_rss_mb for m in ranks],
        transport_counters=dict(sum((Counter(m.counters) for m in ranks), Counter())),
        collective_totals=summed(m.collective_totals for m in ranks),
        device_counters=dict(sum((Counter(m.device_counters) for m in ranks), Counter())),
        authenticated=all(m.authenticated for m in ranks),
        wire_warning=wire_warning(ranks),
        packets_sent=sum(m.counters["packets_sent"] for m in ranks),
        packets_lost=missing,
        bytes_sent=sum(m.counters["bytes_sent"] for m in ranks),
        losses=ranks[0].losses,
        **scores,
        drift_steps=ranks[0].drift_steps,
        drift_max=max((d for _, d in ranks[0].drift_steps), default=None),
        progress_steps=ranks[0].progress_steps,
        work_dir=str(work) if work else None,
        measured_loss=dropped / seen if seen else 0.0,
        measured_loss_interval=stats.wilson_interval(dropped, seen) if seen else None,
        measured_packets=seen,
        rcvbuf_drops=sum(report.rcvbuf_errors.values()),
        measured_window=report.window,
        disturbed=_disturbed(missing, received + missing, dropped / seen if seen else 0.0),
        exempt=exempt, coverage=coverage.to_dict(), invalid=coverage.no_result(profile),
        loss_applied_by=loss_applied_by,
    ))


# Transport counters of datagrams that no rank of the job sent, or that no rank could have
# sent: their senders were not the experiment's
INTRUSION_COUNTERS = ("foreign", "unauthenticated", "malformed", "nonfinite")


def wire_warning(ranks: list[TrainRankMetrics]) -> str | None:
    """A warning when the ranks got datagrams that were not their peers' (or were broken on
    the way): none was applied, but the network was not the experiment's alone."""
    counts = {name: sum(m.counters.get(name, 0) for m in ranks)
              for name in INTRUSION_COUNTERS}
    if not any(counts.values()):
        return None
    listed = ", ".join(f"{n} {c}" for n, c in counts.items() if c)
    return (f"the ranks got datagrams their peers did not send, or that were broken on the "
            f"way ({listed}): none was applied, but something else sent to the ranks' "
            "ports (or a link corrupts packets)")


def _disturbed(missing: int, expected: int, measured: float) -> str | None:
    """Why a lossy run's loss figures are not the network's, or None: its collective missed
    far more packets than the kernel lost, so a rank fell behind and its packets came after
    their deadlines (lateness counted as loss)."""
    if not expected:
        return None
    fraction = missing / expected
    if fraction <= measured + max(0.03, 0.5 * measured):
        return None
    return (f"the collective missed {fraction:.1%} of its packets where the network lost "
            f"{measured:.1%}: a rank fell behind and its packets came too late")
