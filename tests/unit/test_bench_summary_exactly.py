"""summary.json of one planted bench, every field known (harness/bench/summary.py, #71):
which runs make each row, each row's every number from the planted ones, the speed runs and
their check, the invalid run left out, the budget priced from the runs' own times, the
noise floor of the bench's own optimizer. test_bench_summary.py shows the rules one at a
time; here one bench holds them together and the whole summary is compared."""

from __future__ import annotations

import math
import statistics

import pytest

from harness.bench import stability, withholding
from harness.bench import summary as bench_summary
from harness.metrics import verdict
from harness.metrics.hdr import Histogram
from testbed.stats import mean_interval, slope_interval

BAND = 0.8


def _hist(base_us: float, n: int = 100) -> dict:
    h = Histogram()
    for i in range(n):
        h.record(base_us + 10 * i)
    return h.to_dict()


def _run(variant, loss, seed, ppl, role=None, **more) -> dict:
    r = {"variant": variant, "loss": loss, "seed": seed, "ppl": ppl, "tokens_per_s": 100.0,
         "step_hist": _hist(1000.0), "measured_loss": loss, "drift": 0.0,
         "model_sha": f"{variant}-{seed}", "steps": 10, "run_s": 10.0, "tokens_seen": 1000}
    if role:
        r["role"] = role
    return {**r, **more}


def _bench() -> list[dict]:
    return [
        # the lossless reference: seed 2's record carries no role (reliable at 0%: one)
        _run("reliable", 0, 2, 10.0, tokens_per_s=100.0, step_hist=_hist(1000), run_s=20.0),
        _run("reliable", 0, 3, 10.2, "reference", tokens_per_s=110.0, step_hist=_hist(1100),
             run_s=22.0),
        # its chaos check: twins that moved 0.01%
        _run("reliable", 0, 2, 10.001, "twin", run_s=5.0, config={"drop_once": 0.1}),
        _run("reliable", 0, 3, 10.2 * 1.0001, "twin", run_s=5.0, config={"drop_once": 0.1}),
        # the lossy rows: seed 2 +0.5%, seed 3 +1.0%
        _run("unbiased_drift", 0.1, 2, 10.05, "lossy", tokens_per_s=80.0,
             step_hist=_hist(2000), measured_loss=0.1, coverage={"fraction": 0.95},
             drift=0.01, drift_max=0.02, drift_steps=[(1, 0.01), (10, 0.1), (100, 1.0)],
             slow_steps=[5], ppl_rank_worst=10.2, headline=True, run_s=30.0),
        _run("unbiased_drift", 0.1, 3, 10.302, "lossy", tokens_per_s=90.0,
             step_hist=_hist(2500), measured_loss=0.12, coverage={"fraction": 0.97},
             drift=0.03, drift_max=0.05,
             drift_steps=[(0, 5.0), (1, 0.01), (10, 0.01 * 10 ** 0.5), (100, 0.1), (7, 0.0)],
             slow_steps=[7, 8], wire_warning=True, run_s=32.0, tokens_seen=1200),
        # a second loss realisation at the first seed: +1.2%
        _run("unbiased_drift", 0.1, 2, 10.12, "realisation", run_s=30.0,
             coverage={"fraction": 0.1}, step_hist=_hist(9000)),
        # reliable under loss, for its speed: 5 steps, the model of its 5-step lossless run
        _run("reliable", 0.1, 2, 10.9, "speed", steps=5, tokens_per_s=95.0,
             step_hist=_hist(1500), model_sha="short-2", run_s=8.0, tokens_seen=500),
        _run("reliable", 0, 2, 10.8, "speed_reference", steps=5, tokens_per_s=105.0,
             step_hist=_hist(1200), model_sha="short-2", run_s=8.0, tokens_seen=500),
        # a run whose traffic missed its impairment: named, and nowhere else
        _run("unbiased_drift", 0.1, 4, 99.0, "lossy", invalid="coverage 0.40 < 0.90",
             run_s=1.0),
    ]


def _ms(*runs) -> dict:
    return Histogram.merged(r["step_hist"] for r in runs).summary_ms()


def _same(got, want, where="summary"):
    """Equal, floats to 1e-12 relative (the code's sums may run in another order)."""
    if isinstance(want, float) and isinstance(got, float | int) and not isinstance(got, bool):
        assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-15), (where, got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (
            where, sorted(set(got) ^ set(want)))
        for key in want:
            _same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list | tuple):
        assert isinstance(got, list | tuple) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{i}]")
    else:
        assert got == want and type(got) is type(want), (where, got, want)


def test_the_whole_summary_of_a_planted_bench():
    records = _bench()
    by = {(r["variant"], r["loss"], r["seed"], r.get("role")): r for r in records}
    ref2, ref3 = by[("reliable", 0, 2, None)], by[("reliable", 0, 3, "reference")]
    u2, u3 = by[("unbiased_drift", 0.1, 2, "lossy")], by[("unbiased_drift", 0.1, 3, "lossy")]
    speed, short = by[("reliable", 0.1, 2, "speed")], by[("reliable", 0, 2, "speed_reference")]
    chaos = stability.by_reference([dict(r, role=r.get("role") or "reference")
                                    for r in records if not r.get("invalid")])
    got = bench_summary.summarise(records, {"optimizer": "adamw", "steps": 10}, "gloo",
                                  wall_s=200.0, regime="finetune", band_pct=BAND,
                                  start_ppl={2: 10.5, "3": 10.6})

    deltas = [(10.05 / 10.0 - 1) * 100, (10.302 / 10.2 - 1) * 100]
    mean, half = mean_interval(deltas)
    growths = [slope_interval([0.0, math.log(10), math.log(100)],
                              [math.log(d) for d in (0.01, 0.1, 1.0)])[0],
               slope_interval([0.0, math.log(10), math.log(100)],
                              [math.log(d) for d in (0.01, 0.01 * 10 ** 0.5, 0.1)])[0]]
    growth, growth_half = mean_interval(growths)
    lossy_steps, base_steps = _ms(u2, u3), _ms(speed)
    reference_steps, short_steps = _ms(ref2, ref3), _ms(short)
    lossy = {
        "loss": 0.1, "variant": "unbiased_drift", "seeds": 2, "roles": ["lossy"],
        "headline": True, "reference": "reliable", "ppl": statistics.fmean([10.05, 10.302]),
        "speed_steps": None, "ppl_delta_pct": mean, "ppl_delta_ci95": half,
        "ppl_deltas": deltas, "delta_seeds": [2, 3],
        "realisation_sd": statistics.stdev([deltas[0], (10.12 / 10.0 - 1) * 100]),
        "realisations": 2, "ppl_rank_worst": statistics.fmean([10.2, 10.302]),
        "tokens_per_s": 85.0, "step_p50_ms": lossy_steps["p50"],
        "step_p99_ms": lossy_steps["p99"], "step_max_ms": lossy_steps["max"],
        "step_samples": 200, "slow_steps": 3, "disturbed": [],
        "reference_missed_packets": [], "wire_warnings": [3], "measured_loss": 0.11,
        "coverage": 0.95, "drift": 0.02, "drift_max": 0.05, "drift_growth": growth,
        "drift_growth_ci95": growth_half, "throughput_vs_reliable": 85.0 / 95.0,
        "p99_vs_reliable": lossy_steps["p99"] / base_steps["p99"],
        "max_vs_reliable": lossy_steps["max"] / base_steps["max"],
        "steps_behind": None, "steps_behind_of": 10, "steps_behind_by_seed": {},
        "steps_behind_beyond": [], "chaos_check": chaos["reliable"],
        "delta_sd": statistics.stdev(deltas)}
    judged = verdict.delta_ppl(mean, half, 2, BAND, withheld=withholding.withheld(lossy))
    lossy.update(verdict=judged.verdict, verdict_withheld=judged.disturbed)
    assert judged.verdict == verdict.INCONCLUSIVE and judged.disturbed is None
    reference = {
        "loss": 0, "variant": "reliable", "seeds": 2, "roles": ["reference"],
        "headline": None, "reference": None, "ppl": statistics.fmean([10.0, 10.2]),
        "speed_steps": None, "ppl_delta_pct": None, "ppl_delta_ci95": None, "ppl_deltas": [],
        "delta_seeds": [], "realisation_sd": None, "realisations": 0,
        "ppl_rank_worst": statistics.fmean([10.0, 10.2]), "tokens_per_s": 105.0,
        "step_p50_ms": reference_steps["p50"], "step_p99_ms": reference_steps["p99"],
        "step_max_ms": reference_steps["max"], "step_samples": 200, "slow_steps": 0,
        "disturbed": [], "reference_missed_packets": [], "wire_warnings": [],
        "measured_loss": 0.0, "coverage": None, "drift": 0.0, "drift_max": None,
        "drift_growth": None, "drift_growth_ci95": None,
        "throughput_vs_reliable": 105.0 / 105.0,
        "p99_vs_reliable": reference_steps["p99"] / short_steps["p99"],
        "max_vs_reliable": reference_steps["max"] / short_steps["max"],
        "chaos_check": None, "verdict": None, "verdict_withheld": None, "delta_sd": None}
    speed_row = {
        **{k: None for k in reference}, "loss": 0.1, "variant": "reliable", "seeds": 1,
        "roles": ["speed"], "speed_steps": 5, "ppl_deltas": [], "delta_seeds": [],
        "realisations": 0, "tokens_per_s": 95.0, "step_p50_ms": base_steps["p50"],
        "step_p99_ms": base_steps["p99"], "step_max_ms": base_steps["max"],
        "step_samples": 100, "slow_steps": 0, "disturbed": [], "reference_missed_packets": [],
        "wire_warnings": [], "measured_loss": 0.1, "drift": 0.0,
        "throughput_vs_reliable": 1.0, "p99_vs_reliable": 1.0, "max_vs_reliable": 1.0}

    seed_s = statistics.fmean([20 + 5 + 30 + 8 + 8, 22 + 5 + 32])  # the realisation apart
    fixed_s = 30 + (200 - (20 + 22 + 5 + 5 + 30 + 32 + 30 + 8 + 8))
    sd = statistics.stdev(deltas)
    need = bench_summary.seeds_for(sd, BAND / 2)
    decide = bench_summary.seeds_for(sd, BAND - abs(mean))
    expected = {
        "config": {"optimizer": "adamw", "steps": 10}, "regime": "finetune",
        "tokens_seen": [1000, 1200], "stability": chaos, "start_ppl": {2: 10.5, "3": 10.6},
        "reference_gain_pct": {"reliable": statistics.fmean([(10.0 / 10.5 - 1) * 100,
                                                             (10.2 / 10.6 - 1) * 100])},
        "backend": "gloo",
        "noise_floor_pct": statistics.stdev([10.0, 10.2]) / 10.1 * 100,
        "lossless_ppl": [10.0, 10.2], "rows": [reference, speed_row, lossy],
        "band_pct": BAND, "test": verdict.test_text(BAND),
        "budget": {"target_ci95": BAND / 2, "seed_min": seed_s / 60,
                   "realisation_min": 0.5, "start_up_min": 40 / 60, "minutes_now": 200 / 60,
                   "rows": [{"loss": 0.1, "variant": "unbiased_drift", "seeds_now": 2,
                             "seed_sd": sd, "seeds_for_target": need,
                             "minutes_for_target": (fixed_s + need * seed_s) / 60,
                             "seeds_to_decide": decide,
                             "minutes_to_decide": (fixed_s + decide * seed_s) / 60,
                             "curve": [{"seeds": k, "ci95": bench_summary.t95(k) * sd
                                        / math.sqrt(k), "minutes": (fixed_s + k * seed_s) / 60}
                                       for k in bench_summary.CURVE_SEEDS]}]},
        "invalid_runs": [{"variant": "unbiased_drift", "seed": 4, "loss": 0.1,
                          "role": "lossy", "why": "coverage 0.40 < 0.90"}],
        "checks": {"reliable_exact_under_loss": True, "reliable_unpaired": [],
                   "references_missing_packets": []}}
    assert chaos["reliable"]["stable"] is True and need is not None and decide > need
    _same(got, expected)
    # the records are given their roles and Δppl in place (the report reads them)
    assert ref2["role"] == "reference" and ref2["ppl_delta_pct"] == 0.0
    assert speed["ppl_delta_pct"] is None and u3["ppl_delta_pct"] == deltas[1]


def test_the_noise_floor_is_the_benchs_own_optimizers_reference():
    records = [_run("reliable", 0, 2, 10.0), _run("reliable", 0, 3, 10.4),
               _run("reliable/sgd", 0, 2, 20.0, "reference"),
               _run("reliable/sgd", 0, 3, 22.0, "reference")]
    sgd = bench_summary.summarise([dict(r) for r in records], {"optimizer": "sgd"}, "gloo")
    assert sgd["lossless_ppl"] == [20.0, 22.0]
    assert sgd["noise_floor_pct"] == pytest.approx(statistics.stdev([20, 22]) / 21 * 100)
    for spec in ({}, None, {"optimizer": "adamw"}):
        adamw = bench_summary.summarise([dict(r) for r in records], spec, "gloo")
        assert adamw["lossless_ppl"] == [10.0, 10.4], spec
    one = bench_summary.summarise([_run("reliable", 0, 2, 10.0)], {}, "gloo")
    assert one["noise_floor_pct"] is None and one["budget"]["rows"] == []


def test_a_bench_without_wall_time_prices_from_its_runs_and_untimed_runs_price_nothing():
    records = _bench()
    got = bench_summary.summarise(records, {}, "gloo")
    assert got["budget"]["start_up_min"] == 0.0
    assert got["budget"]["minutes_now"] == pytest.approx(160 / 60)
    shorter = bench_summary.summarise(_bench(), {}, "gloo", wall_s=100.0)  # less than runs
    assert shorter["budget"]["start_up_min"] == 0.0
    untimed = _bench()
    del untimed[3]["run_s"]
    assert bench_summary.summarise(untimed, {}, "gloo", wall_s=200.0)["budget"] is None
    assert bench_summary.budget([], [], 1.0) is None


def test_a_row_of_one_seed_or_without_a_reference_is_not_priced():
    rows = [{"reference": None, "ppl_deltas": [1.0, 2.0]},
            {"reference": "reliable", "ppl_deltas": [1.0]},
            {"reference": "reliable", "ppl_deltas": [1.0, 2.0], "delta_sd": 0.5,
             "ppl_delta_pct": 1.5, "loss": 0.1, "variant": "v", "verdict": "holds"},
            {"reference": "reliable", "ppl_deltas": [0.5, 0.7], "delta_sd": 0.1,
             "ppl_delta_pct": 0.6, "loss": 0.1, "variant": "w",
             "verdict": verdict.INCONCLUSIVE, "verdict_withheld": "regime unchecked"},
            {"reference": "reliable", "ppl_deltas": [0.7, 0.9], "delta_sd": 0.1,
             "ppl_delta_pct": 0.8, "loss": 0.1, "variant": "x",
             "verdict": verdict.INCONCLUSIVE}]
    records = [{"seed": 2, "role": "lossy", "run_s": 60.0}]
    priced = bench_summary.budget(records, rows, 60.0)["rows"]
    assert [r["variant"] for r in priced] == ["v", "w", "x"]
    # a verdict, a withheld one, and a mean on the band's edge: nothing decides them
    assert [r["seeds_to_decide"] for r in priced] == [None, None, None]
    assert [r["seeds_now"] for r in priced] == [2, 2, 2]


def test_the_fewest_seeds_for_a_half_width():
    t = bench_summary.t95
    assert bench_summary.seeds_for(0.0, 0.1) == 2
    assert bench_summary.seeds_for(1.0, 1.0) == 7  # t95(6)/√6 = 1.05, t95(7)/√7 = 0.92
    exactly_five = t(5) / math.sqrt(5)
    assert bench_summary.seeds_for(1.0, exactly_five) == 5  # at most the target: reached
    assert bench_summary.seeds_for(1.0, t(7) / math.sqrt(7), most=7) == 7
    assert bench_summary.seeds_for(1.0, t(8) / math.sqrt(8), most=7) is None
    assert bench_summary.seeds_for(1.0, 1e-9) is None


@pytest.mark.parametrize("steps, growth", [
    ([(1, 1.0), (10, 10.0), (100, 100.0)], 1.0),
    ([(1, 1.0), (10, 10.0)], None),                         # two points: no slope
    ([(0, 3.0), (1, 1.0), (10, 10.0), (100, 100.0)], 1.0),  # step 0: no log, left out
    ([(1, 1.0), (10, 0.0), (10, 10.0), (100, 100.0)], 1.0),  # distance 0: left out
    ([(1, 5.0), (2, 1.0), (20, 10.0), (200, 100.0)], None),  # step 1 counts: not a line
])
def test_the_drift_growth_is_the_slope_of_log_distance_on_log_step(steps, growth):
    got = bench_summary.drift_growth(steps)
    if growth is None and len(steps) < 3:
        assert got is None
    elif growth is None:
        assert got is not None and abs(got - 1.0) > 0.05
    else:
        assert got == pytest.approx(growth)


def test_the_fine_tune_gain_is_of_references_only_and_finds_a_seed_by_its_text():
    records = [{"seed": 2, "role": "reference", "variant": "reliable", "ppl": 9.0},
               {"seed": 3, "role": "reference", "variant": "reliable", "ppl": 10.8},
               {"seed": 2, "role": "twin", "variant": "reliable", "ppl": 1.0},
               {"seed": 5, "role": "reference", "variant": "reliable", "ppl": 1.0}]
    assert bench_summary.reference_gains(records, {2: 10.0, "3": 12.0}) == {
        "reliable": pytest.approx(-10.0)}
    assert bench_summary.reference_gains(records, None) == {}


def test_a_verdicts_cell():
    cell = bench_summary.verdict_cell
    assert cell({"verdict": None}) == "-"
    assert cell({"verdict": "holds", "ppl_delta_ci95": None}) == "one seed"
    assert cell({"verdict": "holds", "ppl_delta_ci95": 0.1}) == "holds"
    assert cell({"verdict": "inconclusive", "ppl_delta_ci95": None,
                 "verdict_withheld": "why"}) == "inconclusive (withheld)"


def test_records_without_roles_a_late_reference_and_reliables_full_run_under_loss():
    records = [
        _run("reliable", 0, 2, 10.0), _run("reliable", 0, 3, 10.2, packets_lost=4,
                                           packets_sent=100),
        _run("unbiased_drift", 0.1, 2, 10.1, tokens_per_s=80.0),
        _run("unbiased_drift", 0.1, 3, 10.3, tokens_per_s=90.0, disturbed=True),
        # reliable under loss: a full run and a speed run, at 50 and 95 tokens/s
        _run("reliable", 0.1, 2, 10.5, "lossy", tokens_per_s=50.0),
        _run("reliable", 0.1, 2, 10.9, "speed", steps=5, tokens_per_s=95.0)]
    got = bench_summary.summarise(with_twins(records), {}, "gloo")
    rows = {(r["loss"], r["variant"]): r for r in got["rows"]}
    lossy = rows[(0.1, "unbiased_drift")]
    assert lossy["roles"] == ["lossy"] and lossy["ppl_deltas"] == [
        pytest.approx(1.0), pytest.approx((10.3 / 10.2 - 1) * 100)]
    assert lossy["disturbed"] == [3] and lossy["reference_missed_packets"] == [3]
    assert rows[(0, "reliable")]["reference_missed_packets"] == []
    assert lossy["throughput_vs_reliable"] == pytest.approx(85.0 / 95.0)  # the speed run
    assert got["checks"]["references_missing_packets"] == [
        {"variant": "reliable", "seed": 3, "packets_lost": 4, "packets_sent": 100}]


def with_twins(records: list[dict]) -> list[dict]:
    """The records and a twin of each lossless reliable run, moved by nothing."""
    return records + [dict(r, role="twin", model_sha="twin") for r in records
                      if r["variant"] == "reliable" and r["loss"] == 0 and not r.get("role")]


def test_one_seed_no_speed_runs_and_runs_without_step_times():
    empty = Histogram().to_dict()
    records = [
        _run("reliable", 0, 2, 10.0),
        _run("unbiased_drift", 0.1, 2, 10.1, "lossy", tokens_per_s=80.0, step_hist=empty,
             drift_steps=[(1, 0.01), (10, 0.1), (100, 1.0)]),
        _run("reliable", 0.1, 2, 10.5, "lossy", tokens_per_s=40.0)]
    row = {(r["loss"], r["variant"]): r
           for r in bench_summary.summarise(records, {}, "gloo")["rows"]}[
        (0.1, "unbiased_drift")]
    # one seed: a mean and no interval, of Δppl and of the drift's growth
    assert row["ppl_delta_pct"] == pytest.approx(1.0) and row["ppl_delta_ci95"] is None
    assert row["drift_growth"] == pytest.approx(1.0) and row["drift_growth_ci95"] is None
    # no speed runs: against reliable's own runs at the loss
    assert row["throughput_vs_reliable"] == pytest.approx(2.0)
    # no step times: no tail and no ratio of one
    assert (row["step_p99_ms"], row["step_max_ms"]) == (None, None)
    assert (row["p99_vs_reliable"], row["max_vs_reliable"]) == (None, None)


def test_each_row_is_placed_on_its_own_references_curve():
    from harness.bench import progress

    curve = [[0, 30.0], [5, 12.0]]
    records = [_run("reliable", 0, s, 10.0, progress_steps=curve) for s in (2, 3)] + [
        _run("unbiased_drift", 0.1, 2, 11.0, "lossy"),
        _run("unbiased_drift", 0.1, 3, 10.5, "lossy")]
    got = bench_summary.summarise([dict(r) for r in records], {}, "gloo")
    row = next(r for r in got["rows"] if r["variant"] == "unbiased_drift")
    refs = {(r["variant"], r["seed"]): r for r in records if r["variant"] == "reliable"}
    want = progress.row_progress(records[2:], refs, "reliable")
    assert row["steps_behind_by_seed"] == want["steps_behind_by_seed"]
    assert set(row["steps_behind_by_seed"]) == {"2", "3"}
    assert 0 < row["steps_behind"] < 5


def test_the_budget_decides_by_the_band_the_bench_was_judged_against():
    records = [_run("reliable", 0, s, 10.0) for s in (2, 3)] + [
        _run("unbiased_drift", 0.1, 2, 10.03, "lossy"),
        _run("unbiased_drift", 0.1, 3, 10.05, "lossy")]
    got = bench_summary.summarise(with_twins(records), {}, "gloo", band_pct=0.5)
    row = next(r for r in got["rows"] if r["variant"] == "unbiased_drift")
    assert row["verdict"] == verdict.INCONCLUSIVE
    priced = got["budget"]["rows"][0]
    assert got["budget"]["target_ci95"] == 0.25
    assert priced["seeds_to_decide"] == bench_summary.seeds_for(
        row["delta_sd"], 0.5 - abs(row["ppl_delta_pct"]))
    assert priced["seeds_to_decide"] != bench_summary.seeds_for(
        row["delta_sd"], 0.8 - abs(row["ppl_delta_pct"]))


def test_a_row_on_the_bands_edge_or_beyond_any_seeds_is_not_priced_to_decide():
    rows = [{"reference": "reliable", "ppl_deltas": [0.8, 0.8], "delta_sd": 0.0,
             "ppl_delta_pct": 0.8, "loss": 0.1, "variant": "edge",
             "verdict": verdict.INCONCLUSIVE},
            {"reference": "reliable", "ppl_deltas": [-900.0, 900.0], "delta_sd": 1e6,
             "ppl_delta_pct": 0.0, "loss": 0.1, "variant": "wild", "verdict": "holds"}]
    priced = bench_summary.budget([{"seed": 2, "role": "lossy", "run_s": 60.0}], rows, 60.0)
    edge, wild = priced["rows"]
    assert edge["seeds_to_decide"] is None and edge["minutes_to_decide"] is None
    assert wild["seeds_for_target"] is None and wild["minutes_for_target"] is None
