"""Emulated RoCE semantics on namespace hosts, under real kernel loss (bpf backend)."""

from __future__ import annotations

import json
import math

import pytest

from harness import launch
from testbed import clusters, profiles
from testbed.clusters import netns as netns_cluster
from testbed.impair import engine
from tests.helpers import unique_name

pytestmark = [pytest.mark.netns, pytest.mark.slow]


@pytest.fixture(scope="module")
def pair():
    """Two hosts at MTU 9000: RoCE's 4096-byte packets fit in one datagram."""
    c = netns_cluster.up(netns_cluster.ClusterSpec(hosts=2, name=unique_name(), mtu=9000))
    yield c
    clusters.down(c.name)


def transfer(cluster, names, units, unit_bytes, loss_pct):
    if loss_pct:
        the_plan, choice = engine.make_plan(cluster, profiles.load(
            "random-loss", [f"loss_pct={loss_pct}"]))
        engine.apply(cluster, the_plan, choice)
    try:
        results = launch.run(cluster, "tests.distributed.workers",
                             ["semantics", ",".join(names), str(units), str(unit_bytes)],
                             timeout_s=600)
    finally:
        engine.clear(cluster)
    bad = [r for r in results if r.returncode]
    assert not bad, launch.failure_report(bad, "the workers")
    return json.loads(results[0].stdout.strip().splitlines()[-1])


def within(measured: int, n: int, p: float, sigmas: float = 4.0) -> bool:
    return abs(measured / n - p) <= sigmas * math.sqrt(p * (1 - p) / n)


def test_uc_loses_whole_messages(pair):
    p = 0.05
    uc = transfer(pair, ["roce-uc:65536"], 800, 65536, 5)["roce-uc:65536"]
    assert uc["fragments_per_unit"] == 16  # 64 KiB in 4096-byte packets
    k = uc["fragments_per_unit"]
    expected_uc = 1 - (1 - p) ** k  # 0.56
    lost_uc = uc["units"] - uc["arrived"]
    # 4-sigma binomial bound over 800 messages: odds of a false failure ~6e-5
    assert within(lost_uc, uc["units"], expected_uc), (lost_uc, expected_uc)
    assert uc["intact"] == uc["arrived"]  # nothing partial was ever delivered


def test_ud_loss_is_the_packet_loss(pair):
    out = transfer(pair, ["roce-ud"], 4000, 4096, 5)["roce-ud"]
    assert out["fragments_per_unit"] == 1
    assert within(out["units"] - out["arrived"], out["units"], 0.05), out
    assert out["intact"] == out["arrived"]


def test_rc_delivers_everything_in_order_and_slower_with_more_loss(pair):
    seconds = {}
    for loss_pct in (0, 2, 10):
        out = transfer(pair, ["roce-rc:65536"], 200, 65536, loss_pct)["roce-rc:65536"]
        assert out["arrived"] == out["units"] == out["intact"], out
        assert out["in_order"]
        if loss_pct:
            assert out["counters"]["naks_sent"] > 0  # gaps were seen and asked for again
        seconds[loss_pct] = out["seconds"]
    assert seconds[0] < seconds[2] < seconds[10], seconds


def test_verbs_without_an_rdma_device_names_what_is_missing(pair):
    from tests.helpers import lossbed

    result = lossbed("train", "--cluster", pair.name, "--transport", "verbs", "--steps", "1")
    assert result.returncode == 3, result.stderr
    assert "--transport verbs" in result.stderr and "no RDMA device" in result.stderr
    assert "--kind vm --rdma" in result.stderr
    assert engine.read_record(pair) is None  # nothing was applied


@pytest.mark.parametrize("transport,loss_pct", [("roce-ud", 0), ("roce-uc:65536", 0),
                                                 ("roce-rc:65536", 0), ("roce-rc:65536", 10)])
def test_lossy_collectives_over_roce_semantics_match_torch_allreduce(pair, transport,
                                                                     loss_pct):
    """At 0% loss every semantics gives torch's result; RC gives it under 10% loss too."""
    if loss_pct:
        the_plan, choice = engine.make_plan(pair, profiles.load(
            "random-loss", [f"loss_pct={loss_pct}"]))
        engine.apply(pair, the_plan, choice)
    try:
        results = launch.run(pair, "tests.distributed.workers", ["exact"], timeout_s=600,
                             told={"transport": transport})
    finally:
        engine.clear(pair)
    bad = [r for r in results if r.returncode]
    assert not bad, launch.failure_report(bad, "the workers")
    result = json.loads(results[0].stdout.strip().splitlines()[-1])
    worst = max(result["errors"].items(), key=lambda kv: kv[1])
    assert worst[1] <= 1e-6, worst
    assert result["counters"]["missing"] == 0
    if loss_pct:
        assert result["counters"]["naks_sent"] + result["counters"]["timeouts"] > 0
