"""Per-path packet counters as a backend reads them from the kernel."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class LinkCounters:
    host: str           # where the counters live (the impairment point)
    direction: str      # "ingress" or "egress"
    peer: str
    path: str           # "h2->h1"
    seen_packets: int   # matched packets that reached the impairment point
    dropped_packets: int
    mean_packet_bytes: float | None  # IP-level size of the packets seen (GSO detector)
    bursts: int | None = None      # runs of consecutive drops (bpf backend only)
    max_burst: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)
