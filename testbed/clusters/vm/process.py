"""A process started in a VM through its exec channel, with the part of subprocess.Popen's
interface that launching ranks uses (stdout and stderr as lines of text, stdin, poll, wait,
kill).

The guest starts it and answers at once (guest.py's spawn); a thread here then asks the
guest what it wrote every POLL_S, so the channel, which qemu lets one client use at a
time, is held only for moments.
"""

from __future__ import annotations

import base64
import queue
import threading
import time
from pathlib import Path

from testbed.clusters.vm import channel
from testbed.errors import ClusterError

POLL_S = 0.25
_END = object()


class _Lines:
    """Lines of text as they arrive from the guest; iteration ends when the process did."""

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._partial = ""

    def feed(self, data: bytes) -> None:
        text = self._partial + data.decode(errors="replace")
        *lines, self._partial = text.split("\n")
        for line in lines:
            self._queue.put(line + "\n")

    def close(self) -> None:
        if self._partial:
            self._queue.put(self._partial)
        self._queue.put(_END)

    def __iter__(self):
        while (line := self._queue.get()) is not _END:
            yield line


class _Stdin:
    """The process's stdin, written through the exec channel (text, like Popen(text=True))."""

    def __init__(self, channel_path: Path, pid: int):
        self.channel, self.pid = channel_path, pid

    def write(self, text: str) -> int:
        data = base64.b64encode(text.encode()).decode()
        reply = channel.call(self.channel, {"write": self.pid, "data": data}, timeout_s=60)
        if "error" in reply:
            raise BrokenPipeError(reply["error"])
        return len(text)

    def flush(self) -> None:
        pass  # every write is sent at once

    def close(self) -> None:
        try:
            channel.call(self.channel, {"write": self.pid, "close": True}, timeout_s=60)
        except (ClusterError, TimeoutError, OSError):
            pass


class GuestProcess:
    def __init__(self, channel_path: Path, argv, env: dict, cwd: str | None):
        self.channel = channel_path
        reply = channel.call(self.channel, {"spawn": [str(a) for a in argv], "env": env,
                                            "cwd": cwd}, timeout_s=60)
        if "error" in reply:
            raise ClusterError(f"could not start {argv[0]} in the VM: {reply['error']}")
        self.pid = reply["pid"]  # in the VM
        self.stdin = _Stdin(self.channel, self.pid)
        self.args = list(argv)
        self.returncode: int | None = None
        self.stdout, self.stderr = _Lines(), _Lines()
        self._ended = threading.Event()
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        read = {"stdout_from": 0, "stderr_from": 0}
        try:
            while True:
                reply = channel.call(self.channel, {"poll": self.pid, **read}, timeout_s=60)
                if "error" in reply:
                    raise ClusterError(reply["error"])
                self.stdout.feed(base64.b64decode(reply["stdout"]))
                self.stderr.feed(base64.b64decode(reply["stderr"]))
                read = {"stdout_from": reply["stdout_to"], "stderr_from": reply["stderr_to"]}
                if reply["rc"] is not None:
                    self.returncode = reply["rc"]
                    break
                time.sleep(POLL_S)
        except (ClusterError, TimeoutError, OSError) as err:
            # the VM went away (or stopped answering): the process is as good as dead
            self.stderr.feed(f"\n[lossbed: lost the VM's exec channel: {err}]\n".encode())
            self.returncode = -9
        finally:
            self.stdout.close()
            self.stderr.close()
            self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise TimeoutError(f"{self.args[0]} in the VM still runs after {timeout} s")
        return self.returncode

    def kill_group(self) -> None:
        """SIGKILL to its whole process group in the VM."""
        try:
            channel.call(self.channel, {"kill": self.pid}, timeout_s=30)
        except (ClusterError, TimeoutError, OSError):
            pass  # the VM is gone, and the process with it
