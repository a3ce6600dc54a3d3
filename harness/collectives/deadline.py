"""How long a receiver waits for packets that may never come.

Adaptive: a multiple of the recent time the last packet of a stage took to arrive (an
exponential moving average), plus some slack, kept between a floor and a ceiling. The time
counts from when this rank finished sending, so it includes the other ranks' lateness.

That average only sees packets that made it in time, so on its own it would shrink the
deadline step by step until the ranks' ordinary lateness became loss. Packets that arrive
after their stage ended are the signal that it is too short: a step that saw any doubles
the boost of that stage's budgets (up to 16x), which decays back by 10% a step. A stage
never seen before gets a generous first budget (FIRST_BUDGET_S, at most the ceiling); the
first broadcast at least the multiplier times this step's own reduce stage, because an
owner broadcasts when its reduce ends and its reduce is the same work as ours (on slow hosts
- VMs under TCG - a reduce of 85 messages took 0.3-0.7 s, and a 0.25 s first budget lost a
whole first broadcast).

Each stage (the part of a kind before ":", e.g. "reduce") has its own boost. Why: an owner
broadcasts when its reduce stage ends, so a longer reduce budget on one rank makes its
broadcast late everywhere else. With one boost for both stages, a late broadcast packet
lengthened the receiver's reduce budget too, which made *its* broadcast late for the
others, and so on: at 16 MiB and 10% loss the ranks drove each other to the ceiling (p50
2.4 s, against 0.2 s when they did not). Late broadcast packets now lengthen only the wait
for broadcasts, which delays nobody.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_BOOST = 16.0
FIRST_BUDGET_S = 0.25
BOOST_DECAY = 0.9


@dataclass
class Deadline:
    floor_s: float = 0.005
    ceiling_s: float = 2.0
    multiplier: float = 3.0
    slack_s: float = 0.02
    smoothing: float = 0.2
    boosts: dict = field(default_factory=dict)  # stage -> boost (absent: 1.0)
    _ewma: dict = field(default_factory=dict)
    _late_stages: set = field(default_factory=set)

    def __post_init__(self):
        if not 0 < self.floor_s <= self.ceiling_s:
            raise ValueError(f"deadline floor {self.floor_s} s must be > 0 and <= the ceiling "
                             f"{self.ceiling_s} s")

    def budget(self, kind: str, first_at_least: float = 0.0) -> float:
        """Seconds to wait for a stage of this kind (e.g. "reduce:4194304"). A kind never
        seen gets FIRST_BUDGET_S, or first_at_least if that is longer: what the caller
        knows of this step already (the broadcast: a multiple of how long our own reduce
        took, since every owner's reduce is the same work)."""
        seen = self._ewma.get(kind)
        if seen is None:
            return min(self.ceiling_s, max(self.floor_s, FIRST_BUDGET_S, first_at_least))
        wanted = (self.multiplier * seen + self.slack_s) * self.boost(kind)
        return min(self.ceiling_s, max(self.floor_s, wanted))

    def observe(self, kind: str, last_arrival_s: float) -> None:
        """Record when the last packet of a stage arrived (seconds after waiting began)."""
        old = self._ewma.get(kind)
        self._ewma[kind] = last_arrival_s if old is None else (
            (1 - self.smoothing) * old + self.smoothing * last_arrival_s)

    def boost(self, kind: str) -> float:
        return self.boosts.get(kind.split(":", 1)[0], 1.0)

    def late(self, stage: str) -> None:
        """A packet of this stage came after the stage had ended: its deadline was too
        short."""
        self._late_stages.add(stage)

    def end_step(self) -> None:
        for stage in set(self.boosts) | self._late_stages:
            boost = self.boosts.get(stage, 1.0)
            if stage in self._late_stages:
                self.boosts[stage] = min(MAX_BOOST, boost * 2)
            else:
                self.boosts[stage] = max(1.0, boost * BOOST_DECAY)
        self._late_stages.clear()
