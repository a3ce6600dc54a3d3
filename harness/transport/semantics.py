"""Loss semantics of the transport: what the unit of loss is, and whether it is retried.

    udp        one datagram per packet, sized to the link MTU (the default)
    roce-ud    RDMA Unreliable Datagram: one 4096-byte message per datagram
    roce-uc    RDMA Unreliable Connection: messages of MESSAGE bytes (default 64 KiB) cut
               into 4096-byte packets; a message with any packet lost is lost whole (the
               receiver drops the rest of it; partially placed data is never used)
    roce-rc    RDMA Reliable Connection without PFC: packet sequence numbers, a NAK on a
               gap, go-back-N retransmission from the first missing packet, a timeout
               when the NAK itself is lost. Everything arrives, in order; loss costs time.

The same three semantics over real RDMA queue pairs (harness/verbs/transport.py), where
the loss is the network's and the hardware's, not lossbed's emulation:

    verbs-ud   a UD queue pair: one message per packet, sized to the device's path MTU
    verbs-uc   UC queue pairs, one per peer: messages of MESSAGE bytes (default 64 KiB)
    verbs-rc   RC queue pairs: the device retransmits (go-back-N in RoCE without PFC)
    verbs      verbs-uc

Written as NAME or NAME:BYTES (roce-uc:65536, verbs-uc:8192).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.transport import header as hdr
from testbed.errors import UsageError

ROCE_PACKET_BYTES = 4096  # RoCE's largest path MTU
NAMES = ("udp", "roce-ud", "roce-uc", "roce-rc", "verbs-ud", "verbs-uc", "verbs-rc")
SIZED = ("roce-uc", "roce-rc", "verbs-uc", "verbs-rc")  # the names that take :BYTES
DEFAULT_MESSAGE_BYTES = 64 * 1024
MAX_MESSAGE_BYTES = 16 << 20


@dataclass(frozen=True)
class Semantics:
    name: str = "udp"
    message_bytes: int = DEFAULT_MESSAGE_BYTES

    @classmethod
    def parse(cls, text: str) -> Semantics:
        name, _, size = text.partition(":")
        if name == "verbs":
            name = "verbs-uc"
        if name not in NAMES:
            raise UsageError("--transport", f"unknown transport semantics {text!r}",
                             f"Use one of: {', '.join(NAMES)}, verbs (roce-uc:BYTES sets the "
                             "message)")
        if size:
            if name not in SIZED:
                raise UsageError("--transport", f"{name} has no message size",
                                 f"Only {', '.join(SIZED)} take :BYTES")
            try:
                message = int(size)
            except ValueError:
                raise UsageError("--transport", f"{size!r} is not a number of bytes",
                                 "e.g. roce-uc:65536") from None
            if message < 4 or message % 4:
                raise UsageError("--transport", f"message size {message} is not a positive "
                                 "multiple of 4 bytes", "e.g. roce-uc:65536")
            if message > MAX_MESSAGE_BYTES:
                # a receiver reassembles whole messages: their size bounds its memory
                raise UsageError("--transport", f"message size {message} is over the "
                                 f"{MAX_MESSAGE_BYTES} bytes a message may have",
                                 f"Give at most {MAX_MESSAGE_BYTES} (RDMA's UC/RC messages "
                                 "in training buckets are 64 KiB to a few MiB)")
            return cls(name, message)
        return cls(name)

    @property
    def reliable(self) -> bool:
        return self.name in ("roce-rc", "verbs-rc")

    @property
    def verbs(self) -> bool:
        """Real RDMA queue pairs (harness/verbs/transport.py), not UDP datagrams."""
        return self.name.startswith("verbs-")

    @property
    def queue_pair(self) -> str:
        """ud, uc or rc: the RDMA queue pair type whose semantics these are ("" for udp)."""
        return self.name.rpartition("-")[2] if "-" in self.name else ""

    def fragment_floats(self, mtu: int) -> int:
        """float32 values per datagram."""
        room = hdr.payload_floats(mtu)
        return room if self.name == "udp" else min(room, ROCE_PACKET_BYTES // 4)

    def slot_floats(self, mtu: int) -> int:
        """float32 values per unit the collective rebuilds (lost or kept as one)."""
        if self.name in ("roce-uc", "roce-rc"):
            return self.message_bytes // 4
        return self.fragment_floats(mtu)

    def __str__(self) -> str:
        if self.name in SIZED:
            return f"{self.name}:{self.message_bytes}"
        return self.name
