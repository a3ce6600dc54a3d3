"""The fork audit: a process that calls os.fork or os.forkpty while another thread is alive
fails at that call, and the call is written to the audit's log.

Why: a child forked from a threaded process holds copies of locks that other threads held at
that instant and can deadlock; Python 3.12 warns on such a fork, and libraries (filelock on
3.12+, pulled in by torch) refuse it. lossbed's controller and host agent run thread pools and
output threads, so they must never fork (subprocess's fork_exec is not a fork of Python and is
allowed).

The test fixture loads this module into the pytest process and puts its folder first on
PYTHONPATH, so every Python process the tests start (the CLI, ranks, agents) loads it at start
as `sitecustomize` and is audited too. It is armed only while LOSSBED_TEST_FORK_AUDIT_LOG
names the log file.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback

LOG_ENV = "LOSSBED_TEST_FORK_AUDIT_LOG"
_installed = False


def threads_alive() -> int:
    """Threads of this process as the kernel counts them: Python's and native ones (torch's
    OpenMP pool, for one), as Python 3.12's own fork warning counts them."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def is_lossbeds_own_process() -> bool:
    """lossbed's CLI, a `python -m harness...|testbed...` (ranks, agents), or the tests
    themselves. Other programs the tests start (ansible-playbook forks its workers by design)
    are not lossbed's to audit."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    module = spec.name.split(".")[0] if spec and spec.name else ""
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return program in ("lossbed", "pytest") or module in ("harness", "testbed", "pytest")


def _hook(event: str, args: tuple) -> None:
    if event not in ("os.fork", "os.forkpty"):
        return
    log_path = os.environ.get(LOG_ENV)
    if not log_path or not is_lossbeds_own_process():
        return
    alive = threads_alive()
    if alive <= 1:
        return
    names = ", ".join(t.name for t in threading.enumerate())
    message = (f"{event} in pid {os.getpid()} ({' '.join(sys.argv)[:200]}) while {alive} "
               f"threads are alive (Python's: {names})")
    stack = "".join(traceback.format_stack(limit=16)[:-1])
    with open(log_path, "a") as log:
        log.write(f"{message}\n{stack}\n")
    raise RuntimeError(f"fork audit: {message}")


def install() -> None:
    """Install the hook once per process (audit hooks cannot be removed; the log variable
    arms it)."""
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True


install()
