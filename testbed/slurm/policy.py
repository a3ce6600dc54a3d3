"""The admin's word on a Slurm cluster: which profiles a job may apply, how much loss at most,
on which interface, and the rules that hold a job's request to it (the agent, agent.py, asks
them before it touches the kernel).

The configuration is a YAML file the admin writes (the Ansible role installs it), by
default /etc/lossbed/slurm-agent.yaml, or the file LOSSBED_SLURM_AGENT_CONF names:

    allowed_profiles: [random-loss, burst-loss]   # by name, as the agent's lossbed has them
    max_loss: 0.2          # the highest loss rate (a fraction) on any path
    interface: eth1        # the data-plane NIC the agent impairs, and no other
    socket: /run/lossbed/slurm-agent.sock   # where jobs reach the agent ({node}: its name)
    state: /run/lossbed/slurm-agent         # which job holds the node's impairment
    lease_s: 120           # an impairment outlives its job's last renewal this long at most
    addresses:             # each node's address on `interface`'s network, where that is not
      gpu01: 10.10.0.1     # its NodeAddr (Slurm on the management network, the data plane
      gpu02: 10.10.0.2     # on another NIC); a node not named here: its NodeAddr

A job names a profile, and the agent loads that name from its own lossbed: a job cannot
bring a profile file of its own, nor change its impairments (--set), only pick its loss rate
(--loss, up to max_loss) and which of the node's packets it applies to (the match: lossbed's
runs move their own control traffic in or out of it). The plan a job hands in must be what
that profile says for the job's own nodes, path by path: anything else is refused with the
reason.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from testbed import checks, yamlfile
from testbed.errors import LossbedError, UsageError

CLEAN = "clean"  # the profile that impairs nothing
CONFIG_ENV = "LOSSBED_SLURM_AGENT_CONF"
DEFAULT_CONFIG = Path("/etc/lossbed/slurm-agent.yaml")
DEFAULT_SOCKET = "/run/lossbed/slurm-agent.sock"
DEFAULT_STATE = "/run/lossbed/slurm-agent"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_INTERFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14}")


class Refused(LossbedError):
    """A job's request that the admin's policy does not allow: the reason is the message."""

    exit_code = 6


class ConfigError(LossbedError):
    """The admin's configuration cannot be used: which field, and the fix."""

    exit_code = 3


@dataclass(frozen=True)
class AgentConfig:
    allowed_profiles: tuple[str, ...]
    interface: str
    max_loss: float = 0.2
    socket: str = DEFAULT_SOCKET
    state: str = DEFAULT_STATE
    lease_s: float = 120.0
    addresses: tuple[tuple[str, str], ...] = ()  # (node, data-plane address), as written
    source: str = str(DEFAULT_CONFIG)

    def __post_init__(self):
        where = self.source
        if not self.allowed_profiles or not all(isinstance(p, str) and _NAME.fullmatch(p)
                                                for p in self.allowed_profiles):
            raise ConfigError(f"{where}: allowed_profiles: {list(self.allowed_profiles)!r} "
                              "must be a list of one or more profile names, e.g. "
                              "[random-loss, burst-loss]")
        if not isinstance(self.interface, str) or not _INTERFACE.fullmatch(self.interface):
            raise ConfigError(f"{where}: interface: {self.interface!r} is not an interface "
                              "name: name the data-plane NIC, e.g. interface: eth1")
        try:
            checks.loss_fraction("max_loss", self.max_loss)  # (the one rule of a loss rate)
        except UsageError as err:
            raise ConfigError(f"{where}: max_loss: {err.problem}: e.g. max_loss: 0.2 allows "
                              "up to 20%") from None
        if not (isinstance(self.lease_s, int | float) and math.isfinite(self.lease_s)
                and self.lease_s > 0):
            raise ConfigError(f"{where}: lease_s: {self.lease_s!r} is not a positive number "
                              "of seconds: e.g. lease_s: 120")
        for node, address in self.addresses:
            if not isinstance(node, str) or not _NAME.fullmatch(node):
                raise ConfigError(f"{where}: addresses: {node!r} is not a node name: name "
                                  "each node as Slurm does, e.g. gpu01: 10.10.0.1")
            try:
                ipaddress.IPv4Address(address)
            except (ValueError, TypeError):
                raise ConfigError(f"{where}: addresses: {node}: {address!r} is not an IPv4 "
                                  "address: give the node's address on the data-plane NIC, "
                                  "e.g. gpu01: 10.10.0.1") from None
        for field, value in (("socket", self.socket), ("state", self.state)):
            if not isinstance(value, str) or not value.startswith("/") or ".." in value:
                raise ConfigError(f"{where}: {field}: {value!r} must be an absolute path "
                                  "without '..'")

    def addresses_of(self, nodes: list[str], node_addr: dict[str, str]) -> dict[str, str]:
        """Each of `nodes`' address on the data plane: the admin's `addresses` where it
        names the node, else its NodeAddr (`node_addr`, as slurmctld has it)."""
        written = dict(self.addresses)
        return {n: written.get(n) or node_addr[n] for n in nodes}

    def socket_path(self, node: str) -> Path:
        """Where the agent of `node` listens ({node} in the template is its name)."""
        return Path(self.socket.replace("{node}", node_name(node)))

    def holder_file(self, node: str) -> Path:
        """The record of which job holds `node`'s impairment."""
        return Path(self.state) / f"{node_name(node)}.json"


def node_name(node: str) -> str:
    """A Slurm node's name, checked before it becomes part of a path."""
    if not isinstance(node, str) or not _NAME.fullmatch(node):
        raise LossbedError(f"{node!r} is not a node name (letters, digits, '.', '-', '_')")
    return node


def load_config(path: str | Path | None = None) -> AgentConfig:
    """The admin's configuration: `path`, else LOSSBED_SLURM_AGENT_CONF, else
    /etc/lossbed/slurm-agent.yaml."""
    path = Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)
    if not path.is_file():
        raise ConfigError(f"{path}: no lossbed agent configuration here: the admin installs "
                          "it (ansible/ role lossbed_slurm, docs/guides/slurm.md)")
    try:
        data = yamlfile.read(path)
    except yamlfile.YamlInputError as err:
        raise ConfigError(f"{path}: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping (key: value lines)")
    known = {"allowed_profiles", "interface", "max_loss", "socket", "state", "lease_s",
             "addresses"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown field {unknown[0]!r}: the fields are "
                          f"{', '.join(sorted(known))}")
    for needed in ("allowed_profiles", "interface"):
        if needed not in data:
            raise ConfigError(f"{path}: {needed} is missing: docs/guides/slurm.md shows one")
    profiles, addresses = data["allowed_profiles"], data.get("addresses") or {}
    if not isinstance(addresses, dict):
        raise ConfigError(f"{path}: addresses: must map each node to its data-plane address, "
                          "e.g. gpu01: 10.10.0.1")
    return AgentConfig(**{**data, "allowed_profiles": tuple(profiles)
                          if isinstance(profiles, list) else (),
                          "addresses": tuple((str(n), a) for n, a in addresses.items())},
                       source=str(path))


def judge_profile(config: AgentConfig, asked: dict):
    """The profile a job asked for (Profile.model_dump), if the admin allows it: one of the
    allowed names, as the agent's own lossbed has it, at most its loss rate changed, up to
    max_loss. Else Refused, with the reason."""
    from testbed import profiles
    from testbed.profiles.model import Profile

    try:
        wanted = Profile.model_validate(asked)
    except Exception as err:
        raise Refused(f"the profile sent is not a lossbed profile: {err}") from None
    # (clean changes no packet, it only counts them: a bench's lossless reference runs
    # under it, allowed without the admin naming it, as lossbed has it and no other way)
    if wanted.name not in (*config.allowed_profiles, CLEAN):
        raise Refused(f"profile {wanted.name!r} is not allowed on this cluster (the admin "
                      f"allows: {', '.join(config.allowed_profiles)}; {config.source})")
    base = profiles.load(wanted.name)
    loss = wanted.impairment.loss
    if loss is None and base.impairment.loss is not None:
        expected = base.without_loss()
    elif loss is not None and loss.loss_pct is not None and base.impairment.loss is not None \
            and loss.model == base.impairment.loss.model:
        expected = base.with_loss(loss.loss_pct / 100, wanted.impairment.seed) \
            if loss.loss_pct > 0 else base.without_loss()
    else:
        expected = base
    # (the match, which of the node's packets the impairment applies to, is the job's: a
    # run moves lossbed's own control traffic in or out of it; the node's interface is the
    # job's alone while it holds it)
    if wanted.model_copy(update={"isolated": False, "match": expected.match}) != expected:
        raise Refused(f"profile {wanted.name!r} differs from the admin's beyond its loss "
                      "rate (--set, or a profile file of your own): on this cluster only "
                      "--loss may change an allowed profile")
    highest = max(_loss_rates(wanted), default=0.0)
    if highest > config.max_loss + 1e-12:
        raise Refused(f"a loss of {highest:.4g} is above this cluster's max_loss "
                      f"{config.max_loss:g} ({config.source}): ask for --loss "
                      f"{config.max_loss:g} or less")
    return wanted


def _loss_rates(profile) -> list[float]:
    from testbed.profiles.model import Impairment

    impairments = [profile.impairment, *profile.hosts.values(),
                   *(Impairment.model_validate(link.model_dump(exclude={"src", "dst"}))
                     for link in profile.links)]
    return [imp.loss.stationary_loss() for imp in impairments if imp.loss is not None]


def judge_plan(config: AgentConfig, profile, host_plan: dict, node: str,
               addresses: dict[str, str]) -> None:
    """A host's part of the plan (HostPlan.to_dict) holds only what `profile` says for paths
    between the job's nodes (`addresses`: each node's address, this node's included), on
    the admin's interface of this node. Else Refused."""
    from testbed.impair.plan import HostPlan

    try:
        hp = HostPlan.from_dict(host_plan)
    except Exception as err:
        raise Refused(f"the plan sent is not a lossbed host plan: {err}") from None
    if hp.host != node:
        raise Refused(f"the plan is for host {hp.host!r}, and this is node {node!r}")
    if hp.ifname != config.interface:
        raise Refused(f"the plan impairs {hp.ifname!r}; the admin allows {config.interface!r} "
                      "alone")
    if hp.address != addresses.get(node):
        raise Refused(f"the plan gives node {node} the address {hp.address}; its data-plane "
                      f"address is {addresses.get(node)}")
    if hp.match != profile.match:
        raise Refused("the plan's traffic match is not the one its profile names")
    for rule in hp.rules:
        if addresses.get(rule.peer) != rule.peer_address or rule.peer == node:
            raise Refused(f"the plan impairs a path to {rule.peer} ({rule.peer_address}), "
                          "which is not another node of this job")
        src, dst = (rule.peer, node) if rule.direction == "ingress" else (node, rule.peer)
        if rule.impairment != profile.impairment_for(src, dst, node):
            raise Refused(f"the plan's impairment of {src}->{dst} is not the profile's")
