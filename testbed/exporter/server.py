"""The metrics endpoint: prometheus_client's HTTP server on a registry of lossbed's own
collectors. Safe by default: it binds loopback unless told another address, serves the
metrics and nothing else (no other path does anything), and only reads. A port in use is
refused before anything is impaired (the commands start the endpoint first)."""

from __future__ import annotations

import errno
import ipaddress
import logging

from testbed import checks
from testbed.errors import UsageError

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1"


class Endpoint:
    """A running endpoint: registry, address and port; stop() ends it."""

    def __init__(self, registry, address: str, port: int, server, thread):
        self.registry, self.address, self.port = registry, address, port
        self._server, self._thread = server, thread

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def check_address(option: str, address: str) -> str:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise UsageError(option, f"{address!r} is not an IP address",
                         f"Give one, e.g. {option} 127.0.0.1 (the default: this machine "
                         "only) or 0.0.0.0 (every interface)") from None
    return address


def start(collectors, port: int, address: str = DEFAULT_ADDRESS,
          option: str = "--metrics-port") -> Endpoint:
    """Serve `collectors` on address:port, or a UsageError naming the option and the fix."""
    from prometheus_client import CollectorRegistry, start_http_server

    checks.port(option, port)
    check_address(option.replace("-port", "-address"), address)
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    try:
        server, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as err:
        why = ("is in use" if err.errno == errno.EADDRINUSE else
               f"cannot be bound ({err.strerror})")
        raise UsageError(option, f"{address}:{port} {why}",
                         f"Give a free port ({option} 0 picks one) or stop what holds it") \
            from None
    bound = server.server_address[1]
    log.info("metrics on http://%s:%d/metrics", address, bound)
    return Endpoint(registry, address, bound, server, thread)
