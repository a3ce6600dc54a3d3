"""A real Prometheus for the tests: Debian's server on loopback, scraping the targets it is
given every second, its data in a folder of the test's; stopped after
(../shared/recipes/slurm-and-prometheus.md is how it was first run here)."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

READY_S = 30.0


def available() -> str | None:
    missing = [c for c in ("prometheus", "promtool") if shutil.which(c) is None]
    return (f"needs {', '.join(missing)} (make setup installs prometheus)" if missing
            else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def query(self, promql: str) -> list[dict]:
        """The instant query's result vector."""
        with urllib.request.urlopen(f"{self.url}/api/v1/query?"
                                    + urllib.parse.urlencode({"query": promql}),
                                    timeout=10) as reply:
            said = json.loads(reply.read())
        assert said["status"] == "success", said
        return said["data"]["result"]

    def value(self, promql: str) -> float | None:
        """The query's one value, or None where it has none."""
        result = self.query(promql)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, promql: str, timeout: float = READY_S) -> float:
        """Until the query has a value (the first scrapes are queryable after ~6 s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.value(promql)
            if found is not None:
                return found
            time.sleep(0.5)
        raise AssertionError(f"no value for {promql} after {timeout:.0f} s")


@contextlib.contextmanager
def prometheus_scraping(targets: list[str], folder: Path):
    """Prometheus on 127.0.0.1, scraping `targets` (host:port) every second."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                      "scrape_configs:\n  - job_name: lossbed\n    static_configs:\n"
                      f"      - targets: {json.dumps(targets)}\n")
    port = free_port()
    log = open(folder / "prometheus.log", "wb")  # noqa: SIM115 (the server's, closed below)
    proc = subprocess.Popen(["prometheus", f"--config.file={config}",
                             f"--storage.tsdb.path={folder / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, \
                (folder / "prometheus.log").read_text()[-3000:]
            time.sleep(0.2)
        yield Prometheus(url)
    finally:
        _stop(proc, log)


def _stop(proc: subprocess.Popen, log) -> None:
    """A server of the tests': asked to stop, killed if it will not, its log closed."""
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


PUSHGATEWAY = "prometheus-pushgateway"  # (Debian's name for it)


def pushgateway_available() -> str | None:
    return (None if shutil.which(PUSHGATEWAY) else
            f"needs {PUSHGATEWAY} (make setup installs it)")


@contextlib.contextmanager
def pushgateway(folder: Path, netns: str | None = None):
    """Prometheus' Pushgateway on 127.0.0.1 (of the network namespace `netns`, where given:
    where the pushing command runs), yielding its URL and a reader of what it holds
    (its /metrics, read from inside that namespace too)."""
    folder.mkdir(parents=True, exist_ok=True)
    inside = ["ip", "netns", "exec", netns] if netns else []
    port = free_port()  # (free here; a fresh namespace has nothing on its ports either)
    url = f"http://127.0.0.1:{port}"
    log = open(folder / "pushgateway.log", "wb")  # noqa: SIM115 (the server's, closed below)
    proc = subprocess.Popen([*inside, PUSHGATEWAY, f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def held() -> str:
        read = subprocess.run(
            [*inside, "python3", "-c", "import sys, urllib.request; sys.stdout.write("
             f"urllib.request.urlopen('{url}/metrics', timeout=5).read().decode())"],
            capture_output=True, text=True, timeout=30)
        if read.returncode != 0:
            raise OSError(read.stderr.strip())
        return read.stdout

    try:
        deadline = time.monotonic() + READY_S
        while True:
            try:
                held()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, \
                    (folder / "pushgateway.log").read_text()[-3000:]
                time.sleep(0.2)
        yield url, held
    finally:
        _stop(proc, log)
