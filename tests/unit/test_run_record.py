"""#68 item 3: a run's record is a typed record (harness/train/record.py), built whole from
what the run left and held to its declaration; a bench's record is the run's with the
bench's own fields, made anew, not the run's changed in transit."""

from __future__ import annotations

import typing
from types import SimpleNamespace

import pytest

from harness.bench.fields import RESULT_FIELDS
from harness.metrics.hdr import Histogram
from harness.rank_protocol import RunResult, TrainRankMetrics
from harness.train import record
from harness.train.config import TrainConfig
from harness.train.record import BenchRecord, RunRecord
from testbed import profiles

RESULT = RunResult(index=1, headline="rank0", ppl=9.5, ppl_rank0=9.5, ppl_ranks=[9.5, 9.7],
                   ppl_rank_mean=9.6, ppl_rank_worst=9.7, ppl_average_model=9.4,
                   ppl_owners=None, ce_per_token=2.25, bits_per_byte=1.1,
                   bytes_per_token=2.9, eval_tokens=4096, drift=0.01, parameters=460_000,
                   corpus="stdlib-docs", corpus_sha="ab", split_sha="cd",
                   heldout_windows=64, heldout_dropped=0, tokenizer="bpe-512",
                   vocab_size=512, epochs=1, model_sha="ef")


def rank(i: int, missing: int) -> TrainRankMetrics:
    steps = Histogram()
    for us in (1000, 1100, 1200):
        steps.record(us)
    return TrainRankMetrics(rank=i, losses=[5.0, 4.0], train_s=2.0 + i, tokens=1000,
                            step_us=steps.to_dict(), collective_us=steps.to_dict(),
                            drift_steps=[[10, 0.5], [20, 0.25]],
                            counters={"packets_sent": 100, "packets_received": 90,
                                      "missing": missing, "bytes_sent": 150_000},
                            authenticated=True, max_rss_mb=300.0 + i)


def made(coverage_enough: bool = True) -> RunRecord:
    cfg = TrainConfig(variant="unbiased_drift", steps=20, seed=3)
    profile = profiles.load("random-loss", loss=0.1, loss_seed=0)
    report = SimpleNamespace(total_seen=1000, total_dropped=100, window="this run alone",
                             rcvbuf_errors={"h1": 2, "h2": 1})
    coverage = SimpleNamespace(to_dict=lambda: {"fraction": 0.99},
                               no_result=lambda p: None if coverage_enough else "too little")
    return record.make(cfg, hosts=2, profile=profile, report=report, backend="nft",
                       result=RESULT, ranks=[rank(0, 10), rank(1, 12)], work=None,
                       wall_s=7.5, run_s=6.0, exempt=["the store's port"], coverage=coverage,
                       loss_applied_by=["nft at the receivers' ingress"])


def test_a_run_record_is_made_whole_from_what_the_run_left():
    rec = made()
    assert set(rec) == set(typing.get_type_hints(RunRecord))
    assert rec["variant"] == "unbiased_drift" and rec["hosts"] == 2 and rec["loss"] == 0.1
    assert rec["packets_lost"] == 22 and rec["packets_sent"] == 200
    assert rec["tokens_per_s"] == 2000 / 3.0  # every rank's tokens over the slowest rank
    assert rec["measured_loss"] == 0.1 and rec["rcvbuf_drops"] == 3
    assert rec["drift_max"] == 0.5 and rec["ppl"] == 9.5 and rec["model_sha"] == "ef"
    assert rec["invalid"] is None and rec["run_s"] == 6.0 and rec["exempt"] == ["the store's port"]
    assert "index" not in rec  # (the launch's run number is not the record's)
    assert made(coverage_enough=False)["invalid"] == "too little"


@pytest.mark.parametrize("change, words", [
    (lambda r: r.pop("ppl"), "missing ppl"),
    (lambda r: r.update(ppl_typo=1.0), "not declared: ppl_typo"),
    (lambda r: r.update(ppl="9.5"), "RunRecord.ppl: '9.5' is not"),
    (lambda r: r.update(steps=20.0), "RunRecord.steps: 20.0 is not"),
    (lambda r: r.update(authenticated=None), "RunRecord.authenticated: None"),
])
def test_a_record_that_is_not_its_declaration_is_refused_by_the_field(change, words):
    rec = dict(made())
    change(rec)
    with pytest.raises(TypeError, match=words):
        record.checked(rec)


def test_a_float_field_takes_a_whole_number_and_an_optional_one_none():
    rec = dict(made())
    rec.update(ppl=9, ppl_owners=None, drift_max=None, backend=None)
    assert record.checked(rec) is rec
    with pytest.raises(TypeError, match="RunRecord.ppl: True"):
        record.checked({**rec, "ppl": True})


def test_a_bench_record_is_the_runs_with_the_benchs_own_fields_declared():
    own = set(typing.get_type_hints(BenchRecord)) - set(typing.get_type_hints(RunRecord))
    assert own == {"role", "loss_seed", "regime", "tokens_seen"}
    with pytest.raises(TypeError, match="missing .*role"):
        record.checked(dict(made()), BenchRecord)
    # every field results.jsonl carries is a bench record's, or the summary's Δppl
    assert set(RESULT_FIELDS) - set(typing.get_type_hints(BenchRecord)) == {"ppl_delta_pct"}
