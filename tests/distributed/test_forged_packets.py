"""An on-path attacker during a real training run on namespace hosts (issue 19).

Three hosts train for 30 steps; a fourth process in h3's namespace (tests/injector.py)
reads the job's datagrams that reach h3, learns the nonce and the endpoints of h1 and h2
from them, and sends h1 forged datagrams with h2's address and port: poisoned values and
NaN for the next step, end markers, fragment bombs, far-future packets; h2's genuine
datagrams to h3 redirected unchanged to h1; and replays of them to h3 itself. The run must
come out as the same run without the attacker: the same perplexity, no packet lost, no
memory grown, every forgery counted unauthenticated and every redirect misdirected.

The control: the same attack on the same run unsealed (its profile isolated: no key)
changes its perplexity, so the sealed run's equality is the MAC's doing, not an attack that
missed. (Until the injector addressed its forgeries to the target, the control left the
perplexity exactly as it was: its forgeries, copied from datagrams to the observer, were
refused as another rank's, with or without the key.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.train import run
from harness.train.config import TrainConfig
from testbed import clusters
from testbed.clusters import netns as netns_cluster
from tests.helpers import REPO, unique_name
from tests.injector import FORGED_TTL, REDIRECT_TTL

pytestmark = [pytest.mark.netns, pytest.mark.slow]

# ppl of two runs of the same launch configuration differ by ~5e-8 (relative: the order in
# which packets are summed); the poisoned run of the issue moved it by 4%.
SAME_RUN_TOLERANCE = 1e-5
MEMORY_BOUND_MB = 64  # what rank 0 may hold more than in the run without the attacker
FORGED_PER_ROUND = 36  # to the target in one round of tests/injector.py: 20 + 1 + 12 + 2 + 1
REDIRECTED_PER_ROUND = 10
# The unsealed control must move perplexity by far more than two runs of one launch differ
# (~5e-8) and than the sealed run may (SAME_RUN_TOLERANCE): ten times the latter. How far
# it moves depends on how many forgeries win the race against the genuine datagrams: 1.9%
# in one run here (561.82 -> 572.30), 0.057% in a full suite on 2 cores (561.82 -> 561.51,
# 86 datagrams cut off by forged end markers), which failed the 1e-3 this once was.
CONTROL_MOVES_AT_LEAST = 10 * SAME_RUN_TOLERANCE


COUNTER_TABLE = "lossbedtestforged"


def nft(host, command: str) -> str:
    """nft in a host's namespace (one this test's cluster made)."""
    return subprocess.run(host.exec_argv(["nft", *command.split()]), check=True,
                          capture_output=True, text=True).stdout


def arrivals(host, ttl: int) -> int:
    """Datagrams with this IP TTL that reached the host (the injector's: FORGED_TTL for the
    forgeries, REDIRECT_TTL for the redirected genuine ones)."""
    listed = json.loads(nft(host, f"-j list table ip {COUNTER_TABLE}"))
    return sum(item["rule"]["expr"][-1]["counter"]["packets"] for item in listed["nftables"]
               if "rule" in item and item["rule"].get("comment") == f"ttl{ttl}")


def attack(cluster, run_under_attack) -> tuple[dict, dict]:
    """(the run's record, the injector's report) of run_under_attack() with the injector
    on h3 attacking h1 as h2."""
    target, peer, observer = cluster.hosts
    injector = observer.popen([sys.executable, "-m", "tests.injector", observer.ifname,
                               target.address, peer.address, "20"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        attacked = run_under_attack()
        out, err = injector.communicate(timeout=120)
    finally:
        injector.kill()
    assert injector.returncode == 0, err[-2000:]
    return attacked, json.loads(out.strip().splitlines()[-1])


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
    temporary = set(Path(tempfile.gettempdir()).glob("lossbed-train-*"))
    clean = run.train_runs(cluster, [run.Run(cfg, "clean")], echo=lambda _: None)[0]
    # no --out: the ranks' files went to a temporary folder of the run's, removed with it
    assert set(Path(tempfile.gettempdir()).glob("lossbed-train-*")) == temporary
    assert clean["work_dir"] is None
    target = cluster.hosts[0]
    # what reaches the target from the injector (its datagrams' TTL), counted by its kernel
    nft(target, f"add table ip {COUNTER_TABLE}")
    nft(target, f"add chain ip {COUNTER_TABLE} pre {{ type filter hook prerouting priority "
                "-300; }")
    for ttl in (FORGED_TTL, REDIRECT_TTL):
        nft(target, f"add rule ip {COUNTER_TABLE} pre ip ttl {ttl} counter comment ttl{ttl}")
    attacked, report = attack(cluster, lambda: run.train_runs(
        cluster, [run.Run(cfg, "clean")], echo=lambda _: None)[0])
    sent = report["sent"]
    assert report["rounds"] == 20 and min(sent.values()) > 0, report
    assert attacked["ppl"] == pytest.approx(clean["ppl"], rel=SAME_RUN_TOLERANCE)
    assert attacked["ppl_rank0"] == pytest.approx(clean["ppl_rank0"], rel=SAME_RUN_TOLERANCE)
    assert clean["packets_lost"] == 0 and attacked["packets_lost"] == 0
    counters = attacked["transport_counters"]
    # Every forgery h1 read was refused for its tag, every redirect for its destination,
    # and no genuine datagram was. (Not all sent always arrive: veth's backlog drops some
    # of a burst, as it would drop any packet; the kernel of h1 counts those that came.
    # And a round is set off by the peer's datagrams, so the last one or two can reach h1
    # after its last step's receive, when nothing reads the socket any more: under the
    # full suite's load, 44 of 720 once stayed unread. Unread, they changed nothing: the
    # run is the same.)
    forged, redirected = arrivals(target, FORGED_TTL), arrivals(target, REDIRECT_TTL)
    assert 0.8 * report["forged"] <= forged <= report["forged"], report
    assert 0.8 * report["redirected"] <= redirected <= report["redirected"], report
    unauthenticated = counters.get("unauthenticated", 0)
    assert forged - 2 * FORGED_PER_ROUND <= unauthenticated <= forged, (forged, counters)
    misdirected = counters.get("misdirected", 0)
    assert redirected - 2 * REDIRECTED_PER_ROUND <= misdirected <= redirected, \
        (redirected, counters)
    assert not counters.get("nonfinite") and not counters.get("malformed"), counters
    assert attacked["authenticated"] and clean["authenticated"]
    assert clean["wire_warning"] is None and "unauthenticated" in attacked["wire_warning"]
    grown = attacked["rank_max_rss_mb"][0] - clean["rank_max_rss_mb"][0]
    assert grown < MEMORY_BOUND_MB, (attacked["rank_max_rss_mb"], clean["rank_max_rss_mb"])

    # The control: the same attack without the key (the MAC mutated away) is applied
    unsealed, report = attack(cluster, lambda: run.train_runs(
        cluster, [run.Run(cfg, "clean", ("isolated=true",))], echo=lambda _: None)[0])
    assert not unsealed["authenticated"] and report["rounds"] == 20, report
    # Taken, the forgeries either moved perplexity or cut genuine data off (packets lost
    # on a link that drops none; the sealed runs above lost none): in a full suite on 2
    # cores one run cut 1358 datagrams off and moved perplexity by only 3.5e-5
    moved = abs(unsealed["ppl"] / clean["ppl"] - 1)
    assert moved > CONTROL_MOVES_AT_LEAST or unsealed["packets_lost"] > 0, (
        unsealed["ppl"], clean["ppl"], unsealed["transport_counters"])
