"""What a receiver says about each unit it was handed (the verdicts), and what every
transport counts: one vocabulary for the UDP and verbs transports and the collectives that
read their counts."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# What a packet handler says about a packet it was given
APPLIED, DUPLICATE, STALE, FUTURE, MALFORMED = "applied", "duplicate", "stale", "future", \
    "malformed"
HELD = "held"      # UC: a fragment kept until its message is whole (counted with it)
END = "end"        # an end marker (header.STAGE_*_END), taken note of
EARLY = "early"    # for a coming step: kept, and applied when that step starts
FOREIGN, MASKED = "foreign", "masked"  # what the transport itself drops, before any handler
UNAUTHENTICATED = "unauthenticated"    # ... as does a tag that the job's key did not make
MISDIRECTED = "misdirected"            # ... and a genuine datagram for another rank
NONFINITE = "nonfinite"                # values NaN or infinite: never applied


@dataclass
class Counters:
    packets_sent: int = 0         # datagrams, retransmissions included
    bytes_sent: int = 0
    packets_received: int = 0     # units applied (datagrams; whole messages for UC/RC)
    bytes_received: int = 0       # payload of the data datagrams taken (as bytes_sent counts)
    missing: int = 0              # units expected but not there at the deadline
    late: int = 0                 # for a step already finished
    early: int = 0                # for the next step: kept and applied when it starts
    future: int = 0               # too far ahead: dropped
    duplicates: int = 0
    foreign: int = 0              # not lossbed's, wrong nonce, unknown source
    unauthenticated: int = 0      # right nonce and source, but a tag not made with the key
    misdirected: int = 0          # genuine, but addressed to another rank (a redirected copy)
    truncated: int = 0            # longer than any datagram of the job: cut by the receiver
    malformed: int = 0            # bad length, stage, shard, index or fragment count
    nonfinite: int = 0            # a payload with NaN or infinite values
    messages_incomplete: int = 0  # UC: messages started but lost whole (partial data dropped)
    retransmitted: int = 0        # RC: datagrams sent again
    timeouts: int = 0             # RC: retransmission timeouts
    naks_sent: int = 0
    masked: int = 0               # dropped by the seeded drop mask
    ends_sent: int = 0            # end markers (copies included; not in packets_sent)
    ends_received: int = 0
    segmented_sends: int = 0      # sends the kernel cut into several datagrams (UDP GSO)

    def to_dict(self) -> dict:
        return asdict(self)


# The counter each handler verdict adds to (anything else: malformed)
COUNTER_OF_VERDICT = {APPLIED: "packets_received", DUPLICATE: "duplicates", STALE: "late",
                      FUTURE: "future", EARLY: "early", END: "ends_received",
                      FOREIGN: "foreign", MASKED: "masked",
                      UNAUTHENTICATED: "unauthenticated", NONFINITE: "nonfinite",
                      MISDIRECTED: "misdirected"}


def count_verdict(c: Counters, verdict: str, count: int = 1) -> None:
    """Count `count` units that a packet handler gave `verdict`."""
    if verdict == HELD:
        return  # counted with its message, when that is whole
    name = COUNTER_OF_VERDICT.get(verdict, "malformed")
    setattr(c, name, getattr(c, name) + count)
