"""A small rendezvous store without torch, for ranks that run torch-free (VM hosts under
TCG, where torch takes a minute to import).

It has the part of torch.distributed.TCPStore's interface that lossbed's transports and
collectives use (set, get, add, check, wait, delete_key), so they take either. Rank 0 hosts
it on a port that profiles keep unimpaired; every rank, rank 0 included, talks to it over
TCP, one JSON line per request.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from datetime import timedelta


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        store = self.server
        for line in self.rfile:
            op, key, value = json.loads(line)
            with store.changed:
                if op == "set":
                    store.data[key] = value
                    store.changed.notify_all()
                elif op == "add":
                    store.data[key] = str(int(store.data.get(key, "0")) + value)
                    store.changed.notify_all()
                    value = store.data[key]
                elif op == "get":
                    # wait up to `value` seconds for the key
                    store.changed.wait_for(lambda k=key: k in store.data, timeout=value)
                    value = store.data.get(key)
                elif op == "delete":
                    value = store.data.pop(key, None) is not None
            self.wfile.write((json.dumps(value) + "\n").encode())


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address):
        super().__init__(address, _Handler)
        self.data: dict[str, str] = {}
        self.changed = threading.Condition()


class Store:
    """Connect to the store at host:port (hosting it there first if is_master; port 0
    takes a free one, then in .port)."""

    def __init__(self, host: str, port: int, is_master: bool = False,
                 timeout: timedelta = timedelta(seconds=60)):
        self.timeout_s = timeout.total_seconds()
        self._server = None
        if is_master:
            self._server = _Server((host, port))
            port = self._server.server_address[1]
            threading.Thread(target=self._server.serve_forever, daemon=True).start()
        deadline = time.monotonic() + self.timeout_s
        while True:  # the master may still be starting (Python is slow in a VM)
            try:
                self._conn = socket.create_connection((host, port), timeout=10)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no rendezvous store at {host}:{port} after "
                                       f"{self.timeout_s:.0f} s: is rank 0 running?") from None
                time.sleep(0.2)
        self.port = port
        self._conn.settimeout(None)
        self._reader = self._conn.makefile("r")
        self._lock = threading.Lock()

    def _call(self, op: str, key: str, value=None):
        with self._lock:
            self._conn.sendall((json.dumps([op, key, value]) + "\n").encode())
            line = self._reader.readline()
        if not line:
            raise ConnectionError("the rendezvous store closed the connection: rank 0 left")
        return json.loads(line)

    def set(self, key: str, value) -> None:
        self._call("set", key, value.decode() if isinstance(value, bytes) else str(value))

    def get(self, key: str) -> bytes:
        """The key's value, waiting for it to be set (TCPStore's get does the same)."""
        value = self._call("get", key, self.timeout_s)
        if value is None:
            raise TimeoutError(f"rendezvous key {key!r} not set within {self.timeout_s:.0f} s")
        return value.encode()

    def add(self, key: str, amount: int) -> int:
        return int(self._call("add", key, int(amount)))

    def check(self, keys: list[str]) -> bool:
        return all(self._call("get", key, 0) is not None for key in keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        wait_s = self.timeout_s if timeout is None else timeout.total_seconds()
        deadline = time.monotonic() + wait_s
        for key in keys:
            if self._call("get", key, max(0.0, deadline - time.monotonic())) is None:
                raise TimeoutError(f"rendezvous key {key!r} not set within {wait_s:.1f} s")

    def delete_key(self, key: str) -> bool:
        return bool(self._call("delete", key))

    def close(self) -> None:
        self._conn.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
