"""The pieces of the Prometheus endpoint that need no cluster (#70): the ranks' live marks
into the controller, the collective's histogram in Prometheus' buckets, the run's figures,
the endpoint's safety (loopback by default, a port in use refused by name). The real
Prometheus is tests/netns/test_prometheus.py."""

from __future__ import annotations

import io
import random
import shutil
import socket
import subprocess
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from harness import rank_protocol
from harness.job_output import Job
from harness.live_metrics import RunCollector
from harness.metrics.hdr import Histogram
from harness.rank_protocol import COLLECTIVE_BUCKETS_S, Live, Progress
from testbed.errors import UsageError
from testbed.exporter import server


def test_the_histogram_counts_at_or_below_each_bucket_as_a_sorted_list_does():
    rng = random.Random(1)
    values = [rng.lognormvariate(8, 1.5) for _ in range(5000)]  # µs, 1 ms around the middle
    h = Histogram()
    for v in values:
        h.record(v)
    bounds = [b * 1e6 for b in COLLECTIVE_BUCKETS_S]
    counted = h.counts_at_or_below(bounds)
    for bound, n in zip(bounds, counted, strict=True):
        exact = sum(v <= bound for v in values)
        near = sum(v <= bound * 1.01 for v in values) - sum(v <= bound * 0.99 for v in values)
        assert abs(n - exact) <= near, (bound, n, exact)  # (the buckets' 1% precision)
    assert counted == sorted(counted) and counted[-1] <= len(values)
    assert h.sum() == pytest.approx(sum(values), rel=0.01)


def live(rank: int, step: int = 5, received: int = 90, missing: int = 10) -> Live:
    buckets = [0] * 5 + [3] * (len(COLLECTIVE_BUCKETS_S) - 5)
    return Live(rank=rank, step=step, buckets=buckets, count=3, sum_s=0.03,
                received=received, missing=missing)


def test_a_ranks_live_mark_goes_to_the_collector_and_not_to_the_output():
    taken, out = [], io.StringIO()
    job = Job(logs=None, live=taken.append)
    job.take(live(1).line(), out)
    job.take("the script's own line", out)
    assert taken == [live(1)] and out.getvalue() == "the script's own line\n"
    # a mark of another shape is the script's output, passed through
    job.take(rank_protocol.mark(rank_protocol.LIVE_MARK, {"rank": 0}), out)
    assert "lossbed_live" in out.getvalue() and len(taken) == 1


def served(*collectors) -> str:
    registry = CollectorRegistry(auto_describe=False)
    for c in collectors:
        registry.register(c)
    return generate_latest(registry).decode()


def test_the_runs_figures_sum_the_ranks_as_the_summary_does():
    run = RunCollector("job-1")
    run.take_live(live(0, step=7, received=90, missing=10))
    run.take_live(live(1, step=6, received=80, missing=20))
    run.take_live(live(1, step=8, received=180, missing=20))  # (a rank's newer mark wins)
    text = served(run)
    assert 'lossbed_run_step{job="job-1"} 7.0' in text  # rank 0's
    assert 'lossbed_run_missing_ratio{job="job-1"} 0.1' in text  # 30 of 300
    assert 'lossbed_run_collective_seconds_count{job="job-1"} 6.0' in text
    assert 'lossbed_run_collective_seconds_bucket{job="job-1",le="0.02"} 6.0' in text
    assert 'lossbed_run_collective_seconds_bucket{job="job-1",le="0.01"} 0.0' in text
    assert "lossbed_run_tokens_per_second" not in text  # (no report of tokens: not served)
    run.take_progress(Progress(run=0, runs=1, variant="unbiased", seed=0, step=12, steps=50,
                               loss=3.0, tokens_per_s=1234.0, eta_s=9.0))
    run.take_verdicts([{"variant": "rps", "loss": 0.05, "verdict": "does not hold",
                        "verdict_withheld": False, "ppl_delta_pct": -2.0}])
    text = served(run)
    assert 'lossbed_run_step{job="job-1"} 12.0' in text
    assert 'lossbed_run_tokens_per_second{job="job-1"} 1234.0' in text
    assert ('lossbed_bench_verdict{job="job-1",loss="0.05",variant="rps",verdict="does not '
            'hold"} 1.0' in text)


def test_a_scripts_tokens_so_far_are_served_as_the_summary_divides_them():
    run = RunCollector("job-2")
    run.take_live(live(1))
    run.take_live(Live(**{**live(0).__dict__, "train_s": 4.0, "tokens": None}))
    assert "lossbed_run_tokens_per_second" not in served(run)  # none reported yet
    # rank 0's tokens so far over the longest a rank has run (the summary's train_s)
    run.take_live(Live(**{**live(0).__dict__, "train_s": 4.0, "tokens": 1000}))
    run.take_live(Live(**{**live(1).__dict__, "train_s": 5.0}))
    assert 'lossbed_run_tokens_per_second{job="job-2"} 200.0' in served(run)
    # a rank's mark, as the rank prints it, comes back whole (and one without them: older)
    said = Live.of(0, 3, Histogram(), {"packets_received": 9, "missing": 1}, 2.5, 640)
    assert Live.from_payload(rank_protocol.read_mark(said.line())[1]) == said
    assert Live.from_payload({k: v for k, v in said.__dict__.items()
                              if k not in ("train_s", "tokens")}).tokens is None


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (make setup)")
def test_what_the_run_serves_passes_promtool():
    run = RunCollector("job-1")
    run.take_live(live(0))
    run.take_progress(Progress(run=0, runs=1, variant="unbiased", seed=0, step=12, steps=50,
                               loss=3.0, tokens_per_s=1234.0, eta_s=9.0))
    checked = subprocess.run(["promtool", "check", "metrics"], input=served(run),
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_endpoint_binds_loopback_serves_metrics_and_refuses_a_port_in_use():
    endpoint = server.start([RunCollector("j")], 0)
    try:
        assert endpoint.address == "127.0.0.1" and endpoint.port > 0
        with urllib.request.urlopen(endpoint.url, timeout=5) as reply:
            assert "lossbed_run_step" in reply.read().decode()
        with pytest.raises(UsageError, match=f"--metrics-port: 127.0.0.1:{endpoint.port} is "
                                             "in use"):
            server.start([RunCollector("j")], endpoint.port)
    finally:
        endpoint.stop()
    with socket.socket() as probe:  # stopped: nothing listens there any more
        assert probe.connect_ex(("127.0.0.1", endpoint.port)) != 0


@pytest.mark.parametrize(("port", "address", "said"), [
    (70000, "127.0.0.1", "--metrics-port: 70000 is not a port"),
    (-1, "127.0.0.1", "--metrics-port: -1 is not a port"),
    (0, "localhost", "--metrics-address: 'localhost' is not an IP address"),
])
def test_a_bad_port_or_address_is_refused_by_name(port, address, said):
    with pytest.raises(UsageError) as err:
        server.start([], port, address)
    assert said in str(err.value)


def test_a_benchs_verdicts_are_pushed_to_a_pushgateway_and_a_failed_push_is_said():
    import http.server
    import threading

    from harness.live_metrics import push

    got = {}

    class Gateway(http.server.BaseHTTPRequestHandler):
        def do_PUT(self):  # (push_to_gateway replaces the group: PUT)
            got["path"] = self.path
            got["body"] = self.rfile.read(int(self.headers["Content-Length"])).decode()
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    gateway = http.server.HTTPServer(("127.0.0.1", 0), Gateway)
    thread = threading.Thread(target=gateway.serve_forever, daemon=True)
    thread.start()
    said = []
    answer = RunCollector("bench-x")
    answer.take_verdicts([
        {"variant": "rps", "loss": 0.1, "verdict": "holds", "verdict_withheld": False,
         "ppl_delta_pct": 1.5},
        {"variant": "unbiased", "loss": 0.1, "verdict": "inconclusive",
         "verdict_withheld": True, "ppl_delta_pct": None}])
    try:
        assert push(f"http://127.0.0.1:{gateway.server_port}", answer, "bench-x", said.append)
    finally:
        gateway.shutdown()
        gateway.server_close()
        thread.join(5)
    assert got["path"] == "/metrics/job/lossbed/run/bench-x"
    assert ('lossbed_bench_verdict{job="bench-x",loss="0.1",variant="rps",verdict="holds"} 1.0'
            in got["body"])
    assert 'variant="unbiased",verdict="withheld"} 1.0' in got["body"]
    assert 'lossbed_bench_ppl_delta_ratio{job="bench-x",loss="0.1",variant="rps"} 0.015' \
        in got["body"]
    # nobody there: said, and the bench's results stay (push returns False, raises nothing)
    assert not push(f"http://127.0.0.1:{gateway.server_port}", answer, "bench-x", said.append)
    assert "[metrics] could not push to http://127.0.0.1:" in said[-1]


def test_the_dashboard_asks_only_for_what_lossbed_serves():
    import json
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    sources = (repo / "testbed/exporter/impairment.py").read_text() + \
        (repo / "harness/live_metrics.py").read_text()
    families = set(re.findall(r'MetricFamily\(\s*"(lossbed_[a-z_]+)"', sources))
    served = {f + suffix for f in families
              for suffix in ("", "_total", "_info", "_bucket", "_count", "_sum")}
    dashboard = json.loads((repo / "docs/guides/grafana-dashboard.json").read_text())
    asked = {name for panel in dashboard["panels"] for target in panel["targets"]
             for name in re.findall(r"lossbed_[a-z_]+", target["expr"])}
    assert asked and sorted(asked - served) == []
    # every family is on the dashboard
    shown = {re.sub(r"_(total|info|bucket|count|sum)$", "", n) for n in asked}
    assert sorted(families - shown) == []
