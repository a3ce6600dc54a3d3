"""A latency histogram in the HDR style: log-linear buckets with a fixed relative precision,
so p50/p99/p99.9 come out right to ~1% for any range of values, in constant memory, and
histograms from several ranks merge by adding counts."""

from __future__ import annotations

import math
from collections import Counter

PRECISION = 0.01  # bucket width relative to its value


class Histogram:
    def __init__(self):
        self.counts: Counter[int] = Counter()
        self.total = 0
        self.max = 0.0
        self.min = math.inf

    def record(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"latency {value} is negative")
        self.counts[self._bucket(value)] += 1
        self.total += 1
        self.max = max(self.max, value)
        self.min = min(self.min, value)

    @staticmethod
    def _bucket(value: float) -> int:
        return -1 if value <= 0 else int(math.floor(math.log(value) / math.log1p(PRECISION)))

    @staticmethod
    def _value(bucket: int) -> float:
        # the middle of the bucket
        return 0.0 if bucket < 0 else math.exp((bucket + 0.5) * math.log1p(PRECISION))

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
        return {"p50": self.percentile(50), "p99": self.percentile(99),
                "p999": self.percentile(99.9), "max": self.max if self.total else math.nan,
                "count": self.total}

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
