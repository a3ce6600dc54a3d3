"""Progress lines on stderr for work that takes more than a second.

Silent for quick work, so a 4-host `up` prints nothing extra; a 32-host one shows how far it
has got. Not a logger: this is for the person at the terminal.
"""

from __future__ import annotations

import sys
import time

SHOW_AFTER_S = 1.0


class Progress:
    def __init__(self, label: str, total: int, stream=None, show_after_s: float = SHOW_AFTER_S):
        self.label = label
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr
        self.show_after_s = show_after_s
        self.started = time.monotonic()
        self.shown = False

    def advance(self, what: str = "", steps: int = 1) -> None:
        self.done += steps
        elapsed = time.monotonic() - self.started
        if elapsed < self.show_after_s:
            return
        self.shown = True
        eta = ""
        if 0 < self.done < self.total:
            eta = f", about {elapsed / self.done * (self.total - self.done):.0f} s left"
        end = "\n" if not self.stream.isatty() else ""
        prefix = "\r" if self.stream.isatty() else ""
        self.stream.write(
            f"{prefix}{self.label}: {self.done}/{self.total} {what}{eta}".ljust(60) + end
        )
        self.stream.flush()

    def finish(self) -> None:
        if self.shown and self.stream.isatty():
            self.stream.write("\n")
            self.stream.flush()
