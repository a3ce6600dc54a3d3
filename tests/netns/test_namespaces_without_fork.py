"""Namespaces are created, entered and removed without a child process, from any thread, and
the calling thread stays in its own namespace."""

from __future__ import annotations

import fcntl
import os
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from testbed.host import namespaces
from tests.helpers import unique_name

pytestmark = pytest.mark.netns


SIOCGSKNS = 0x894C  # linux/sockios.h: an fd of the network namespace a socket lives in


def _own_namespace() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


def _namespace_of(sock: socket.socket) -> int:
    fd = fcntl.ioctl(sock.fileno(), SIOCGSKNS)
    try:
        return os.fstat(fd).st_ino
    finally:
        os.close(fd)


def test_a_namespace_made_and_used_from_a_thread_pool_is_its_own_and_goes_away():
    name = f"lossbed-{unique_name()}-x"
    mine = _own_namespace()

    def work() -> tuple[int, list[str], int, int]:
        namespaces.create(name)
        with namespaces.netlink(name) as ipr:
            links = [link.get_attr("IFLA_IFNAME") for link in ipr.link("dump")]
        with namespaces.socket_in(name, socket.AF_INET, socket.SOCK_DGRAM) as sock:
            socket_ns = _namespace_of(sock)
        return os.stat(namespaces.path(name)).st_ino, links, socket_ns, _own_namespace()

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:  # the audit fails any fork here
            ns_inode, links, socket_ns, worker_ns = pool.submit(work).result()
        assert links == ["lo"], "a new namespace holds only its loopback"
        assert ns_inode != mine
        assert socket_ns == ns_inode, "the socket was not made inside the namespace"
        assert worker_ns == mine, "the worker thread was left inside the new namespace"
        assert _own_namespace() == mine
        assert name in namespaces.names()
    finally:
        namespaces.remove(name)
    assert name not in namespaces.names()
    assert not os.path.exists(namespaces.path(name))


def test_a_missing_namespace_is_named():
    with pytest.raises(FileNotFoundError, match="lossbed-nosuch"):
        namespaces.socket_in("lossbed-nosuch")
