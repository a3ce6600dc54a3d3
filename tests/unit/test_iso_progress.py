"""Iso-progress: a lossy run's final perplexity placed on its lossless reference's held-out
curve, in steps behind (harness/bench/progress.py), per seed and per row."""

from __future__ import annotations

import math

import pytest

from harness.bench import progress
from harness.bench import summary as bench_summary
from harness.bench import table as bench_table
from harness.metrics.hdr import Histogram

# a reference of 100 steps whose held-out ppl falls from 200 to 100, recorded every 20 steps
CURVE = [[20, 180.0], [40, 160.0], [60, 140.0], [80, 120.0]]


@pytest.mark.parametrize(("ppl", "behind"), [
    (100.0, 0.0),     # at the reference's end
    (95.0, 0.0),      # below it: not ahead by a measured amount, 0 behind
    (120.0, 20.0),    # on a recorded point
    (180.0, 80.0),    # the first point
])
def test_a_final_ppl_on_the_curve_is_that_many_steps_behind(ppl, behind):
    assert progress.steps_behind(CURVE, 100, 100.0, ppl) == pytest.approx(behind)


def test_between_points_it_interpolates_in_log_perplexity():
    ppl = math.sqrt(120.0 * 100.0)  # half way from step 80 to 100 in log-ppl
    assert progress.steps_behind(CURVE, 100, 100.0, ppl) == pytest.approx(10.0)


def test_a_curve_that_comes_back_up_is_read_where_it_first_came_down():
    bumpy = [[20, 150.0], [40, 110.0], [60, 130.0], [80, 105.0]]
    down = (math.log(150) - math.log(120)) / (math.log(150) - math.log(110))
    assert progress.steps_behind(bumpy, 100, 100.0, 120.0) == pytest.approx(
        100 - (20 + 20 * down))  # not 60-80's crossing, nor the 40-60 rise


def test_above_the_curve_or_without_one_is_no_number():
    assert progress.steps_behind(CURVE, 100, 100.0, 190.0) is None
    assert progress.steps_behind([], 100, 100.0, 120.0) is None


def _record(variant, loss, seed, ppl, role, curve=None):
    return {"variant": variant, "loss": loss, "seed": seed, "ppl": ppl, "role": role,
            "tokens_per_s": 100.0, "measured_loss": loss, "drift": 0.0, "model_sha": "x",
            "steps": 100, "progress_steps": curve or [],
            "step_hist": Histogram().to_dict()}


def test_each_lossy_row_gets_its_seeds_steps_behind_and_the_table_says_it():
    records = [_record("reliable", 0.0, s, 100.0, "reference", CURVE) for s in (0, 1)]
    records += [_record("rps/adamw", 0.0, s, 100.0, "reference") for s in (0, 1)]
    records += [_record("unbiased_drift", 0.1, 0, 120.0, "lossy"),
                _record("unbiased_drift", 0.1, 1, 140.0, "lossy"),
                _record("rps/adamw", 0.1, 0, 101.0, "lossy"),
                _record("rps/adamw", 0.1, 1, 101.0, "lossy")]
    summary = bench_summary.summarise(records, {}, "bpf")
    rows = {r["variant"]: r for r in summary["rows"] if r["loss"] > 0}
    drift = rows["unbiased_drift"]
    assert drift["steps_behind_by_seed"] == {"0": pytest.approx(20.0), "1": pytest.approx(40.0)}
    assert drift["steps_behind"] == pytest.approx(30.0)
    # rps/adamw's reference recorded no curve (a lossy collective's): nothing is claimed
    assert rows["rps/adamw"]["steps_behind"] is None
    assert rows["rps/adamw"]["steps_behind_by_seed"] == {}
    text = bench_table.table(summary)
    assert "iso-progress" in text and "unbiased_drift at 10% 30.0 of 100" in text
    assert "rps/adamw at 10%" not in text.split("iso-progress")[1].splitlines()[0]


def test_a_seed_behind_the_whole_curve_is_named_not_averaged_away():
    records = [_record("reliable", 0.0, s, 100.0, "reference", CURVE) for s in (0, 1)]
    records += [_record("unbiased_drift", 0.1, 0, 120.0, "lossy"),
                _record("unbiased_drift", 0.1, 1, 500.0, "lossy")]
    summary = bench_summary.summarise(records, {}, "bpf")
    row = next(r for r in summary["rows"] if r["variant"] == "unbiased_drift")
    assert row["steps_behind"] is None and row["steps_behind_beyond"] == [1]
    assert "seeds [1] behind the whole curve (more than 100 steps)" in bench_table.table(summary)


def test_the_bench_records_the_curve_on_reliable_references_only():
    from harness.bench.spec import PROGRESS_EVERY, BenchSpec

    runs = BenchSpec.make(variants=["reliable", "unbiased_drift", "rps", "rps/adamw"]).cases()
    curves = {(r.role, r.variant): r.cfg.progress_every for r in runs}
    assert curves[("reference", "reliable")] == PROGRESS_EVERY
    assert curves[("reference", "reliable/sgd")] == PROGRESS_EVERY
    # rps/adamw's reference is a lossy collective's: its ranks hold models of their own
    assert curves[("reference", "rps/adamw")] == 0
    assert {every for (role, _), every in curves.items() if role != "reference"} == {0}
    assert BenchSpec.make(progress_every=0).cases()[0].cfg.progress_every == 0


@pytest.mark.parametrize(("fields", "words"), [
    ({"progress_every": -1}, "is negative"),
    ({"progress_every": 5, "variant": "rps"}, "models of their own")])
def test_a_curve_asked_of_the_wrong_run_is_refused_naming_the_field(fields, words):
    from harness.train.config import TrainConfig
    from testbed.errors import UsageError

    with pytest.raises(UsageError, match=words) as refused:
        TrainConfig(**fields)  # (refused as it is made)
    assert "progress_every" in str(refused.value)
