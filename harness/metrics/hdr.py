"""A latency histogram in the HDR style: log-linear buckets with a fixed relative precision,
so p50/p99/p99.9 come out right to ~1% for any range of values, in constant memory, and
histograms from several ranks merge by adding counts."""

from __future__ import annotations

import math
from collections import Counter

PRECISION = 0.01  # bucket width relative to its value
# Zero has a bucket of its own. Values between 0 and 1 take negative buckets like any other
# value (they once shared -1 with zero, and read back as 0).
ZERO_BUCKET = -(1 << 40)
# A percentile q is backed by at least one sample beyond it only with 100 / (100 - q)
# samples or more: p99 needs 100, p99.9 needs 1000. With fewer, it is the maximum.


class Histogram:
    def __init__(self):
        self.counts: Counter[int] = Counter()
        self.total = 0
        self.max = 0.0
        self.min = math.inf

    def record(self, value: float) -> None:
        if not value >= 0 or math.isinf(value):
            raise ValueError(f"latency {value} is negative or not finite")
        self.counts[self._bucket(value)] += 1
        self.total += 1
        self.max = max(self.max, value)
        self.min = min(self.min, value)

    @staticmethod
    def _bucket(value: float) -> int:
        if value == 0:
            return ZERO_BUCKET
        return int(math.floor(math.log(value) / math.log1p(PRECISION)))

    @staticmethod
    def _value(bucket: int) -> float:
        # the middle of the bucket
        if bucket == ZERO_BUCKET:
            return 0.0
        return math.exp((bucket + 0.5) * math.log1p(PRECISION))

    @staticmethod
    def samples_needed(q: float) -> int:
        """Samples for percentile q to be more than the maximum (see above)."""
        return math.ceil(100 / (100 - q) - 1e-9) if q < 100 else math.inf

    def percentile(self, q: float) -> float:
        if not self.total:
            return math.nan
        rank = max(1, math.ceil(q / 100 * self.total))
        seen = 0
        for bucket in sorted(self.counts):
            seen += self.counts[bucket]
            if seen >= rank:
                return min(self._value(bucket), self.max)
        return self.max

    def merge(self, other: Histogram) -> Histogram:
        self.counts.update(other.counts)
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

    def to_dict(self) -> dict:
        return {"counts": {str(k): v for k, v in self.counts.items()}, "total": self.total,
                "max": self.max, "min": self.min if self.total else None}

    @classmethod
    def from_dict(cls, d: dict) -> Histogram:
        h = cls()
        h.counts = Counter({int(k): v for k, v in d["counts"].items()})
        h.total, h.max = d["total"], d["max"]
        h.min = d["min"] if d["min"] is not None else math.inf
        return h
