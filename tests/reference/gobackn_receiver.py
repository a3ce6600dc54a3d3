"""Go-back-N's receiver datagram by datagram: the reference the tests hold the compiled
core's in_order (harness/transport/gobackn.py, _wire.c) against. Not used in production."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReceiveFlow:
    """One source's flow at the receiver."""

    expected: int = 0

    def accept(self, psn: int) -> str:
        """"deliver", "duplicate" or "gap" for an arriving psn."""
        if psn == self.expected:
            self.expected += 1
            return "deliver"
        if psn < self.expected:
            return "duplicate"
        return "gap"
