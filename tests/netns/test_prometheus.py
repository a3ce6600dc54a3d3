"""The impairment and the run, live in a real Prometheus (#70): Debian's server on loopback
scrapes `lossbed run --metrics-port` every second during a short run under 10% loss; what
it stored agrees with what the run's summary (verify's measurements, the coverage) says,
and what lossbed serves passes `promtool check metrics`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.helpers import REPO, unique_name
from tests.prometheus_server import available, free_port, prometheus_scraping

pytestmark = pytest.mark.skipif(available() is not None, reason=f"{available()}")

LOSS = 0.1
WINDOW = "[10m]"


@pytest.fixture(scope="module")
def cluster():
    from testbed import clusters
    from testbed.clusters import netns as netns_cluster
    from tests.helpers import NOTHING, leftovers

    name = unique_name()
    made = netns_cluster.up(netns_cluster.ClusterSpec(hosts=2, name=name))
    yield made
    clusters.down(name)
    assert leftovers(name) == NOTHING


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return reply.read().decode()


def test_prometheus_sees_the_drop_ratio_and_coverage_the_run_reports(cluster, tmp_path):
    port = free_port()
    out = tmp_path / "run"
    with prometheus_scraping([f"127.0.0.1:{port}"], tmp_path / "prometheus") as prometheus:
        run = subprocess.Popen(
            [sys.executable, "-m", "harness.cli", "run", "--cluster", cluster.name,
             "--profile", "random-loss", "--loss", str(LOSS), "--out", str(out),
             "--metrics-port", str(port), "--", "torchrun",
             str(REPO / "examples/plain_pytorch.py"), "--variant", "unbiased", "--steps",
             "400"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # what lossbed serves while the profile is on passes Prometheus' own check
            deadline = time.monotonic() + 120
            served = ""
            while "lossbed_impairment_applied{" not in served or \
                    'lossbed_impairment_applied{cluster="' + cluster.name + '"} 1.0' \
                    not in served or "lossbed_run_collective_seconds_count" not in served:
                assert run.poll() is None and time.monotonic() < deadline, run.communicate()
                time.sleep(0.5)
                try:
                    served = scrape(port)
                except OSError:
                    served = ""
            checked = subprocess.run(["promtool", "check", "metrics"], input=served,
                                     capture_output=True, text=True, timeout=30)
            assert checked.returncode == 0, checked.stdout + checked.stderr + served
            prometheus.wait_for("lossbed_impairment_applied == 1", timeout=60)
            said, err = run.communicate(timeout=600)
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode == 0, err[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        dropped = prometheus.value(
            f"sum(max_over_time(lossbed_impairment_dropped_packets_total{WINDOW}))")
        seen = prometheus.value(f"sum(max_over_time(lossbed_impairment_packets_total{WINDOW}))")
        dropped_bytes = prometheus.value(
            f"sum(max_over_time(lossbed_impairment_dropped_bytes_total{WINDOW}))")
        seen_bytes = prometheus.value(
            f"sum(max_over_time(lossbed_impairment_seen_bytes_total{WINDOW}))")
        covered = prometheus.value(f"last_over_time(lossbed_impairment_coverage_ratio{WINDOW})")
        missing = prometheus.value(f"last_over_time(lossbed_run_missing_ratio{WINDOW})")
        steps = prometheus.value(f"max_over_time(lossbed_run_step{WINDOW})")
        tokens_per_s = prometheus.value(
            f"max_over_time(lossbed_run_tokens_per_second{WINDOW})")
        calls = prometheus.value(
            f"max_over_time(lossbed_run_collective_seconds_count{WINDOW})")
        target = prometheus.value(
            f"max(last_over_time(lossbed_impairment_configured_loss_ratio{WINDOW}))")
    # the drop ratio over the run, as Prometheus stored it, is verify's measured loss
    assert seen and abs(dropped / seen - summary["measured_loss"]) < 0.005, (
        dropped, seen, summary["measured_loss"])
    # the bytes it dropped, as a share of those it saw: the same loss, counted in bytes
    assert seen_bytes and abs(dropped_bytes / seen_bytes - dropped / seen) < 0.02, (
        dropped_bytes, seen_bytes)
    assert abs(covered - summary["coverage"]["fraction"]) < 0.01, (covered, summary["coverage"])
    assert target == pytest.approx(LOSS)
    assert 0 < steps <= summary["steps"] and calls > 0
    # the script reports its tokens as it goes: served live, as the summary divides them
    assert 0 < tokens_per_s < 3 * summary["tokens_per_s"], (tokens_per_s, summary)
    assert abs(missing - summary["missing_fraction"]) < 0.03, (missing, summary)
    assert f"[metrics] on http://127.0.0.1:{port}/metrics" in err


def test_a_port_in_use_is_refused_before_anything_is_impaired(cluster, tmp_path):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "harness.cli", "run", "--cluster", cluster.name,
             "--profile", "random-loss", "--loss", str(LOSS), "--out", str(tmp_path / "x"),
             "--metrics-port", str(port), "--", "torchrun",
             str(REPO / "examples/plain_pytorch.py")], capture_output=True, text=True,
            timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"--metrics-port: 127.0.0.1:{port} is in use" in done.stderr
    assert "applied" not in done.stderr  # nothing was impaired, no rank started
    from testbed.impair import engine

    assert engine.read_record(cluster) is None
