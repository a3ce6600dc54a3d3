"""An on-path attacker during a real training run on namespace hosts (issue 19).

Three hosts train for 30 steps; a fourth process in h3's namespace (tests/injector.py)
reads the job's datagrams that reach h3, learns the nonce and the endpoints of h1 and h2
from them, and sends h1 forged datagrams with h2's address and port: poisoned values and
NaN for the next step, end markers, fragment bombs, far-future packets, and replays of
h2's genuine datagrams. The run must come out as the same run without the attacker: the
same perplexity, no packet lost, no memory grown, and every forgery counted.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.train import run
from harness.train.config import TrainConfig
from testbed import clusters
from testbed.clusters import netns as netns_cluster
from tests.helpers import REPO, unique_name
from tests.injector import FORGED_TTL

pytestmark = [pytest.mark.netns, pytest.mark.slow]

# ppl of two runs of the same launch configuration differ by ~5e-8 (relative: the order in
# which packets are summed); the poisoned run of the issue moved it by 4%.
SAME_RUN_TOLERANCE = 1e-5
MEMORY_BOUND_MB = 64  # what rank 0 may hold more than in the run without the attacker
FORGED_PER_ROUND = 36  # to the target in one round of tests/injector.py: 20 + 1 + 12 + 2 + 1


COUNTER_TABLE = "lossbedtestforged"


def nft(host, command: str) -> str:
    """nft in a host's namespace (one this test's cluster made)."""
    return subprocess.run(host.exec_argv(["nft", *command.split()]), check=True,
                          capture_output=True, text=True).stdout


def forged_arrivals(host) -> int:
    listed = json.loads(nft(host, f"-j list table ip {COUNTER_TABLE}"))
    return sum(item["rule"]["expr"][-1]["counter"]["packets"] for item in listed["nftables"]
               if "rule" in item)


@pytest.fixture(scope="module")
def cluster():
    c = netns_cluster.up(netns_cluster.ClusterSpec(hosts=3, name=unique_name()))
    yield c
    clusters.down(c.name)


def test_forged_datagrams_on_path_change_nothing_and_are_all_counted(cluster):
    # align_every=1: ranks start every step together, so no packet is lost to lateness and
    # packets_lost is 0 in both runs (the comparison is exact)
    cfg = TrainConfig(steps=30, batch=8, seq_len=64, log_every=100, variant="unbiased_drift",
                      align_every=1)
    clean = run.train_runs(cluster, [run.Run(cfg, "clean")], echo=lambda _: None)[0]
    target, peer, observer = cluster.hosts
    # what reaches the target from the injector (its datagrams' TTL), counted by its kernel
    nft(target, f"add table ip {COUNTER_TABLE}")
    nft(target, f"add chain ip {COUNTER_TABLE} pre {{ type filter hook prerouting priority "
                "-300; }")
    nft(target, f"add rule ip {COUNTER_TABLE} pre ip ttl {FORGED_TTL} counter")
    injector = observer.popen([sys.executable, "-m", "tests.injector", observer.ifname,
                               target.address, peer.address, "20"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        attacked = run.train_runs(cluster, [run.Run(cfg, "clean")], echo=lambda _: None)[0]
        out, err = injector.communicate(timeout=120)
    finally:
        injector.kill()
    assert injector.returncode == 0, err[-2000:]
    report = json.loads(out.strip().splitlines()[-1])
    sent = report["sent"]
    assert report["rounds"] == 20 and min(sent.values()) > 0, report
    assert attacked["ppl"] == pytest.approx(clean["ppl"], rel=SAME_RUN_TOLERANCE)
    assert attacked["ppl_rank0"] == pytest.approx(clean["ppl_rank0"], rel=SAME_RUN_TOLERANCE)
    assert clean["packets_lost"] == 0 and attacked["packets_lost"] == 0
    counters = attacked["transport_counters"]
    # Every forgery h1 read was refused for its tag, and no genuine datagram was. (Not all
    # 720 sent always arrive: veth's backlog drops some of a burst, as it would drop any
    # packet; the kernel of h1 counts those that came. And a round is set off by the
    # peer's datagrams, so the last one or two can reach h1 after its last step's
    # receive, when nothing reads the socket any more: under the full suite's load, 44 of
    # 720 once stayed unread. Unread, they changed nothing: the run is the same.)
    arrived = forged_arrivals(target)
    assert 0.8 * report["forged"] <= arrived <= report["forged"], report
    unauthenticated = counters.get("unauthenticated", 0)
    assert arrived - 2 * FORGED_PER_ROUND <= unauthenticated <= arrived, (arrived, counters)
    assert not counters.get("nonfinite") and not counters.get("malformed"), counters
    assert attacked["authenticated"] and clean["authenticated"]
    assert clean["wire_warning"] is None and "unauthenticated" in attacked["wire_warning"]
    grown = attacked["rank_max_rss_mb"][0] - clean["rank_max_rss_mb"][0]
    assert grown < MEMORY_BOUND_MB, (attacked["rank_max_rss_mb"], clean["rank_max_rss_mb"])
