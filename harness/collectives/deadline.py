"""How long a receiver waits for packets that may never come.

Adaptive: a multiple of the recent time the last packet of a stage took to arrive (an
exponential moving average), plus some slack, kept between a floor and a ceiling. The time
counts from when this rank finished sending, so it includes the other ranks' lateness. A
stage never seen before gets the ceiling: the first steps (ranks still starting up at
different times) must not turn lateness into loss.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Deadline:
    floor_s: float = 0.02
    ceiling_s: float = 2.0
    multiplier: float = 3.0
    slack_s: float = 0.01
    smoothing: float = 0.2
    _ewma: dict | None = None

    def __post_init__(self):
        if not 0 < self.floor_s <= self.ceiling_s:
            raise ValueError(f"deadline floor {self.floor_s} s must be > 0 and <= the ceiling "
                             f"{self.ceiling_s} s")
        self._ewma = {}

    def budget(self, kind: str) -> float:
        """Seconds to wait for a stage of this kind (e.g. "reduce:4194304")."""
        seen = self._ewma.get(kind)
        if seen is None:
            return self.ceiling_s
        return min(self.ceiling_s, max(self.floor_s, self.multiplier * seen + self.slack_s))

    def observe(self, kind: str, last_arrival_s: float) -> None:
        """Record when the last packet of a stage arrived (seconds after the stage began)."""
        old = self._ewma.get(kind)
        self._ewma[kind] = last_arrival_s if old is None else (
            (1 - self.smoothing) * old + self.smoothing * last_arrival_s)
