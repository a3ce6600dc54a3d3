"""Per-path packet counters as a backend reads them from the kernel."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class LinkCounters:
    """Cumulative since the impairment was applied, so two readings of the same applied plan
    subtract into what happened between them (`since`)."""

    host: str           # where the counters live (the impairment point)
    direction: str      # "ingress" or "egress"
    peer: str
    path: str           # "h2->h1"
    seen_packets: int   # matched packets that reached the impairment point
    dropped_packets: int
    # IP-level bytes of `sized_packets` packets, the ones the backend measures sizes of (nft
    # and bpf: every packet seen; netem: the packets it sent on): the super-packet detector
    sized_bytes: int = 0
    sized_packets: int = 0
    # IP-level bytes of every packet seen, and of the dropped ones (netem sizes only what it
    # sent and counts its drops in packets: its path's filters count the bytes it was
    # given; None for a tree from before they did, or a kernel without act_gact)
    seen_bytes: int | None = None
    dropped_bytes: int | None = None
    bursts: int | None = None      # runs of consecutive drops (bpf backend only)
    max_burst: int | None = None   # the longest run since the plan was applied (not windowed)

    @property
    def mean_packet_bytes(self) -> float | None:
        return self.sized_bytes / self.sized_packets if self.sized_packets else None

    def since(self, earlier: LinkCounters) -> LinkCounters:
        """What the path counted after `earlier`, a reading of the same path."""
        assert (earlier.host, earlier.path) == (self.host, self.path)
        return LinkCounters(
            host=self.host, direction=self.direction, peer=self.peer, path=self.path,
            seen_packets=self.seen_packets - earlier.seen_packets,
            dropped_packets=self.dropped_packets - earlier.dropped_packets,
            sized_bytes=self.sized_bytes - earlier.sized_bytes,
            sized_packets=self.sized_packets - earlier.sized_packets,
            seen_bytes=_less(self.seen_bytes, earlier.seen_bytes),
            dropped_bytes=_less(self.dropped_bytes, earlier.dropped_bytes),
            bursts=_less(self.bursts, earlier.bursts),
            max_burst=self.max_burst)

    def to_dict(self) -> dict:
        return asdict(self)


def _less(now: int | None, earlier: int | None) -> int | None:
    return now - earlier if now is not None and earlier is not None else None


@dataclass
class ExemptCounters:
    """What a host's exclusions let through unimpaired (SSH, the rendezvous port: the
    profile's match.exclude), at the impairment point, in one direction. Cumulative since
    the impairment was applied, like LinkCounters."""

    host: str
    direction: str      # "ingress" or "egress"
    packets: int
    bytes: int          # IP-level

    def since(self, earlier: ExemptCounters) -> ExemptCounters:
        assert (earlier.host, earlier.direction) == (self.host, self.direction)
        return ExemptCounters(self.host, self.direction, self.packets - earlier.packets,
                              self.bytes - earlier.bytes)

    def to_dict(self) -> dict:
        return asdict(self)
