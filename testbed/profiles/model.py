"""What an impairment profile can say, as typed models. Units are in the field names.

A profile describes the network between the hosts of a cluster:

    impairment   applied to every path between two hosts, unless overridden
    direction    where it is applied: "ingress" (the receiver's, default), "egress", "both"
    match        which traffic is impaired (by default: all but SSH and lossbed's own ports)
    hosts        per-host overrides: fields that replace the default on paths *into* that
                 host (ingress) or *out of* it (egress)
    links        per-path overrides: {src, dst, ...fields} for the path src -> dst

A profile's loss is the probability that one packet from one host to another is lost. With
direction "ingress" (the default) each path crosses exactly one impairment point, the
receiver's ingress, so 10% means 10% end to end. "both" impairs each path twice.

Why one file of this length: it is the profile format's one definition, read top to bottom
(the kernel's limits, the loss models, the other impairments, which traffic, the profile),
and the loader's error messages and the schema are made from it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from testbed import checks, ports

# ---- what the kernel's fields can hold -------------------------------------------------------
# A value past these is refused here, with the reason, instead of being cut or wrapped when it
# is encoded (a delay of 5,000 s would reach the kernel as 274.9 s).

# netem's probabilities are 32-bit fractions and nftables draws 1 in 10^9: a nonzero
# percentage finer than that would silently become 0 (no loss at all).
PERCENT_RESOLUTION = 1e-7
# netem holds delay and jitter as 32-bit counts of psched ticks of 64 ns (tc refuses more).
TICK_NS = 64
MAX_TICKS_MS = (2**32 - 1) * TICK_NS / 1e6          # 274877.90688 ms
# slot lengths are signed 64-bit nanoseconds; a slot distribution's jitter a signed 32-bit one
MAX_S64_NS_MS = (2**63 - 1) / 1e6
MAX_S32_NS_MS = (2**31 - 1) / 1e6                   # 2147.483647 ms
# netem's rate is bytes/s in 64 bits (RATE64); at least 1 byte/s, or it means "no limit"
MIN_RATE_MBIT = 8 / 1e6
MAX_RATE_MBIT = (2**64 - 1) * 8 / 1e6
# the bpf backend holds a burst's age limit in u64 nanoseconds
MAX_U64_NS_MS = (2**64 - 1) / 1e6
U32_MAX = 2**32 - 1
S32_MAX = 2**31 - 1

# Why a field has the limit it has: the profile loader adds this to a bound's error.
LIMITS = {
    "delay_ms": "netem holds a delay as a 32-bit count of 64 ns ticks",
    "jitter_ms": "netem holds jitter as a 32-bit count of 64 ns ticks (a slot "
                 "distribution's jitter: signed 32-bit nanoseconds)",
    "min_delay_ms": "netem holds slot lengths in signed 64-bit nanoseconds",
    "max_delay_ms": "netem holds slot lengths in signed 64-bit nanoseconds",
    "max_packets": "netem's slot packet limit is a signed 32-bit number",
    "max_bytes": "netem's slot byte limit is a signed 32-bit number",
    "rate_mbit": "netem's rate is whole bytes per second in 64 bits (0 would mean no limit)",
    "limit_packets": "netem's queue limit is a 32-bit number",
    "reorder_gap_packets": "netem's reorder gap is a 32-bit number",
    "max_burst_ms": "the bpf backend holds it in 64-bit nanoseconds",
    "mean_burst_packets": "r = 1/mean_burst_packets must stay above 2^-32, the finest "
                          "probability netem and bpf encode",
}


def _resolvable(value: float) -> float:
    if 0 < value < PERCENT_RESOLUTION:
        raise ValueError(f"{value!r} % is below the finest probability any backend encodes "
                         f"({PERCENT_RESOLUTION:g} %): it would act as 0. Use 0 or a larger "
                         "value")
    return value


Percent = Annotated[float, Field(ge=0, le=100), AfterValidator(_resolvable)]
Probability100 = Annotated[float, Field(ge=0, le=100, description="percent"),
                           AfterValidator(_resolvable)]


class _Strict(BaseModel):
    # allow_inf_nan=False: .inf and .nan are YAML floats, and `ge=0` alone lets inf through
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# ---- loss models -------------------------------------------------------------------------


class Bernoulli(_Strict):
    """Each packet is lost independently with probability loss_pct (netem's `loss random`).

    correlation_pct: netem's loss correlation (each draw leans towards the previous one). Only
    the netem backend implements it.
    """

    model: Literal["bernoulli"] = "bernoulli"
    loss_pct: Percent
    correlation_pct: Percent = 0.0

    @model_validator(mode="after")
    def _correlation_needs_loss(self):
        if self.correlation_pct > 0 and self.loss_pct == 0:
            raise ValueError(
                "correlation_pct is set but loss_pct is 0: correlation needs loss. "
                "Set loss_pct > 0 or remove correlation_pct"
            )
        return self

    def stationary_loss(self) -> float:
        return self.loss_pct / 100

    def mean_burst_length(self) -> float:
        p = self.stationary_loss()
        return 1 / (1 - p) if p < 1 else float("inf")


class GilbertElliott(_Strict):
    """Two-state bursty loss (netem's `loss gemodel p r 1-h 1-k`).

    In the Good state a packet is lost with loss_in_good_pct (1-k), in the Bad state with
    loss_in_bad_pct (1-h). Each packet, Good -> Bad with p_pct, Bad -> Good with r_pct.
    Give either p_pct and r_pct, or loss_pct and mean_burst_packets (the simple Gilbert
    model: loss only in Bad, none in Good), from which p and r are derived.

    max_burst_ms bounds a burst in time as well. Why: the chain steps once per packet, so on
    a path that falls quiet the only packets left to end a burst are the retransmissions
    themselves. A TCP sender doubles its timeout after each lost retransmission, so a burst
    of ~10 packets on a quiet path lasts 0.2 s * 2^10 (minutes, RTO capped at 120 s): a
    step of the reliable baseline would not finish within gloo's 300 s timeout.
    With a limit, a packet that finds the Bad state older than max_burst_ms is treated as
    arriving in the Good state. 0: only packets end a burst (netem's behaviour; the netem
    backend cannot time bursts, so a limit selects the bpf backend).
    """

    model: Literal["gilbert_elliott"] = "gilbert_elliott"
    p_pct: Probability100 | None = None
    r_pct: Probability100 | None = None
    loss_in_bad_pct: Percent = 100.0
    loss_in_good_pct: Percent = 0.0
    loss_pct: Annotated[float, Field(ge=0, lt=100), AfterValidator(_resolvable)] | None = None
    mean_burst_packets: Annotated[float, Field(ge=1, le=2**32)] | None = None
    max_burst_ms: Annotated[float, Field(ge=0, le=MAX_U64_NS_MS)] = 0.0

    @model_validator(mode="after")
    def _one_parametrisation(self):
        by_rates = self.p_pct is not None or self.r_pct is not None
        by_loss = self.loss_pct is not None or self.mean_burst_packets is not None
        if by_rates and by_loss:
            raise ValueError(
                "give either p_pct and r_pct, or loss_pct and mean_burst_packets, not both"
            )
        if by_loss:
            if self.loss_pct is None or self.mean_burst_packets is None:
                raise ValueError("loss_pct and mean_burst_packets go together: give both")
            if self.loss_in_bad_pct != 100 or self.loss_in_good_pct != 0:
                raise ValueError(
                    "loss_pct/mean_burst_packets describe the simple Gilbert model "
                    "(loss_in_bad_pct 100, loss_in_good_pct 0): give p_pct and r_pct instead"
                )
        elif self.p_pct is None or self.r_pct is None:
            raise ValueError("give p_pct and r_pct (or loss_pct and mean_burst_packets)")
        elif self.r_pct == 0 and self.p_pct > 0:
            raise ValueError("r_pct is 0: the Bad state is never left. Set r_pct > 0")
        return self

    @property
    def p(self) -> float:
        """Good -> Bad transition probability (a fraction)."""
        if self.p_pct is not None:
            return self.p_pct / 100
        loss = self.loss_pct / 100
        return loss * self.r / (1 - loss)

    @property
    def r(self) -> float:
        """Bad -> Good transition probability (a fraction)."""
        if self.r_pct is not None:
            return self.r_pct / 100
        return 1 / self.mean_burst_packets

    def stationary_loss(self) -> float:
        p, r = self.p, self.r
        if p + r == 0:
            return self.loss_in_good_pct / 100
        bad = p / (p + r)
        return bad * self.loss_in_bad_pct / 100 + (1 - bad) * self.loss_in_good_pct / 100

    def mean_burst_length(self) -> float:
        """Mean run of consecutive losses, for the simple Gilbert model (1-h=100%, 1-k=0)."""
        return 1 / self.r if self.r > 0 else float("inf")


class FourState(_Strict):
    """netem's 4-state Markov loss (`loss state p13 p31 p32 p23 p14`, Salvo/Sorrentino GI):
    state 1 receives in a gap, 2 receives in a burst, 3 loses in a burst, 4 is an isolated
    loss. A packet is lost when the chain steps into (or stays in) state 3, or into 4;
    from 4 the chain always returns to 1 (netem's loss_4state())."""

    model: Literal["four_state"] = "four_state"
    p13_pct: Percent
    p31_pct: Percent = 100.0
    p32_pct: Percent = 0.0
    p23_pct: Percent = 100.0
    p14_pct: Percent = 0.0

    def transition_matrix(self) -> list[list[float]]:
        """Rows: from state 1..4, columns: to state 1..4."""
        p13, p31, p32 = self.p13_pct / 100, self.p31_pct / 100, self.p32_pct / 100
        p23, p14 = self.p23_pct / 100, self.p14_pct / 100
        return [
            [1 - p13 - p14, 0.0, p13, p14],
            [0.0, 1 - p23, p23, 0.0],
            [p31, p32, 1 - p31 - p32, 0.0],
            [1.0, 0.0, 0.0, 0.0],
        ]

    def stationary(self) -> list[float]:
        """The chain's long-run law when it starts in state 1, as netem's does, solved
        directly: each closed class of states reachable from state 1 has one stationary law
        (a linear system), weighted by the probability that the chain ends up in it (the
        absorption probabilities of the transient states). Exact for any rates, also those
        where some states are never reached."""
        import numpy as np

        t = np.array(self.transition_matrix())
        n = len(t)
        # the generator T - I, its diagonal from the off-diagonal rates: computing 1 - p and
        # then subtracting 1 would lose the digits of a small p (p = 1e-9 kept 7 of them)
        g = t - np.diag(np.diag(t))
        g -= np.diag(g.sum(axis=1))
        reach = (t > 0) | np.eye(n, dtype=bool)
        for _ in range(n):  # transitive closure
            reach = reach | ((reach.astype(int) @ reach.astype(int)) > 0)
        seen = [i for i in range(n) if reach[0, i]]
        # recurrent: every state it reaches reaches it back; classes: mutually reachable
        recurrent = [i for i in seen if all(reach[j, i] for j in range(n) if reach[i, j])]
        classes = []
        for i in recurrent:
            if not any(i in c for c in classes):
                classes.append([j for j in recurrent if reach[i, j] and reach[j, i]])
        transient = [i for i in seen if i not in recurrent]
        pi = np.zeros(n)
        for members in classes:
            system = g[np.ix_(members, members)].T.copy()  # law @ (T - I) = 0 on the class
            system[-1, :] = 1.0  # the law sums to 1
            rhs = np.zeros(len(members))
            rhs[-1] = 1.0
            law = np.linalg.solve(system, rhs)
            if 0 in members:
                weight = 1.0
            else:  # P(state 1 ends up in this class): (I - Q) h = R 1
                r = t[np.ix_(transient, members)].sum(axis=1)
                h = np.linalg.solve(-g[np.ix_(transient, transient)], r)
                weight = float(h[transient.index(0)])
            pi[members] += weight * law
        return [float(x) for x in pi]

    def stationary_loss(self) -> float:
        """Fraction of packets lost: the chain's time in states 3 and 4."""
        pi = self.stationary()
        return pi[2] + pi[3]

    def mean_burst_length(self) -> float:
        """Mean run of consecutive losses: isolated losses (4) last one packet, bursts in
        state 3 last 1 / (p31 + p32) on average."""
        pi = self.stationary()
        p13, p31, p32 = self.p13_pct / 100, self.p31_pct / 100, self.p32_pct / 100
        p23, p14 = self.p23_pct / 100, self.p14_pct / 100
        isolated = pi[0] * p14
        bursts = pi[0] * p13 + pi[1] * p23
        if isolated + bursts == 0:
            return 0.0
        burst_len = 1 / (p31 + p32) if p31 + p32 > 0 else float("inf")
        return (isolated + bursts * burst_len) / (isolated + bursts)

    @model_validator(mode="after")
    def _rows_are_probabilities(self):
        if self.p13_pct + self.p14_pct > 100:
            raise ValueError("p13_pct + p14_pct leave state 1 with more than 100%")
        if self.p31_pct + self.p32_pct > 100:
            raise ValueError("p31_pct + p32_pct leave state 3 with more than 100%")
        return self


LossModel = Annotated[Bernoulli | GilbertElliott | FourState, Field(discriminator="model")]


# ---- the other impairments ---------------------------------------------------------------


class Slot(_Strict):
    """netem's slotting: packets leave in bursts at slot boundaries (e.g. Wi-Fi, DOCSIS).

    A slot's length is either uniform between min_delay_ms and max_delay_ms (tc's `slot MIN
    MAX`; max defaults to min), or drawn from a distribution table around delay_ms with
    jitter_ms (tc's `slot distribution NAME DELAY JITTER`). max_packets / max_bytes: what
    one slot may send (0: no limit)."""

    min_delay_ms: Annotated[float, Field(ge=0, le=MAX_S64_NS_MS)] | None = None
    max_delay_ms: Annotated[float, Field(ge=0, le=MAX_S64_NS_MS)] | None = None
    distribution: Literal["normal", "pareto", "paretonormal"] | None = None
    delay_ms: Annotated[float, Field(ge=0, le=MAX_S64_NS_MS)] | None = None
    jitter_ms: Annotated[float, Field(gt=0, le=MAX_S32_NS_MS)] | None = None
    max_packets: Annotated[int, Field(ge=0, le=S32_MAX)] = 0
    max_bytes: Annotated[int, Field(ge=0, le=S32_MAX)] = 0

    @model_validator(mode="after")
    def _one_form(self):
        uniform = self.min_delay_ms is not None or self.max_delay_ms is not None
        table = (self.distribution is not None or self.delay_ms is not None
                 or self.jitter_ms is not None)
        if uniform and table:
            raise ValueError("give either min_delay_ms (and max_delay_ms), or distribution, "
                             "delay_ms and jitter_ms, not both")
        if table:
            missing = [name for name in ("distribution", "delay_ms", "jitter_ms")
                       if getattr(self, name) is None]
            if missing:
                raise ValueError(f"a slot distribution needs {', '.join(missing)} too")
        elif self.min_delay_ms is None:
            raise ValueError("give min_delay_ms (and max_delay_ms), or distribution, "
                             "delay_ms and jitter_ms")
        elif self.max_delay_ms is not None and self.max_delay_ms < self.min_delay_ms:
            raise ValueError("max_delay_ms is below min_delay_ms: swap them")
        return self

    @property
    def uniform_max_delay_ms(self) -> float:
        return self.max_delay_ms if self.max_delay_ms is not None else self.min_delay_ms or 0.0


class Impairment(_Strict):
    """What happens to packets on one path. Every field is optional; nothing set = clean."""

    loss: LossModel | None = None
    delay_ms: Annotated[float, Field(ge=0, le=MAX_TICKS_MS)] = 0.0
    jitter_ms: Annotated[float, Field(ge=0, le=MAX_TICKS_MS)] = 0.0
    delay_correlation_pct: Percent = 0.0
    delay_distribution: Literal["uniform", "normal", "pareto", "paretonormal"] | None = None
    rate_mbit: Annotated[float, Field(ge=MIN_RATE_MBIT, le=MAX_RATE_MBIT)] | None = None
    reorder_pct: Percent = 0.0
    reorder_correlation_pct: Percent = 0.0
    # tc's `gap`: after each reordered packet the next gap-1 packets are delayed for sure;
    # from then on each is sent at once with probability reorder_pct. None: 1, as tc sends.
    reorder_gap_packets: Annotated[int, Field(ge=1, le=U32_MAX)] | None = None
    duplicate_pct: Percent = 0.0
    duplicate_correlation_pct: Percent = 0.0
    corrupt_pct: Percent = 0.0
    corrupt_correlation_pct: Percent = 0.0
    ecn: bool = Field(False, description="mark ECN-capable packets instead of dropping them")
    slot: Slot | None = None
    seed: Annotated[int, Field(ge=0, lt=2**64)] | None = None
    limit_packets: Annotated[int, Field(ge=1, le=U32_MAX)] | None = None

    @model_validator(mode="after")
    def _dependencies(self):
        pairs = [
            ("delay_correlation_pct", self.delay_correlation_pct, "jitter_ms", self.jitter_ms),
            ("delay_distribution", self.delay_distribution, "jitter_ms", self.jitter_ms),
            ("reorder_pct", self.reorder_pct, "delay_ms", self.delay_ms),
            ("reorder_correlation_pct", self.reorder_correlation_pct, "reorder_pct",
             self.reorder_pct),
            ("reorder_gap_packets", self.reorder_gap_packets, "reorder_pct", self.reorder_pct),
            ("duplicate_correlation_pct", self.duplicate_correlation_pct, "duplicate_pct",
             self.duplicate_pct),
            ("corrupt_correlation_pct", self.corrupt_correlation_pct, "corrupt_pct",
             self.corrupt_pct),
            ("ecn", self.ecn, "loss", self.loss),
        ]
        for name, value, needs, present in pairs:
            if value and not present:
                raise ValueError(f"{name} is set but {needs} is not: {name} needs {needs}. "
                                 f"Set {needs}, or remove {name}")
        return self

    def is_clean(self) -> bool:
        return self == Impairment()


# ---- which traffic -----------------------------------------------------------------------


class PortRange(_Strict):
    """Ports `first`..`last` inclusive. In YAML also written as "5000-5100" or 22."""

    first: Annotated[int, Field(ge=0, le=65535)]
    last: Annotated[int, Field(ge=0, le=65535)]

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value):
        if isinstance(value, int):
            return {"first": value, "last": value}
        if isinstance(value, str):
            first, sep, last = value.partition("-")
            try:
                return {"first": int(first), "last": int(last) if sep else int(first)}
            except ValueError:
                raise ValueError(f"{value!r} is not a port or a range like 5000-5100") from None
        return value

    @model_validator(mode="after")
    def _not_empty(self):
        if self.last < self.first:
            raise ValueError(
                f"port range {self.first}-{self.last} is empty: write it as "
                f"{self.last}-{self.first}"
            )
        return self

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


Protocol = Literal["udp", "tcp"]


class Flow(_Strict):
    """Traffic of one protocol whose source *or* destination port is in `ports` (so both
    directions of a connection to that port)."""

    protocol: Protocol
    ports: list[PortRange] = Field(default_factory=list, description="empty: any port")


def _default_exclusions() -> list[Flow]:
    return [Flow(protocol="tcp",
                 ports=[PortRange(first=p, last=p) for p in ports.ALWAYS_RELIABLE_TCP])]


class Match(_Strict):
    """Which packets are impaired. `include` empty means all IPv4 traffic between hosts;
    `exclude` always wins. The default keeps SSH and lossbed's control and rendezvous
    ports reliable."""

    include: list[Flow] = Field(default_factory=list)
    exclude: list[Flow] = Field(default_factory=_default_exclusions)


# ---- the profile --------------------------------------------------------------------------


class LinkOverride(Impairment):
    src: str
    dst: str


class Profile(_Strict):
    # A profile's name may become part of a results folder: a name, never a path.
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    description: Annotated[str, Field(max_length=2000)] = ""
    impairment: Impairment = Field(default_factory=Impairment)
    direction: Literal["ingress", "egress", "both"] = "ingress"
    match: Match = Field(default_factory=Match)
    hosts: dict[str, Impairment] = Field(default_factory=dict)
    links: list[LinkOverride] = Field(default_factory=list)
    # Only the experiment's hosts can send on the emulated network, and the run was asked
    # to price the MAC (--unsealed): then training's datagrams go unauthenticated.
    # Otherwise every datagram carries a MAC with a key drawn for the launch (the default,
    # a bench's own cluster included). Records say which.
    isolated: bool = False

    @model_validator(mode="after")
    def _links_unique(self):
        seen = set()
        for i, link in enumerate(self.links):
            if link.src == link.dst:
                raise ValueError(f"links[{i}]: src and dst are both {link.src!r}")
            if (link.src, link.dst) in seen:
                raise ValueError(f"links[{i}]: {link.src} -> {link.dst} is given twice")
            seen.add((link.src, link.dst))
        return self

    def with_loss(self, fraction: float, seed: int | None = None) -> Profile:
        """This profile with its loss rate set to `fraction` (0.1: 10%) on every path, the
        loss realisation `seed` (None: the profile's own): what `bench --loss` and
        `collective-bench --loss` run. Only a profile whose one loss rate is a single
        number can take it: a Bernoulli model, or the simple Gilbert model (loss_pct with
        mean_burst_packets, whose bursts keep their length). Refused (ValueError, with the
        reason) for a profile without a loss model (the run would say 10% and lose nothing
        it was told to), for per-host or per-link loss (their paths would keep their own
        rate while the record says `fraction`), and for a model whose rate is not one
        number (p_pct/r_pct, four-state)."""
        checks.loss_fraction("--loss", fraction)  # (the one rule of a loss fraction)
        if fraction == 0:  # (0 is no loss: the loader makes it without_loss())
            raise ValueError("a loss of 0 sets no loss rate: use without_loss()")
        loss = self.impairment.loss
        if loss is None:
            raise ValueError(f"profile {self.name!r} has no loss model for a loss rate to set: "
                             "use random-loss or burst-loss")
        overriding = sorted({*(h for h, i in self.hosts.items() if "loss" in i.model_fields_set),
                             *(f"{k.src}->{k.dst}" for k in self.links
                               if "loss" in k.model_fields_set)})
        if overriding:
            raise ValueError(f"profile {self.name!r} sets its own loss for "
                             f"{', '.join(overriding)}: one loss rate cannot describe it. "
                             "Run it without --loss (its own rates), or use random-loss")
        if loss.model == "four_state" or loss.loss_pct is None:
            raise ValueError(f"profile {self.name!r}'s {loss.model} model is given by its "
                             "transition rates, not one loss rate: run it without --loss, "
                             "or use random-loss or burst-loss")
        # (the profile's unit is the percent: the one conversion from the fraction a user gives)
        changes = {"loss": {**loss.model_dump(), "loss_pct": fraction * 100}}
        if seed is not None:
            changes["seed"] = seed
        impairment = Impairment.model_validate({**self.impairment.model_dump(exclude_unset=True),
                                                **changes})
        return self.model_copy(update={"impairment": impairment})

    def without_loss(self) -> Profile:
        """This profile with no loss on any path (`--loss 0`): its own rates, per host and
        per link too, removed; delay, rate and the rest kept."""

        def lossless(imp: Impairment) -> Impairment:
            kept = imp.model_dump(exclude_unset=True, exclude={"loss"})
            return type(imp).model_validate(kept)

        return self.model_copy(update={
            "impairment": lossless(self.impairment),
            "hosts": {h: lossless(i) for h, i in self.hosts.items()},
            "links": [lossless(link) for link in self.links]})

    def impairs_nothing(self) -> bool:
        """No path of this profile changes a packet: it only counts them (clean)."""
        return (self.impairment.is_clean()
                and all(i.is_clean() for i in self.hosts.values())
                and all(Impairment.model_validate(
                    link.model_dump(exclude={"src", "dst"})).is_clean() for link in self.links))

    def impairment_for(self, src: str, dst: str, at: str) -> Impairment:
        """The impairment of path src -> dst as applied at `at` (dst for ingress, src for
        egress): the default, then the host's override, then the link's, field by field."""
        merged = self.impairment.model_dump(exclude_unset=False)
        host = self.hosts.get(at)
        if host is not None:
            merged.update(host.model_dump(exclude_unset=True))
        for link in self.links:
            if (link.src, link.dst) == (src, dst):
                merged.update(link.model_dump(exclude_unset=True, exclude={"src", "dst"}))
        return Impairment.model_validate(merged)
