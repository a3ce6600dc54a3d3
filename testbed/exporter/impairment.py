"""The impairment as Prometheus reads it: what `lossbed verify` and the coverage measure, per
host and path, read by their own functions at each scrape (testbed/impair/verify.py): one
counting, two outlets.

    lossbed_impairment_applied                  1 while a profile is applied, else 0
    lossbed_impairment_profile_info             the profile, its backend, direction, cluster
    lossbed_impairment_packets_total            packets the impairment point saw  } per host,
    lossbed_impairment_dropped_packets_total    packets it dropped                } path and
    lossbed_impairment_seen_bytes_total         IP bytes of the packets it saw    } direction
    lossbed_impairment_dropped_bytes_total      IP bytes of those it dropped
    lossbed_impairment_configured_loss_ratio    the profile's loss on the path (its stationary
                                                rate)
    lossbed_impairment_measured_loss_ratio      dropped / seen, since the profile was applied
    lossbed_impairment_coverage_ratio           the share of the hosts' bytes that crossed the
                                                impairment, over the watched window (a run's:
                                                since its profile went on); per host too
    lossbed_impairment_lease_seconds_left       where hosts hold a lease (remote, Slurm)

Counters are the kernel's, cumulative since the profile was applied; a new profile starts
them again from 0 (Prometheus' rate() and increase() read that as a counter reset). Nothing
here changes an impairment: every call is a read.
"""

from __future__ import annotations

import logging
import threading
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from testbed.errors import LossbedError
from testbed.impair import coverage, engine, verify

log = logging.getLogger(__name__)

LABELS = ["host", "path", "direction"]
# Two scrapes this close share one reading of the kernel: on hosts elsewhere each reading is
# a command per host (SSH, srun), not to be run at every scrape of a 1-second interval
FRESH_S = {True: 0.5, False: 5.0}  # (by whether the hosts share this machine)


class ImpairmentCollector:
    """A prometheus_client collector of `cluster`'s impairment. The coverage is measured
    from the reading `since` (set with watch_from(); None: from the first scrape)."""

    def __init__(self, cluster=None, *,
                 min_coverage: float = coverage.DEFAULT_MIN_COVERAGE):
        self.cluster = cluster  # (None until attach(): a cluster a command makes later)
        self.min_coverage = min_coverage
        self.since: verify.Reading | None = None
        self._lock = threading.Lock()
        self._cached: tuple[float, list] | None = None
        self._applied_at = None  # which application `since` is a reading of

    def attach(self, cluster) -> None:
        with self._lock:
            self.cluster, self.since, self._cached, self._applied_at = cluster, None, None, None

    def watch_from(self, reading: verify.Reading) -> None:
        """The coverage's window starts at `reading` (a run's, taken as its profile went on:
        the same window as the run's summary)."""
        applied_at = (engine.read_record(self.cluster) or {}).get("applied_at")
        with self._lock:
            self.since, self._applied_at, self._cached = reading, applied_at, None

    def describe(self):
        return []  # (collected at each scrape: what exists depends on what is applied)

    def collect(self):
        with self._lock:
            fresh_s = FRESH_S[bool(self.cluster is None or self.cluster.shares_this_machine)]
            if self._cached is None or time.monotonic() - self._cached[0] > fresh_s:
                self._cached = (time.monotonic(), self._families())
            return list(self._cached[1])

    def _families(self) -> list:
        if self.cluster is None:
            return []
        applied = GaugeMetricFamily("lossbed_impairment_applied",
                                    "1 while lossbed holds a profile on the cluster, else 0",
                                    labels=["cluster"])
        try:
            reading = verify.read(self.cluster)
            report = verify.report(self.cluster, reading)
            record = engine.read_record(self.cluster) or {}
        except LossbedError:  # nothing applied (yet, or any more)
            applied.add_metric([self.cluster.name], 0)
            return [applied]
        except Exception as err:  # noqa: BLE001 - mid-clear, a table may vanish under a read
            log.debug("no reading of %s this scrape: %s", self.cluster.name, err)
            applied.add_metric([self.cluster.name], 0)
            return [applied]
        applied.add_metric([self.cluster.name], 1)
        if self.since is None or record.get("applied_at") != self._applied_at:
            # a profile applied anew (a bench's next run): its counters start again from 0,
            # and so does the coverage's window, from this reading
            self.since, self._applied_at = reading, record.get("applied_at")
        families = [applied, *self._paths(report), *self._coverage(reading),
                    *self._lease(reading)]
        info = InfoMetricFamily("lossbed_impairment_profile", "the profile lossbed applied",
                                labels=["cluster"])
        info.add_metric([self.cluster.name], {
            "profile": report.profile, "backend": report.backend,
            "direction": str((record.get("profile") or {}).get("direction", ""))})
        return [*families, info]

    def _paths(self, report: verify.Report) -> list:
        seen = CounterMetricFamily("lossbed_impairment_packets",
                                   "packets the impairment point saw on the path", labels=LABELS)
        dropped = CounterMetricFamily("lossbed_impairment_dropped_packets",
                                      "packets the impairment dropped on the path",
                                      labels=LABELS)
        dropped_size = CounterMetricFamily("lossbed_impairment_dropped_bytes",
                                           "IP bytes of the packets the impairment dropped "
                                           "on the path", labels=LABELS)
        size = CounterMetricFamily("lossbed_impairment_seen_bytes",
                                   "IP bytes of the packets the impairment point saw on the "
                                   "path",
                                   labels=LABELS)
        target = GaugeMetricFamily("lossbed_impairment_configured_loss_ratio",
                                   "the profile's loss rate on the path (stationary)",
                                   labels=LABELS)
        measured = GaugeMetricFamily("lossbed_impairment_measured_loss_ratio",
                                     "dropped over seen packets since the profile was applied",
                                     labels=LABELS)
        for path in report.paths:
            labels = [path.host, path.path, path.direction]
            seen.add_metric(labels, path.seen_packets)
            dropped.add_metric(labels, path.dropped_packets)
            if path.dropped_bytes is not None:
                dropped_size.add_metric(labels, path.dropped_bytes)
            if path.seen_bytes is not None:
                size.add_metric(labels, path.seen_bytes)
            target.add_metric(labels, path.target_loss)
            if path.measured_loss is not None:
                measured.add_metric(labels, path.measured_loss)
        return [seen, dropped, size, dropped_size, target, measured]

    def _coverage(self, reading: verify.Reading) -> list:
        share = GaugeMetricFamily("lossbed_impairment_coverage_ratio",
                                  "the share of the hosts' bytes that crossed the impairment "
                                  "in the watched window (a run's: since its profile went on)",
                                  labels=["cluster"])
        per_host = GaugeMetricFamily("lossbed_impairment_host_coverage_ratio",
                                     "the share of the host's bytes that crossed the impairment",
                                     labels=["host", "direction"])
        measured = verify.measure_coverage(self.cluster, reading, self.since, self.min_coverage)
        if measured.fraction is not None:
            share.add_metric([self.cluster.name], measured.fraction)
        for h in measured.hosts:
            if h.fraction is not None:
                per_host.add_metric([h.host, h.direction], h.fraction)
        return [share, per_host]

    def _lease(self, reading: verify.Reading) -> list:
        left = GaugeMetricFamily("lossbed_impairment_lease_seconds_left",
                                 "seconds until the host reverts the impairment by itself "
                                 "unless renewed", labels=["host"])
        for host, seconds in (reading.lease_left or {}).items():
            if seconds is not None:
                left.add_metric([host], seconds)
        return [left]
