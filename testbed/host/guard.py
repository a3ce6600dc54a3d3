"""Run a command for a remote controller, and stop it when the controller goes away.

    ssh host 'python -m testbed.host.guard python -m harness.train.worker …'

The command runs in its own process group, and what arrives on this process's stdin (the
SSH channel) is passed on to the command's stdin (the controller answers rank 0 that way).
When the channel closes — the controller ended the launch, was killed, or lost the network —
the group gets SIGTERM, then SIGKILL after a grace period: no rank outlives its controller
on a real host.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

GRACE_S = 5.0


def main(argv: list[str] | None = None) -> int:
    command = sys.argv[1:] if argv is None else argv
    if not command:
        print("usage: python -m testbed.host.guard COMMAND [ARGS…]", file=sys.stderr)
        return 2
    child = subprocess.Popen(command, start_new_session=True, stdin=subprocess.PIPE)

    def forward_stdin():
        try:
            while chunk := os.read(sys.stdin.fileno(), 4096):
                try:
                    child.stdin.write(chunk)
                    child.stdin.flush()
                except OSError:
                    pass  # the command closed its stdin or ended: keep watching the channel
        except OSError:
            pass
        _stop(child)

    threading.Thread(target=forward_stdin, daemon=True).start()
    code = child.wait()
    # Leave at once: the stdin watcher may hold the stdin lock, and a normal interpreter
    # shutdown would abort on it ("could not acquire lock … at interpreter shutdown").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if code >= 0 else 128 - code)


def _stop(child: subprocess.Popen) -> None:
    if child.poll() is not None:
        return
    try:
        os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main())
