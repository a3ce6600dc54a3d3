"""What `lossbed doctor` is asked (the run the checks are judged against) and what it
answers (findings, each with the fix)."""

from __future__ import annotations

from dataclasses import KW_ONLY, asdict, dataclass, field
from typing import TYPE_CHECKING

from testbed.errors import UsageError

if TYPE_CHECKING:  # (for annotations: the profile model loads pydantic)
    from testbed.profiles.model import Profile

DEVICES = ("cpu", "cuda")
BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True, kw_only=True)
class Request:
    """The run the checks are judged against."""

    profile: Profile | None = None  # None: any loss
    device: str = "cpu"
    backend: str = "gloo"
    transport: str = "udp"
    ranks_per_host: int = 1
    loss_backend: str | None = None  # as `apply --backend`: None lets lossbed choose
    force_interface: bool = False  # the run impairs the NIC even if it carries SSH (apply's)

    def __post_init__(self):
        if self.device not in DEVICES:
            raise UsageError("--device", f"{self.device!r} is not a device lossbed trains on",
                             f"Use one of: {', '.join(DEVICES)}")
        if self.backend not in BACKENDS:
            raise UsageError("LOSSBED_BACKEND", f"{self.backend!r} is not a reliable backend",
                             f"Use one of: {', '.join(BACKENDS)}")


@dataclass
class Finding:
    """One check on one host: its state, whether it is met (ok), whether the run asked for
    cannot work without it (needed), and the fix."""

    host: str
    check: str
    state: str
    _: KW_ONLY
    ok: bool
    needed: bool
    fix: str = ""


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    facts: dict = field(default_factory=dict)  # host name -> HostFacts

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.needed and not f.ok]

    def to_dict(self) -> dict:
        return {"ok": not self.blocking, "findings": [asdict(f) for f in self.findings],
                "facts": {name: asdict(f) for name, f in self.facts.items()}}
