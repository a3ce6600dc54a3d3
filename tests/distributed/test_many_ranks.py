"""The many-rank mode's collective (harness/scale/memory.py) held to the real one: the same
seeded drop mask over the UDP transport on loopback (harness/collectives/lossy.py, three rank
threads with their deadlines) and in memory give the same results, step by step, for RPS's
averaging and bounded drift's sharded update (#58). The two sum what arrived in different
orders (arrival order, source order), so they agree to float32 rounding."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.collectives.lossy import LossyCollective
from harness.reproduce import loopback
from harness.scale.fates import NoLoss, SeededFate
from harness.scale.memory import MemoryExchange, per_packet_at
from harness.transport.dropmask import DropMask

pytestmark = pytest.mark.slow

WORLD, NUMEL, STEPS = 3, 3 * 7 * 350 + 5, 6


def _inputs(seed: int = 3):
    rng = np.random.default_rng(seed)
    grads = rng.standard_normal((STEPS, WORLD, NUMEL)).astype(np.float32)
    params = rng.standard_normal((WORLD, NUMEL)).astype(np.float32)
    return grads, params


def _run(collectives, grads, params):
    """STEPS of RPS's averaging, then STEPS of bounded drift's sharded update (SGD at 0.1
    by each owner), on every rank's thread: each rank's arrays after each step, and the
    packets each rank missed per step."""
    averaged = params.copy()
    updated = params.copy()
    seen, missed = [], []

    def rank_work(r):
        mine_avg = torch.from_numpy(averaged[r])
        mine_upd = torch.from_numpy(updated[r])
        steps, lost = [], []
        for s in range(STEPS):
            mine_avg += torch.from_numpy(grads[s, r]) * 0.01  # a local step, then average
            stats = collectives[r].allreduce(mine_avg)
            lost.append((stats.reduce_missing, stats.broadcast_missing))
            steps.append(mine_avg.clone())

        def owner_step(start, end, mean_grad):
            mine_upd[start:end] -= 0.1 * mean_grad

        for s in range(STEPS):
            stats = collectives[r].sharded_update(torch.from_numpy(grads[s, r]), mine_upd,
                                                  owner_step)
            lost.append((stats.reduce_missing, stats.broadcast_missing))
            steps.append(mine_upd.clone())
        return steps, lost

    for steps, lost in loopback.on_every_rank(WORLD, rank_work):
        seen.append(torch.stack(steps).numpy())
        missed.append(lost)
    return np.stack(seen), missed


def _real(mask, grads, params):
    with loopback.transports(WORLD, drop_mask=mask) as (store, transports):
        collectives = [LossyCollective(t, store) for t in transports]
        return _run(collectives, grads, params)


def _in_memory(fate, grads, params):
    exchange = MemoryExchange(WORLD, per_packet_at(1500), fate)
    return _run([exchange.collective(r) for r in range(WORLD)], grads, params)


def test_in_memory_equals_the_udp_transport_under_the_same_seeded_mask():
    grads, params = _inputs()
    mask = DropMask(11, 0.1)
    memory, memory_missed = _in_memory(SeededFate(mask, WORLD), grads, params)
    assert sum(m for rank in memory_missed for pair in rank for m in pair) > 20  # it lost
    for _ in range(3):  # the real one may also lose a late packet on a busy machine
        real, real_missed = _real(mask, grads, params)
        if real_missed == memory_missed:
            break
    else:
        pytest.fail(f"the UDP run lost other packets than the mask three times: "
                    f"{real_missed} against {memory_missed}")
    scale = np.abs(real).max()
    assert np.abs(real - memory).max() <= 1e-6 * scale
    # and the replicas really differ where broadcasts were lost (the comparison is not
    # between identical arrays)
    assert np.abs(memory[0] - memory[1]).max() > 1e-3


def test_without_loss_every_rank_holds_the_exact_mean():
    grads, params = _inputs(4)
    memory, missed = _in_memory(NoLoss(), grads, params)
    assert all(m == (0, 0) for rank in missed for m in rank)
    assert np.abs(memory[0] - memory[1]).max() == 0 and np.abs(memory[0] - memory[2]).max() == 0
    first = params.mean(axis=0) + 0.01 * grads[0].mean(axis=0)  # the first average
    assert np.allclose(memory[0][0], first, atol=1e-5)


def test_many_ranks_train_the_reliable_model_without_loss_and_drift_under_it():
    """At 0% every scheme is reliable training (the same model to float rounding: the
    schemes sum the same gradients in other orders); at 10% the replicas drift and what was
    dropped is the loss process's rate."""
    from harness.scale.training import ManyRankConfig, run

    common = dict(world=4, steps=6, global_batch=8, seq_len=32, tokenizer="bytes",
                  eval_tokens=2048, optimizer="sgd", lr=0.05, scored_ranks=4)
    reliable = run(ManyRankConfig(variant="reliable", **common))
    for variant in ("rps", "unbiased_drift", "unbiased"):
        lossless = run(ManyRankConfig(variant=variant, **common))
        assert lossless["packets_missing"] == 0 and lossless["drift"] < 1e-4
        assert np.allclose(lossless["losses"], reliable["losses"], rtol=1e-4)
        assert abs(lossless["ppl"] / reliable["ppl"] - 1) < 1e-3
        lossy = run(ManyRankConfig(variant=variant, loss=0.1, loss_seed=3, drift_every=3,
                                   **common))
        assert 0.07 < lossy["measured_loss"] < 0.13, lossy["measured_loss"]
        assert lossy["drift"] > 1e-4 and len(lossy["drift_steps"]) == 2
        assert lossy["losses"][0] == reliable["losses"][0]  # the first step's loss: before
        assert lossy["losses"] != reliable["losses"]        # any packet could be lost


def test_the_chaos_twin_loses_one_steps_blocks_on_every_rank_alike():
    """drop_once (the stability check's twin, as the real worker's: the same step and the
    same blocks, harness/train/one_lossy_step.py): the run is its reference's up to that
    step and another after it, its replicas still equal; only the reliable reference has
    a twin."""
    from harness.scale.training import ManyRankConfig, run
    from harness.train import one_lossy_step

    common = dict(world=3, steps=6, global_batch=6, seq_len=32, tokenizer="bytes",
                  eval_tokens=2048, lr=2e-3)
    reference = run(ManyRankConfig(**common))
    twin = run(ManyRankConfig(drop_once=0.1, **common))
    lossy_step = one_lossy_step.step_of(6, None)
    assert 0 <= lossy_step < 5
    # a step's loss is computed before its update: equal through the twin's lossy step
    assert twin["losses"][:lossy_step + 1] == reference["losses"][:lossy_step + 1]
    assert twin["losses"][lossy_step + 1:] != reference["losses"][lossy_step + 1:]
    assert twin["ppl"] != reference["ppl"]
    assert twin["drift"] < 1e-5  # (the sums' order differs per rank: float rounding only)
    assert twin["packets_missing"] == 0
    with pytest.raises(ValueError, match="drop_once"):
        run(ManyRankConfig(variant="unbiased_drift", drop_once=0.1, **common))


def test_a_rank_that_fails_stops_the_others_with_its_error():
    from harness.scale.memory import on_every_rank

    def work(rank):
        if rank == 2:
            raise FloatingPointError("rank 2: loss nan at step 0")
        exchange.barrier.wait()

    exchange = MemoryExchange(4, 350, NoLoss())
    with pytest.raises(FloatingPointError, match="rank 2"):
        on_every_rank(4, work, abort=exchange.barrier.abort)


def test_lossless_reliable_training_is_the_same_at_every_n_and_starts_from_a_checkpoint(
        tmp_path):
    """The global batch fixed, reliable training is the same arithmetic at n = 2 and 4 (to
    the sums' order): reproduce's row 8 runs a seed's reference once for every n. A run saved
    with save_to starts the next one (the fine-tune regime's checkpoint)."""
    from harness.scale.training import ManyRankConfig, run

    common = dict(steps=5, global_batch=8, seq_len=32, tokenizer="bytes", eval_tokens=2048)
    saved = tmp_path / "start.pt"
    two = run(ManyRankConfig(world=2, save_to=str(saved), **common))
    four = run(ManyRankConfig(world=4, **common))
    assert np.allclose(two["losses"], four["losses"], rtol=1e-5)
    assert abs(two["ppl"] / four["ppl"] - 1) < 1e-4
    warm = run(ManyRankConfig(world=2, start_from=str(saved), lr=1e-9, **common))
    assert abs(warm["ppl"] / two["ppl"] - 1) < 1e-4  # (a rate too small to move it)
    assert warm["losses"][0] < two["losses"][0] - 0.1


def test_a_training_run_over_the_udp_transport_replays_in_the_many_rank_mode(tmp_path,
                                                                             monkeypatch):
    """unbiased_drift on three namespace hosts over the UDP transport, its loss the
    receivers' seeded drop mask (LOSSBED_DROP_MASK), and the many-rank mode fed the same
    mask: the same packets lost, the same per-step training loss (rank 0's) and the same
    final perplexity, to the float rounding of the sums' order (own first, then sources in
    order in memory; arrival order on the wire)."""
    from harness.scale.training import ManyRankConfig
    from harness.scale.training import run as many_ranks
    from harness.train import run as train
    from harness.train.config import TrainConfig
    from testbed import clusters
    from testbed.clusters import netns as netns_cluster
    from tests.helpers import unique_name

    monkeypatch.setenv("LOSSBED_DROP_MASK", "7:0.1")
    settings = dict(variant="unbiased_drift", steps=8, seq_len=32, tokenizer="bytes",
                    eval_tokens=2048, lr=2e-3)
    memory = many_ranks(ManyRankConfig(world=3, global_batch=12, loss=0.1, loss_seed=7,
                                       fate="mask", **settings))
    cluster = netns_cluster.up(netns_cluster.ClusterSpec(hosts=3, name=unique_name()))
    try:
        for _ in range(3):  # a packet late on a busy machine is loss the mask did not draw
            real = train.train(cluster, TrainConfig(batch=4, log_every=100, align_every=1,
                                                    **settings),
                               "clean", [], tmp_path / "real", echo=lambda _: None)
            if real["packets_lost"] == memory["packets_missing"]:
                break
        else:
            pytest.fail(f"the UDP runs lost {real['packets_lost']} packets, the mask "
                        f"{memory['packets_missing']}")
    finally:
        clusters.down(cluster.name)
    assert memory["packets_missing"] > 100
    assert np.allclose(real["losses"], memory["losses_rank0"], rtol=1e-4, atol=0), (
        real["losses"], memory["losses_rank0"])
    assert abs(real["ppl"] / memory["ppl"] - 1) < 1e-4, (real["ppl"], memory["ppl"])
    assert real["headline"] == memory["headline"] == "owners"


def test_bench_many_rank_answers_the_question_at_n_ranks_in_one_process(tmp_path):
    """`lossbed bench --many-rank 2 4`: row 8's claims at those n, each line labelled as the
    many-rank mode's, its runs and checkpoints in --out, its two seeds in two processes, no
    cluster made."""
    import json

    from testbed.clusters import netns as netns_cluster
    from tests.helpers import lossbed

    before = netns_cluster.leftover_clusters()
    out = tmp_path / "many"
    done = lossbed("bench", "--many-rank", "2", "4", "--loss", "0.1", "--steps", "2",
                   "--seeds", "2", "--pretrain-steps", "2", "--tokenizer", "bytes",
                   "--seq-len", "32", "--out", str(out), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    claims = {c["row"]: c for c in json.loads((out / "reproduction.json").read_text())["claims"]}
    assert set(claims) == {"8a", "8b", "8c", "8d"}
    assert all("many-rank mode" in c["claim"] for c in claims.values())
    assert set(claims["8a"]["per_n"]) == {"2", "4"}
    runs = [json.loads(line) for line in (out / "many_rank.jsonl").read_text().splitlines()]
    assert {(r["role"], r["world"]) for r in runs} >= {("lossy", 2), ("lossy", 4)}
    assert all(0.05 < r["measured_loss"] < 0.15 for r in runs if r["role"] == "lossy")
    # the two seeds ran in processes of their own (spawned: this one has threads), each
    # writing its records as it went; each seed's references have their chaos twins, and
    # the claims carry the check and both seeds' Δppl at every n
    for seed in (2, 3):  # after the pilot seeds 0 and 1
        own = (out / f"many_rank-seed{seed}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in own] == [r for r in runs if r["seed"] == seed]
        assert sorted(r["config"]["optimizer"] for r in runs
                      if r["seed"] == seed and r["role"] == "twin") == ["adamw", "sgd"]
    assert claims["8a"]["stability"]["seeds"] == [2, 3]
    assert {n: len(d["ppl_deltas"]) for n, d in claims["8a"]["per_n"].items()} == {
        "2": 2, "4": 2}
    if (os.cpu_count() or 1) > 1:  # one process a core (CI and this machine have 2)
        assert "2 seeds in 2 processes" in done.stderr
    assert "| 8a |" in done.stdout
    assert netns_cluster.leftover_clusters() == before


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # (the command's name may hold spaces: the fields after its closing ')')
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def test_row_8s_worker_processes_end_when_their_parent_is_killed(tmp_path):
    """A SIGKILL to `lossbed bench --many-rank` (no handler runs) leaves no seed's worker
    training on: each asked the kernel for its parent's death as its own."""
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import with_repo_on_path

    parent = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "bench", "--many-rank", "2", "4", "--loss",
         "0.1", "--steps", "400", "--seeds", "2", "--pretrain-steps", "400", "--tokenizer",
         "bytes", "--seq-len", "32", "--out", str(tmp_path / "killed")],
        env={**os.environ, "PYTHONPATH": with_repo_on_path()}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    workers = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            workers = [p for p in _children(parent.pid)
                       if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
            if len(workers) == 2 and (tmp_path / "killed").exists():
                break
            time.sleep(0.5)
        else:
            pytest.fail("no two worker processes started")
        time.sleep(3)  # (past their initialiser)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists()
                                                  for p in workers):
            time.sleep(0.2)
        assert not [p for p in workers if Path(f"/proc/{p}").exists()]
    finally:
        parent.kill()
        for p in workers:  # (should the test fail: none left to train on)
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
