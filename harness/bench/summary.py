"""A bench's records summed up (summary.json): per (loss, variant) the paired Δppl over seeds
with its 95% interval and the noise floor, the spread over loss realisations, throughput and
tail latency against reliable at the same loss, the checks, and what more seeds would buy
(the budget)."""

from __future__ import annotations

import math
import statistics

from harness.bench import progress, stability, withholding
from harness.bench.spec import Variant, base_variant, reference_variant
from harness.metrics import verdict
from harness.metrics.hdr import Histogram
from testbed.stats import mean_interval, slope_interval, t95

# The half-width of a paired Δppl (points) the bench is sized for, from the band it is judged
# against (half of it): the budget section says how many seeds, and minutes, each variant
# needs for it
TARGET_CI95 = verdict.target_half_width(verdict.BAND_PCT)
CURVE_SEEDS = (2, 3, 4, 5, 6, 8, 12, 16, 32)


MOST_SEEDS = 10_000  # seeds_for looks no further



def _step_ms(runs: list[dict]) -> dict:
    """Step-time percentiles (ms) over the steps of all these runs (their histograms
    merged)."""
    return Histogram.merged(r["step_hist"] for r in runs).summary_ms()


def seeds_for(sd: float, target: float, most: int = MOST_SEEDS) -> int | None:
    """The fewest seeds (2 or more) whose 95% half-width t95(k)·sd/√k is at most `target`,
    for a per-seed spread `sd`; None beyond `most`."""
    for k in range(2, most + 1):
        if t95(k) * sd / math.sqrt(k) <= target:
            return k
    return None


def budget(records: list[dict], rows: list[dict], wall_s: float | None,
           target: float = TARGET_CI95, band_pct: float = verdict.BAND_PCT) -> dict | None:
    """What more seeds would buy, priced from this bench's own runs: a seed costs the wall
    time of its runs (references, lossy and speed runs; set-up and evaluation included),
    the realisation runs and the launch's start-up do not grow with seeds. Per lossy row,
    the half-width at k seeds projected from the seed-to-seed sd of its Δppl (itself rough
    with few seeds), the seeds and minutes it needs for ±target, and for an inconclusive
    row the seeds that would decide it if its mean and sd stayed as they are (the interval
    then clears the band's nearer edge). None when the runs were not timed (records
    without run_s)."""
    if not records or any(r.get("run_s") is None for r in records):
        return None
    seeds = sorted({r["seed"] for r in records})
    fixed = ("realisation",)  # at the first seed alone, whatever the seeds
    per_seed = [sum(r["run_s"] for r in records if r["seed"] == s
                    and r["role"] not in fixed) for s in seeds]
    seed_s = statistics.fmean(per_seed)
    realisation_s = sum(r["run_s"] for r in records if r["role"] in fixed)
    runs_s = sum(r["run_s"] for r in records)
    start_up_s = max(wall_s - runs_s, 0.0) if wall_s is not None else 0.0
    fixed_s = realisation_s + start_up_s

    def minutes(k: int) -> float:
        return (fixed_s + k * seed_s) / 60

    projected = []
    for row in rows:
        deltas = row.get("ppl_deltas") or []
        if row.get("reference") is None or len(deltas) < 2:
            continue
        sd = row["delta_sd"]
        need = seeds_for(sd, target)
        margin = abs(band_pct - abs(row["ppl_delta_pct"]))  # the mean's distance to an edge
        decide = (seeds_for(sd, margin) if row.get("verdict") == verdict.INCONCLUSIVE
                  and not row.get("verdict_withheld") and margin > 0 else None)
        projected.append({
            "loss": row["loss"], "variant": row["variant"], "seeds_now": len(deltas),
            "seed_sd": sd, "seeds_for_target": need,
            "minutes_for_target": minutes(need) if need else None,
            "seeds_to_decide": decide, "minutes_to_decide": minutes(decide) if decide else None,
            "curve": [{"seeds": k, "ci95": t95(k) * sd / math.sqrt(k), "minutes": minutes(k)}
                      for k in CURVE_SEEDS]})
    return {"target_ci95": target, "seed_min": seed_s / 60,
            "realisation_min": realisation_s / 60, "start_up_min": start_up_s / 60,
            "minutes_now": (wall_s if wall_s is not None else runs_s) / 60,
            "rows": projected}


def drift_growth(drift_steps: list) -> float | None:
    """A run's drift growth exponent b (rms drift ~ step^b): the least-squares slope of
    log distance on log step over its samples (None: fewer than three). 0: bounded, as
    2507.07114's broadcasts promise; 0.5: replicas random-walking apart."""
    import math

    points = [(math.log(step), math.log(d)) for step, d in drift_steps if step > 0 and d > 0]
    if len(points) < 3:
        return None
    return slope_interval([x for x, _ in points], [y for _, y in points])[0]


def reference_gains(records: list[dict], start_ppl: dict | None) -> dict[str, float]:
    """Per lossless reference (variant text): how far its runs moved perplexity from the
    checkpoints they started from (finetune regime), mean over seeds, in percent. A 'holds'
    within ±band means little if fine-tuning itself moves ppl by less than the band."""
    if not start_ppl:
        return {}
    moved: dict[str, list[float]] = {}
    for r in records:
        start = start_ppl.get(r["seed"], start_ppl.get(str(r["seed"])))
        if r["role"] == "reference" and start:
            moved.setdefault(r["variant"], []).append((r["ppl"] / start - 1) * 100)
    return {variant: statistics.fmean(v) for variant, v in moved.items()}


def summarise(records: list[dict], spec_dict: dict, backend: str,
              wall_s: float | None = None, regime: str | None = None,
              band_pct: float = verdict.BAND_PCT, start_ppl: dict | None = None) -> dict:
    """Per (loss, variant): the paired Δppl over seeds with its 95% interval, the spread over
    loss realisations at seed 0, speed against reliable at the same loss, which model the
    perplexity is of; and the checks. Records carry `role` (see training_bench); a record
    without one is taken as a lossy run, or a reference when reliable at 0% loss."""
    for r in records:
        r.setdefault("role", "reference" if r["variant"] == "reliable" and r["loss"] == 0
                     else "lossy")
    # a run whose traffic did not meet its impairment measured another network: it is named,
    # and left out of every row, verdict and check below
    invalid = [{"variant": r["variant"], "seed": r["seed"], "loss": r["loss"],
                "role": r["role"], "why": r["invalid"]} for r in records if r.get("invalid")]
    records = [r for r in records if not r.get("invalid")]
    refs = {(r["variant"], r["seed"]): r for r in records if r["role"] == "reference"}
    # A lossless reference of a lossy collective is lossless only if nothing came late: a
    # rank that falls behind (shared cores) loses packets at 0% too, and its model is then
    # one perturbed run, not the reference (SGD here: 16% apart between two of one seed)
    late_refs = {key: r for key, r in refs.items() if r.get("packets_lost")}
    for r in records:
        ref = refs.get((reference_variant(r["variant"]), r["seed"]))
        quality = r["role"] in ("lossy", "realisation", "reference")
        r["ppl_delta_pct"] = ((r["ppl"] / ref["ppl"] - 1) * 100
                              if quality and ref and ref is not r else
                              (0.0 if r["role"] == "reference" else None))
    # the seed-to-seed spread of the main reference (reliable under the bench's --optimizer)
    main = Variant("reliable").resolved((spec_dict or {}).get("optimizer", "adamw")).text
    lossless = [r["ppl"] for r in records if r["role"] == "reference" and r["variant"] == main]
    noise_floor = (statistics.stdev(lossless) / statistics.fmean(lossless) * 100
                   if len(lossless) > 1 else None)
    # the chaos check of every reference: its twins against its own seeds' runs
    chaos = stability.by_reference(records)
    first_seed = min((r["seed"] for r in records), default=0)
    groups = {}
    for r in records:
        if r["role"] in ("realisation", "speed_reference", "twin"):
            continue
        groups.setdefault((r["loss"], r["variant"]), []).append(r)
    speed = {}  # reliable's runs that measure speed, per loss
    for r in records:
        if base_variant(r["variant"]) == "reliable" and r["role"] in ("speed",
                                                                      "speed_reference"):
            speed.setdefault(r["loss"], []).append(r)
    rows = []
    for (loss, variant), runs in sorted(groups.items()):
        paired = [r for r in runs if r["ppl_delta_pct"] is not None
                  and r["role"] != "reference"]
        deltas = [r["ppl_delta_pct"] for r in paired]
        mean, half = mean_interval(deltas) if deltas else (None, None)
        half = half if half != math.inf else None  # one seed: no interval (JSON has no ∞)
        realised = [r["ppl_delta_pct"] for r in records if r["loss"] == loss
                    and r["variant"] == variant and r["seed"] == first_seed
                    and r["role"] in ("lossy", "realisation")
                    and r["ppl_delta_pct"] is not None]
        steps = _step_ms(runs)
        # reliable under loss runs only for its speed (--speed-steps): a perplexity of
        # those short runs is not reliable's under loss, so its row shows none
        speed_only = all(r["role"] == "speed" for r in runs)
        row = {
            "loss": loss, "variant": variant, "seeds": len(runs),
            "roles": sorted({r["role"] for r in runs}),
            "headline": runs[0].get("headline"),
            "reference": None if runs[0]["role"] in ("reference", "speed")
            else reference_variant(variant),
            "ppl": None if speed_only else statistics.fmean(r["ppl"] for r in runs),
            "speed_steps": runs[0].get("steps") if speed_only else None,
            "ppl_delta_pct": mean, "ppl_delta_ci95": half, "ppl_deltas": deltas,
            "delta_seeds": [r["seed"] for r in paired],  # whose Δppl each of ppl_deltas is
            "realisation_sd": statistics.stdev(realised) if len(realised) > 1 else None,
            "realisations": len(realised),
            "ppl_rank_worst": None if speed_only else statistics.fmean(
                r.get("ppl_rank_worst") or r["ppl"] for r in runs),
            "tokens_per_s": statistics.fmean(r["tokens_per_s"] for r in runs),
            # the steady steps of all seeds together: p99 needs 100 of them, else None
            "step_p50_ms": steps["p50"], "step_p99_ms": steps["p99"],
            "step_max_ms": steps["max"], "step_samples": steps["count"],
            "slow_steps": sum(len(r.get("slow_steps") or []) for r in runs),
            "disturbed": [r["seed"] for r in runs if r.get("disturbed")],
            # seeds whose lossless reference (of this variant) missed packets: late, so not
            # the lossless model (checks.references_missing_packets)
            "reference_missed_packets": [] if runs[0]["role"] == "reference" else sorted(
                r["seed"] for r in runs if (reference_variant(variant), r["seed"]) in late_refs),
            "wire_warnings": [r["seed"] for r in runs if r.get("wire_warning")],
            "measured_loss": statistics.fmean(r["measured_loss"] for r in runs),
            # the least share of the hosts' bytes that crossed the impairment, over its runs
            "coverage": min((r["coverage"]["fraction"] for r in runs
                             if (r.get("coverage") or {}).get("fraction") is not None),
                            default=None),
            "drift": statistics.fmean(r["drift"] for r in runs),
            # during training (drift_every): the largest replica distance over the steps of
            # all runs, and the growth exponent per run with its 95% interval over seeds
            "drift_max": max((r["drift_max"] for r in runs if r.get("drift_max") is not None),
                             default=None),
        }
        growths = [g for g in (drift_growth(r.get("drift_steps") or []) for r in runs)
                   if g is not None]
        growth, growth_half = mean_interval(growths) if growths else (None, None)
        row["drift_growth"] = growth
        row["drift_growth_ci95"] = growth_half if growth_half != math.inf else None
        base = speed.get(loss) or groups.get((loss, "reliable"), [])
        if base:
            base_steps = _step_ms(base)
            row["throughput_vs_reliable"] = row["tokens_per_s"] / statistics.fmean(
                r["tokens_per_s"] for r in base)
            row["p99_vs_reliable"] = (row["step_p99_ms"] / base_steps["p99"]
                                      if row["step_p99_ms"] and base_steps["p99"] else None)
            row["max_vs_reliable"] = (row["step_max_ms"] / base_steps["max"]
                                      if row["step_max_ms"] and base_steps["max"] else None)
        if row["reference"]:  # iso-progress: its final ppl on its reference's curve
            row.update(progress.row_progress(runs, refs, row["reference"]))
        # the chaos check of this row's own reference (None: not checked)
        row["chaos_check"] = chaos.get(row["reference"]) if row["reference"] else None
        judged = judge(row, band_pct)
        row["verdict"] = judged.verdict if judged else None
        row["verdict_withheld"] = judged.disturbed if judged else None
        # the noise of a paired Δ: what its interval is made of (sd of the per-seed Δppl)
        row["delta_sd"] = statistics.stdev(deltas) if len(deltas) > 1 else None
        rows.append(row)
    # reliable under loss must train exactly the lossless model: its speed runs against the
    # lossless ones of the same length and seed; None when none was made ("not run")
    # A run under loss without a lossless one of its seed and length is not compared: it
    # is named (unpaired), and the check is False rather than left out
    short = {r["seed"]: r for r in records if r["role"] == "speed_reference"}
    under_loss = [r for r in records if base_variant(r["variant"]) == "reliable"
                   and r["loss"] > 0]
    compared, unpaired = [], []
    for r in under_loss:
        ref = short.get(r["seed"]) or refs.get((r["variant"], r["seed"]))
        if ref is not None and ref.get("steps") == r.get("steps"):
            compared.append((r, ref))
        else:
            unpaired.append({"seed": r["seed"], "loss": r["loss"], "steps": r.get("steps")})
    exact = (all(r["model_sha"] == ref["model_sha"] for r, ref in compared) and not unpaired
             if under_loss else None)
    incomplete = [{"variant": r["variant"], "seed": r["seed"],
                   "packets_lost": r["packets_lost"], "packets_sent": r.get("packets_sent")}
                  for r in late_refs.values()]
    tokens = sorted({r["tokens_seen"] for r in records if r.get("tokens_seen")
                     and r["role"] not in ("speed", "speed_reference")})
    return {"config": spec_dict, "regime": regime, "tokens_seen": tokens,
            "stability": chaos, "start_ppl": start_ppl,
            "reference_gain_pct": reference_gains(records, start_ppl),
            "backend": backend, "noise_floor_pct": noise_floor,
            "lossless_ppl": lossless, "rows": rows,
            "band_pct": band_pct, "test": verdict.test_text(band_pct),
            "budget": budget(records, rows, wall_s, verdict.target_half_width(band_pct),
                             band_pct),
            "invalid_runs": invalid,
            "checks": {"reliable_exact_under_loss": exact,
                       "reliable_unpaired": unpaired,
                       "references_missing_packets": incomplete}}


def judge(row: dict, band_pct: float) -> verdict.Check | None:
    """A row's Δppl against ±band_pct (verdict.delta_ppl), or None where the row has no
    Δppl to judge (a reference, a speed run: their rows carry none)."""
    if row.get("ppl_delta_pct") is None:
        return None
    return verdict.delta_ppl(row["ppl_delta_pct"], row.get("ppl_delta_ci95"),
                             len(row.get("ppl_deltas") or []), band_pct,
                             withheld=withholding.withheld(row))


def verdict_cell(row: dict) -> str:
    """A row's verdict as the table and the report show it."""
    if row.get("verdict") is None:
        return "-"
    if row.get("ppl_delta_ci95") is None and not row.get("verdict_withheld"):
        return "one seed"  # no interval: more seeds, not a verdict
    return row["verdict"] + (" (withheld)" if row.get("verdict_withheld") else "")
