"""From a profile and a cluster to what each host must do: the plan. Pure: no kernel access,
so it can be printed (`--dry-run`) and unit-tested without root.

A path src -> dst is impaired at dst's ingress (direction "ingress"), at src's egress
("egress"), or at both. Each host gets one rule per peer and direction it impairs, so the
kernel's counters are per path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from testbed.errors import UsageError
from testbed.profiles.model import Impairment, Match, Profile


@dataclass(frozen=True)
class PlannedHost:
    """The minimum a plan needs to know about a host."""

    name: str
    address: str
    ifname: str
    mtu: int = 1500


@dataclass(frozen=True)
class LinkRule:
    direction: str  # "ingress": packets from `peer` arriving here; "egress": leaving to `peer`
    peer: str
    peer_address: str
    impairment: Impairment

    def path(self, host: str) -> str:
        return f"{self.peer}->{host}" if self.direction == "ingress" else f"{host}->{self.peer}"


@dataclass(frozen=True)
class HostPlan:
    host: str
    address: str
    ifname: str
    match: Match
    rules: tuple[LinkRule, ...] = field(default_factory=tuple)
    mtu: int = 1500


    def to_dict(self) -> dict:
        return {"host": self.host, "address": self.address, "ifname": self.ifname,
                "mtu": self.mtu, "match": self.match.model_dump(mode="json"),
                "rules": [{"direction": r.direction, "peer": r.peer,
                           "peer_address": r.peer_address,
                           "impairment": r.impairment.model_dump(mode="json")}
                          for r in self.rules]}

    @classmethod
    def from_dict(cls, d: dict) -> HostPlan:
        """The inverse of to_dict: how a plan travels to an agent on a VM or remote host."""
        return cls(host=d["host"], address=d["address"], ifname=d["ifname"], mtu=d["mtu"],
                   match=Match.model_validate(d["match"]),
                   rules=tuple(LinkRule(direction=r["direction"], peer=r["peer"],
                                        peer_address=r["peer_address"],
                                        impairment=Impairment.model_validate(r["impairment"]))
                               for r in d["rules"]))


@dataclass(frozen=True)
class Plan:
    profile: Profile
    backend: str
    hosts: tuple[HostPlan, ...]

    def host(self, name: str) -> HostPlan:
        return next(h for h in self.hosts if h.host == name)

    def describe(self) -> str:
        lines = [f"profile {self.profile.name}: backend {self.backend}, "
                 f"direction {self.profile.direction}"]
        lines.append(f"  match: {describe_match(self.profile.match)}")
        for hp in self.hosts:
            lines.append(f"  {hp.host} ({hp.ifname} {hp.address}):")
            for rule in hp.rules:
                lines.append(f"    {rule.direction:<7} {rule.path(hp.host):<12} "
                             f"{describe_impairment(rule.impairment)}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "profile": self.profile.model_dump(mode="json"),
            "backend": self.backend,
            "hosts": [
                {"host": hp.host, "address": hp.address, "ifname": hp.ifname, "mtu": hp.mtu,
                 "rules": [{"direction": r.direction, "peer": r.peer,
                            "peer_address": r.peer_address, "path": r.path(hp.host),
                            "impairment": r.impairment.model_dump(mode="json",
                                                                  exclude_defaults=True)}
                           for r in hp.rules]}
                for hp in self.hosts
            ],
        }


def describe_loss(loss) -> str:
    """One loss model, as the plan prints it (loss 1%, loss GE ..., loss 4-state ...)."""
    if loss.model == "bernoulli":
        text = f"loss {loss.loss_pct:g}%"
        if loss.correlation_pct:
            text += f" corr {loss.correlation_pct:g}%"
    elif loss.model == "gilbert_elliott":
        text = (f"loss GE p={loss.p * 100:.4g}% r={loss.r * 100:.4g}% "
                f"1-h={loss.loss_in_bad_pct:g}% 1-k={loss.loss_in_good_pct:g}% "
                f"(mean {loss.stationary_loss() * 100:.3g}%)")
        if loss.max_burst_ms:
            text += f" bursts <= {loss.max_burst_ms:g}ms"
    else:
        text = (f"loss 4-state p13={loss.p13_pct:g}% p31={loss.p31_pct:g}% "
                f"p32={loss.p32_pct:g}% p23={loss.p23_pct:g}% p14={loss.p14_pct:g}%")
    return text


def stated_loss(profile: Profile, loss: float | None) -> str:
    """Which loss rate a command applies, in one line: the --loss it was given (0: none), or
    the profile's own rates, per host and per link where it has them (the line a user
    reads to see that `--loss 0` is a lossless run, and no --loss the profile's rate)."""
    if loss == 0:
        return "loss: none (--loss 0)"
    if loss is not None:
        return f"loss: {loss * 100:g}% on every path (--loss {loss:g})"
    overrides = [(f"at {host}", imp.loss) for host, imp in profile.hosts.items()]
    overrides += [(f"{link.src}->{link.dst}", link.loss) for link in profile.links]
    said = [f"{where} {describe_loss(lost) if lost else 'no loss'}"
            for where, lost in overrides]
    default = profile.impairment.loss
    if default is not None:
        said.insert(0, f"{describe_loss(default)} on "
                       f"{'the other paths' if overrides else 'every path'}")
    return f"loss: the profile's own: {', '.join(said) or 'none'} (--loss sets another)"


def describe_impairment(imp: Impairment) -> str:
    parts = []
    if imp.loss is not None:
        parts.append(describe_loss(imp.loss))
    if imp.delay_ms or imp.jitter_ms:
        text = f"delay {imp.delay_ms:g}ms"
        if imp.jitter_ms:
            text += f" +-{imp.jitter_ms:g}ms"
        if imp.delay_distribution:
            text += f" {imp.delay_distribution}"
        parts.append(text)
    if imp.rate_mbit:
        parts.append(f"rate {imp.rate_mbit:g}Mbit")
    for name in ("reorder", "duplicate", "corrupt"):
        value = getattr(imp, f"{name}_pct")
        if value:
            parts.append(f"{name} {value:g}%")
    if imp.ecn:
        parts.append("ecn")
    if imp.slot:
        parts.append(f"slot {imp.slot.min_delay_ms:g}-{imp.slot.max_delay_ms:g}ms")
    if imp.seed is not None:
        parts.append(f"seed {imp.seed}")
    if imp.limit_packets:
        parts.append(f"limit {imp.limit_packets}")
    return ", ".join(parts) or "clean (counted only)"


def describe_match(match: Match) -> str:
    def flows(items):
        return ", ".join(
            f"{f.protocol} {','.join(str(p) for p in f.ports) or 'any port'}" for f in items
        )
    include = flows(match.include) if match.include else "all IPv4 traffic"
    exclude = flows(match.exclude) if match.exclude else "nothing"
    return f"{include}; except {exclude}"


def build(profile: Profile, hosts: Sequence[PlannedHost], backend: str,
          only: Sequence[str] | None = None) -> Plan:
    """One HostPlan per host (or per host in `only`): the rules it applies at its interface."""
    names = [h.name for h in hosts]
    _check_names(profile, names, only)
    by_name = {h.name: h for h in hosts}
    directions = ["ingress", "egress"] if profile.direction == "both" else [profile.direction]
    plans = []
    for h in hosts:
        if only and h.name not in only:
            continue
        rules = []
        for direction in directions:
            for peer in hosts:
                if peer.name == h.name:
                    continue
                src, dst = (peer.name, h.name) if direction == "ingress" else (h.name, peer.name)
                rules.append(LinkRule(direction=direction, peer=peer.name,
                                      peer_address=by_name[peer.name].address,
                                      impairment=profile.impairment_for(src, dst, at=h.name)))
        plans.append(HostPlan(host=h.name, address=h.address, ifname=h.ifname,
                              match=profile.match, rules=tuple(rules), mtu=h.mtu))
    return Plan(profile=profile, backend=backend, hosts=tuple(plans))


def _check_names(profile: Profile, names: list[str], only: Sequence[str] | None) -> None:
    known = ", ".join(names)
    for host in profile.hosts:
        if host not in names:
            raise UsageError(f"profile {profile.name}: hosts.{host}",
                             f"the cluster has no host {host!r}",
                             f"Use one of: {known}")
    for i, link in enumerate(profile.links):
        for end in ("src", "dst"):
            if getattr(link, end) not in names:
                raise UsageError(f"profile {profile.name}: links[{i}].{end}",
                                 f"the cluster has no host {getattr(link, end)!r}",
                                 f"Use one of: {known}")
    for host in only or ():
        if host not in names:
            raise UsageError("--only", f"the cluster has no host {host!r}",
                             f"Use one of: {known}")
