"""A run as Prometheus reads it while it runs: what the ranks say of themselves (their live
marks: rank_protocol.Live, about once a second each, asked for only when metrics are served)
and lossbed's own training progress (rank_protocol.Progress), kept by the controller as they
come and handed out at each scrape (prometheus_client is imported only then: a command that
serves nothing never loads it). The same figures the run's summary adds up at the end,
summed over the ranks the same way:

    lossbed_run_step                          optimizer steps done (rank 0's)
    lossbed_run_tokens_per_second             lossbed's own training (train, bench); a
                                              script's where it reports its tokens as it
                                              goes (lossbed.report(tokens=N))
    lossbed_run_collective_seconds            the lossy collective's time per call, a
                                              histogram over every rank's calls
    lossbed_run_missing_ratio                 the share of the packets the collectives
                                              expected that never came (every rank's)
    lossbed_bench_verdict                     once a bench answered: 1 for the verdict
                                              each variant got at each loss (holds, does
                                              not hold, inconclusive, withheld, none)
    lossbed_bench_ppl_delta_ratio             its Δppl against its reference (0.01: +1%)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from harness.rank_protocol import COLLECTIVE_BUCKETS_S, Live, Progress


@dataclass
class Served:
    """A command's metrics endpoint (--metrics-port): the impairment's figures and the
    run's, on one registry. Started before anything is impaired (a port in use is refused
    first); stop() when the command ends."""

    endpoint: object     # testbed.exporter.server.Endpoint
    impairment: object   # testbed.exporter.impairment.ImpairmentCollector
    run: RunCollector

    @classmethod
    def if_asked(cls, cluster, port: int | None, address: str, job: str,
                 min_coverage: float, echo) -> Served | None:
        """start(), where a port is given (--metrics-port); else None."""
        return None if port is None else cls.start(cluster, port, address, job, min_coverage,
                                                   echo)

    @classmethod
    def start(cls, cluster, port: int, address: str, job: str, min_coverage: float,
              echo) -> Served:
        """cluster: None where it is made later (the bench's own): attach it then."""
        from testbed.exporter import server
        from testbed.exporter.impairment import ImpairmentCollector

        impairment = ImpairmentCollector(cluster, min_coverage=min_coverage)
        run = RunCollector(job)
        endpoint = server.start([impairment, run], port, address)
        echo(f"[metrics] on {endpoint.url}")
        return cls(endpoint, impairment, run)

    def stop(self) -> None:
        self.endpoint.stop()


class RunCollector:
    """The run's live figures, thread-safe: the output pumps write, the scrapes read."""

    def __init__(self, job: str):
        self.job = job
        self._lock = threading.Lock()
        self._ranks: dict[int, Live] = {}
        self._progress: Progress | None = None
        self._rows: list[dict] = []

    def take_live(self, said: Live) -> None:
        with self._lock:
            self._ranks[said.rank] = said

    def take_progress(self, said: Progress) -> None:
        with self._lock:
            self._progress = said

    def take_verdicts(self, rows: list[dict]) -> None:
        """A bench's answer: its summary's rows (variant, loss, verdict, ppl_delta_pct)."""
        with self._lock:
            self._rows = [dict(r) for r in rows]

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            ranks, progress, rows = dict(self._ranks), self._progress, list(self._rows)
        labels = ["job"]
        step = GaugeMetricFamily("lossbed_run_step", "optimizer steps the run has done",
                                 labels=labels)
        if progress is not None:
            step.add_metric([self.job], progress.step)
        elif 0 in ranks:
            step.add_metric([self.job], ranks[0].step)
        yield step
        tokens_per_s = _tokens_per_s(progress, ranks)
        if tokens_per_s is not None:
            tokens = GaugeMetricFamily("lossbed_run_tokens_per_second",
                                       "training tokens per second, the last report",
                                       labels=labels)
            tokens.add_metric([self.job], tokens_per_s)
            yield tokens
        if ranks:
            yield self._collective(ranks.values(), labels)
            received = sum(r.received for r in ranks.values())
            missing = sum(r.missing for r in ranks.values())
            if received + missing:
                share = GaugeMetricFamily("lossbed_run_missing_ratio",
                                          "packets the lossy collectives expected and never "
                                          "received, as a share of those expected (every rank)",
                                          labels=labels)
                share.add_metric([self.job], missing / (received + missing))
                yield share
        if rows:
            yield from self._verdicts(rows)

    def _verdicts(self, rows: list[dict]):
        from prometheus_client.core import GaugeMetricFamily

        verdict = GaugeMetricFamily("lossbed_bench_verdict",
                                    "1 for the verdict the variant got at the loss (its Δppl "
                                    "against the paper's band: docs/explanation/methodology.md)",
                                    labels=["job", "variant", "loss", "verdict"])
        delta = GaugeMetricFamily("lossbed_bench_ppl_delta_ratio",
                                  "the variant's Δppl against its lossless reference",
                                  labels=["job", "variant", "loss"])
        for row in rows:
            said = ("withheld" if row.get("verdict_withheld") else row.get("verdict")) or "none"
            where = [self.job, str(row["variant"]), f"{row['loss']:g}"]
            verdict.add_metric([*where, said], 1)
            if row.get("ppl_delta_pct") is not None:
                delta.add_metric(where, row["ppl_delta_pct"] / 100)
        yield verdict
        yield delta

    def _collective(self, ranks, labels):
        from prometheus_client.core import HistogramMetricFamily

        counts = [0] * len(COLLECTIVE_BUCKETS_S)
        total, count = 0.0, 0
        for r in ranks:
            counts = [a + b for a, b in zip(counts, r.buckets, strict=True)]
            total += r.sum_s
            count += r.count
        buckets = [(f"{bound:g}", n) for bound, n in zip(COLLECTIVE_BUCKETS_S, counts,
                                                          strict=True)]
        family = HistogramMetricFamily("lossbed_run_collective_seconds",
                                       "the lossy collective's time per call (every rank)",
                                       labels=labels)
        family.add_metric([self.job], [*buckets, ("+Inf", count)], sum_value=total)
        return family


def _tokens_per_s(progress: Progress | None, ranks: dict[int, Live]) -> float | None:
    """lossbed's own training: its last progress report's. A script's: the tokens rank 0
    reported so far over the longest time a rank has run (the summary's division); None
    before the script reported any."""
    if progress is not None:
        return progress.tokens_per_s
    rank0 = ranks.get(0)
    train_s = max((r.train_s for r in ranks.values()), default=0.0)
    if rank0 is None or not rank0.tokens or train_s <= 0:
        return None
    return rank0.tokens / train_s


def push(url: str, run: RunCollector, job: str, echo) -> bool:
    """The run's figures (a bench's verdicts) to a Prometheus Pushgateway at `url`, grouped
    by the job's name; whether it went (a failure is said, the results are kept)."""
    from prometheus_client import CollectorRegistry, push_to_gateway

    registry = CollectorRegistry(auto_describe=False)
    registry.register(run)
    try:
        push_to_gateway(url, job="lossbed", registry=registry, grouping_key={"run": job},
                        timeout=30)
    except Exception as err:  # noqa: BLE001 - said, and the results stay where they are
        echo(f"[metrics] could not push to {url}: {type(err).__name__}: {err}")
        return False
    echo(f"[metrics] pushed to {url} (job lossbed, run {job})")
    return True
