"""`lossbed collective-bench` end to end on a small matrix."""

from __future__ import annotations

import json

import pytest

from testbed.clusters import netns as netns_cluster
from tests.helpers import lossbed

pytestmark = [pytest.mark.netns, pytest.mark.slow]

FIELDS = {"algorithm", "size_bytes", "profile", "loss", "measured_loss", "p50_ms", "p99_ms",
          "max_ms", "algbw_gbps", "hosts", "mtu", "align_every"}


def test_collective_bench_writes_every_field_for_every_run_and_cleans_up(tmp_path):
    out = tmp_path / "cb.jsonl"
    before = set(netns_cluster.leftover_clusters())
    # the sizes as nccl-tests takes them (-b/-e/-f): 64 KiB and 256 KiB
    result = lossbed("collective-bench", "--hosts", "2", "-b", "64K", "-e", "256K", "-f", "4",
                     "--loss", "0", "0.1", "--profiles", "random-loss", "--iters", "3",
                     "--json", str(out), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    algorithms = {"reliable", "zero_fill", "unbiased", "rescale", "rps"}
    assert {(r["profile"], r["algorithm"], r["size_bytes"]) for r in rows} == \
        {(p, a, s) for p in ("clean", "random-loss") for a in algorithms
         for s in (65536, 262144)}
    for row in rows:
        assert FIELDS <= set(row), FIELDS - set(row)
        assert row["hosts"] == 2 and row["mtu"] == 9000
        # nccl-tests' units: the mean iteration; busbw = algbw * 2(n-1)/n, 1 for 2 ranks
        nccl = row["nccl"]
        assert nccl["size"] == row["size_bytes"] and nccl["count"] == row["size_bytes"] // 4
        assert nccl["algbw"] == pytest.approx(row["size_bytes"] / (row["mean_ms"] / 1e3) / 1e9)
        assert nccl["busbw"] == pytest.approx(nccl["algbw"])
        assert nccl["loss"] == row["measured_loss"]
        assert nccl["missing"] == row["missing_fraction"]
        assert row["align_every"] == 0  # the lossy collective as training runs it
    for row in rows:  # rank 0's stages that ended at their deadline, lossy ones only
        if row["algorithm"] == "reliable":
            assert row["deadlines_hit"] is None
        else:
            assert set(row["deadlines_hit"]) == {"reduce", "broadcast"}, row
            assert all(n >= 0 for n in row["deadlines_hit"].values()), row
    lossy = [r for r in rows if r["profile"] == "random-loss"]
    assert all(0.05 < r["measured_loss"] < 0.15 for r in lossy)  # the kernel applied ~10%
    assert "p99/rel" in result.stdout and "raw UDP rate" in result.stdout
    assert "dl r/b" in result.stdout
    for algorithm in algorithms:  # nccl-tests' table: a block per algorithm and case
        for case in ("clean at 0%", "random-loss at 10%"):
            assert f"# all-reduce {algorithm}, 2 ranks, {case} (measured " in result.stdout
    assert result.stdout.count("#        (B)   (elements)") == 10
    assert set(netns_cluster.leftover_clusters()) == before  # its own cluster is gone


def test_collective_bench_rows_whose_traffic_missed_the_impairment_exit_5(tmp_path):
    """collective-bench exits 5 where its rows are no result (#71: only run was tested): a
    profile of the user's whose match leaves the lossy collectives' UDP out."""
    profile = tmp_path / "udp-spared.yaml"
    profile.write_text("impairment:\n  loss: {model: bernoulli, loss_pct: 1}\n"
                       "match:\n  exclude: [{protocol: udp}]\n")
    before = set(netns_cluster.leftover_clusters())
    result = lossbed("collective-bench", "--hosts", "2", "--sizes", "0.25", "--loss", "0.1",
                     "--profiles", str(profile), "--algorithms", "unbiased", "--iters", "2",
                     timeout=600)
    assert result.returncode == 5, result.stderr[-3000:]
    assert "no result" in result.stderr
    assert set(netns_cluster.leftover_clusters()) == before
