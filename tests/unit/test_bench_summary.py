"""The bench summary claims only what it checked: the reliable-under-loss equality is
"not run" when no reliable run under loss was made, and the table says so."""

from __future__ import annotations

import pytest

from harness.bench import summary as bench_summary
from harness.bench import table as bench_table
from harness.metrics.hdr import Histogram
from testbed import stats


def _record(variant: str, loss: float, seed: int, sha: str) -> dict:
    steps = Histogram()
    for us in (1000.0, 1100.0, 1200.0):
        steps.record(us)
    return {"variant": variant, "loss": loss, "seed": seed, "ppl": 10.0 + seed,
            "tokens_per_s": 100.0, "step_hist": steps.to_dict(), "measured_loss": loss,
            "drift": 0.0, "model_sha": sha, "steps": 10}


# a reference's chaos check that passed (harness/bench/stability.py): twins that moved
# nothing on 4 seeds
STABLE = {"reference": "reliable", "seeds": [2, 3, 4, 5], "deltas_pct": [0.0] * 4,
          "delta_pct": 0.0, "delta_ci95": 0.0, "tolerance_pct": 0.2, "stable": True,
          "perturbation": "one step with 10% of its gradient's datagram blocks zeroed"}


def with_twins(records: list[dict], moved_pct: float = 0.0) -> list[dict]:
    """The records and a twin of each reference (a reliable run at 0% without a role is
    one): its own seed, ppl moved by moved_pct, so that every reference is chaos-checked."""
    refs = [r for r in records if r.get("role", "reference" if r["variant"] == "reliable"
                                         and r["loss"] == 0 else "lossy") == "reference"]
    twins = [dict(r, role="twin", ppl=r["ppl"] * (1 + moved_pct / 100),
                  config={"drop_once": 0.1}, model_sha="twin") for r in refs]
    return records + twins


def test_reliable_equality_is_not_run_without_a_reliable_run_under_loss():
    records = [_record("reliable", 0.0, s, f"ref{s}") for s in (0, 1)]
    records += [_record("unbiased", 0.1, s, f"u{s}") for s in (0, 1)]
    summary = bench_summary.summarise(records, {}, "bpf")
    assert summary["checks"]["reliable_exact_under_loss"] is None
    assert "reliable under loss == lossless model: not run" in bench_table.table(summary)


def test_reliable_equality_holds_or_fails_by_the_models_it_compared():
    records = [_record("reliable", 0.0, s, f"ref{s}") for s in (0, 1)]
    same = records + [_record("reliable", 0.1, s, f"ref{s}") for s in (0, 1)]
    assert bench_summary.summarise(same, {}, "bpf")["checks"]["reliable_exact_under_loss"] is True
    differs = records + [_record("reliable", 0.1, 0, "ref0"), _record("reliable", 0.1, 1, "x")]
    checks = bench_summary.summarise(differs, {}, "bpf")["checks"]
    assert checks["reliable_exact_under_loss"] is False


def test_every_speed_run_of_the_bench_plan_is_compared_with_its_speed_reference():
    """The bench's own plan: each `reliable` speed run under loss has a lossless
    speed_reference of its seed and length, so the equality is checked (True), never
    silently "not run" (mutation caught: speed references of another length, or none,
    which left the check None). A speed run without one is named and fails the check."""
    from harness.bench.spec import BenchSpec

    spec = BenchSpec.make(seeds=4, steps=20, speed_steps=5, speed_seeds=3)
    records = [dict(_record(c.variant, c.loss, c.cfg.seed, f"sha{c.cfg.seed}-{c.cfg.steps}"),
                    role=c.role, steps=c.cfg.steps, loss_seed=c.loss_seed)
               for c in spec.cases()]
    speed = [r for r in records if r["role"] == "speed"]
    # the bench's first speed_seeds seeds (after the pilot seeds 0 and 1)
    assert sorted(r["seed"] for r in speed) == [2, 3, 4] == spec.seed_list[:3]
    assert len([r for r in records if r["role"] == "speed_reference"]) == 3
    assert BenchSpec.make().speed_seeds == 2 < BenchSpec.make().seeds  # the default's
    summary = bench_summary.summarise(records, {}, "bpf")
    assert summary["checks"]["reliable_exact_under_loss"] is True
    assert summary["checks"]["reliable_unpaired"] == []
    orphaned = [r for r in records if not (r["role"] == "speed_reference" and r["seed"] == 4)]
    summary = bench_summary.summarise(orphaned, {}, "bpf")
    assert summary["checks"]["reliable_exact_under_loss"] is False
    assert summary["checks"]["reliable_unpaired"] == [{"seed": 4, "loss": 0.1, "steps": 5}]
    assert "without a lossless run of its seed and length: seed 4 at 10% (5 steps)" \
        in bench_table.table(summary)


def test_with_three_steps_a_row_has_no_p99_but_its_maximum():
    records = [_record("reliable", 0.0, 0, "a"), _record("unbiased", 0.1, 0, "b")]
    row = bench_summary.summarise(records, {}, "bpf")["rows"][-1]
    assert row["step_p99_ms"] is None and row["step_samples"] == 3
    assert abs(row["step_max_ms"] - 1.2) < 0.001


def test_an_unsealed_bench_says_every_profile_is_isolated_and_the_default_does_not():
    from harness.bench.spec import BenchSpec

    own = BenchSpec.make(losses=[0.1], seeds=1, steps=10, isolated=True).cases()
    assert all(r.isolated for r in own)
    assert all(r.train_run().load_profile().isolated for r in own)
    shared = BenchSpec.make(losses=[0.1], seeds=1, steps=10).cases()
    assert not any(r.train_run().load_profile().isolated for r in shared)


def test_the_bench_plan_has_references_realisations_and_short_reliable_runs():
    from harness.bench.spec import BenchSpec

    spec = BenchSpec.make(losses=[0.1], seeds=2, steps=100, realisations=3, speed_steps=30,
                          variants=["reliable", "zero_fill", "unbiased", "unbiased_drift", "rps"])
    runs = spec.cases()
    by_role = {}
    for r in runs:
        by_role.setdefault(r.role, []).append(r)
    # rps (under SGD) is judged against reliable training under the same SGD
    assert sorted((r.variant, r.cfg.seed) for r in by_role["reference"]) == [
        ("reliable", 2), ("reliable", 3), ("reliable/sgd", 2), ("reliable/sgd", 3)]
    # no reference is a lossy collective here: none waits for every packet; the runs under
    # loss keep their deadlines
    assert not any(r.cfg.wait_for_all for r in runs)
    assert {r.variant for r in by_role["lossy"]} == {"zero_fill", "unbiased",
                                                     "unbiased_drift", "rps"}
    # reliable under loss: short, with as short a lossless twin per seed
    assert all(r.cfg.steps == 30 and r.variant == "reliable"
               for r in by_role["speed"] + by_role["speed_reference"])
    assert len(by_role["speed"]) == len(by_role["speed_reference"]) == 2
    # other loss realisations at the first seed, for the variants the question is about
    assert sorted((r.variant, r.loss_seed) for r in by_role["realisation"]) == [
        ("rps", 1000), ("rps", 2000), ("unbiased_drift", 1000), ("unbiased_drift", 2000)]
    assert all(r.cfg.seed == 2 for r in by_role["realisation"])
    # every lossy run is seeded, each (seed, realisation) with a loss seed of its own
    lossy = [r for r in runs if r.loss > 0]
    assert all(r.train_run().load_profile().impairment.loss.loss_pct == 10.0
               and r.train_run().load_profile().impairment.seed == r.loss_seed for r in lossy)
    assert len({(r.cfg.seed, r.loss_seed) for r in lossy if r.variant == "rps"}) == 4


def test_rps_is_compared_with_reliable_under_sgd_and_adamw_rps_with_itself():
    ppl = {"reliable": 10.0, "reliable/sgd": 12.0, "rps/adamw": 14.0}
    records = [dict(_record(v, 0.0, s, f"{v}{s}"), role="reference", ppl=ppl[v])
               for v in ppl for s in (0, 1)]
    lossy_ppl = {"rps": 12.6, "unbiased_drift": 10.5, "rps/adamw": 14.7}
    lossy = [dict(_record(v, 0.1, s, "x"), role="lossy", ppl=lossy_ppl[v])
             for v in lossy_ppl for s in (0, 1)]
    summary = bench_summary.summarise(records + lossy, {}, "bpf")
    rows = {r["variant"]: r for r in summary["rows"] if r["loss"] == 0.1}
    assert rows["rps"]["ppl_delta_pct"] == pytest.approx(5.0)            # 12.6 vs 12
    assert rows["unbiased_drift"]["ppl_delta_pct"] == pytest.approx(5.0)  # 10.5 vs 10
    assert rows["rps/adamw"]["ppl_delta_pct"] == pytest.approx(5.0)      # 14.7 vs 14
    assert rows["rps"]["reference"] == "reliable/sgd"
    assert rows["rps/adamw"]["reference"] == "rps/adamw"
    # the seed-to-seed spread of the lossless model is the main reference's (AdamW) alone
    assert summary["lossless_ppl"] == [10.0, 10.0]


def _judged(mean, half, seeds=4, band=0.8, **row):
    return bench_summary.judge({"reference": "reliable", "ppl_delta_pct": mean,
                                "ppl_delta_ci95": half, "ppl_deltas": [mean] * seeds,
                                "chaos_check": STABLE, **row}, band).verdict


@pytest.mark.parametrize(("mean", "half", "verdict"), [
    (0.0, 0.5, "holds"),            # inside: -0.5..+0.5 within ±0.8
    (0.33, 0.12, "holds"),          # the regime map's fine-tune cell: 0.21..0.45
    (-0.5, 0.3, "holds"),           # inside, a better model: -0.8..-0.2
    (0.5, 0.29, "holds"),           # just inside the upper edge (0.79)
    (0.5, 0.31, "inconclusive"),    # across the upper edge (0.81)
    (-0.6, 0.3, "inconclusive"),    # across the lower edge
    (0.0, 0.9, "inconclusive"),     # wider than the band: across both edges
    (1.5, 0.6, "does not hold"),    # outside above: 0.9..2.1
    (-2.0, 1.0, "does not hold"),   # outside below: -3.0..-1.0
    (1.0, 0.15, "does not hold"),   # outside, though near 0 by the old test's standard
])
def test_a_delta_is_judged_against_the_band_not_against_zero(mean, half, verdict):
    assert _judged(mean, half) == verdict


def test_the_band_is_the_one_asked_for_and_an_interval_excluding_zero_is_no_verdict():
    # +0.33 +- 0.12 excludes 0 (the old "worse"): against the paper's band it holds
    assert _judged(0.33, 0.12) == "holds"
    assert _judged(0.33, 0.12, band=0.2) == "does not hold"  # 0.21..0.45
    assert _judged(1.5, 0.6, band=3.0) == "holds"


def test_one_seed_and_runs_that_did_not_measure_the_claim_get_no_verdict():
    assert _judged(0.1, None, seeds=1) == "inconclusive"
    assert bench_summary.verdict_cell({"verdict": "inconclusive", "ppl_delta_ci95": None}) \
        == "one seed"
    assert _judged(0.0, 0.1, disturbed=[1]) == "inconclusive"  # a rank fell behind
    assert _judged(0.0, 0.1, reference_missed_packets=[0]) == "inconclusive"


def test_the_summary_states_its_band_and_test_and_sizes_itself_from_the_band():
    records = [_record("reliable", 0.0, s, "a") for s in (0, 1, 2)]
    for r in records:
        r["ppl"] = 10.0
    lossy = [dict(_record("unbiased_drift", 0.1, s, "x"), role="lossy", ppl=p)
             for s, p in ((0, 10.01), (1, 10.02), (2, 10.0))]
    summary = bench_summary.summarise(with_twins(records) + lossy, {}, "bpf", band_pct=0.8)
    assert summary["band_pct"] == 0.8 and "±0.8%" in summary["test"]
    assert "two one-sided tests" in summary["test"]
    row = next(r for r in summary["rows"] if r["loss"] == 0.1)
    assert row["verdict"] == "holds", row
    assert bench_summary.TARGET_CI95 == 0.4  # half the paper's band


def test_a_run_whose_collective_missed_far_more_than_the_network_lost_is_disturbed():
    from harness.train.record import _disturbed

    assert _disturbed(1000, 10000, 0.10) is None          # 10% missing at 10% loss
    assert _disturbed(1250, 10000, 0.10) is None          # within the margin
    assert "fell behind" in _disturbed(10000, 100000, 0.01)   # 10% missing at 1% loss
    assert "fell behind" in _disturbed(5000, 10000, 0.10)  # the run seen: 10x the loss
    assert _disturbed(0, 0, 0.1) is None


def test_datagrams_no_peer_sent_warn_in_the_record_and_the_bench_table():
    from harness.rank_protocol import TrainRankMetrics
    from harness.train.record import wire_warning

    def ranks(*counters):
        return [TrainRankMetrics(rank=i, counters=c) for i, c in enumerate(counters)]

    assert wire_warning(ranks({"foreign": 0, "packets_received": 10})) is None
    text = wire_warning(ranks({"unauthenticated": 3}, {"foreign": 2, "nonfinite": 1}))
    assert "unauthenticated 3" in text and "foreign 2" in text and "nonfinite 1" in text
    assert "malformed" not in text  # only the counters above zero are named
    records = [_record("reliable", 0.0, 0, "a"),
               dict(_record("unbiased", 0.1, 0, "b"), wire_warning=text)]
    summary = bench_summary.summarise(records, {}, "bpf")
    assert summary["rows"][-1]["wire_warnings"] == [0]
    assert summary["rows"][0]["wire_warnings"] == []
    assert "got datagrams their peers did not send" in bench_table.table(summary)


def test_reliable_under_loss_shows_no_perplexity_from_its_short_speed_runs():
    # Its runs under loss are speed runs of --speed-steps (10 in reproduce's benches): the
    # perplexity of a 10-step model (946 there, against 286 for the 300-step reference)
    # printed in the reliable row at 10% read as reliable training breaking under loss.
    records = []
    for s in (0, 1):
        records.append(dict(_record("reliable", 0.0, s, f"ref{s}"), role="reference",
                            steps=300))
        records.append(dict(_record("reliable", 0.0, s, f"short{s}"), role="speed_reference",
                            ppl=946.0))
        records.append(dict(_record("reliable", 0.1, s, f"short{s}"), role="speed",
                            ppl=946.0))
        records.append(dict(_record("unbiased", 0.1, s, f"u{s}"), role="lossy", steps=300))
    summary = bench_summary.summarise(records, {}, "bpf")
    speed_row = next(r for r in summary["rows"] if r["variant"] == "reliable"
                     and r["loss"] == 0.1)
    assert speed_row["ppl"] is None and speed_row["ppl_rank_worst"] is None
    assert speed_row["speed_steps"] == 10
    reference_row = next(r for r in summary["rows"] if r["variant"] == "reliable"
                         and r["loss"] == 0.0)
    assert reference_row["ppl"] == 10.5  # the 300-step references', not the speed runs'
    text = bench_table.table(summary)
    line = next(x for x in text.splitlines() if x.lstrip().startswith("10% reliable"))
    assert "946" not in line
    assert "speed runs of 10 steps" in text


def test_a_lossless_reference_whose_collective_missed_packets_is_named():
    # rps's references in reproduce --full missed 42-7368 packets at 0% loss (late on 2
    # shared cores): two references of one seed then differed by 16% in perplexity
    # (278.25 and 324.47, SGD), so a Δppl against one is partly that
    records = [dict(_record("reliable", 0.0, 0, "r0"), role="reference", packets_lost=0),
               dict(_record("rps/adamw", 0.0, 0, "p0"), role="reference", packets_lost=42,
                    packets_sent=4737600),
               dict(_record("rps/adamw", 0.1, 0, "p1"), role="lossy", packets_lost=473000)]
    summary = bench_summary.summarise(records, {}, "bpf")
    assert summary["checks"]["references_missing_packets"] == [
        {"variant": "rps/adamw", "seed": 0, "packets_lost": 42, "packets_sent": 4737600}]
    assert ("! lossless references that missed packets (late): rps/adamw seed 0 (42 of "
            "4737600)") in bench_table.table(summary)
    rps_row = next(r for r in summary["rows"]
                   if r["variant"] == "rps/adamw" and r["loss"] == 0.1)
    assert rps_row["reference_missed_packets"] == [0]
    clean = bench_summary.summarise(records[:1] + [dict(records[1], packets_lost=0)], {}, "bpf")
    assert clean["checks"]["references_missing_packets"] == []
    assert "missed packets" not in bench_table.table(clean)


def _timed_bench(drift_ppls: list[float]) -> list[dict]:
    """Per seed: reliable's reference (60 s), its twin (60 s) and unbiased_drift at 10%
    (90 s); one realisation run at seed 0 (90 s)."""
    records = []
    for seed, ppl in enumerate(drift_ppls):
        ref = _record("reliable", 0.0, seed, f"ref{seed}") | {"ppl": 100.0, "run_s": 60.0,
                                                              "role": "reference"}
        lossy = _record("unbiased_drift", 0.1, seed, f"d{seed}") | {"ppl": ppl, "run_s": 90.0,
                                                                   "role": "lossy"}
        records += [ref, lossy]
    records.append(_record("unbiased_drift", 0.1, 0, "r") | {"ppl": 104.0, "run_s": 90.0,
                                                            "role": "realisation"})
    return with_twins(records)


def test_the_budget_prices_a_seed_from_its_runs_and_projects_the_seeds_a_target_needs():
    # Δppl per seed +1, +2, +3 (sd 1.0): judged against ±2.0 the bench is sized for ±1.0
    # (half the band), which needs k with t95(k)/√k <= 1, i.e. 7 seeds
    summary = bench_summary.summarise(_timed_bench([101.0, 102.0, 103.0]), {}, "bpf",
                                      wall_s=750.0, band_pct=2.0)
    plan = summary["budget"]
    assert plan["seed_min"] == 3.5              # 60 s + 60 s (the twin) + 90 s per seed
    assert plan["realisation_min"] == 1.5       # does not grow with seeds
    assert plan["start_up_min"] == 0.5          # 750 s in all, 720 s of runs
    (row,) = plan["rows"]
    assert row["variant"] == "unbiased_drift" and row["seeds_now"] == 3
    assert abs(row["seed_sd"] - 1.0) < 1e-9
    assert row["seeds_for_target"] == 7
    assert stats.t95(7) / 7 ** 0.5 <= 1.0 < stats.t95(6) / 6 ** 0.5
    assert abs(row["minutes_for_target"] - (2.0 + 7 * 3.5)) < 1e-9
    at3 = next(c for c in row["curve"] if c["seeds"] == 3)
    assert abs(at3["ci95"] - summary["rows"][-1]["ppl_delta_ci95"]) < 1e-9  # the row's own
    text = bench_table.table(summary)
    assert "a seed costs 3.5 min" in text and "±1.0 needs 7 seeds (~26 min)" in text


def test_a_wider_spread_needs_more_seeds_and_untimed_runs_have_no_budget():
    narrow = bench_summary.summarise(_timed_bench([101.0, 102.0, 103.0]), {}, "bpf", wall_s=570.0)
    wide = bench_summary.summarise(_timed_bench([101.0, 104.0, 107.0]), {}, "bpf", wall_s=570.0)
    assert wide["budget"]["rows"][0]["seeds_for_target"] > \
        narrow["budget"]["rows"][0]["seeds_for_target"]
    untimed = _timed_bench([101.0, 102.0, 103.0])
    del untimed[0]["run_s"]
    summary = bench_summary.summarise(untimed, {}, "bpf", wall_s=570.0)
    assert summary["budget"] is None and "budget:" not in bench_table.table(summary)


def test_the_stability_twins_are_lossless_references_with_one_step_as_a_lossy_one():
    from harness.bench.spec import BenchSpec

    plain = BenchSpec.make(losses=[0.1], seeds=2, steps=50, variants=["reliable", "unbiased"],
                           stability=False)
    assert not [r for r in plain.cases() if r.role == "twin"]
    spec = BenchSpec.make(losses=[0.05, 0.1], seeds=3, steps=50,
                          variants=["reliable", "unbiased"])
    assert spec.stability  # on by default: every verdict waits for it
    twins = [r for r in spec.cases() if r.role == "twin"]
    # every reference a verdict leans on, on every seed (the bench's: after the pilots')
    assert [(t.variant, t.cfg.seed, t.loss, t.profile) for t in twins] == [
        ("reliable", 2, 0.0, "clean"), ("reliable", 3, 0.0, "clean"),
        ("reliable", 4, 0.0, "clean")]
    for twin in twins:
        reference = next(r for r in spec.cases() if r.role == "reference"
                         and r.cfg.seed == twin.cfg.seed and r.variant == "reliable")
        # the bench's largest loss rate, once; everything else as the reference
        assert twin.cfg.drop_once == 0.1 and reference.cfg.drop_once == 0.0
        # the same run but its one lossy step (the reference's held-out curve is measured
        # aside and changes no training: test_training's drift test)
        assert {**twin.cfg.to_dict(), "drop_once": 0.0} == {**reference.cfg.to_dict(),
                                                            "progress_every": 0}
    # one seed: one twin per reference
    assert len([r for r in BenchSpec.make(seeds=1).cases() if r.role == "twin"]) == 2


def test_the_default_bench_checks_both_references_on_every_seed():
    """rps is judged against reliable under SGD: that reference gets twins of its own
    (until #65 only reliable under AdamW had twins, on seeds 0 and 1)."""
    from harness.bench.spec import BenchSpec

    spec = BenchSpec.make()
    twins = sorted((r.variant, r.cfg.seed, r.cfg.optimizer, r.cfg.lr)
                   for r in spec.cases() if r.role == "twin")
    references = sorted((r.variant, r.cfg.seed, r.cfg.optimizer, r.cfg.lr)
                        for r in spec.cases() if r.role == "reference")
    assert twins == references
    assert {t[0] for t in twins} == {"reliable", "reliable/sgd"}
    assert sorted({t[1] for t in twins}) == spec.seed_list == [2, 3, 4, 5]


def _planted(sgd_twin_moves: list[float], adamw_twin_moves=(0.01, -0.02, 0.0, 0.01)):
    """4 seeds: reliable (AdamW, ppl 10) and reliable/sgd (ppl 12) references, each with a
    twin per seed that moved its ppl by the given percents; unbiased_drift and rps at 10%
    0.1% worse than their references on every seed (a Δppl that holds if judged)."""
    seeds = (2, 3, 4, 5)
    records = []
    for variant, ppl, moves in (("reliable", 10.0, adamw_twin_moves),
                                ("reliable/sgd", 12.0, sgd_twin_moves)):
        for s, move in zip(seeds, moves, strict=True):
            records.append(dict(_record(variant, 0.0, s, f"r{s}"), role="reference", ppl=ppl))
            records.append(dict(_record(variant, 0.0, s, f"t{s}"), role="twin",
                                ppl=ppl * (1 + move / 100), config={"drop_once": 0.1}))
    for variant, ppl in (("unbiased_drift", 10.0), ("rps", 12.0)):
        for i, s in enumerate(seeds):
            records.append(dict(_record(variant, 0.1, s, "x"), role="lossy",
                                ppl=ppl * (1.001 + i * 1e-5)))
    return bench_summary.summarise(records, {}, "bpf")


def test_a_chaotic_sgd_reference_withholds_rps_while_unbiased_drift_stands():
    summary = _planted(sgd_twin_moves=[0.9, -1.2, 2.5, 0.4])
    rows = {r["variant"]: r for r in summary["rows"] if r["loss"] == 0.1}
    assert rows["unbiased_drift"]["verdict"] == "holds"
    assert rows["unbiased_drift"]["verdict_withheld"] is None
    assert rows["rps"]["verdict"] == "inconclusive"
    assert rows["rps"]["verdict_withheld"].startswith(
        "regime unstable: the twins of reliable/sgd")
    checks = summary["stability"]
    assert checks["reliable"]["stable"] and not checks["reliable/sgd"]["stable"]
    text = bench_table.table(summary)
    assert "regime stability of reliable/sgd (judges rps)" in text
    assert "regime stability of reliable (judges unbiased_drift)" in text
    assert "CHAOTIC or undecided" in text


def test_both_references_stable_both_rows_judged():
    summary = _planted(sgd_twin_moves=[0.01, 0.02, -0.01, 0.0])
    rows = {r["variant"]: r for r in summary["rows"] if r["loss"] == 0.1}
    assert rows["unbiased_drift"]["verdict"] == rows["rps"]["verdict"] == "holds"
    # each row beside its own reference's check and interval
    assert rows["rps"]["chaos_check"]["reference"] == "reliable/sgd"
    assert rows["unbiased_drift"]["chaos_check"]["reference"] == "reliable"
    line = next(x for x in bench_table.table(summary).splitlines()
                if x.split()[1:2] == ["rps"])
    check = rows["rps"]["chaos_check"]
    assert f"{check['delta_pct']:+.3f}±{check['delta_ci95']:.3f}" in line


@pytest.mark.parametrize(("moves", "stable"), [
    ((0.05, 0.06, 0.04, 0.05), True),      # 0.05 ± 0.013: inside ±0.2
    ((0.19, 0.19, 0.19, 0.19), True),      # at 0.19 with no spread: inside
    ((0.21, 0.21, 0.21, 0.21), False),     # every twin just past the tolerance
    ((0.15, 0.0, 0.3, 0.15), False),       # mean 0.15, but its interval reaches 0.37
    ((-0.15, 0.0, -0.3, -0.15), False),    # the same below
    ((0.1, -0.1, 0.1, -0.1), True),        # mean 0, ± 0.18: just inside
])
def test_a_reference_is_stable_only_when_its_twins_interval_is_inside_the_tolerance(
        moves, stable):
    summary = _planted(sgd_twin_moves=list(moves))
    result = summary["stability"]["reliable/sgd"]
    assert result["tolerance_pct"] == pytest.approx(0.2) and result["seeds"] == [2, 3, 4, 5]
    assert result["deltas_pct"] == pytest.approx(list(moves))
    mean, half = stats.mean_interval(list(moves))
    assert result["delta_pct"] == pytest.approx(mean)
    assert result["delta_ci95"] == pytest.approx(half)
    assert result["stable"] is stable
    assert result["perturbation"] == "one step with 10% of its gradient's datagram blocks zeroed"
    # the twins are no row and no reference: the rows are as without them
    assert [(r["loss"], r["variant"], r["seeds"]) for r in summary["rows"]] == [
        (0.0, "reliable", 4), (0.0, "reliable/sgd", 4), (0.1, "rps", 4),
        (0.1, "unbiased_drift", 4)]
    rps = next(r for r in summary["rows"] if r["variant"] == "rps")
    assert bool(rps["verdict_withheld"]) is not stable


def test_one_twin_has_no_interval_and_decides_nothing():
    records = [dict(_record("reliable", 0.0, 2, "r"), role="reference", ppl=10.0),
               dict(_record("reliable", 0.0, 2, "t"), role="twin", ppl=10.0,
                    config={"drop_once": 0.1}),
               dict(_record("unbiased", 0.1, 2, "x"), role="lossy", ppl=10.01)]
    summary = bench_summary.summarise(records, {}, "bpf")
    assert summary["stability"]["reliable"]["delta_ci95"] is None
    assert not summary["stability"]["reliable"]["stable"]
    assert "one seed: no interval" in bench_table.table(summary)


def test_a_bench_without_a_twin_says_its_stability_was_not_checked_and_withholds():
    """--no-stability: no row gets a verdict (it used to say "holds" there, while reproduce
    withheld the same rows as "regime unchecked": one rule now decides both)."""
    records = [dict(_record("reliable", 0.0, s, "r"), role="reference", ppl=10.0)
               for s in (2, 3, 4)]
    records += [dict(_record("unbiased", 0.1, s, "x"), role="lossy", ppl=10.0 + s * 1e-3)
                for s in (2, 3, 4)]
    summary = bench_summary.summarise(records, {}, "bpf")
    assert summary["stability"] == {}
    assert "regime stability: not checked" in bench_table.table(summary)
    row = next(r for r in summary["rows"] if r["variant"] == "unbiased")
    assert row["verdict"] == "inconclusive"
    assert row["verdict_withheld"] == ("regime unchecked: no chaos check of reliable was run "
                                       "(no twin)")
    assert "unchecked" in bench_table.table(summary)


def test_an_inconclusive_row_says_how_many_seeds_would_decide_it():
    # Δppl +0.2, +0.5, +0.8: mean 0.5, sd 0.3, 95% interval -0.25..+1.25 across +0.8. At this
    # mean and sd the interval clears the edge (0.3 away) once t95(k)·0.3/√k <= 0.3: k = 7
    summary = bench_summary.summarise(_timed_bench([100.2, 100.5, 100.8]), {}, "bpf",
                                      wall_s=570.0)
    row = summary["rows"][-1]
    assert row["verdict"] == "inconclusive" and abs(row["delta_sd"] - 0.3) < 1e-9
    (plan,) = summary["budget"]["rows"]
    assert plan["seeds_to_decide"] == 7
    assert stats.t95(7) / 7 ** 0.5 <= 1.0 < stats.t95(6) / 6 ** 0.5
    text = bench_table.table(summary)
    assert "about 7 seeds" in text and "would decide it" in text
    assert "noise of a paired Δppl (sd over seeds, points): unbiased_drift at 10% 0.30" in text


def test_the_lossless_fine_tune_gain_is_shown_beside_the_verdicts():
    # finetune regime: the references started from checkpoints of ppl 100 (seed 0) and 110
    # (seed 1); reliable's fine-tune moved them by -2% and -4%, reliable/sgd's by -0.5%
    records = [dict(_record("reliable", 0.0, 0, "a"), role="reference", ppl=98.0),
               dict(_record("reliable", 0.0, 1, "b"), role="reference", ppl=105.6),
               dict(_record("reliable/sgd", 0.0, 0, "c"), role="reference", ppl=99.5),
               dict(_record("reliable/sgd", 0.0, 1, "d"), role="reference", ppl=109.45)]
    summary = bench_summary.summarise(records, {}, "bpf", start_ppl={0: 100.0, 1: 110.0})
    assert summary["reference_gain_pct"] == {"reliable": pytest.approx(-3.0),
                                             "reliable/sgd": pytest.approx(-0.5)}
    text = bench_table.table(summary)
    assert "fine-tuning itself, lossless" in text and "reliable -3.00%" in text
    # a fine-tune that moves ppl less than the band: a 'holds' against it says little
    assert "! reliable/sgd: fine-tuning moved ppl by less than the ±0.8% band" in text
    assert "! reliable:" not in text
    # from scratch there is no checkpoint: nothing is claimed
    scratch = bench_summary.summarise(records, {}, "bpf")
    assert scratch["reference_gain_pct"] == {} and "fine-tuning itself" not in \
        bench_table.table(scratch)


@pytest.mark.parametrize(("power", "bounded"), [(0.0, True), (-0.4, True), (0.5, False)])
def test_drift_during_training_gives_each_row_its_largest_distance_and_growth(power, bounded):
    # planted: the replicas' distance grows as step^power over 5 samples of each seed
    def run(seed):
        steps = [30, 60, 90, 120, 150]
        drift = [[s, 0.01 * (1 + 0.01 * seed) * s ** power] for s in steps]
        return dict(_record("unbiased_drift", 0.1, seed, "x"), role="lossy",
                    drift_steps=drift, drift_max=max(d for _, d in drift))

    records = [dict(_record("reliable", 0.0, s, f"r{s}"), role="reference") for s in (0, 1, 2)]
    records += [run(s) for s in (0, 1, 2)]
    summary = bench_summary.summarise(records, {}, "bpf")
    row = next(r for r in summary["rows"] if r["variant"] == "unbiased_drift")
    assert row["drift_growth"] == pytest.approx(power, abs=1e-9)
    assert row["drift_max"] == pytest.approx(max(r["drift_max"] for r in records[3:]))
    assert "drift during training" in bench_table.table(summary)
    assert f"b {power:+.2f}" in bench_table.table(summary)
    from harness.metrics.verdict import FAILS, HOLDS
    from harness.reproduce.training import drift_check

    assert drift_check(row).verdict == (HOLDS if bounded else FAILS)
    # runs without samples (drift_every 0): no growth, no line
    plain = bench_summary.summarise(records[:3] + [dict(_record("unbiased_drift", 0.1, 0, "y"),
                                                        role="lossy")], {}, "bpf")
    assert next(r for r in plain["rows"] if r["loss"] == 0.1)["drift_growth"] is None
    assert "drift during training" not in bench_table.table(plain)
