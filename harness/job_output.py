"""What the hosts of a `lossbed run` job write, as it comes: lossbed's own marks taken out
(the job joined, a rank's metrics, the error that ended a rank), every line kept in its
host's log file (OUT/logs/HOST.log), the job's own output passed through; and, when the
job failed, the one line that says which rank on which host and why (#66: the torchrun
tracebacks were 110-174 lines, the reason somewhere inside them)."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness import rank_protocol
from harness.rank_protocol import Live, ScriptRankMetrics

LAST_LINES = 40  # per host: where the reason of a failure without an error mark is read
# where torchrun's agent's frames are (its traceback when a worker failed)
AGENT_FRAMES = ("/bin/torchrun", "torch/distributed/elastic/", "torch/distributed/run.py",
                "torch/distributed/launcher/")


@dataclass
class Job:
    """What the hosts' output says, as it comes."""

    logs: Path  # the folder of the hosts' log files
    joined: threading.Event = field(default_factory=threading.Event)
    metrics: list[ScriptRankMetrics] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    timed_out: bool = False   # the job ran past --timeout-s and was stopped
    stopped_by: str | None = None  # what stopped the hosts still running (None: they ended)
    last: dict[str, collections.deque] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # where the ranks' live marks go as they come (served metrics); None: dropped
    live: Callable[[Live], None] | None = None

    def pump(self, stream, sink, host: str) -> None:
        """One stream of a host, to its end: every line into the host's log file; torchrun's
        own failure report (its agent's traceback and its ===== summary) there alone, the
        rest take()n."""
        self.logs.mkdir(parents=True, exist_ok=True)
        held = _TorchrunReport()
        with open(self.logs / f"{host}.log", "a") as log:
            for line in stream:
                log.write(line)
                log.flush()
                with self.lock:
                    self.last.setdefault(host, collections.deque(maxlen=LAST_LINES)).append(
                        line.rstrip("\n"))
                for shown in held.feed(line.rstrip("\n")):
                    self.take(shown, sink)
            for shown in held.feed(None):
                self.take(shown, sink)

    def take(self, line: str, stream) -> None:
        """One line of a host's output: lossbed's own marks kept, the rest passed through."""
        marked = rank_protocol.read_mark(line)
        if marked is not None:
            name, payload = marked
            with self.lock:
                if name == rank_protocol.JOINED_MARK:
                    self.joined.set()
                    return
                if name == rank_protocol.METRICS_MARK:
                    with contextlib.suppress(TypeError, ValueError):  # not its shape: output
                        self.metrics.append(ScriptRankMetrics.from_dict(payload))
                        return
                if name == rank_protocol.ERROR_MARK:
                    self.errors.append(payload)
            if name == rank_protocol.LIVE_MARK:
                said = Live.from_payload(payload) if isinstance(payload, dict) else None
                if said is not None:
                    if self.live is not None:
                        self.live(said)
                    return
        stream.write(line + "\n")
        stream.flush()

    def failure_line(self, code: int, hosts: list[str]) -> str | None:
        """For a job that failed (code not 0): the first rank that said what ended it, its
        host and its error; else the last line a host wrote that reads as an error; and
        where every host's output is. None for a job that ended 0."""
        if code == 0:
            return None
        where = f"every host's output: {self.logs}/"
        if self.timed_out:
            return f"timed out ({self.stopped_by}); {where}"
        if self.errors:
            first = self.errors[0]
            host = first.get("host") or "?"
            return (f"failed: rank {first.get('rank')} on {host}: "
                    f"{_last_line(str(first.get('error', '')))}; {where}")
        for host in hosts:
            said = [line for line in self.last.get(host, ()) if _reads_as_error(line)]
            if said:
                return f"failed (exit {code}): on {host}: {said[-1].strip()}; {where}"
        return f"failed (exit {code}); {where}"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else text


def _reads_as_error(line: str) -> bool:
    """A Python exception's last line ("ValueError: ...", "...Error: ..."), but torchrun's
    own (its agent's ChildFailedError says only that a child failed)."""
    head = line.strip().split(":", 1)[0]
    return (head.endswith(("Error", "Exception", "Interrupt")) and " " not in head
            and ":" in line and not head.startswith("torch.distributed.elastic"))


class _TorchrunReport:
    """Holds back what torchrun's agent writes when a worker failed: the traceback through
    torch.distributed's own code and its ===== box of failures, and C++ tracebacks (c10d's
    TCPStore prints one when the store's host leaves first), all in the host's log
    file. A traceback is held until it ends, then passed on unless its frames are
    torchrun's; the box from its first ===== line to its last."""

    RULE = "=" * 20

    def __init__(self):
        self.block: list[str] = []
        self.in_box = False

    def feed(self, line: str | None) -> list[str]:
        """The lines to pass on now (None: the stream ended)."""
        if line is None:
            return self._end_block()
        if line.lstrip().startswith("frame #") or "Exception raised from " in line:
            return []  # a C++ traceback (TCPStore's at shutdown, of a run that went well)
        if self.in_box:
            if line.startswith(self.RULE) and len(self.block) > 1:
                self.in_box, self.block = False, []
            else:
                self.block.append(line)
            return []
        if line.startswith(self.RULE):
            shown = self._end_block()
            self.in_box, self.block = True, [line]
            return shown
        if self.block or line.startswith("Traceback (most recent call last)"):
            if self.block and not line.startswith((" ", "\t", "Traceback")) and not (
                    line.startswith(("During handling", "The above exception"))
                    or not line.strip()):
                self.block.append(line)  # the exception's own line ends the traceback
                return self._end_block()
            self.block.append(line)
            return []
        return [line]

    def _end_block(self) -> list[str]:
        block, self.block = self.block, []
        # the agent's own frames (a script's error inside a collective passes through
        # torch/distributed/ too, and is shown)
        torchruns = any(any(mark in x for mark in AGENT_FRAMES) for x in block
                        if x.lstrip().startswith("File "))
        return [] if torchruns else block

