"""The bench's question is fixed before its runs: regime, band, test and stopping rule are
written to question.json and printed before the first run, and printed with the answer."""

from __future__ import annotations

import json

import pytest

from harness.bench import training_bench
from harness.bench.question import question
from harness.bench.spec import BenchSpec


def test_the_question_names_regime_band_test_and_stopping_rule():
    asked = question(BenchSpec.make(band_pct=0.5, seeds=6, regime="scratch"))
    text = asked["text"]
    assert "at 10% (random-loss)" in text
    assert "within ±0.5% of the same seed's lossless run" in text
    assert "regime scratch: 150 steps" in text
    assert "equivalence" in text and "±0.5%" in asked["test"]
    assert "seeds 2-7 (confirmatory: none of the pilot seeds 0, 1" in text
    assert asked["seed_list"] == [2, 3, 4, 5, 6, 7] and asked["pilot_seeds_used"] == []
    on_pilots = question(BenchSpec.make(seeds=3, first_seed=0))
    assert on_pilots["pilot_seeds_used"] == [0, 1]
    assert "seeds 0-2 (pilot seeds 0, 1 among them" in on_pilots["text"]
    assert "fixed sample: 6 seed(s), one look after all of them" in asked["stopping_rule"]
    assert asked["stopping_rule"] in text
    # each lossy variant with what it is judged against (rps: reliable under SGD)
    assert "unbiased_drift against reliable" in text and "rps against reliable/sgd" in text
    assert "rps/adamw against its own lossless run" in question(
        BenchSpec.make(variants=["reliable", "rps/adamw"]))["text"]


def test_it_is_written_and_printed_before_the_first_run(monkeypatch, tmp_path):
    said = []

    def train_runs(cluster, runs, out, echo, **options):
        assert (tmp_path / "question.json").is_file()  # before any run
        raise RuntimeError("stop before training")

    class Hosts:
        shares_this_machine = True

    monkeypatch.setattr(training_bench.run, "train_runs", train_runs)
    spec = BenchSpec.make(seeds=2, steps=2, regime="scratch")
    with pytest.raises(RuntimeError, match="stop before training"):
        training_bench.run_bench(Hosts(), spec, tmp_path, echo=said.append)
    kept = json.loads((tmp_path / "question.json").read_text())
    assert kept == question(spec)
    assert f"[bench] question: {kept['text']}" in said


def test_the_table_prints_the_question_above_the_answer():
    from harness.bench import summary as bench_summary
    from harness.bench import table as bench_table

    summary = bench_summary.summarise([], {}, "bpf")
    summary["question"] = question(BenchSpec.make())
    assert bench_table.table(summary).splitlines()[0] == \
        f"question: {summary['question']['text']}"
