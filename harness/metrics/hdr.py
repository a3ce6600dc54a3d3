"""Latency histograms: the `hdrhistogram` package's HdrHistogram (log-linear buckets with a
fixed relative precision, constant memory, histograms from several ranks merge by adding),
behind the few calls lossbed makes and the one policy it adds (summary: a percentile too few
samples back is None).

The package counts integers, lossbed's latencies are float microseconds: values are scaled
by SCALE before they are counted, so a latency below 1 µs keeps three decimals instead of
reading back as 0. The exact minimum and maximum are kept beside the buckets."""

from __future__ import annotations

import math

from hdrh.histogram import HdrHistogram

SCALE = 1000  # counted in thousandths of the recorded unit (µs -> ns)
HIGHEST = 3_600_000_000 * SCALE  # an hour in µs: a step longer than that is a hang
SIGNIFICANT_DIGITS = 2  # buckets at most 1% wide relative to their value
# A percentile q is backed by at least one sample beyond it only with 100 / (100 - q)
# samples or more: p99 needs 100, p99.9 needs 1000. With fewer, it is the maximum.


class Histogram:
    def __init__(self):
        self.hdr = HdrHistogram(1, HIGHEST, SIGNIFICANT_DIGITS)
        self.total = 0
        self.max = 0.0
        self.min = math.inf

    def record(self, value: float) -> None:
        if not value >= 0 or math.isinf(value):
            raise ValueError(f"latency {value} is negative or not finite")
        if value * SCALE > HIGHEST:
            raise ValueError(f"latency {value} µs is over an hour: a hang, not a latency")
        self.hdr.record_value(round(value * SCALE))
        self.total += 1
        self.max = max(self.max, value)
        self.min = min(self.min, value)

    @staticmethod
    def samples_needed(q: float) -> int:
        """Samples for percentile q to be more than the maximum (see above)."""
        return math.ceil(100 / (100 - q) - 1e-9) if q < 100 else math.inf

    def percentile(self, q: float) -> float:
        if not self.total:
            return math.nan
        # the package answers with its bucket's highest value: never above the real maximum
        return min(self.hdr.get_value_at_percentile(q) / SCALE, self.max)

    def merge(self, other: Histogram) -> Histogram:
        if other.total:
            self.hdr.add(other.hdr)
        self.total += other.total
        self.max = max(self.max, other.max)
        self.min = min(self.min, other.min)
        return self

    def summary(self) -> dict:
        """p50, p99, p99.9, max and count. A percentile that too few samples back (see
        samples_needed) is None rather than the maximum under another name."""
        out = {}
        for name, q in (("p50", 50), ("p99", 99), ("p999", 99.9)):
            enough = self.total >= self.samples_needed(q)
            out[name] = self.percentile(q) if enough and self.total else None
        out["max"] = self.max if self.total else None
        out["count"] = self.total
        return out

    def summary_ms(self) -> dict:
        """summary() of a histogram of microseconds, its percentiles and max in
        milliseconds (None stays None)."""
        s = self.summary()
        return {k: (v / 1000 if v is not None and k != "count" else v) for k, v in s.items()}

    def counts_at_or_below(self, bounds: list[float]) -> list[int]:
        """How many recorded values are at or below each bound (ascending, the recorded
        unit): Prometheus' cumulative buckets (to the buckets' 1% precision)."""
        counts, i, running = [0] * len(bounds), 0, 0
        for item in self.hdr.get_recorded_iterator():
            value = self.hdr.get_highest_equivalent_value(item.value_iterated_to) / SCALE
            while i < len(bounds) and value > bounds[i]:
                counts[i] = running
                i += 1
            running += item.count_added_in_this_iter_step
        for j in range(i, len(bounds)):
            counts[j] = running
        return counts

    def sum(self) -> float:
        """The recorded values' sum (their mean times their count, to the buckets' 1%)."""
        return self.hdr.get_mean_value() * self.total / SCALE if self.total else 0.0

    def to_dict(self) -> dict:
        """JSON: the package's own compressed encoding of the buckets, and the exact ends."""
        return {"hdr": self.hdr.encode().decode("ascii"), "total": self.total,
                "max": self.max, "min": self.min if self.total else None}

    @classmethod
    def of(cls, values) -> Histogram:
        """A histogram of these values."""
        made = cls()
        for value in values:
            made.record(value)
        return made

    @classmethod
    def combined(cls, histograms) -> Histogram:
        """One histogram of several (new: they are left as they were)."""
        total = cls()
        for h in histograms:
            total.merge(h)
        return total

    @classmethod
    def merged(cls, encoded) -> Histogram:
        """One histogram of several written by to_dict (the ranks', the runs')."""
        return cls.combined(cls.from_dict(d) for d in encoded)

    @classmethod
    def from_dict(cls, d: dict) -> Histogram:
        if "hdr" not in d:
            raise ValueError("a latency histogram without 'hdr' was written by a lossbed "
                             "before 2026-12-03 (its own buckets): rerun that run")
        h = cls()
        if d["total"]:
            h.hdr = HdrHistogram.decode(d["hdr"].encode("ascii"))
        h.total, h.max = d["total"], d["max"]
        h.min = d["min"] if d["min"] is not None else math.inf
        return h
