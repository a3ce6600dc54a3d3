"""With UDP segmentation offload on, loss still hits single datagrams: the kernel cuts each
send into datagrams before the receiver's ingress, where the impairment sees them one by one.

Two namespace hosts at MTU 9000 (7 datagrams per send), random loss at 5% (bpf backend)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from harness import launch
from testbed import clusters, profiles
from testbed.clusters import netns as netns_cluster
from testbed.impair import engine, verify
from tests.helpers import unique_name

pytestmark = [pytest.mark.netns, pytest.mark.slow]

UNITS, BURST = 7000, 70  # 100 calls of 70 packets: 10 sends of 7 datagrams each
P = 0.05


@pytest.fixture(scope="module")
def pair():
    c = netns_cluster.up(netns_cluster.ClusterSpec(hosts=2, name=unique_name(), mtu=9000))
    yield c
    clusters.down(c.name)


def test_segmented_sends_lose_single_datagrams_at_the_receivers_ingress(pair):
    profile = profiles.load("random-loss", [f"loss_pct={P * 100}"])
    told = launch.rank_settings(profile)
    assert told == {"segmentation": True}  # ingress: segmentation is allowed
    the_plan, choice = engine.make_plan(pair, profile)
    engine.apply(pair, the_plan, choice)
    try:
        results = launch.run(pair, "tests.distributed.workers",
                             ["segmented", str(UNITS), str(BURST)], timeout_s=300,
                             told=told)
        report = verify.verify(pair)
    finally:
        engine.clear(pair)
    bad = [r for r in results if r.returncode]
    assert not bad, launch.failure_report(bad, "the workers")
    out = json.loads(results[0].stdout.strip().splitlines()[-1])
    sender = out["sender"]
    assert sender["packets_sent"] == UNITS
    assert sender["segmented_sends"] == UNITS // 7  # every send carried 7 datagrams

    # The receiver's ingress saw every datagram (not one super-packet per send) ...
    path = next(p for p in report.paths
                if p.host == pair.hosts[0].name and p.path.startswith(pair.hosts[1].name))
    assert path.seen_packets >= UNITS
    assert not path.superpackets and path.mean_packet_bytes <= pair.mtu

    # ... and lost them independently: at rate P, and a lost datagram's neighbour in the
    # same send is lost with probability P too. Had whole sends been lost, it would be 1.
    arrived = np.zeros(UNITS, dtype=bool)
    arrived[out["arrived"]] = True
    lost = ~arrived
    assert out["intact"] == int(arrived.sum())
    rate = lost.mean()
    assert abs(rate - P) <= 4 * math.sqrt(P * (1 - P) / UNITS), rate
    same_send = (np.arange(UNITS - 1) % 7) != 6  # k and k+1 went in the same send
    first_lost = lost[:-1] & same_send
    neighbour_lost = (lost[1:] & first_lost).sum() / max(1, first_lost.sum())
    # ~300 lost datagrams with a neighbour in their send: P=0.05 gives ~15 of them, with a
    # standard deviation of ~4; 0.2 is more than 10 deviations above and far below 1
    assert neighbour_lost < 0.2, neighbour_lost

