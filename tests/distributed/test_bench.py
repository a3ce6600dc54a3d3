"""`lossbed bench` and `lossbed compare`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from harness.bench.fields import RESULT_FIELDS
from testbed.clusters import netns as netns_cluster
from testbed.host.hosts import processes_in_namespaces
from tests.helpers import REPO, lossbed

pytestmark = [pytest.mark.netns, pytest.mark.slow]

FIELDS = {"variant", "profile", "loss", "seed", "steps", "hosts", "tokens_per_s", "step_ms",
          "collective_ms", "ppl", "ppl_rank0", "ppl_delta_pct", "measured_loss",
          "rcvbuf_drops", "drift", "backend"}


def test_bench_writes_every_field_the_table_and_plots_and_leaves_nothing(tmp_path):
    before = netns_cluster.leftover_clusters()
    out = tmp_path / "bench"
    # from scratch (the default fine-tunes: test_the_finetune_regime... below)
    result = lossbed("bench", "--hosts", "2", "--steps", "4", "--seeds", "2", "--loss", "0.1",
                     "--speed-steps", "4", "--realisations", "2", "--regime", "scratch",
                     "--out", str(out), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    # per seed: the references (reliable under AdamW, and under SGD for rps, at 0),
    # reliable's short lossless twin, the default lossy variants (unbiased_drift, rps) at 10%
    # and reliable's speed run; one more loss realisation of unbiased_drift and rps at the
    # first seed; the chaos check's twin of each reference on each seed
    roles = {}
    for r in rows:
        roles[r["role"]] = roles.get(r["role"], 0) + 1
    assert roles == {"reference": 4, "speed_reference": 2, "lossy": 4, "speed": 2,
                     "realisation": 2, "twin": 4}
    assert {r["seed"] for r in rows} == {2, 3}  # after the pilot seeds 0 and 1
    assert {(r["variant"], r["loss"]) for r in rows} >= {
        ("reliable", 0.0), ("reliable/sgd", 0.0), ("rps", 0.1), ("unbiased_drift", 0.1)}
    # every row has exactly the declared fields (docs/reference/outputs.md's table is made
    # from them), and a field the runs stopped filling in is caught: null in every row
    assert all(list(row) == list(RESULT_FIELDS) for row in rows)
    # nothing to say in this bench: every run valid, sealed, and 4 steps long (drift is
    # sampled every 30, progress every 15)
    null_here = {"invalid", "wire_warning", "progress_steps", "drift_max"}
    assert sorted(k for k in RESULT_FIELDS if k not in null_here
                  and all(row[k] is None for row in rows)) == []
    for row in rows:
        assert FIELDS <= set(row), FIELDS - set(row)
        assert set(row["step_ms"]) >= {"p50", "p99", "p999"}
        assert set(row["collective_ms"]) >= {"p50", "p99", "p999"}
        assert row["tokenizer"].startswith("bpe") and row["bytes_per_token"] > 2
        assert len(row["ppl_ranks"]) == 2 and row["corpus_sha"] and row["split_sha"]
        base = row["variant"].split("/")[0]
        assert row["headline"] == {"reliable": "rank0", "unbiased_drift": "owners"}.get(
            base, "rank_mean")
        assert (row["ppl_owners"] is not None) == (base == "unbiased_drift")
        # the bench's own cluster too: every datagram sealed unless --unsealed
        assert row["authenticated"] is True and row["wire_warning"] is None
    lossy_seeds = {(r["seed"], r["loss_seed"]) for r in rows if r["loss"] > 0
                   and r["variant"] == "rps"}
    assert len(lossy_seeds) == 3  # two seeds, and one more realisation at the first
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checks"]["reliable_exact_under_loss"] is True
    assert summary["noise_floor_pct"] is not None
    assert {"ppl_delta_pct", "ppl_delta_ci95"} <= set(summary["rows"][0])
    for name in ("summary.md", "loss_curves.png", "step_time_cdf.png"):
        assert (out / name).stat().st_size > 0, name
    # perplexity against loss needs two loss rates besides 0: one here, so no such plot
    assert not (out / "ppl_vs_loss.png").exists()
    assert "ppl_vs_loss.png" not in (out / "summary.md").read_text()
    assert "tok/s vs rel" in result.stdout and "noise floor" in result.stdout
    assert "[bench 18/18]" in result.stderr  # progress with run numbers
    assert sorted(summary["stability"]) == ["reliable", "reliable/sgd"]
    assert all(c["seeds"] == [2, 3] for c in summary["stability"].values())
    assert "realisation" in result.stderr and "verdict: equivalence" in result.stdout
    assert netns_cluster.leftover_clusters() == before


def test_the_finetune_regime_trains_its_checkpoint_once_and_reuses_it(tmp_path, monkeypatch):
    """--regime finetune: the first bench trains the seed's lossless checkpoint (into the
    cache, whole), every run of the bench starts from it (its first loss is far below a
    fresh model's ln(vocab)), the summary names the regime; the second bench reuses it."""
    cache = tmp_path / "checkpoints"
    monkeypatch.setenv("LOSSBED_CHECKPOINTS", str(cache))
    args = ["bench", "--hosts", "2", "--steps", "3", "--seeds", "1", "--loss", "0.1",
            "--speed-steps", "2", "--realisations", "1", "--regime", "finetune",
            "--pretrain-steps", "40", "--variants", "reliable", "unbiased_drift/broadcast"]
    first = lossbed(*args, "--out", str(tmp_path / "a"), timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "[checkpoints] training 1 lossless checkpoint(s), seeds [2], 40 steps" \
        in first.stderr
    folders = sorted(p.name for p in cache.iterdir())
    assert len(folders) == 1 and not folders[0].startswith(".partial"), folders
    assert (cache / folders[0] / "lossbed-checkpoint.json").is_file()
    rows = [json.loads(line) for line in (tmp_path / "a" / "results.jsonl").read_text()
            .splitlines()]
    assert {r["variant"] for r in rows} == {"reliable", "unbiased_drift/broadcast"}
    for r in rows:
        assert r["regime"] == "finetune"
        # a fresh tiny model starts at ln(2048) = 7.6; 40 steps at 2e-3 take it below 6.5
        assert r["losses"][0] < 6.5, (r["variant"], r["role"], r["losses"][:3])
    summary = (tmp_path / "a" / "summary.md").read_text()
    assert "regime finetune: from a lossless checkpoint (40 steps at adamw peak 0.002), 3 " \
        "steps at adamw peak 0.0001" in summary
    # the second: its lossless reference alone (what reuses the checkpoint, at less cost)
    second = lossbed("bench", "--hosts", "2", "--steps", "3", "--seeds", "1", "--loss", "0",
                     "--regime", "finetune", "--pretrain-steps", "40", "--variants",
                     "reliable", "--no-stability", "--out", str(tmp_path / "b"), timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"[checkpoints] seed 2: reused {cache / folders[0]} (cached)" in second.stderr
    assert "training 1 lossless" not in second.stderr
    assert sorted(p.name for p in cache.iterdir()) == folders


def _ctrl_c_not_ignored():
    # A shell starts background jobs with SIGINT ignored, and Python then keeps ignoring it:
    # give the bench the Ctrl-C a terminal would, however pytest itself was started.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_in_the_middle_leaves_no_namespace_rule_or_process(tmp_path):
    before = netns_cluster.leftover_clusters()
    child = subprocess.Popen([sys.executable, "-m", "harness.cli", "bench", "--hosts", "2",
                              "--steps", "400", "--seeds", "1", "--regime", "scratch",
                              "--out", str(tmp_path / "b")],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, preexec_fn=_ctrl_c_not_ignored)
    deadline = time.monotonic() + 120
    for line in child.stderr:
        if "step 21/" in line or time.monotonic() > deadline:
            break
    created = netns_cluster.leftover_clusters() - before
    assert created, "the bench should have built its cluster"
    child.send_signal(signal.SIGINT)
    child.communicate(timeout=120)
    assert child.returncode != 0
    assert netns_cluster.leftover_clusters() == before
    namespaces = [ns for c in created for ns in netns_cluster.cluster_namespaces(c)]
    assert namespaces == [] and processes_in_namespaces(namespaces) == {}


