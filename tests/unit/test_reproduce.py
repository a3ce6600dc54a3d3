"""`lossbed reproduce`: the verdict logic, and each row's checks on both sides — the real
schemes hold, planted wrong ones (a biased estimator, a drift that grows like √t, a
collective that does not compute what it claims) are reported as "does not hold"."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.metrics.verdict import FAILS, HOLDS, INCONCLUSIVE, Check, combine
from harness.reproduce import aggregation, drift, rps_scaling, training


@pytest.mark.parametrize("measured, half, verdict", [
    (0.02, 0.03, HOLDS),           # [-0.01, 0.05] within 0 ± 0.1
    (0.30, 0.05, FAILS),           # [0.25, 0.35] entirely outside
    (0.05, 0.10, INCONCLUSIVE),    # [-0.05, 0.15] reaches across the edge at 0.1
    (0.00, float("inf"), INCONCLUSIVE),  # one seed: no interval
])
def test_a_verdict_is_an_equivalence_test(measured, half, verdict):
    assert Check("x", measured, half, 0.0, 0.1, 10).verdict == verdict


def test_a_claim_holds_only_if_every_check_does():
    holds, fails, unsure = (Check("x", m, h, 0, 0.1, 9) for m, h in
                            ((0, 0.01), (1, 0.01), (0.09, 0.05)))
    assert combine([holds, holds]) == HOLDS
    assert combine([holds, unsure]) == INCONCLUSIVE
    assert combine([holds, unsure, fails]) == FAILS


# ---- row 1 --------------------------------------------------------------------------------


def test_the_real_collective_computes_the_mean_of_exactly_what_arrived():
    check, detail = aggregation.exact_check(steps=2)
    assert detail["data_packets_dropped"] > 20  # loss really happened (≈ 70 expected)
    assert check.verdict == HOLDS, detail


def test_a_collective_computing_something_else_is_caught_element_by_element():
    """zero_fill divides by n where the mean of what arrived divides by the count."""
    check, detail = aggregation.exact_check(steps=2, estimator="zero_fill")
    assert check.verdict == FAILS and detail["mismatched"] > 1000, detail


def own_value(total, count, own, world, p):
    """Planted: the owner's own contribution. Unbiased when every rank's data has the same
    mean (why the old test, with identical data only, could not tell)."""
    return own


def test_the_estimators_meet_their_predictions_and_a_planted_one_does_not():
    by = {(m["case"], m["estimator"]): m["verdict"]
          for m in aggregation.monte_carlo_checks(estimators=[*aggregation.ESTIMATORS,
                                                               own_value])}
    for estimator in aggregation.ESTIMATORS:
        for case in aggregation.CASES:
            assert by[(case, estimator)] == HOLDS, (case, estimator)
    assert by[("different means", "own_value")] == FAILS


def test_the_predicted_biases_are_the_formulas():
    means = np.ones(4)
    # zero-fill at n = 4, p = 0.1, mu = 1: owner -p (n-1)/n mu; everyone the issue's -0.069
    assert aggregation.predicted_bias("zero_fill", means, 0.1) == pytest.approx([-0.075] * 4)
    assert aggregation.predicted_bias("zero_fill", means, 0.1, at="everyone") == \
        pytest.approx([-0.075 * (1 - 0.075)] * 4)
    different = np.linspace(-1.0, 2.0, 4)
    assert aggregation.predicted_bias("rescale", different, 0.1) == pytest.approx([0] * 4)
    bias = aggregation.predicted_bias("received_mean", different, 0.1)
    assert bias[0] < 0 < bias[3] and abs(bias.sum()) < 1e-12  # they cancel over shards


# ---- row 2 --------------------------------------------------------------------------------


def test_parameter_broadcast_drift_is_bounded_and_a_random_walk_is_not():
    # 600 steps: at 300 both checks were inconclusive (their intervals reach across the
    # tolerance), which the old `!= FAILS` let pass; a claim that holds must say HOLDS
    steps = 600
    bounded = drift.bounded_checks(drift.simulate(2, steps, 0.1, "parameter"), 2, 0.1, steps)
    assert combine(bounded) == HOLDS, [c.to_dict() for c in bounded]
    # planted: gradient mode without resync, whose drift grows like √t
    walk = drift.bounded_checks(drift.simulate(2, steps, 0.1, "gradient"), 2, 0.1, steps)
    assert walk[0].verdict == FAILS and walk[0].measured > 0.35, walk[0]


def test_the_growth_exponent_of_a_pure_square_root_drift_is_one_half():
    t = np.arange(1, 2001, dtype=np.float64)
    exponent, half = drift.growth_exponent(1e-4 * t)  # mean square ∝ t: rms ∝ √t
    # (0.499: a window's mean against its midpoint, on log-spaced windows)
    assert exponent == pytest.approx(0.5, abs=0.005) and half < 0.01
    flat, _ = drift.growth_exponent(np.full(2000, 3e-4))
    assert flat == pytest.approx(0.0, abs=1e-9)


# ---- row 3 --------------------------------------------------------------------------------


def test_rps_adds_the_predicted_variance_and_a_step_that_averages_nothing_does_not():
    predicted = rps_scaling.predicted_variance(2, 0.1)
    measured = rps_scaling.measure(2, 40, 0.1)
    assert abs(measured.mean() / predicted - 1) < 0.2, (measured.mean(), predicted)
    untouched = rps_scaling.measure(2, 5, 0.1, average=lambda rps, x: None)
    assert untouched.max() == 0.0


def test_row_3_does_not_hold_for_a_step_that_averages_nothing(monkeypatch):
    # planted: an RPS step that leaves every model as it was adds no variance, so 3a's
    # v(n) / predicted is 0, not 1 (the old test only looked at the measurement)
    real = rps_scaling.measure
    monkeypatch.setattr(rps_scaling, "measure", lambda world, trials, p: real(
        world, trials, p, average=lambda rps, x: None))
    claims = {c["row"]: c for c in rps_scaling.run(worlds=(2, 4), trials=4, echo=lambda m: None)}
    assert claims["3a"]["verdict"] == FAILS, claims["3a"]


def test_the_formula_agrees_with_enumeration_and_with_a_direct_simulation():
    """Expected values that are not the module's own output. n = 2 by hand: the other
    rank's block arrives at the owner (a) and the owner's average arrives back (b), each
    with probability 0.9; the average model moves by ((1 + b) m - x_o - b x_k) / 2 with
    m = (x_o + a x_k) / (1 + a). Its variance (s = 1): a=1, b=0 (0.09): 0.5 / 4;
    a=0, b=1 (0.09): 2 / 4; otherwise 0. So v(2) = (0.045 + 0.18) / 4 = 0.05625."""
    assert rps_scaling.predicted_variance(2, 0.1) == pytest.approx(0.05625, rel=0.01)
    # n = 4: simulate the semantics themselves (owner 0 averages what arrived, a rank
    # takes that average if it arrived, else keeps its own), not the formula's algebra
    rng = np.random.default_rng(3)
    draws, world, p = 200_000, 4, 0.1
    x = rng.standard_normal((draws, world))
    arrived = rng.random((draws, world)) >= p    # rank k's block reached the owner
    returned = rng.random((draws, world)) >= p   # the owner's average reached rank k
    arrived[:, 0] = returned[:, 0] = True        # the owner has its own
    owner_mean = (x * arrived).sum(1) / arrived.sum(1)
    after = np.where(returned, owner_mean[:, None], x)
    moved = after.mean(1) - x.mean(1)
    assert rps_scaling.predicted_variance(4, 0.1) == pytest.approx(float((moved ** 2).mean()),
                                                                  rel=0.02)


# ---- rows 4-5 -----------------------------------------------------------------------------


# what harness.bench.stability.check gives (a stable reference: its twins' interval inside)
STABLE = {"reference": "reliable", "seeds": [2, 3], "perturbation": "one step with 10% of "
          "its gradient's datagram blocks zeroed", "ppl_references": [107.120, 92.3],
          "ppl_twins": [107.185, 92.31], "deltas_pct": [0.06, 0.01], "stable": True,
          "delta_pct": 0.035, "delta_ci95": 0.1, "tolerance_pct": 0.2}


def _summary(rows, stability=STABLE):
    """A bench's summary: every row carries its reference's chaos check (`stability`)."""
    return {"config": {"hosts": 4, "preset": "tiny", "steps": 60, "seeds": 3,
                       "optimizer": "adamw", "lr": 2e-3, "profile": "random-loss"},
            "stability": {"reliable": stability},
            "rows": [{"loss": loss, "variant": v, "seeds": 3, "ppl": 100.0,
                      "ppl_delta_pct": d, "ppl_delta_ci95": h, "ppl_rank_worst": 101.0,
                      "drift": 0.0, "measured_loss": loss,
                      "reference": None if loss == 0 else "reliable",
                      "chaos_check": None if loss == 0 else stability}
                     for loss, v, d, h in rows]}


def test_the_training_rows_hold_the_10_percent_runs_to_the_papers_bound():
    claims = {c["row"]: c for c in training.rows({"curve": _summary([
        (0.1, "unbiased_drift", 0.3, 0.2), (0.1, "rps", 2.0, 0.5),
        (0.3, "rps", 0.5, 1.0), (0.0, "reliable", 0.0, None)])})}
    assert claims["4a"]["verdict"] == HOLDS       # [0.1, 0.5] within ±0.8
    assert claims["4b"]["verdict"] == FAILS       # [1.5, 2.5] outside
    assert claims["4c"]["verdict"] == INCONCLUSIVE  # [-0.5, 1.5]: wider than the band


# Every rule that withholds a verdict (harness/bench/withholding.py), on planted rows on
# both sides of it: the row would hold (Δppl 0.1 ± 0.2) or fail (5.0 ± 0.5) by its numbers;
# with the rule's condition it gets no verdict, without it the numbers' verdict
RULE_CASES = {
    "regime unchecked": {"chaos_check": None},
    "regime unstable": {"chaos_check": {**STABLE, "stable": False, "delta_pct": 13.0}},
    "disturbed": {"disturbed": [0, 1]},
    "references late": {"reference_missed_packets": [1]},
}


def test_every_withholding_rule_has_a_planted_case():
    from harness.bench import withholding

    assert set(RULE_CASES) == set(withholding.RULES)


@pytest.mark.parametrize("rule", list(RULE_CASES))
@pytest.mark.parametrize(("delta", "half", "verdict"), [(0.1, 0.2, HOLDS), (5.0, 0.5, FAILS)])
def test_each_rule_withholds_the_verdict_whatever_the_delta_and_only_when_it_applies(
        rule, delta, half, verdict):
    """The same rule and the same reason in reproduce's rows and in the bench's own."""
    from harness.bench import summary as bench_summary

    clean = _summary([(0.1, "unbiased_drift", delta, half)])
    planted = _summary([(0.1, "unbiased_drift", delta, half)])
    planted["rows"][0].update(RULE_CASES[rule])
    assert training.rows({"curve": clean})[0]["verdict"] == verdict
    assert bench_summary.judge(clean["rows"][0], 0.8).verdict == verdict
    assert training.rows({"curve": clean})[0]["verdict"] == verdict
    withheld = training.rows({"curve": planted})[0]
    assert withheld["verdict"] == INCONCLUSIVE
    assert rule in withheld["measured"]["quantity"]
    assert withheld["measured"]["disturbed"].startswith(rule)
    in_the_bench = bench_summary.judge(planted["rows"][0], 0.8)
    assert in_the_bench.verdict == INCONCLUSIVE
    assert in_the_bench.disturbed == withheld["measured"]["disturbed"]


def test_no_rule_reads_the_delta():
    from harness.bench import withholding

    row = {"disturbed": [], "reference_missed_packets": [], "reference": "reliable"}
    for delta in (-50.0, -0.5, 0.0, 0.5, 50.0, None, float("nan")):
        for half in (0.01, 5.0, None):
            planted = {**row, "ppl_delta_pct": delta, "ppl_delta_ci95": half,
                       "ppl_deltas": [delta]}
            assert withholding.withheld({**planted, "chaos_check": STABLE}) is None
            assert withholding.withheld({**planted, "chaos_check": None}).startswith(
                "regime unchecked")


def test_a_row_whose_runs_were_disturbed_is_no_verdict_on_the_algorithm():
    # reproduce --full's burst bench: at 10% burst loss the collectives missed 16-94% of
    # their packets (a rank fell behind; late is lost), and Δppl +77 ± 69 would have read
    # "does not hold" for the algorithm under 10% loss
    summary = _summary([(0.1, "unbiased_drift", 77.3, 68.9), (0.1, "rps", 35.4, 31.1)])
    summary["rows"][0]["disturbed"] = [0, 1, 2, 3]
    claims = {c["row"]: c for c in training.rows({"curve": summary})}
    assert claims["4a"]["verdict"] == INCONCLUSIVE
    assert "disturbed" in claims["4a"]["measured"]["quantity"]
    assert claims["4b"]["verdict"] == FAILS  # the same numbers, undisturbed


def test_the_training_benches_are_valid_specs_in_a_stable_regime_with_its_twin():
    for quick in (True, False):
        for spec in training.plans(quick).values():
            assert (spec.train.optimizer, spec.train.lr) == ("adamw", 2e-3) and spec.stability
            # every reference on every seed (seeds after the pilots')
            references = [(r.variant, r.cfg.seed) for r in spec.cases()
                          if r.role == "reference"]
            assert [(r.variant, r.cfg.seed) for r in spec.cases()
                    if r.role == "twin"] == references
            assert all(seed >= 2 for _, seed in references)


# ---- the command --------------------------------------------------------------------------


def test_lossbed_reproduce_writes_the_table_and_refuses_an_unknown_row(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness.cli", "reproduce", "--rows", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "reproduction.json").read_text())
    assert [c["row"] for c in result["claims"]] == ["1a", "1b", "1c", "1d", "1e", "1f"]
    assert all(c["verdict"] == HOLDS for c in result["claims"]), result["claims"]
    table = (tmp_path / "reproduction.md").read_text()
    assert "| 1b | arXiv 2507.07114 |" in table and "**holds**" in table
    bad = subprocess.run([sys.executable, "-m", "harness.cli", "reproduce", "--rows", "9",
                          "--out", str(tmp_path / "x")], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    assert bad.returncode != 0 and "--rows" in bad.stderr and not (tmp_path / "x").exists()


def test_a_mean_of_few_values_gets_students_t_not_the_normal_quantile():
    # The drift row's stationary value is a mean of batch means: 4 batches at --quick (400
    # steps), 20 at --full. With the normal quantile its interval was 38% (quick) and 6%
    # (full) narrower than a 95% interval of so few values is. Mutation caught: t95 returning
    # the normal's 1.96, or n instead of n - 1 degrees of freedom. Expected values are
    # Student's t from printed tables (not this code's own output).
    from testbed import stats

    values = [1.0, 2.0, 3.0, 4.0]
    mean, half = stats.mean_interval(values)
    sd = statistics.stdev(values)
    assert mean == 2.5 and half == pytest.approx(3.182 * sd / 2, rel=1e-3)
    assert stats.mean_interval([5.0]) == (5.0, math.inf)  # one value: no interval
    assert stats.t95(12) == pytest.approx(2.201, abs=1e-3)   # 11 degrees
    assert stats.t95(20) == pytest.approx(2.093, abs=1e-3)   # 19 degrees
    assert stats.t95(61) == pytest.approx(2.000, abs=1e-3)
    assert stats.t95(200_000) == pytest.approx(1.95996, abs=1e-4)  # the normal's


def test_a_slopes_interval_is_students_t_over_its_residuals():
    # y = 2x + residuals (+1, -1, -1, +1) at x = 0..3: slope 2, its standard error
    # sqrt(sum r^2 / (n-2) / sum (x - mean)^2) = sqrt(4/2/5), t with 2 degrees 4.303
    from testbed import stats

    slope, half = stats.slope_interval([0, 1, 2, 3], [1, 1, 3, 7])
    assert slope == pytest.approx(2.0)
    assert half == pytest.approx(4.303 * math.sqrt(4 / 2 / 5), rel=1e-3)
    assert stats.slope_interval([0, 1], [0, 1])[1] == math.inf


# Planted rebuilds in the real collective (harness.collectives.lossy calls rebuild for the
# owner's estimate, and pipeline.py for the packets it broadcasts before the reduce stage
# ends): rows 1b and 1d must fail on them


def _own_value_rebuild(estimator, total, count, own, world, loss_rate, out=None):
    out = np.empty_like(own) if out is None else out
    out[...] = own
    return out


def _biased_rebuild(estimator, total, count, own, world, loss_rate, out=None):
    from harness.collectives.rebuild import rebuild

    estimate = rebuild(estimator, total, count, own, world, loss_rate, out=out)
    estimate *= 1.01
    return estimate


@pytest.mark.parametrize(("planted", "estimator", "case", "steps"), [
    # own value: mean error 0 with identical means (the old 1b passed it), squared error 27x
    (_own_value_rebuild, "received_mean", "identical means", 5),
    (_biased_rebuild, "received_mean", "identical means", 5),
    # own value: off by mu_o - mean(mu) on every shard
    (_own_value_rebuild, "rescale", "different means", 5),
    # +1%: within the interval of 4 x ROW1_STEPS steps, which the row runs
    (_biased_rebuild, "rescale", "identical means", 4 * aggregation.ROW1_STEPS),
])
def test_rows_1b_and_1d_fail_on_a_planted_rebuild_in_the_real_collective(
        monkeypatch, planted, estimator, case, steps):
    from harness.collectives import lossy, pipeline

    monkeypatch.setattr(lossy, "rebuild", planted)
    monkeypatch.setattr(pipeline, "rebuild", planted)
    checks, detail = aggregation.collective_checks(estimator, case, steps)
    assert combine(checks) == FAILS, [c.to_dict() for c in checks]
    # measured on what the collective did: its drop mask dropped, its rate was measured
    assert 0.08 < detail["rate_applied"] < 0.12
    assert all(0.05 < r < 0.15 for r in detail["rate_used"])


def test_row_1b_holds_for_the_true_rebuild_on_the_real_collective():
    checks, detail = aggregation.collective_checks("received_mean", "identical means",
                                                   aggregation.ROW1_STEPS)
    assert combine(checks) == HOLDS, [c.to_dict() for c in checks]
    squared = checks[-1]
    assert "squared" in squared.quantity and squared.predicted > 0.02
    # (rescale holding: the whole row at --quick, test_lossbed_reproduce_writes_the_table)
    checks, _ = aggregation.collective_checks("rescale", "different means",
                                              aggregation.ROW1_STEPS)
    # different means, per shard: received-mean's owner-weighting would be -0.055 on shard 0
    assert all(abs(c.measured) < aggregation.SHARD_TOLERANCE for c in checks)


# ---- row 6 --------------------------------------------------------------------------------


def _map_summary(cells, stability=STABLE, regime="scratch: 60 steps at adamw peak 0.002"):
    summary = _summary([(0.1, v, d, h) for v, d, h in cells] + [(0.0, "reliable", 0.0, None)],
                       stability)
    for row in summary["rows"]:
        row["ppl_deltas"] = [row["ppl_delta_pct"]] * 3
    return {**summary, "regime": regime, "tokens_seen": [15360]}


def test_the_regime_map_gives_every_cell_its_delta_interval_seeds_and_verdict():
    from harness.reproduce import regime_map, report

    summaries = {
        "scratch 1e-4": _map_summary([("unbiased_drift", 0.1, 0.2),
                                      ("unbiased_drift/reduce", 0.0, 0.1),
                                      ("unbiased_drift/broadcast", 0.2, 1.0)]),
        "scratch 2e-3": _map_summary([("unbiased_drift", 14.0, 3.0),
                                      ("unbiased_drift/reduce", 1.8, 0.5),
                                      ("unbiased_drift/broadcast", 13.3, 2.0),
                                      ("unbiased_drift/resync=5", 3.0, 1.0)],
                                     stability={**STABLE, "stable": False,
                                                "delta_pct": 1.5}),
    }
    claims = {c["row"]: c for c in regime_map.rows(summaries)}
    # labels by the regime's place in the map, not the run's order: scratch 2e-3 is 6c in
    # --quick as in --full
    assert list(claims) == ["6a", "6c", "6c-resync"]
    cells = {(c["regime"], c["variant"]): c for claim in claims.values()
             for c in claim["cells"]}
    assert cells[("scratch 1e-4", "unbiased_drift")]["verdict"] == HOLDS
    assert cells[("scratch 1e-4", "unbiased_drift/broadcast")]["verdict"] == INCONCLUSIVE
    assert claims["6a"]["verdict"] == INCONCLUSIVE
    # scratch 2e-3 failed its twin check: no cell of it gets a verdict, whatever its Δppl
    assert all(c["verdict"] == INCONCLUSIVE and c["withheld"].startswith("regime unstable")
               for (regime, _), c in cells.items() if regime == "scratch 2e-3")
    one = cells[("scratch 1e-4", "unbiased_drift/reduce")]
    assert (one["ppl_delta_pct"], one["ppl_delta_ci95"], one["seeds"]) == (0.0, 0.1, 3)
    # the resync curve starts at K = 0, the scheme's own cell
    assert [c["variant"] for c in claims["6c-resync"]["cells"]] == [
        "unbiased_drift", "unbiased_drift/resync=5"]
    table = report.markdown({"mode": "quick", "commit": "x", "date": "d",
                             "claims": list(claims.values())})
    assert "| scratch 1e-4 | unbiased_drift/reduce | +0.00 | 0.10 | +0.00, +0.00, +0.00 | 3 " \
           "| holds |" in table
    assert table.count("| scratch 2e-3 | unbiased_drift |") == 1
    assert "regime unstable" in table


def test_the_regime_map_benches_are_valid_and_quick_is_a_subset():
    from harness.reproduce import regime_map

    full, quick = regime_map.plans(False), regime_map.plans(True)
    assert set(quick) < set(full) == set(regime_map.REGIMES)
    for plans in (full, quick):
        for spec in plans.values():
            assert spec.stability and spec.losses == (0.1,) and spec.train.optimizer == "adamw"
            assert set(regime_map.STAGES) <= set(spec.variants)
            assert "reliable" not in spec.variants  # its lossless runs are the references
    scratch = full["scratch 2e-3"]
    assert [v for v in scratch.variants if "resync" in v] == [
        "unbiased_drift/resync=20", "unbiased_drift/resync=5", "unbiased_drift/resync=1"]
    finetune = full["finetune 1e-4"]
    assert (finetune.regime, finetune.train.lr, finetune.finetune_lr) == ("finetune", 2e-3, 1e-4)
    assert {(s.regime, s.train.lr) for n, s in full.items() if n.startswith("scratch")} == {
        ("scratch", 1e-4), ("scratch", 5e-4), ("scratch", 2e-3)}


def test_a_stopped_regime_map_resumes_from_the_benches_that_finished(tmp_path, monkeypatch):
    import contextlib

    from harness.reproduce import regime_map

    benched, lines = [], []

    def fake_bench(cluster, spec, out, echo):
        benched.append(spec.train.lr)
        out.mkdir(parents=True, exist_ok=True)
        summary = _map_summary([(v, 0.1, 0.2) for v in spec.variants])
        (out / "summary.json").write_text(json.dumps(summary))
        return summary

    monkeypatch.setattr(regime_map, "run_bench", fake_bench)
    place = lambda spec: contextlib.nullcontext(None)  # noqa: E731
    first = regime_map.run(place, True, tmp_path, echo=lines.append, commit="abc1234")
    assert len(benched) == len(regime_map.QUICK_REGIMES)
    # again with the same --out: nothing is trained again, and it says so
    again = regime_map.run(place, True, tmp_path, echo=lines.append, commit="abc1234")
    assert len(benched) == len(regime_map.QUICK_REGIMES) and again == first
    assert sum("reused its finished bench" in line for line in lines) == 2
    # a bench of another commit, or one that stopped (no marker), is run again
    (tmp_path / "bench-map-scratch-2e-3" / regime_map.MARKER).unlink()
    regime_map.run(place, True, tmp_path, echo=lines.append, commit="def5678")
    assert len(benched) == 2 * len(regime_map.QUICK_REGIMES)


# ---- row 7: RPS training at n = 2, 4, 8 ------------------------------------------------------


def test_the_rps_server_benches_keep_the_global_batch_and_judge_rps_against_reliable_sgd():
    from harness.reproduce import rps_servers

    for quick in (True, False):
        plans = rps_servers.plans(quick)
        assert sorted(plans) == [2, 4, 8]
        for n, spec in plans.items():
            assert spec.hosts == n and spec.train.batch * n == rps_servers.GLOBAL_BATCH
            cases = spec.cases()
            assert {c.variant for c in cases if c.role == "reference"} == {"reliable/sgd"}
            assert {c.variant for c in cases if c.role == "twin"} == {"reliable/sgd"}
            assert {(c.variant, c.cfg.optimizer) for c in cases if c.role == "lossy"} == {
                ("rps", "sgd")}


def _rps_summary(deltas, seeds=(2, 3, 4, 5)):
    from testbed import stats

    mean, half = stats.mean_interval(list(deltas))
    return {"config": {"seq_len": 64, "seeds": len(deltas)}, "regime": "scratch",
            "stability": {"reliable/sgd": STABLE},
            "rows": [{"loss": 0.1, "variant": "rps", "seeds": len(deltas),
                      "ppl_delta_pct": mean, "ppl_delta_ci95": half,
                      "ppl_deltas": list(deltas), "delta_seeds": list(seeds), "ppl": 100.0,
                      "reference": "reliable/sgd", "chaos_check": STABLE}]}


# Δppl per seed (seeds 2-5) at n = 2 and at n = 8 (n = 4 between them)
@pytest.mark.parametrize(("at_2", "at_8", "per_n", "trend", "bound"), [
    # shrinking on every seed by 0.4 ± 0.05: the paper's sentence shown
    ((0.5, 0.6, 0.4, 0.5), (0.1, 0.15, 0.05, 0.1), HOLDS, HOLDS, HOLDS),
    # the same on every seed: no trend seen. Before #65 this printed "holds" under the
    # paper's sentence; only the weaker bound holds
    ((0.1, 0.2, 0.15, 0.1), (0.1, 0.2, 0.15, 0.1), HOLDS, INCONCLUSIVE, HOLDS),
    # up on two seeds, down on two: mean +0.01, no trend either way
    ((0.1, 0.2, 0.15, 0.1), (0.2, 0.1, 0.25, 0.04), HOLDS, INCONCLUSIVE, HOLDS),
    # grew by 0.1 on every seed: shown to grow (the sentence does not hold), within the bound
    ((0.1, 0.2, 0.15, 0.1), (0.2, 0.3, 0.26, 0.19), HOLDS, FAILS, HOLDS),
    # grew far beyond the bound
    ((0.1, 0.2, 0.15, 0.1), (2.4, 2.6, 2.5, 2.5), FAILS, FAILS, FAILS),
])
def test_row_7_tests_the_papers_trend_as_stated_and_the_weaker_bound_apart(
        at_2, at_8, per_n, trend, bound):
    from harness.reproduce import rps_servers

    middle = tuple((a + b) / 2 for a, b in zip(at_2, at_8, strict=True))
    summaries = {2: _rps_summary(at_2), 4: _rps_summary(middle), 8: _rps_summary(at_8)}
    claims = {c["row"]: c for c in rps_servers.rows(summaries)}
    assert claims["7a"]["verdict"] == per_n
    assert claims["7b"]["verdict"] == trend
    assert claims["7c"]["verdict"] == bound
    assert sorted(claims["7a"]["per_n"]) == [2, 4, 8]
    # 7b is the paper's sentence, tested one-sided on the seeds' paired differences
    (check,) = claims["7b"]["checks"]
    differences = [b - a for a, b in zip(at_2, at_8, strict=True)]
    assert check["measured"] == pytest.approx(sum(differences) / 4)
    assert check["trials"] == 4 and check["test"].startswith("one-sided")
    assert claims["7b"]["paper"] == "arXiv 1810.07766"
    assert "not the paper's sentence" in claims["7c"]["paper"]


def test_the_trend_pairs_the_seeds_it_has_at_both_ends():
    from harness.metrics import verdict

    assert verdict.paired({2: 0.1, 3: 0.5, 4: 0.2}, {3: 0.4, 4: 0.0, 5: 9.0}) == \
        pytest.approx([-0.1, -0.2])
    shown = verdict.decrease("d", [-0.4, -0.39, -0.41, -0.4])
    assert shown.verdict == HOLDS and shown.measured + shown.half_width < 0
    # one-sided t at 95% with 3 degrees: 2.353 (two-sided would be 3.182)
    spread = verdict.decrease("d", [-0.1, -0.3, -0.2, -0.2])
    assert spread.half_width == pytest.approx(2.353 * 0.0816 / 2, rel=1e-3)
    assert verdict.decrease("d", [-1.0]).verdict == INCONCLUSIVE  # one seed: no interval
    assert verdict.decrease("d", [-1.0, -1.1], disturbed="x").verdict == INCONCLUSIVE


def _row_8_record(role, variant, n, seed, ppl, optimizer="adamw"):
    return {"role": role, "variant": variant, "world": n, "seed": seed, "ppl": ppl,
            "drift": 0.1, "drift_max": 0.2 * n, "loss": 0.1 if role == "lossy" else 0.0,
            "config": {"optimizer": optimizer, "seq_len": 64, "steps": 40, "global_batch": 64,
                       "drop_once": 0.1 if role == "twin" else 0.0}}


def _row_8_records(twin_moves=(0.0, 0.0)):
    """Three seeds' planted runs; seeds 0 and 1 with twins that moved ppl by twin_moves
    percent (None: no twins)."""
    record = _row_8_record
    records = []
    for seed in (0, 1, 2):
        records += [record("start", "reliable", 4, seed, 102.0),
                    record("reference", "reliable", 4, seed, 100.0),
                    record("reference", "reliable", 4, seed, 110.0, "sgd")]
        if twin_moves is not None and seed < 2:
            move = 1 + twin_moves[seed] / 100
            records += [record("twin", "reliable", 4, seed, 100.0 * move),
                        record("twin", "reliable", 4, seed, 110.0 * move, "sgd")]
        for n, ud, rps in ((4, 100.1, 110.05), (64, 100.2 + 0.01 * seed, 112.0 + 0.1 * seed)):
            records += [record("lossy", "unbiased_drift", n, seed, ud),
                        record("lossy", "rps", n, seed, rps, "sgd")]
    return records


def test_row_8_judges_every_n_against_the_band_and_the_trend_of_rps():
    """The many-rank rows from planted runs: Δppl per seed against the same seed's
    reference, one check per n, labelled as the many-rank mode's."""
    from harness.reproduce import scale_rows

    claims = {c["row"]: c for c in scale_rows.rows(_row_8_records())}
    assert claims["8a"]["stability"]["stable"] and claims["8b"]["stability"]["stable"]
    assert claims["8a"]["verdict"] == "holds" and claims["8a"]["mode"] == "many-rank"
    assert claims["8a"]["per_n"][64]["drift_max"] == 12.8
    # lossless fine-tuning's own move beside it (102 -> 100: -1.96%, and 110 for SGD)
    assert [round(g, 2) for g in claims["8a"]["reference_gain_pct"]] == [-1.96] * 3
    assert [round(g, 2) for g in claims["8b"]["reference_gain_pct"]] == [7.84] * 3
    assert claims["8b"]["verdict"] == "does not hold"  # +1.8 to +3.6% at n = 64
    # the harm grew with n on every seed (+1.77, +1.86, +1.95 points): the paper's
    # sentence (8c) is shown not to hold, and so is lossbed's weaker bound (8d)
    assert claims["8c"]["verdict"] == "does not hold"
    assert claims["8c"]["checks"][0]["measured"] == pytest.approx(1.8636, abs=1e-3)
    assert claims["8d"]["verdict"] == "does not hold"
    assert "not the paper's sentence" in claims["8d"]["paper"]
    assert "many-rank mode" in claims["8b"]["measured"]["quantity"]


@pytest.mark.parametrize("twin_moves, reason", [
    ((0.05, 0.5), "regime unstable"),   # seed 1's twin moved ppl by more than a quarter band
    (None, "regime unchecked"),         # no twin run: nothing says the regime is stable
])
def test_row_8_withholds_its_verdicts_when_the_regime_is_chaotic_or_unchecked(twin_moves,
                                                                              reason):
    """The chaos check (harness/bench/stability.py) holds row 8 as it holds the bench: the
    same planted Δppl that gives 8a 'holds' and 8b 'does not hold' gets no verdict."""
    from harness.reproduce import scale_rows

    claims = {c["row"]: c for c in scale_rows.rows(_row_8_records(twin_moves))}
    for row in ("8a", "8b", "8c", "8d"):
        assert claims[row]["verdict"] == "inconclusive", row
        assert all(reason in (c["disturbed"] or "") for c in claims[row]["checks"]), row


def test_every_row_names_the_papers_claim_and_how_strong_its_test_is():
    """Every row label the reproduce modules can give (literal, or the regime map's and
    rows 4a/4b and 8a/8b made ones) is in harness/reproduce/sentences.py, and the report
    prints it."""
    import ast

    from harness.reproduce import regime_map, report, sentences

    labels = set()
    for path in Path(report.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "claim"
                    and isinstance(node.args[0], ast.Constant)):
                labels.add(node.args[0].value)
    labels |= {"4a", "4b", "8a", "8b"} | set(regime_map.LABELS.values()) | {
        f"{regime_map.LABELS['scratch 2e-3']}-resync"}
    assert {"1a", "2a", "3a", "4e", "5", "7b", "7c", "8c", "8d"} <= labels  # the scan works
    assert labels == set(sentences.SENTENCES)
    for row, (claim, tests) in sentences.SENTENCES.items():
        assert claim and tests.split(": ", 1)[0] in sentences.STRENGTHS, (row, tests)
    # the paper's trend and the weaker bound are told apart
    assert sentences.about("7b")["tests"].startswith("the claim: as stated")
    assert sentences.about("7c")["tests"].startswith("weaker")
    with pytest.raises(KeyError, match="sentences.py"):
        sentences.about("9z")
    table = report.markdown({"mode": "quick", "commit": "x", "date": "d", "claims": [
        {**claim_of("7b"), **sentences.about("7b")}]})
    assert "| 7b |" in table and "the claim: as stated" in table and SHRINKS_WORDS in table


SHRINKS_WORDS = "the harm of the drop rate shrinks as the number of servers grows"


def claim_of(row: str) -> dict:
    from harness.metrics.verdict import claim, decrease

    return claim(row, "arXiv 1810.07766", "x", "y", [decrease("d", [-0.1, -0.2])])


def test_row_8_with_twins_at_every_n_judges_each_n_by_its_own_check():
    """A chaotic reference at n = 64 withholds the n = 64 checks alone; without twins at an
    n, the smallest n's check stands for it (#65)."""
    from harness.reproduce import scale_rows

    records = _row_8_records()
    for seed in (0, 1, 2):  # twins at n = 64 too: AdamW's stable, SGD's moved by 1%
        records += [_row_8_record("twin", "reliable", 64, seed, 100.0),
                    _row_8_record("twin", "reliable", 64, seed, 110.0 * (1.01 + seed / 100),
                                  "sgd")]
    claims = {c["row"]: c for c in scale_rows.rows(records)}
    by_n = {c["quantity"]: c for c in claims["8b"]["checks"]}
    at_4 = next(c for q, c in by_n.items() if "(n=4," in q)
    at_64 = next(c for q, c in by_n.items() if "(n=64," in q)
    assert at_4["disturbed"] is None and at_4["verdict"] == "holds"
    assert at_64["disturbed"].startswith("regime unstable: the twins of reliable/sgd")
    assert claims["8b"]["per_n"][64]["chaos_check"]["stable"] is False
    assert claims["8a"]["verdict"] == "holds"  # AdamW's twins were stable at both n
