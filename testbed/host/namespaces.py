"""Network namespaces without fork: create, remove, and open sockets inside them.

pyroute2 enters a namespace by forking a child (`netns.create`, `netns.create_socket`,
`IPRoute(netns=...)`). The controller does this from thread pools and output threads, and a
fork while threads run can deadlock in the child; Python 3.12 warns on it and libraries
(filelock, pulled in by torch) refuse it. A network namespace is a property of one thread,
not of the process: setns(2) and unshare(CLONE_NEWNET) change only the calling thread. So
each operation here runs in a short-lived thread of its own that enters (or creates) the
namespace, does its one thing, and ends; a socket keeps the namespace it was made in.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import socket
import threading
from collections.abc import Callable
from typing import TypeVar

from pyroute2 import IPRoute

RUN_DIR = "/run/netns"  # where `ip netns` keeps its namespaces: they are visible to it too

_CLONE_NEWNET = 0x40000000
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_SHARED = 1 << 20
_MNT_DETACH = 2
_NETLINK_ROUTE = 0

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

T = TypeVar("T")


def path(namespace: str) -> str:
    return os.path.join(RUN_DIR, namespace)


def _check(result: int, what: str, namespace: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} failed for namespace {namespace!r}: {os.strerror(err)}")


def _in_own_thread(work: Callable[[], T]) -> T:
    """Run work in a new thread and return its result (or raise its error). The thread ends
    with it, so whatever namespace it entered is gone with it."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as err:  # handed to the caller below
            outcome["error"] = err

    thread = threading.Thread(target=run, name="lossbed-netns")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _enter(namespace: str) -> None:
    """Move the calling thread into the namespace."""
    fd = os.open(path(namespace), os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(fd, _CLONE_NEWNET), "setns", namespace)
    finally:
        os.close(fd)


def socket_in(namespace: str, family: int = socket.AF_INET, kind: int = socket.SOCK_DGRAM,
              proto: int = 0) -> socket.socket:
    """A socket that lives in the namespace."""
    if not os.path.exists(path(namespace)):
        raise FileNotFoundError(errno.ENOENT, f"no network namespace {namespace!r}",
                                path(namespace))

    def make() -> socket.socket:
        _enter(namespace)
        return socket.socket(family, kind, proto)

    return _in_own_thread(make)


def netlink(namespace: str) -> IPRoute:
    """A netlink route session inside the namespace, made without a child process."""
    sock = socket_in(namespace, socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_ROUTE)
    return IPRoute(fileno=sock.detach())


def _share_run_dir() -> None:
    """Make RUN_DIR a shared mount point, as `ip netns add` does, so a namespace's bind mount
    is seen in every mount namespace (`ip netns exec` makes private ones)."""
    os.makedirs(RUN_DIR, exist_ok=True)
    rundir = RUN_DIR.encode()
    if _libc.mount(b"none", rundir, b"none", _MS_SHARED | _MS_REC, None) == 0:
        return
    # Not a mount point yet: bind it over itself, then share it.
    _check(_libc.mount(rundir, rundir, b"none", _MS_BIND | _MS_REC, None), "mount --bind",
           RUN_DIR)
    _check(_libc.mount(b"none", rundir, b"none", _MS_SHARED | _MS_REC, None),
           "mount --make-shared", RUN_DIR)


def create(namespace: str) -> None:
    """A new, empty network namespace under RUN_DIR (as `ip netns add` makes it)."""
    _share_run_dir()
    target = path(namespace)
    os.close(os.open(target, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))

    def make() -> None:
        _check(_libc.unshare(_CLONE_NEWNET), "unshare", namespace)
        # /proc/thread-self: the new namespace is this thread's, not the process's.
        _check(_libc.mount(b"/proc/thread-self/ns/net", target.encode(), b"none", _MS_BIND,
                           None), "mount --bind", namespace)

    try:
        _in_own_thread(make)
    except BaseException:
        os.unlink(target)
        raise


def remove(namespace: str) -> None:
    """Detach the namespace's mount and its file; the kernel frees the namespace (and every
    link in it) once no process or socket holds it."""
    target = path(namespace)
    _libc.umount2(target.encode(), _MNT_DETACH)
    os.unlink(target)


def names() -> list[str]:
    """The namespaces under RUN_DIR."""
    try:
        return sorted(os.listdir(RUN_DIR))
    except FileNotFoundError:
        return []
