"""Soft-RoCE between VM hosts: real RDMA queue pairs (rxe) over the VMs' NICs, under real
netem loss. Its own module, so its VMs never run beside another module's (2 cores)."""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest

from testbed import profiles
from testbed.impair import engine

pytestmark = [pytest.mark.netns, pytest.mark.vm, pytest.mark.slow]
KEY = "5a" * 32  # the job key the ranks share (a launch draws a fresh one)


def verbs_transfer(cluster, qp: str, size: int, count: int, rate_mps: int = 0) -> dict:
    """h2 sends `count` messages of `size` bytes over a `qp` queue pair to h1 (real verbs)."""
    h1, h2 = cluster.hosts
    out = {}
    common = ["--qp", qp, "--size", str(size), "--count", str(count)]

    def receive():
        out["recv"] = h1.run(["/usr/bin/python3", "-m", "harness.verbs.transfer", "recv",
                              *common, "--address", h1.address], timeout=300)

    thread = threading.Thread(target=receive)
    thread.start()
    sent = h2.run(["/usr/bin/python3", "-m", "harness.verbs.transfer", "send", *common,
                   "--address", h2.address, "--to", h1.address, "--rate-mps", str(rate_mps)],
                  timeout=300)
    thread.join()
    assert sent.returncode == 0, sent.stderr.decode()[-2000:]
    assert out["recv"].returncode == 0, out["recv"].stderr.decode()[-2000:]
    return json.loads(out["recv"].stdout)


@pytest.fixture(scope="module")
def rdma_vms(vm_pair):
    return vm_pair  # (conftest.py: one pair for every VM module, Soft-RoCE on)


def test_soft_roce_ud_and_uc_complete_without_loss(rdma_vms):
    assert all(h["rdma"] and "rxe0" in h["rdma"] for h in rdma_vms.status()["hosts"])
    ud = verbs_transfer(rdma_vms, "ud", 1024, 500)
    uc = verbs_transfer(rdma_vms, "uc", 65536, 100)
    for result in (ud, uc):
        assert result["intact"] == result["sent"] and result["error_completions"] == 0, result


def test_under_loss_uc_loses_whole_messages_and_ud_single_packets(rdma_vms):
    """2% packet loss on RoCE's UDP: a 1 KiB UD message is one packet, a 64 KiB UC message
    is 64; UC loses a message when any of its packets is lost, and nothing partial is ever
    delivered (every completed message is intact)."""
    from testbed.impair import verify

    the_plan, choice = engine.make_plan(rdma_vms, profiles.load("random-loss", ["loss_pct=2"]))
    engine.apply(rdma_vms, the_plan, choice)
    try:
        start = verify.read(rdma_vms)
        ud = verbs_transfer(rdma_vms, "ud", 1024, 2000, rate_mps=2000)
        uc = verbs_transfer(rdma_vms, "uc", 65536, 300, rate_mps=100)
        covered = verify.measure_coverage(rdma_vms, verify.read(rdma_vms), start)
    finally:
        engine.clear(rdma_vms)
    # Soft-RoCE sends through eth0, where netem (through its IFB, not counted twice) sees
    # it: the queue pairs' traffic met the impairment, and rxe is no kernel bypass
    assert covered.enough and covered.fraction > 0.9, covered.to_dict()
    assert not [w for w in covered.elsewhere() if w.startswith("rdma ")], covered.elsewhere()
    ud_loss = ud["lost"] / ud["sent"]
    uc_loss = uc["lost"] / uc["sent"]
    # UD: about the packet loss (2%; 4 sd of 2,000 trials is 1.3 points, so below 3.5%).
    assert 0.005 <= ud_loss <= 0.035, ud
    # UC: at least the whole-message rate 1-(0.98)^64 = 73% minus 4 sd (300 trials: 10
    # points), and far above UD's.
    assert uc_loss >= 0.60, uc
    assert uc["completed"] == uc["intact"] and uc["error_completions"] == 0, uc
    assert ud["completed"] == ud["intact"], ud


def verbs_allreduce(cluster, transport: str, numel: int, steps: int = 2) -> list[dict]:
    """lossbed's lossy all-reduce (LossyCollective over the verbs transport, torch-free)
    between h1 (rank 0) and h2 (rank 1), over real queue pairs; each rank's report."""
    h1, h2 = cluster.hosts
    out = {}

    def rank(k, host):
        out[k] = host.run([sys.executable, "-m", "harness.verbs.collective", "--rank", str(k),
                           "--world", "2", "--address", host.address, "--store", h1.address,
                           "--transport", transport, "--numel", str(numel),
                           "--steps", str(steps), "--key", KEY], timeout=300)

    threads = [threading.Thread(target=rank, args=(k, h)) for k, h in enumerate(cluster.hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in (0, 1):
        assert out[k].returncode == 0, out[k].stderr.decode()[-2000:]
    return [json.loads(out[k].stdout) for k in (0, 1)]


def lost(reports: list[dict]) -> float:
    """The fraction of messages (data, not end markers) that never arrived, over all ranks
    and steps."""
    steps = [s for r in reports for s in r["steps"]]
    expected = sum(s["reduce_messages"] + s["broadcast_messages"] for s in steps)
    return sum(s["reduce_lost"] + s["broadcast_lost"] for s in steps) / expected


def test_lossy_allreduce_over_ud_uc_and_rc_queue_pairs_is_exact_without_loss(rdma_vms):
    for transport in ("verbs-ud", "verbs-uc:8192", "verbs-rc:8192"):
        reports = verbs_allreduce(rdma_vms, transport, numel=8000)
        for r in reports:
            assert r["counters"]["malformed"] == r["counters"]["foreign"] == 0, r
            # every message sealed with the job key and found good (harness.transport.auth)
            assert r["authenticated"] and r["counters"]["unauthenticated"] == 0, r
            for step in r["steps"]:
                assert step["reduce_messages"] > 0 and step["broadcast_messages"] > 0, r
                assert step["reduce_lost"] == step["broadcast_lost"] == 0, r
                assert step["exact"] and step["consistent"], r
        # UD's message is one packet of the path MTU (1024 B on a 1500-byte link)
        assert reports[0]["message_bytes"] == (1024 if transport == "verbs-ud" else 8192)


def test_lossy_allreduce_under_loss_ud_loses_packets_uc_whole_messages_rc_nothing(rdma_vms):
    """5% packet loss (netem): UD messages are one packet each, UC messages of 8 KiB are 8
    (a message is lost with 1-0.95^8 = 34%). Whatever was lost, every value on every rank is
    one the received-mean estimator may give for what arrived (nothing partial is ever
    used); over RC the device retransmits until the result is exact, and says so in its
    counters."""
    the_plan, choice = engine.make_plan(rdma_vms, profiles.load("random-loss", ["loss_pct=5"]))
    engine.apply(rdma_vms, the_plan, choice)
    try:
        ud = verbs_allreduce(rdma_vms, "verbs-ud", numel=40_000)
        uc = verbs_allreduce(rdma_vms, "verbs-uc:8192", numel=80_000)
        rc = verbs_allreduce(rdma_vms, "verbs-rc:8192", numel=40_000)
    finally:
        engine.clear(rdma_vms)

    for name, reports in (("UD 1 KiB", ud), ("UC 8 KiB", uc), ("RC 8 KiB", rc)):
        print(f"{name}: {lost(reports):.1%} of messages lost, "
              f"{max(r['seconds'] for r in reports):.2f} s, device: "
              f"{[r['device_counters'] for r in reports]}")
        for r in reports:  # per step (seconds, reduce lost, broadcast lost), and counters
            per_step = [(round(s["seconds"], 2), s["reduce_lost"], s["broadcast_lost"])
                        for s in r["steps"]]
            print(f"  rank {r['rank']}: steps {per_step} counters {r['counters']}")
    for r in ud + uc + rc:
        assert all(step["consistent"] for step in r["steps"]), r
    # UD: 680 messages (both ranks, 2 steps), 5% lost (4 sd: 1.7%-8.3%; the bounds leave
    # room for a few late ones); UC: 80 messages, 34% lost (4 sd:
    # 13%-55%). UC's upper bound is looser than 4 sd: Soft-RoCE loses more UC messages than
    # 1-(1-p)^8 (46% in one run at 4.3% packet loss; its receiver also drops the message
    # after one whose last packet was lost). That UC loses far more than UD is the point,
    # and it is asserted as such.
    # (It once came out at 15-18%: the first step's broadcast deadline, 0.25 s with nothing
    # learned, was shorter than an owner's reduce under TCG, and one rank lost a whole
    # first broadcast, 85 messages counted late. The first broadcast now waits at least 3x
    # the rank's own reduce: harness/collectives/deadline.py.)
    assert 0.004 < lost(ud) < 0.10, ud
    for r in ud:
        applied = r["counters"]["packets_received"] / r["counters"]["packets_sent"]
        assert 0.85 < applied < 0.996, r["counters"]
    assert 0.13 < lost(uc) < 0.75, uc
    assert lost(uc) > 2 * lost(ud), (uc, ud)
    assert lost(rc) == 0 and all(step["exact"] for r in rc for step in r["steps"]), rc
    # the device retransmitted what netem took: its requester saw NAKs or timeouts
    device = [r["device_counters"] for r in rc]
    assert sum(d.get("completer_retry_err", 0) + d.get("rcvd_seq_err", 0)
               for d in device) > 0, device


# torch and transformers import for ~100 s in a VM under TCG and a step takes ~20 s: this
# one test took 280-400 s, a quarter of CI's budget for the whole suite. The lossy
# collective over the same queue pairs is tested above; this end-to-end run is asked for.
@pytest.mark.skipif(not os.environ.get("LOSSBED_TEST_VM_TRAINING"),
                    reason="training in VMs takes 5-7 min under TCG: set "
                           "LOSSBED_TEST_VM_TRAINING=1 to run it")
def test_lossbed_train_over_real_uc_queue_pairs_under_netem_loss(rdma_vms, tmp_path):
    """`lossbed train --transport verbs-uc` end to end on the VM hosts: the ranks start in
    the VMs through their exec channels, the lossy collective runs over Soft-RoCE UC queue
    pairs while netem loses 5% of the packets, and the record comes back with perplexity,
    the messages lost whole, and the device's own counters. (torch takes about a minute to
    import under TCG: one short run.)"""
    from tests.helpers import lossbed

    out = tmp_path / "run.json"
    result = lossbed("train", "--cluster", rdma_vms.name, "--variant", "unbiased",
                     "--transport", "verbs-uc:16384", "--steps", "3", "--preset", "tiny",
                     "--batch", "2", "--seq-len", "32", "--eval-tokens", "256",
                     # (learning the BPE tokenizer under TCG took minutes: bytes need none)
                     "--tokenizer", "bytes",
                     "--profile", "random-loss", "--set", "loss_pct=5", "--json", str(out),
                     timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["variant"] == "unbiased@verbs-uc:16384" and len(rec["losses"]) == 3, rec
    from harness.train.config import TrainConfig
    from tests.helpers import untrained_ppl

    # 3 steps under loss still leave the model better than the one it started from
    assert 1 < rec["ppl"] < untrained_ppl(TrainConfig(**rec["config"])), rec
    # 16 KiB messages are 16 packets: at 5% packet loss most are lost whole, not all
    assert 0 < rec["packets_lost"] < rec["packets_sent"], rec
    assert 0.01 < rec["measured_loss"] < 0.12, rec
    device = rec["device_counters"]
    assert device.get("rdma_sends", 0) > 0 and device.get("rdma_recvs", 0) > 0, device
    assert engine.read_record(rdma_vms) is None  # the impairment was cleared
